// CudaBackend: construction, memory (with out-of-memory errors that give the sizes),
// copies, scratch workspaces, CUDA graphs, and make_cuda_backend.
#include "backend/cuda/cuda_backend.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/gemm_problem.h"

namespace deepinfer {
namespace cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const std::string& where) {
  // Consume the error this call left as the runtime's last error: once reported here, a
  // non-sticky one (e.g. a host copy during a stream capture, which the runner catches and
  // then runs the step eagerly) must not fail the next kernel launch's check (check_launch).
  cudaGetLastError();
  fail("CUDA error in ", where, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
       ") from ", call);
}

void check_device(const Tensor& t, const char* what) {
  DI_CHECK(t.defined(), what, ": tensor is undefined");
  DI_CHECK(t.device == Device::CUDA, what, ": expected a CUDA tensor, got ", t.describe());
}
void check_dtype(const Tensor& t, DType dtype, const char* what) {
  check_device(t, what);
  DI_CHECK(t.dtype == dtype, what, ": expected ", dtype_name(dtype), ", got ", t.describe());
}
void check_float(const Tensor& t, const char* what) {
  check_device(t, what);
  DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, what, ": expected F32 or BF16, got ",
           t.describe());
}

void check_exact(const Tensor& t, std::initializer_list<DType> dtypes, const std::vector<int64_t>& dims,
                 const char* what) {
  check_device(t, what);
  std::string names;
  bool ok = false;
  for (DType d : dtypes) {
    ok = ok || t.dtype == d;
    names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  DI_CHECK(ok, what, ": expected ", names, ", got ", t.describe());
  DI_CHECK(t.is_contiguous() && t.dims() == dims, what, ": must be contiguous ", shape_string(dims), ", got ",
           t.describe());
}

RowView rows_of(const Tensor& t, const char* what) {
  check_device(t, what);
  DI_CHECK(t.ndim >= 1, what, ": scalar tensor ", t.describe());
  RowView v;
  v.data = t.data;
  v.dtype = t.dtype;
  v.cols = t.shape[t.ndim - 1];
  DI_CHECK(t.stride[t.ndim - 1] == 1 || v.cols == 1, what, ": last dimension must be contiguous, got ",
           t.describe());
  if (t.ndim == 1) {
    v.rows = 1;
    v.row_stride = v.cols;
    return v;
  }
  v.row_stride = t.stride[t.ndim - 2];
  v.rows = 1;
  for (int d = 0; d < t.ndim - 1; ++d) v.rows *= t.shape[d];
  // Outer dims must step uniformly so row r sits at r * row_stride.
  for (int d = t.ndim - 3; d >= 0; --d) {
    DI_CHECK(t.shape[d] == 1 || t.stride[d] == t.stride[d + 1] * t.shape[d + 1], what,
             ": rows must be uniformly strided, got ", t.describe());
  }
  if (v.rows <= 1) v.row_stride = v.cols;
  return v;
}

CudaBackend::CudaBackend(const BackendOptions& options) : options_(options) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  DI_CHECK(err == cudaSuccess && count > 0, "cuda backend: no usable CUDA device (",
           err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")");
  DI_CHECK(options.device_index >= 0 && options.device_index < count, "cuda backend: device ",
           options.device_index, " requested, ", count, " present");
  device_ = options.device_index;
  DI_CUDA(cudaSetDevice(device_), "cuda backend init (device ", device_, ")");
  cudaDeviceProp prop{};
  DI_CUDA(cudaGetDeviceProperties(&prop, device_), "cuda backend init");
  DI_CHECK(prop.major >= 9, "cuda backend: built for sm_90a, device ", prop.name,
           " has compute capability ", prop.major, ".", prop.minor);
  num_sms_ = prop.multiProcessorCount;
  // Switches come from options.cuda (the DEEPINFER_CUDA_* settings, core/settings.h).
  const CudaOptions& o = options.cuda;
  sync_each_op_ = o.sync_each_op;
  stream_gemm_ = o.stream_gemm;
  stream_max_rows_ = stream_gemm_ ? o.stream_max_rows : 0;
  DI_CHECK(o.attn_chunk == 0 || o.attn_chunk == 32 || o.attn_chunk == 64,
           "cuda backend: CudaOptions::attn_chunk must be 0 (by shape), 32 or 64, got ", o.attn_chunk);
  pipe_stages_ = o.pipe_stages;
  pipe_fp8_ = o.pipe_fp8;
  pipe_max_tokens_ = o.pipe_max_tokens;
  pipe_dense_fp8_rows_ = o.pipe_dense_fp8_rows;
  pipe_dense_bf16_rows_ = o.pipe_dense_bf16_rows;
  pdl_ = o.pdl;
  moe_cutlass_ = o.moe_cutlass;
  moe_cutlass_tile_ = o.moe_cutlass_tile;
  moe_cutlass_fp8_ = o.moe_cutlass_fp8;
  DI_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cuda backend init");
  DI_CHECK(cublasLtCreate(&lt_) == CUBLAS_STATUS_SUCCESS, "cuda backend: cublasLtCreate failed");
  lt_workspace_bytes_ = size_t{32} << 20;
  DI_CUDA(cudaMalloc(&lt_workspace_, lt_workspace_bytes_), "cuda backend init (cuBLASLt workspace ",
          lt_workspace_bytes_, " bytes)");
  DI_CUDA(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking),
          "cuda backend init (side stream)");
  DI_CUDA(cudaMalloc(&side_lt_workspace_, lt_workspace_bytes_),
          "cuda backend init (side cuBLASLt workspace)");
  DI_CUDA(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming),
          "cuda backend init (side events)");
  DI_CUDA(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming),
          "cuda backend init (side events)");
}

CudaBackend::~CudaBackend() {
  if (on_side_) side_swap();
  cudaStreamSynchronize(side_stream_);
  cudaStreamSynchronize(stream_);
  if (side_fork_) cudaEventDestroy(side_fork_);
  if (side_done_) cudaEventDestroy(side_done_);
  cudaFree(side_lt_workspace_);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  for (cudaEvent_t e : fence_events_) cudaEventDestroy(e);
  for (cudaGraphExec_t g : graphs_) {
    if (g) cudaGraphExecDestroy(g);
  }
  for (Scratch& s : scratch_) cudaFree(s.ptr);
  for (Scratch& s : side_scratch_) cudaFree(s.ptr);
  expert_tables_.clear();
  for (auto& [key, plan] : lt_plans_) {
    if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
    if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
  }
  cudaFree(lt_workspace_);
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

DeviceBuffer CudaBackend::alloc(DType dtype, const std::vector<int64_t>& dims) {
  Tensor t(nullptr, dtype, dims, Device::CUDA);
  const size_t num_bytes = (t.num_bytes() + 255) / 256 * 256;
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, num_bytes ? num_bytes : 256);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    fail("out of GPU memory allocating ", t.describe(), " (", num_bytes, " bytes = ",
         num_bytes / double(1 << 30), " GiB): device ", device_, " has ", free_bytes, " bytes free of ",
         total_bytes, " (", cudaGetErrorString(err), ")");
  }
  t.data = p;
  return DeviceBuffer(t, std::shared_ptr<void>(p, [](void* q) { cudaFree(q); }));
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  DI_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), "copy: ", src.describe(), " -> ",
           dst.describe(), " must have equal dtype and numel");
  if (src.numel() == 0) return;
  if (!src.is_contiguous() || !dst.is_contiguous()) {
    copy_strided(src, dst);
    return;
  }
  const bool host = src.device == Device::CPU || dst.device == Device::CPU;
  DI_CUDA(cudaMemcpyAsync(dst.data, src.data, src.num_bytes(), cudaMemcpyDefault, stream_), "copy ",
          src.describe(), " -> ", dst.describe());
  // Host memory may be pageable and freed after return: wait for the transfer.
  if (host) DI_CUDA(cudaStreamSynchronize(stream_), "copy ", src.describe(), " -> ", dst.describe());
}

DeviceBuffer CudaBackend::alloc_host(DType dtype, const std::vector<int64_t>& dims) {
  Tensor t(nullptr, dtype, dims, Device::CPU);
  const size_t num_bytes = (t.num_bytes() + 255) / 256 * 256;
  void* p = nullptr;
  cudaError_t err = cudaHostAlloc(&p, num_bytes ? num_bytes : 256, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail("out of page-locked host memory allocating ", t.describe(), " (", num_bytes, " bytes): ",
         cudaGetErrorString(err));
  }
  t.data = p;
  return DeviceBuffer(t, std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); }));
}

void CudaBackend::copy_async(const Tensor& src, Tensor& dst) {
  DI_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), "copy_async: ", src.describe(),
           " -> ", dst.describe(), " must have equal dtype and numel");
  if (src.numel() == 0) return;
  if (!src.is_contiguous() || !dst.is_contiguous() ||
      (src.device == Device::CPU && dst.device == Device::CPU)) {
    copy(src, dst);
    return;
  }
  DI_CUDA(cudaMemcpyAsync(dst.data, src.data, src.num_bytes(), cudaMemcpyDefault, stream_),
          "copy_async ", src.describe(), " -> ", dst.describe());
}

int64_t CudaBackend::record_fence() {
  constexpr size_t kRing = 8;
  if (fence_events_.empty()) {
    fence_events_.resize(kRing, nullptr);
    for (cudaEvent_t& e : fence_events_)
      DI_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "record_fence (event)");
  }
  const int64_t fence = next_fence_++;
  DI_CUDA(cudaEventRecord(fence_events_[fence % kRing], stream_), "record_fence ", fence);
  return fence;
}

void CudaBackend::wait_fence(int64_t fence) {
  DI_CHECK(fence >= 0 && fence < next_fence_, "wait_fence: fence ", fence, " was never recorded");
  const cudaEvent_t e = fence_events_[static_cast<size_t>(fence) % fence_events_.size()];
  DI_CUDA(cudaEventSynchronize(e), "wait_fence ", fence);
}

void CudaBackend::synchronize() { DI_CUDA(cudaStreamSynchronize(stream_), "synchronize"); }

Backend::MemoryInfo CudaBackend::memory_info() const {
  size_t free_bytes = 0, total_bytes = 0;
  DI_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes), "memory_info (cudaMemGetInfo)");
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

void CudaBackend::check_launch(const char* op, const std::string& shapes) {
  DI_CUDA(cudaGetLastError(), op, " ", shapes);
  if (sync_each_op_ && !capturing()) DI_CUDA(cudaStreamSynchronize(stream_), op, " ", shapes);
}

bool CudaBackend::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream_, &status);
  return status != cudaStreamCaptureStatusNone;
}

void* CudaBackend::scratch(Slot slot, size_t num_bytes, const char* op) {
  Scratch& s = scratch_[slot];
  if (num_bytes <= s.num_bytes) return s.ptr;
  DI_CHECK(!capturing(), op, ": workspace must grow to ", num_bytes,
           " bytes during a graph capture; run the step once uncaptured first");
  DI_CUDA(cudaStreamSynchronize(stream_), op, " (workspace growth)");
  DI_CUDA(cudaStreamSynchronize(side_stream_), op, " (workspace growth: the other line)");
  cudaFree(s.ptr);
  s.ptr = nullptr;
  s.num_bytes = 0;
  const size_t want = (num_bytes + (1 << 20) - 1) / (1 << 20) * (1 << 20);
  cudaError_t err = cudaMalloc(&s.ptr, want);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    fail("out of GPU memory in ", op, ": workspace of ", want, " bytes; device has ", free_bytes,
         " bytes free of ", total_bytes);
  }
  s.num_bytes = want;
  ++workspace_epoch_;
  return s.ptr;
}

const CudaBackend::ExpertTable& CudaBackend::expert_table(const std::vector<ExpertWeights>& experts) {
  DI_CHECK(!experts.empty(), "moe_experts: no experts");
  const size_t E = experts.size();
  std::vector<const void*> host(6 * E, nullptr);
  for (size_t e = 0; e < E; ++e) {
    const Weight* ws[3] = {&experts[e].gate, &experts[e].up, &experts[e].down};
    for (int j = 0; j < 3; ++j) {
      host[j * E + e] = ws[j]->w.data;
      host[(3 + j) * E + e] = ws[j]->scale_inv.data;
    }
  }
  // Keyed by every pointer: a list that keeps its first expert but not the others (EPLB's
  // re-placement, model/expert_parallel.h) gets its own table.
  auto it = expert_tables_.find(host);
  if (it != expert_tables_.end()) return it->second;
  DI_CHECK(!capturing(), "moe_experts: first call with these experts during a graph capture; run "
                         "the step once uncaptured first");
  ExpertTable table;
  table.num_experts = static_cast<int>(E);
  table.ptrs = alloc(DType::I64, {static_cast<int64_t>(6 * E)});
  DI_CUDA(cudaMemcpy(table.ptrs.tensor().data, host.data(), host.size() * sizeof(void*),
                     cudaMemcpyHostToDevice),
          "moe_experts expert table (", E, " experts)");
  return expert_tables_.emplace(std::move(host), std::move(table)).first->second;
}

void CudaBackend::set_smem_limit(const void* kernel, size_t num_bytes, const char* op) {
  size_t& current = smem_limits_[kernel];
  if (num_bytes <= current) return;
  // The limit belongs to the kernel (on this device), not to this backend: another backend in the
  // process may have raised it further, and setting a smaller value would lower it under that
  // backend's launches (gemm18, bench/NOTES.md). Only raise it.
  cudaFuncAttributes attr{};
  DI_CUDA(cudaFuncGetAttributes(&attr, kernel), op, " (dynamic shared memory limit)");
  if (static_cast<size_t>(attr.maxDynamicSharedSizeBytes) < num_bytes)
    DI_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(num_bytes)),
            op, " (dynamic shared memory ", num_bytes, " bytes)");
  current = num_bytes;
}

void CudaBackend::side_swap() {
  std::swap(stream_, side_stream_);
  std::swap(lt_workspace_, side_lt_workspace_);
  std::swap(scratch_, side_scratch_);
  on_side_ = !on_side_;
}

void CudaBackend::side_begin() {
  DI_CHECK(!on_side_ && !side_pending_, "side_begin: a side line is already open or not joined");
  DI_CUDA(cudaEventRecord(side_fork_, stream_), "side_begin");
  DI_CUDA(cudaStreamWaitEvent(side_stream_, side_fork_, 0), "side_begin");
  side_swap();
}

void CudaBackend::side_end() {
  DI_CHECK(on_side_, "side_end without side_begin");
  side_swap();
  DI_CUDA(cudaEventRecord(side_done_, side_stream_), "side_end");
  side_pending_ = true;
}

void CudaBackend::side_join() {
  DI_CHECK(!on_side_, "side_join: the side line is still open (side_end first)");
  if (!side_pending_) return;
  side_pending_ = false;
  DI_CUDA(cudaStreamWaitEvent(stream_, side_done_, 0), "side_join");
}

void CudaBackend::graph_capture_begin() {
  // A side line left open by an error in an earlier step is closed and joined here.
  if (on_side_) side_swap();
  side_join();
  DI_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph_capture_begin");
}

int CudaBackend::graph_capture_end() {
  if (on_side_) side_swap();  // an error inside a side line: join it so the capture can end
  side_join();
  cudaGraph_t graph = nullptr;
  DI_CUDA(cudaStreamEndCapture(stream_, &graph), "graph_capture_end");
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  DI_CUDA(err, "graph_capture_end (instantiate)");
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size()) - 1;
}

void CudaBackend::graph_replay(int graph_id) {
  DI_CHECK(graph_id >= 0 && graph_id < static_cast<int>(graphs_.size()) && graphs_[graph_id],
           "graph_replay: unknown graph id ", graph_id);
  DI_CUDA(cudaGraphLaunch(graphs_[graph_id], stream_), "graph_replay ", graph_id);
  check_launch("graph_replay", std::to_string(graph_id));
}

void CudaBackend::graph_release(int graph_id) {
  if (graph_id < 0 || graph_id >= static_cast<int>(graphs_.size()) || !graphs_[graph_id]) return;
  cudaGraphExecDestroy(graphs_[graph_id]);
  graphs_[graph_id] = nullptr;
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace deepinfer
