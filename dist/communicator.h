// Communicator: the collectives several processes (ranks) of one run use, on tensors of the
// backend they compute on (host tensors for the CPU backend, device tensors for CUDA).
// Implementations: a single process (size 1, every collective is the identity), MPI on host
// memory (Open MPI; the CPU backend in CI) and NCCL on CUDA device memory. The model and the
// runner only see this interface; which one a run gets is decided once (make_communicator).
//
// Every collective is called by every rank in the same order with the same shapes (SPMD); a
// rank that skips one hangs the others, so the callers keep their control flow identical.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

// Where this process sits, from the launcher's environment: mpirun (OMPI_COMM_WORLD_RANK,
// _SIZE, _LOCAL_RANK) or torchrun's convention (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT). Neither: one process.
struct ProcessLayout {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // this process's GPU on its host
  std::string launcher = "none";  // "mpirun" | "torchrun" | "none"
  std::string master_addr;        // torchrun: rendezvous host (NCCL's unique id, bootstrap only)
  int master_port = 0;             // + 1 under torchrun's agent store (its own server is there)
};
// Reads the environment; throws Error naming the variable when one is malformed or
// inconsistent (rank outside [0, world_size)).
ProcessLayout process_layout_from_env();
// Same, from a lookup (tests): get(name) returns nullptr when unset.
ProcessLayout process_layout_from(const char* (*get)(const char* name));

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single" | "mpi" | "nccl"

  // t = sum over ranks of t (every rank gets the same bits). F32, BF16 or I32, contiguous.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // out [size * n, ...] = the `in` [n, ...] of rank 0, then rank 1, ... (rank-major rows).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // Rows of `in` go to ranks: send_rows[r] consecutive rows (rank-major) to rank r; `out`
  // receives recv_rows[r] rows from each rank r, rank-major. Row = in's trailing dims (out's
  // must match); both contiguous. The counts are exchanged beforehand by the caller (e.g. an
  // all_gather of I32 counts): MoE dispatch/combine of tokens to the ranks of their experts.
  virtual void all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                            std::span<const int64_t> recv_rows) = 0;
  // t on every rank = t of `root`.
  virtual void broadcast(Tensor& t, int root) = 0;
  // Host bytes from `root` to every rank (step descriptions: runner/step_follow); every
  // implementation has a host path (NCCL: its bootstrap MPI, or staged through the device).
  virtual void broadcast_bytes(void* data, int64_t num_bytes, int root) = 0;
  virtual void barrier() = 0;

  // A sub-communicator (collective: every rank of this one calls it, in the same order): the
  // ranks that pass the same `color` form it, ranked by `key` (then by their rank here), as
  // MPI_Comm_split / ncclCommSplit do. Owned by this communicator (valid while it lives).
  // --dp x --tp: each data-parallel group's tensor-parallel ranks, and each tensor-parallel
  // position's ranks across the groups (model/parallel.h).
  Communicator& split(int color, int key);

 protected:
  virtual std::unique_ptr<Communicator> make_split(int color, int key) = 0;
  // Implementations whose sub-communicators must go before their own handle call it first
  // in their destructor.
  void destroy_splits() { splits_.clear(); }

 private:
  std::vector<std::unique_ptr<Communicator>> splits_;
};

// Size 1: all_reduce_sum / broadcast leave t, all_gather and all_to_all_v copy in to out.
std::unique_ptr<Communicator> make_single_communicator();
// Open MPI on host memory (initialises MPI on first use, finalises at exit). nullptr when
// deepinfer was built without MPI (DEEPINFER_MPI off).
std::unique_ptr<Communicator> make_mpi_communicator();
// NCCL on the CUDA device `layout.local_rank` (the caller made it current), collectives on
// `cuda_stream` (a cudaStream_t: the backend's). The unique id travels over MPI when the run
// came from mpirun, else over a TCP rendezvous at MASTER_ADDR:MASTER_PORT (bootstrap only).
// nullptr when deepinfer was built without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(const ProcessLayout& layout, void* cuda_stream);
// The communicator a run of `layout` on `device` gets: single when world_size == 1, else NCCL
// for CUDA and MPI for the CPU. Throws Error saying what is missing from the build.
std::unique_ptr<Communicator> make_communicator(const ProcessLayout& layout, Device device,
                                                void* cuda_stream = nullptr);

// Helpers shared by the implementations.
int64_t contiguous_bytes(const Tensor& t, const char* what);  // throws unless contiguous
int64_t row_bytes(const Tensor& t, const char* what);          // bytes of one row (dim 0)

}  // namespace deepinfer
