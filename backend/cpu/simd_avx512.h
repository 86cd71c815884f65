// Helpers shared by the AVX-512 kernels (gemm.cpp, simd_avx512.cpp); include only where
// <immintrin.h> is, and call only from functions built with DI_AVX512_TARGET.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define DI_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace deepinfer::cpu {

// hsum8_floats' fixed order in both 8-lane halves of a zmm at once: lane 0 ends as
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), lane 8 the same of lanes 8..15 (IEEE
// addition is commutative, so the swapped operands in the other lanes change nothing there).
// Three shuffles and three adds instead of a store and fourteen scalar adds; the low half's
// sum is _mm512_cvtss_f32 of the result, the high half's hsum8_high.
DI_AVX512_TARGET inline __m512 hsum8_halves(__m512 v) {
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));           // (l0 + l1), (l2 + l3), ...
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));           // (01 + 23), (45 + 67), ...
  return _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // (0123 + 4567) in lanes 0, 8
}
// Each 4-lane quad's fixed sum (q0 + q1) + (q2 + q3), in the quad's first lane.
DI_AVX512_TARGET inline __m512 hsum4_quads(__m512 v) {
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
  return _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
}
DI_AVX512_TARGET inline float hsum8_low(__m512 summed) { return _mm512_cvtss_f32(summed); }
DI_AVX512_TARGET inline float hsum8_high(__m512 summed) {
  return _mm_cvtss_f32(_mm512_extractf32x4_ps(summed, 2));
}

}  // namespace deepinfer::cpu
#endif
