// NcclCommunicator: the collectives on CUDA device memory over NCCL (from the CUDA toolkit),
// issued on the backend's stream. The unique id that joins the ranks travels over MPI when the
// run came from mpirun, else over one TCP connection per rank to MASTER_ADDR:MASTER_PORT
// (torchrun's convention): bootstrap only, every byte of data goes through NCCL.
//
// libnccl.so.2 is loaded when the first communicator is made (dlopen), not linked: a binary
// that never runs on several GPUs does not need the 200 MB library where it runs (the CUDA
// toolkit's lib64 or pip's nvidia-nccl-cu13 on LD_LIBRARY_PATH); nccl.h gives the types.
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace deepinfer {
namespace {

// The NCCL entry points deepinfer calls, from libnccl.so.2.
struct NcclApi {
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclCommSplit) comm_split = nullptr;  // NCCL >= 2.18; null in older libraries
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    DI_CHECK(lib != nullptr, "NCCL: cannot load libnccl.so.2 (", dlerror(), "); put the CUDA toolkit's lib64 or "
             "pip's nvidia-nccl-cu13 lib directory on LD_LIBRARY_PATH");
    NcclApi a;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      DI_CHECK(fn != nullptr, "NCCL: libnccl.so.2 has no ", name);
    };
    load(a.get_error_string, "ncclGetErrorString");
    load(a.get_unique_id, "ncclGetUniqueId");
    load(a.comm_init_rank, "ncclCommInitRank");
    load(a.comm_destroy, "ncclCommDestroy");
    load(a.comm_user_rank, "ncclCommUserRank");
    load(a.comm_count, "ncclCommCount");
    load(a.all_reduce, "ncclAllReduce");
    load(a.all_gather, "ncclAllGather");
    load(a.broadcast, "ncclBroadcast");
    load(a.send, "ncclSend");
    load(a.recv, "ncclRecv");
    load(a.group_start, "ncclGroupStart");
    load(a.group_end, "ncclGroupEnd");
    // Optional: only --dp x --tp needs it (Communicator::split), which names it when missing.
    a.comm_split = reinterpret_cast<decltype(&ncclCommSplit)>(dlsym(lib, "ncclCommSplit"));
    return a;
  }();
  return api;
}

void check_nccl(ncclResult_t rc, const char* what) {
  DI_CHECK(rc == ncclSuccess, "NCCL ", what, ": ", nccl().get_error_string(rc));
}
void check_cuda(cudaError_t rc, const char* what) {
  DI_CHECK(rc == cudaSuccess, "CUDA (NCCL communicator) ", what, ": ", cudaGetErrorString(rc));
}

ncclDataType_t nccl_type(DType dt, const char* what) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    default: fail("NCCL ", what, ": dtype ", dtype_name(dt), " (F32, BF16 or I32 expected)");
  }
}

// Rank 0 listens on MASTER_PORT and sends the id to each of the other ranks, which connect
// to MASTER_ADDR (retrying while rank 0 starts).
void tcp_exchange_id(const ProcessLayout& l, ncclUniqueId& id) {
  DI_CHECK(!l.master_addr.empty() && l.master_port > 0, "NCCL rendezvous: set MASTER_ADDR and "
           "MASTER_PORT (torchrun's convention) or start the ranks with mpirun");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (l.rank == 0) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    DI_CHECK(s >= 0, "NCCL rendezvous: socket");
    const int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(l.master_port));
    DI_CHECK(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(s, l.world_size) == 0,
             "NCCL rendezvous: cannot listen on port ", l.master_port, " (MASTER_PORT): ", std::strerror(errno));
    for (int i = 1; i < l.world_size; ++i) {
      const int c = accept(s, nullptr, nullptr);
      DI_CHECK(c >= 0, "NCCL rendezvous: accept: ", std::strerror(errno));
      const bool ok = send(c, &id, sizeof(id), 0) == static_cast<ssize_t>(sizeof(id));
      close(c);
      DI_CHECK(ok, "NCCL rendezvous: sending the unique id failed");
    }
    close(s);
    return;
  }
  addrinfo* res = nullptr;
  const std::string port = std::to_string(l.master_port);
  DI_CHECK(getaddrinfo(l.master_addr.c_str(), port.c_str(), &hints, &res) == 0 && res != nullptr,
           "NCCL rendezvous: cannot resolve MASTER_ADDR '", l.master_addr, "'");
  for (int attempt = 0;; ++attempt) {
    const int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c >= 0 && connect(c, res->ai_addr, res->ai_addrlen) == 0) {
      size_t got = 0;
      while (got < sizeof(id)) {
        const ssize_t n = recv(c, reinterpret_cast<char*>(&id) + got, sizeof(id) - got, 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      close(c);
      freeaddrinfo(res);
      DI_CHECK(got == sizeof(id), "NCCL rendezvous: short unique id from ", l.master_addr);
      return;
    }
    if (c >= 0) close(c);
    if (attempt >= 600) {
      freeaddrinfo(res);
      fail("NCCL rendezvous: rank ", l.rank, " could not reach ", l.master_addr, ":", l.master_port, " in 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const ProcessLayout& l, void* stream)
      : rank_(l.rank), size_(l.world_size), stream_(static_cast<cudaStream_t>(stream)) {
    ncclUniqueId id{};
    if (rank_ == 0) check_nccl(nccl().get_unique_id(&id), "get unique id");
    if (l.launcher == "mpirun") {
      own_bootstrap_ = make_mpi_communicator();
      bootstrap_ = own_bootstrap_.get();
      DI_CHECK(bootstrap_ != nullptr, "NCCL under mpirun: this build has no MPI to pass the unique id; "
               "use torchrun's variables (MASTER_ADDR, MASTER_PORT) instead");
      bootstrap_->broadcast_bytes(&id, sizeof(id), 0);
    } else {
      tcp_exchange_id(l, id);
    }
    check_nccl(nccl().comm_init_rank(&comm_, size_, id, rank_), "comm init");
  }
  // A sub-communicator of ncclCommSplit (host bytes over the parent bootstrap's split, if any).
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, Communicator* bootstrap)
      : stream_(stream), comm_(comm), bootstrap_(bootstrap) {
    check_nccl(nccl().comm_user_rank(comm_, &rank_), "comm user rank");
    check_nccl(nccl().comm_count(comm_, &size_), "comm count");
  }
  ~NcclCommunicator() override {
    destroy_splits();
    if (staging_ != nullptr) cudaFree(staging_);
    if (comm_ != nullptr) nccl().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void all_reduce_sum(Tensor& t) override {
    check_device(t, "all_reduce_sum");
    contiguous_bytes(t, "all_reduce_sum");
    check_nccl(nccl().all_reduce(t.data, t.data, static_cast<size_t>(t.numel()), nccl_type(t.dtype, "all_reduce_sum"),
                             ncclSum, comm_, stream_),
               "all_reduce_sum");
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_device(in, "all_gather in");
    check_device(out, "all_gather out");
    const int64_t bytes = contiguous_bytes(in, "all_gather in");
    DI_CHECK(contiguous_bytes(out, "all_gather out") == bytes * size_, "all_gather: out ", out.describe(),
             " must hold ", size_, " x ", in.describe());
    check_nccl(nccl().all_gather(in.data, out.data, static_cast<size_t>(bytes), ncclInt8, comm_, stream_), "all_gather");
  }
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                    std::span<const int64_t> recv_rows) override {
    check_device(in, "all_to_all_v in");
    check_device(out, "all_to_all_v out");
    DI_CHECK(static_cast<int>(send_rows.size()) == size_ && static_cast<int>(recv_rows.size()) == size_,
             "all_to_all_v: one send and one receive count per rank (", size_, ")");
    const int64_t row = row_bytes(in, "all_to_all_v in");
    int64_t so = 0, ro = 0;
    check_nccl(nccl().group_start(), "group start");
    for (int r = 0; r < size_; ++r) {
      const size_t sb = static_cast<size_t>(send_rows[r] * row), rb = static_cast<size_t>(recv_rows[r] * row);
      if (sb > 0) check_nccl(nccl().send(static_cast<const char*>(in.data) + so, sb, ncclInt8, r, comm_, stream_), "send");
      if (rb > 0) check_nccl(nccl().recv(static_cast<char*>(out.data) + ro, rb, ncclInt8, r, comm_, stream_), "recv");
      so += static_cast<int64_t>(sb);
      ro += static_cast<int64_t>(rb);
    }
    check_nccl(nccl().group_end(), "group end");
    DI_CHECK(so <= static_cast<int64_t>(in.num_bytes()) && ro <= static_cast<int64_t>(out.num_bytes()),
             "all_to_all_v: counts exceed in ", in.describe(), " or out ", out.describe());
  }
  void broadcast(Tensor& t, int root) override {
    check_device(t, "broadcast");
    check_nccl(nccl().broadcast(t.data, t.data, contiguous_bytes(t, "broadcast"), ncclInt8, root, comm_, stream_),
               "broadcast");
  }
  // Host bytes: over the bootstrap MPI when there is one, else staged through the device.
  void broadcast_bytes(void* data, int64_t num_bytes, int root) override {
    if (bootstrap_ != nullptr) return bootstrap_->broadcast_bytes(data, num_bytes, root);
    if (num_bytes > staging_bytes_) {
      if (staging_ != nullptr) check_cuda(cudaFree(staging_), "free");
      check_cuda(cudaMalloc(&staging_, static_cast<size_t>(num_bytes)), "staging alloc");
      staging_bytes_ = num_bytes;
    }
    const size_t n = static_cast<size_t>(num_bytes);
    if (rank_ == root) check_cuda(cudaMemcpyAsync(staging_, data, n, cudaMemcpyHostToDevice, stream_), "copy");
    check_nccl(nccl().broadcast(staging_, staging_, n, ncclInt8, root, comm_, stream_), "broadcast_bytes");
    check_cuda(cudaMemcpyAsync(data, staging_, n, cudaMemcpyDeviceToHost, stream_), "copy");
    check_cuda(cudaStreamSynchronize(stream_), "synchronize");
  }
  void barrier() override {
    int32_t one = 1;
    broadcast_bytes(&one, sizeof(one), 0);
  }

 protected:
  std::unique_ptr<Communicator> make_split(int color, int key) override {
    DI_CHECK(nccl().comm_split != nullptr, "NCCL: this libnccl.so.2 has no ncclCommSplit (NCCL >= 2.18 "
             "needed for --dp with --tp > 1)");
    Communicator* bootstrap = bootstrap_ != nullptr ? &bootstrap_->split(color, key) : nullptr;  // owned there
    ncclComm_t sub = nullptr;
    check_nccl(nccl().comm_split(comm_, color, key, &sub, nullptr), "comm split");
    return std::make_unique<NcclCommunicator>(sub, stream_, bootstrap);
  }

 private:
  static void check_device(const Tensor& t, const char* what) {
    DI_CHECK(t.device == Device::CUDA, "NCCL ", what, ": ", t.describe(), " must be device memory");
  }
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<Communicator> own_bootstrap_;  // MPI under mpirun
  Communicator* bootstrap_ = nullptr;            // it, or (a split) the parent bootstrap's split
  void* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const ProcessLayout& layout, void* cuda_stream) {
  return std::make_unique<NcclCommunicator>(layout, cuda_stream);
}

}  // namespace deepinfer
