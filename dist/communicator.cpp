#include "dist/communicator.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace deepinfer {
namespace {

int parse_int(const char* name, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  DI_CHECK(end != value && *end == '\0' && v >= 0 && v < (1L << 30), "environment: ", name, "='",
           value, "' is not a non-negative integer");
  return static_cast<int>(v);
}

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  void all_reduce_sum(Tensor& t) override { contiguous_bytes(t, "all_reduce_sum"); }
  void all_gather(const Tensor& in, Tensor& out) override {
    const int64_t n = contiguous_bytes(in, "all_gather in");
    DI_CHECK(contiguous_bytes(out, "all_gather out") == n && in.device == Device::CPU,
             "all_gather (single process): out ", out.describe(), " must be in ", in.describe(),
             " on the host");
    if (out.data != in.data) std::memcpy(out.data, in.data, static_cast<size_t>(n));
  }
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                    std::span<const int64_t> recv_rows) override {
    DI_CHECK(send_rows.size() == 1 && recv_rows.size() == 1 && send_rows[0] == recv_rows[0] &&
                 in.device == Device::CPU,
             "all_to_all_v (single process): one host rank sending to itself");
    const int64_t n = send_rows[0] * row_bytes(in, "all_to_all_v in");
    DI_CHECK(n <= contiguous_bytes(out, "all_to_all_v out"), "all_to_all_v: out too small");
    if (n > 0 && out.data != in.data) std::memcpy(out.data, in.data, static_cast<size_t>(n));
  }
  void broadcast(Tensor& t, int root) override {
    DI_CHECK(root == 0, "broadcast: root ", root, " outside a single process");
  }
  void broadcast_bytes(void*, int64_t, int root) override {
    DI_CHECK(root == 0, "broadcast_bytes: root ", root, " outside a single process");
  }
  void barrier() override {}

 protected:
  std::unique_ptr<Communicator> make_split(int, int) override { return std::make_unique<SingleCommunicator>(); }
};

}  // namespace

Communicator& Communicator::split(int color, int key) {
  DI_CHECK(color >= 0 && key >= 0, name(), " communicator: split(color ", color, ", key ", key,
           "): both must be >= 0");
  std::unique_ptr<Communicator> c = make_split(color, key);
  DI_CHECK(c != nullptr && c->size() >= 1 && c->rank() >= 0 && c->rank() < c->size(), name(),
           " communicator: split(color ", color, ", key ", key, ") made no communicator");
  splits_.push_back(std::move(c));
  return *splits_.back();
}

int64_t contiguous_bytes(const Tensor& t, const char* what) {
  DI_CHECK(t.defined() && t.is_contiguous(), what, ": ", t.describe(), " must be contiguous");
  return static_cast<int64_t>(t.num_bytes());
}

int64_t row_bytes(const Tensor& t, const char* what) {
  DI_CHECK(t.defined() && t.is_contiguous() && t.ndim >= 1, what, ": ", t.describe(),
           " must be contiguous with rows");
  return t.shape[0] == 0 ? 0 : static_cast<int64_t>(t.num_bytes()) / t.shape[0];
}

ProcessLayout process_layout_from(const char* (*get)(const char* name)) {
  ProcessLayout l;
  auto read = [&](const char* name, int& field) {
    const char* v = get(name);
    if (v == nullptr || *v == '\0') return false;
    field = parse_int(name, v);
    return true;
  };
  if (read("OMPI_COMM_WORLD_SIZE", l.world_size)) {
    l.launcher = "mpirun";
    DI_CHECK(read("OMPI_COMM_WORLD_RANK", l.rank), "environment: OMPI_COMM_WORLD_SIZE is set but "
             "OMPI_COMM_WORLD_RANK is not");
    if (!read("OMPI_COMM_WORLD_LOCAL_RANK", l.local_rank)) l.local_rank = l.rank;
  } else if (read("WORLD_SIZE", l.world_size)) {
    l.launcher = "torchrun";
    DI_CHECK(read("RANK", l.rank), "environment: WORLD_SIZE is set but RANK is not (torchrun's "
             "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
    if (!read("LOCAL_RANK", l.local_rank)) l.local_rank = l.rank;
    const char* addr = get("MASTER_ADDR");
    l.master_addr = addr != nullptr ? addr : "";
    read("MASTER_PORT", l.master_port);
    // torchrun's agent hosts its own store on MASTER_PORT (workers reuse it): the NCCL id
    // rendezvous takes the next port then.
    const char* agent_store = get("TORCHELASTIC_USE_AGENT_STORE");
    if (l.master_port > 0 && agent_store != nullptr && std::string(agent_store) == "True") ++l.master_port;
  }
  DI_CHECK(l.world_size >= 1 && l.rank < l.world_size && l.local_rank <= l.rank,
           "environment (", l.launcher, "): rank ", l.rank, " / local rank ", l.local_rank,
           " outside a world of ", l.world_size);
  return l;
}

ProcessLayout process_layout_from_env() {
  return process_layout_from([](const char* name) -> const char* { return std::getenv(name); });
}

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

std::unique_ptr<Communicator> make_communicator(const ProcessLayout& layout, Device device,
                                                void* cuda_stream) {
  if (layout.world_size == 1) return make_single_communicator();
  std::unique_ptr<Communicator> c;
  if (device == Device::CUDA) {
    c = make_nccl_communicator(layout, cuda_stream);
    DI_CHECK(c != nullptr, "several processes on CUDA need NCCL: this deepinfer was built without "
             "CUDA (DEEPINFER_CUDA=OFF)");
  } else {
    DI_CHECK(layout.launcher == "mpirun", "several processes on the CPU backend need mpirun (the MPI "
             "communicator); got a ", layout.launcher, " layout of ", layout.world_size, " ranks");
    c = make_mpi_communicator();
    DI_CHECK(c != nullptr, "several processes on the CPU need MPI: this deepinfer was built without "
             "it (install libopenmpi-dev: tools/setup.sh, then reconfigure)");
  }
  DI_CHECK(c->size() == layout.world_size && c->rank() == layout.rank, c->name(), " communicator: rank ",
           c->rank(), " of ", c->size(), ", the environment said ", layout.rank, " of ", layout.world_size);
  return c;
}

#ifndef DEEPINFER_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator() { return nullptr; }
#endif
#ifndef DEEPINFER_HAVE_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(const ProcessLayout&, void*) { return nullptr; }
#endif

}  // namespace deepinfer
