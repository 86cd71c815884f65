// deepinfer_pdl_tax: what one dependent kernel boundary costs inside a CUDA graph on this GPU,
// with and without programmatic dependent launch (the decode step's ~230 kernels are such a
// chain; bench/NOTES.md, session 15). A graph of kLaunches launches of one kernel, each reading
// what the one before wrote, is replayed; the time per launch is the boundary's cost plus the
// kernel's own dependent work. Kernels:
//   empty-1     1 block:   wait, trigger
//   empty-grid  one block per SM x 2: wait, trigger
//   scalar-1    1 block:   wait, trigger, one load of the previous value, one store
//   row-1       1 block of 256 threads: a 2,048-value bf16 row (one 16-byte load a thread), sum of
//               squares through a block reduction, the row scaled and stored (an rms_norm's shape)
//   row-grid    one block per SM x 2, each does row-1's work on the same row (a GEMV's prologue:
//               every block reads the activation row the kernel before wrote); block 0 stores
// Usage: deepinfer_pdl_tax [--launches N] [--reps R]; prints one line per (kernel, launch mode).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/device_utils.cuh"

namespace {

#define CHECK(call)                                                                          \
  do {                                                                                       \
    const cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "deepinfer_pdl_tax: %s: %s\n", #call, cudaGetErrorString(e_));    \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

using deepinfer::cuda::pdl_trigger;  // the backend's own (device_utils.cuh)
using deepinfer::cuda::pdl_wait;

constexpr int kRow = 2048, kThreads = 256;

__global__ void empty_kernel() {
  pdl_wait();
  pdl_trigger();
}

__global__ void scalar_kernel(const float* in, float* out) {
  pdl_wait();
  pdl_trigger();
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = in[0] + 1.0f;
}

// Each thread: 8 consecutive values (one 16-byte load).
__global__ void __launch_bounds__(kThreads) row_kernel(const __nv_bfloat16* in, __nv_bfloat16* out) {
  __shared__ float red[kThreads / 32];
  pdl_wait();
  pdl_trigger();
  const int t = threadIdx.x;
  const uint4 raw = reinterpret_cast<const uint4*>(in)[t];
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&raw);
  float x[8], ss = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[i] = __bfloat162float(v[i]);
    ss += x[i] * x[i];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((t & 31) == 0) red[t >> 5] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += red[w];
  const float r = rsqrtf(total / kRow + 1e-6f);
  if (blockIdx.x != 0) return;  // the grid form: every block reads, block 0 stores
  uint4 o;
  __nv_bfloat16* ov = reinterpret_cast<__nv_bfloat16*>(&o);
#pragma unroll
  for (int i = 0; i < 8; ++i) ov[i] = __float2bfloat16_rn(x[i] * r);
  reinterpret_cast<uint4*>(out)[t] = o;
}

struct Arm {
  const char* name;
  int kind;  // 0 empty, 1 scalar, 2 row
  bool grid;
};

}  // namespace

int main(int argc, char** argv) {
  int launches = 256, reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--launches") && i + 1 < argc)
      launches = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: deepinfer_pdl_tax [--launches N] [--reps R]\n");
      return 2;
    }
  }
  if (launches < 2 || reps < 1) {
    std::fprintf(stderr, "deepinfer_pdl_tax: --launches must be >= 2 and --reps >= 1\n");
    return 2;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int grid_blocks = 2 * prop.multiProcessorCount;
  void* bufs[2];
  for (void*& b : bufs) {
    CHECK(cudaMalloc(&b, kRow * sizeof(float)));
    CHECK(cudaMemset(b, 0, kRow * sizeof(float)));
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Arm arms[] = {{"empty-1", 0, false}, {"empty-grid", 0, true}, {"scalar-1", 1, false},
                      {"row-1", 2, false},   {"row-grid", 2, true}};
  std::printf("%s, %d SMs; a graph of %d launches, median of %d replays\n", prop.name, prop.multiProcessorCount,
              launches, reps);
  for (const Arm& arm : arms) {
    for (bool pdl : {false, true}) {
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(arm.grid ? grid_blocks : 1);
      config.blockDim = dim3(arm.kind == 0 ? 32 : kThreads);
      config.stream = stream;
      config.attrs = &attr;
      config.numAttrs = pdl ? 1 : 0;
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < launches; ++i) {
        void* in = bufs[i % 2];
        void* out = bufs[(i + 1) % 2];
        if (arm.kind == 0)
          CHECK(cudaLaunchKernelEx(&config, empty_kernel));
        else if (arm.kind == 1)
          CHECK(cudaLaunchKernelEx(&config, scalar_kernel, static_cast<const float*>(in), static_cast<float*>(out)));
        else
          CHECK(cudaLaunchKernelEx(&config, row_kernel, static_cast<const __nv_bfloat16*>(in),
                                   static_cast<__nv_bfloat16*>(out)));
      }
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK(cudaStreamEndCapture(stream, &graph));
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      CHECK(cudaGraphLaunch(exec, stream));  // warm-up
      CHECK(cudaStreamSynchronize(stream));
      std::vector<double> us;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaStreamSynchronize(stream));
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(us.begin(), us.end());
      const double med = us[us.size() / 2];
      std::printf("pdl_tax %-10s %-5s graph %9.1f us  per launch %6.2f us\n", arm.name, pdl ? "pdl" : "plain", med,
                  med / launches);
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
    }
  }
  return 0;
}
