// Backend::prefetch_weights on CUDA: a weight read soon is pulled into L2 beside the main line
// (bench/NOTES.md, l2pf19). A few one-warp CTAs issue bulk L2 prefetches
// (cp.async.bulk.prefetch.L2, fire and forget) over the tensor's bytes and exit: they hold no
// SM while the lines arrive, so the main line's next kernel is not kept from its SMs.

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace deepinfer::cuda {
namespace {

constexpr uint32_t kPrefetchChunk = 16384;  // bytes per bulk prefetch (a multiple of 16)
constexpr int kPrefetchCtas = 8;

// Bytes [begin, begin + num_bytes) with begin and num_bytes multiples of 16.
__global__ void __launch_bounds__(32) l2_prefetch_kernel(const char* begin, uint64_t num_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t step = uint64_t{kPrefetchChunk} * gridDim.x * blockDim.x;
  for (uint64_t off = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kPrefetchChunk; off < num_bytes;
       off += step) {
    const uint64_t left = num_bytes - off;
    const uint32_t n = left < kPrefetchChunk ? static_cast<uint32_t>(left) : kPrefetchChunk;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin + off), "r"(n) : "memory");
  }
#else
  const uint64_t step = uint64_t{128} * gridDim.x * blockDim.x;
  for (uint64_t off = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 128; off < num_bytes; off += step)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(begin + off) : "memory");
#endif
}

}  // namespace

void CudaBackend::prefetch_weights(const Tensor& w) {
  // A hint: anything it cannot cover (not on the device, not contiguous) is left alone.
  if (!w.defined() || w.device != Device::CUDA || !w.is_contiguous()) return;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(w.data) + 15) & ~uintptr_t{15};
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(w.data) + w.num_bytes()) & ~uintptr_t{15};
  if (hi <= lo) return;
  const uint64_t num_bytes = hi - lo;
  const uint64_t chunks = (num_bytes + kPrefetchChunk - 1) / kPrefetchChunk;
  const unsigned ctas = static_cast<unsigned>(chunks < 32 * kPrefetchCtas ? (chunks + 31) / 32 : kPrefetchCtas);
  DI_CUDA(cudaEventRecord(pf_fork_, stream_), "prefetch_weights");
  DI_CUDA(cudaStreamWaitEvent(pf_stream_, pf_fork_, 0), "prefetch_weights");
  l2_prefetch_kernel<<<ctas, 32, 0, pf_stream_>>>(reinterpret_cast<const char*>(lo), num_bytes);
  DI_CUDA(cudaGetLastError(), "prefetch_weights (launch, ", w.describe(), ")");
  DI_CUDA(cudaEventRecord(pf_done_, pf_stream_), "prefetch_weights");
  pf_pending_ = true;
}

}  // namespace deepinfer::cuda
