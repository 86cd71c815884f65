// CPU GEMM at the embedded model's shapes (hidden 384, experts 128, dense MLP 1024, lm_head
// 8192 in BF16), one backend thread, so the CPU-time column is the kernel's own cost even on a
// shared machine (A/B two builds by that column; wall time moves with the machine's load).
//   build/bench/cpu/bench_gemm --benchmark_repetitions=3 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <random>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace {

using namespace deepinfer;

struct Case {
  HostBuffer w, scale, x, out;
  Weight weight;
};

Case make_case(DType dtype, int64_t M, int64_t N, int64_t K) {
  Case c;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  c.w = HostBuffer(dtype, {N, K});
  for (int64_t i = 0; i < N * K; ++i) {
    if (dtype == DType::BF16) c.w.ptr<uint16_t>()[i] = float_to_bf16(u(rng));
    else if (dtype == DType::F8_E4M3) c.w.ptr<uint8_t>()[i] = float_to_fp8_e4m3(100.0f * u(rng));
    else c.w.ptr<float>()[i] = u(rng);
  }
  c.weight.w = c.w.tensor();
  if (dtype == DType::F8_E4M3) {
    const int64_t nb = (N + 127) / 128, kb = (K + 127) / 128;
    c.scale = HostBuffer(DType::F32, {nb, kb});
    for (int64_t i = 0; i < nb * kb; ++i) c.scale.ptr<float>()[i] = 0.01f;
    c.weight.scale_inv = c.scale.tensor();
  }
  c.x = HostBuffer(DType::F32, {M, K});
  for (int64_t i = 0; i < M * K; ++i) c.x.ptr<float>()[i] = u(rng);
  c.out = HostBuffer(DType::F32, {M, N});
  return c;
}

void BM_gemm(benchmark::State& state, DType dtype, int64_t N, int64_t K) {
  const int64_t M = state.range(0);
  BackendOptions options;
  options.num_threads = 1;
  auto backend = make_cpu_backend(options);
  Case c = make_case(dtype, M, N, K);
  Tensor out = c.out.tensor();
  for (auto _ : state) {
    backend->gemm(c.x.tensor(), c.weight, out);
    benchmark::DoNotOptimize(c.out.ptr<float>());
  }
  state.counters["MAC/s"] = benchmark::Counter(static_cast<double>(M * N * K) * state.iterations(),
                                               benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_gemm, fp8_up_1024x384, DType::F8_E4M3, 1024, 384)->Arg(1)->Arg(2)->Arg(8)->Arg(64);
BENCHMARK_CAPTURE(BM_gemm, fp8_down_384x1024, DType::F8_E4M3, 384, 1024)->Arg(1)->Arg(2)->Arg(8)->Arg(64);
BENCHMARK_CAPTURE(BM_gemm, fp8_expert_128x384, DType::F8_E4M3, 128, 384)->Arg(1)->Arg(2);
BENCHMARK_CAPTURE(BM_gemm, bf16_lm_head_8192x384, DType::BF16, 8192, 384)->Arg(1)->Arg(2)->Arg(8)->Arg(64);
BENCHMARK_CAPTURE(BM_gemm, f32_576x192, DType::F32, 576, 192)->Arg(1)->Arg(8);
// The absorbed attention heads (gemm_heads: W_UK 128x64 and W_UV 64x128 per head, F32).
BENCHMARK_CAPTURE(BM_gemm, f32_head_128x64, DType::F32, 128, 64)->Arg(1)->Arg(2);
BENCHMARK_CAPTURE(BM_gemm, f32_head_64x128, DType::F32, 64, 128)->Arg(1)->Arg(2);

}  // namespace

BENCHMARK_MAIN();
