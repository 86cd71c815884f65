// The sampling rule shared by the host sampler (sample/), the CPU op and the CUDA op
// (Backend::sample). Every step after the temperature division is either an integer
// operation or a float operation with one IEEE result (division, multiply, add, fma,
// rint; a*b+c through double), so the host and the device choose the same token bit for bit:
//
//   row logits l[V] (F32), SampleRowParams p
//   -. a row holding a NaN logit has no token: kNoToken (-1), greedy or not (the forward
//      broke; the engine ends that request with an error). So has a sampled row whose
//      logits are all -inf / +inf (nothing finite to draw from).
//   0. greedy (temperature below kMinTemperature, 1e-5 as vLLM's _SAMPLING_EPS; 0 included):
//      argmax, lowest id on ties. Below the floor l / T overflows or is dominated by the
//      rounding of the division, so such temperatures mean "greedy" everywhere.
//   1. s_v = l_v / T; candidates are the finite s_v (-inf, +inf, NaN are dropped).
//   2. e_v = exp_neg(s_v - max s) in [0, 1] (our own exp: same bits on both sides;
//      0 below x = -23), weight W_v = floor(e_v * 2^26) (an integer; the max has 2^26, so
//      32 weights add up in 32 bits: the device sums a warp's equal buckets in one step).
//   3. min_p: keep e_v >= min_p.
//   4. top_k: keep the k first in the order (s desc, id asc) — ties at the cut go to
//      the lower ids.
//   5. top_p: keep the shortest prefix of that order whose mass sum W >= ceil(top_p * sum W).
//   6. draw: bits = the 53 Philox bits of (seed, stream, position); target =
//      floor(bits * total / 2^53); the token is the lowest id v whose running sum of
//      kept W over ids <= v exceeds target (the draw walks ids in order, so the device
//      needs a prefix sum, not a sort).
// Masses are integers, so the sum order does not matter and no near-tie can split the
// host from the device. Tokens whose probability is below 2^-32 of the most likely one
// are never drawn (weight 0); that is below 1.5e-8 times the most likely one's.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DI_SAMPLE_HD __host__ __device__ __forceinline__
#else
#define DI_SAMPLE_HD inline
#endif

namespace deepinfer::sample_rule {

// IEEE single operations that no compiler contracts or approximates (nvcc fuses a*b+c
// by default; the __*_rn intrinsics are never fused).
DI_SAMPLE_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DI_SAMPLE_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DI_SAMPLE_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// a * b + c rounded to double, then to float: the product of two floats is exact in double,
// so a compiler that contracts it into a double fma gets the same bits. (Not std::fma: a
// library call of ~50 ns per element where the CPU build has no FMA instructions.)
DI_SAMPLE_HD float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(__dadd_rn(__dmul_rn(a, b), c));
#else
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c));
#endif
}
DI_SAMPLE_HD bool is_finite(float x) { return x - x == 0.0f; }  // false for inf and NaN

// The token of a row that has none (a NaN logit; nothing finite to sample from).
inline constexpr int32_t kNoToken = -1;
// Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
inline constexpr float kMinTemperature = 1e-5f;
DI_SAMPLE_HD bool is_greedy(float temperature) { return !(temperature >= kMinTemperature); }

// Philox4x32-10 (Salmon et al., SC'11): counter-based, so a draw is a pure function of
// (key, counter). ctr is updated in place.
DI_SAMPLE_HD void philox4x32_10(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t c1 = ctr[1], c3 = ctr[3];
    ctr[0] = hi1 ^ c1 ^ key0;
    ctr[1] = lo1;
    ctr[2] = hi0 ^ c3 ^ key1;
    ctr[3] = lo0;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
}

// 53 random bits for draw `position` of stream `stream` under `seed` (u = bits * 2^-53).
DI_SAMPLE_HD uint64_t philox_bits53(uint64_t seed, uint64_t stream, uint64_t position) {
  uint32_t ctr[4] = {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
                     static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return ((static_cast<uint64_t>(ctr[0]) << 21) ^ (ctr[1] >> 11)) & ((uint64_t{1} << 53) - 1);
}

// Bit casts that compile on host and device (the same bits on both sides).
DI_SAMPLE_HD uint32_t bits_of_float(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}
// NaN by its bits (no compiler flag can fold it away).
DI_SAMPLE_HD bool is_nan(float x) { return (bits_of_float(x) & 0x7fffffffu) > 0x7f800000u; }
DI_SAMPLE_HD float float_of_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

// exp(x) for x <= 0 (Cody-Waite reduction, Cephes' expf polynomial), 0 below -23
// (exp(-23) * 2^26 < 1: such a token's weight is 0 anyway). Relative error ~1e-7.
DI_SAMPLE_HD float exp_neg(float x) {
  if (!(x >= -23.0f)) return 0.0f;
#if defined(__CUDA_ARCH__)
  const float n = rintf(fmul(x, 1.44269504088896341f));
#else
  const float n = std::rint(fmul(x, 1.44269504088896341f));
#endif
  float r = ffma(n, -0.693359375f, x);
  r = ffma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = ffma(p, r, 1.3981999507e-3f);
  p = ffma(p, r, 8.3334519073e-3f);
  p = ffma(p, r, 4.1665795894e-2f);
  p = ffma(p, r, 1.6666665459e-1f);
  p = ffma(p, r, 5.0000001201e-1f);
  const float y = fadd(ffma(p, fmul(r, r), r), 1.0f);
  // 2^n for n in [-34, 0] from its bits (exact scaling of a normal number).
  const float scale = float_of_bits(static_cast<uint32_t>(static_cast<int>(n) + 127) << 23);
  const float e = fmul(y, scale);
  return e < 1.0f ? e : 1.0f;
}

// Weight of a candidate at x = s - max (<= 0): floor(exp_neg(x) * 2^26), the max has 2^26.
inline constexpr uint32_t kMaxWeight = 1u << 26;
DI_SAMPLE_HD uint32_t weight(float x) {
  return static_cast<uint32_t>(fmul(exp_neg(x), static_cast<float>(kMaxWeight)));
}

// A key whose unsigned order is the float order (larger s -> larger key).
DI_SAMPLE_HD uint32_t order_key(float s) {
  const uint32_t bits = bits_of_float(s);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The mass a top-p prefix must reach: ceil(top_p * total) (integer masses: ">= top_p * total").
DI_SAMPLE_HD uint64_t top_p_need(float top_p, uint64_t total) {
  const double want = static_cast<double>(top_p) * static_cast<double>(total);
#if defined(__CUDA_ARCH__)
  const uint64_t need = static_cast<uint64_t>(ceil(want));
#else
  const uint64_t need = static_cast<uint64_t>(std::ceil(want));
#endif
  return need < total ? need : total;
}

// floor(bits53 * total / 2^53): the draw's point in [0, total).
DI_SAMPLE_HD uint64_t draw_target(uint64_t bits53, uint64_t total) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(bits53 << 11, total);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits53 << 11) * total) >> 64);
#endif
}

}  // namespace deepinfer::sample_rule

#if !defined(__CUDACC__)
#include "backend/backend.h"
namespace deepinfer::sample_rule {
// The whole rule for one row on the host (backend/cpu/sampling_rows.cpp): the reference
// of Backend::sample and the host sampler's last stage. logits [vocab] F32.
// Returns kNoToken (-1) for a row with a NaN logit, or a sampled row with no finite logit.
int32_t sample_row(const float* logits, int64_t vocab, const SampleRowParams& p);
}  // namespace deepinfer::sample_rule
#endif
