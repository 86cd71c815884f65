// MpiCommunicator: the collectives on host memory over Open MPI (the CPU backend's
// communicator; mpirun -np N deepinfer ... in CI). all_reduce_sum is an all-gather followed by
// a sum in rank order on every rank, so every rank holds the same bits whatever algorithm MPI
// picks, and the result does not depend on message sizes (batch invariance).
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "dist/communicator.h"

namespace deepinfer {
namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("MPI ", what, ": ", std::string(msg, static_cast<size_t>(len)));
}

int as_count(int64_t bytes, const char* what) {
  DI_CHECK(bytes >= 0 && bytes <= std::numeric_limits<int>::max(), "MPI ", what, ": ", bytes,
           " bytes exceed one message (2 GiB)");
  return static_cast<int>(bytes);
}

void check_host(const Tensor& t, const char* what) {
  DI_CHECK(t.device == Device::CPU, "MPI communicator ", what, ": ", t.describe(),
           " must be host memory (device tensors go through NCCL)");
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Serialized: the engine's thread (the server's engine loop) may be another than main.
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
      DI_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI: this MPI library does not provide MPI_THREAD_SERIALIZED");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  // A sub-communicator of MPI_Comm_split (owned: freed with this object while MPI lives).
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm), owned_(true) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    destroy_splits();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void all_reduce_sum(Tensor& t) override {
    check_host(t, "all_reduce_sum");
    const int64_t bytes = contiguous_bytes(t, "all_reduce_sum");
    const int64_t n = t.numel();
    gathered_.resize(static_cast<size_t>(bytes * size_));
    check_mpi(MPI_Allgather(t.data, as_count(bytes, "all_reduce_sum"), MPI_BYTE, gathered_.data(),
                            as_count(bytes, "all_reduce_sum"), MPI_BYTE, comm_),
              "all_reduce_sum");
    // Rank order, the same on every rank: ((r0 + r1) + r2) + ...
    switch (t.dtype) {
      case DType::F32: sum_ranks<float>(t, n); break;
      case DType::I32: sum_ranks<int32_t>(t, n); break;
      default:
        fail("MPI all_reduce_sum: ", t.describe(), " must be F32 or I32 (the CPU backend's activations)");
    }
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_host(in, "all_gather in");
    check_host(out, "all_gather out");
    const int64_t bytes = contiguous_bytes(in, "all_gather in");
    DI_CHECK(contiguous_bytes(out, "all_gather out") == bytes * size_ && out.dtype == in.dtype,
             "all_gather: out ", out.describe(), " must hold ", size_, " x ", in.describe());
    check_mpi(MPI_Allgather(in.data, as_count(bytes, "all_gather"), MPI_BYTE, out.data,
                            as_count(bytes, "all_gather"), MPI_BYTE, comm_),
              "all_gather");
  }
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                    std::span<const int64_t> recv_rows) override {
    check_host(in, "all_to_all_v in");
    check_host(out, "all_to_all_v out");
    DI_CHECK(static_cast<int>(send_rows.size()) == size_ && static_cast<int>(recv_rows.size()) == size_,
             "all_to_all_v: one send and one receive count per rank (", size_, ")");
    const int64_t row = row_bytes(in, "all_to_all_v in");
    DI_CHECK(row_bytes(out, "all_to_all_v out") == row || out.shape[0] == 0 || in.shape[0] == 0,
             "all_to_all_v: rows of in ", in.describe(), " and out ", out.describe(), " differ");
    std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    int64_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      sc[r] = as_count(send_rows[r] * row, "all_to_all_v");
      rc[r] = as_count(recv_rows[r] * row, "all_to_all_v");
      sd[r] = as_count(so, "all_to_all_v");
      rd[r] = as_count(ro, "all_to_all_v");
      so += sc[r];
      ro += rc[r];
    }
    DI_CHECK(so <= static_cast<int64_t>(in.num_bytes()) && ro <= static_cast<int64_t>(out.num_bytes()),
             "all_to_all_v: counts exceed in ", in.describe(), " or out ", out.describe());
    check_mpi(MPI_Alltoallv(in.data, sc.data(), sd.data(), MPI_BYTE, out.data, rc.data(), rd.data(),
                            MPI_BYTE, comm_),
              "all_to_all_v");
  }
  void broadcast(Tensor& t, int root) override {
    check_host(t, "broadcast");
    broadcast_bytes(t.data, contiguous_bytes(t, "broadcast"), root);
  }
  void broadcast_bytes(void* data, int64_t num_bytes, int root) override {
    DI_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside ", size_, " ranks");
    check_mpi(MPI_Bcast(data, as_count(num_bytes, "broadcast"), MPI_BYTE, root, comm_),
              "broadcast");
  }
  void barrier() override { check_mpi(MPI_Barrier(comm_), "barrier"); }

 protected:
  std::unique_ptr<Communicator> make_split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  template <typename T>
  void sum_ranks(Tensor& t, int64_t n) {
    const T* g = reinterpret_cast<const T*>(gathered_.data());
    T* dst = static_cast<T*>(t.data);
    for (int64_t i = 0; i < n; ++i) {
      T acc = g[i];
      for (int r = 1; r < size_; ++r) acc += g[r * n + i];
      dst[i] = acc;
    }
  }
  MPI_Comm comm_ = MPI_COMM_WORLD;
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
  std::vector<char> gathered_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace deepinfer
