// AVX-512 forms of the 8-lane helpers (cpu_backend.h), chosen at run time where the CPU has
// AVX-512F/BW/VL/DQ; each keeps every lane and every sum of its 8-lane form, so the results
// are the same bits. The 8-lane forms' vectors never cross a call into or out of these
// functions (built for another ISA than the rest: cpu_backend.h says why).
// GCC 12 reports the AVX-512 intrinsics' own _mm512_undefined_* as (maybe) uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd_avx512.h"

namespace deepinfer::cpu {

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
}

// Keys b[0], b[1] share one register (low half: b[0]'s 8 lanes, high half: b[1]'s), as do
// b[2], b[3]: accumulator (r, pair) holds the 8-lane accumulators of (r, 2 pair) and
// (r, 2 pair + 1) lane for lane, each taking the same chunks in the same order.
DI_AVX512_TARGET void dot8x4x3_rows_avx512(const float* const* a, const float* const* b, int64_t n,
                                           float* const* out) {
  __m512 c[3][2];
  for (int r = 0; r < 3; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += 8) {
    const __m512 b01 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(b[0] + k)),
                                          _mm256_loadu_ps(b[1] + k), 1);
    const __m512 b23 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(b[2] + k)),
                                          _mm256_loadu_ps(b[3] + k), 1);
    for (int r = 0; r < 3; ++r) {
      const __m512 ar = _mm512_broadcast_f32x8(_mm256_loadu_ps(a[r] + k));
      c[r][0] = _mm512_fmadd_ps(ar, b01, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(ar, b23, c[r][1]);
    }
  }
  for (int r = 0; r < 3; ++r)
    for (int p = 0; p < 2; ++p) {
      const __m512 v = hsum8_halves(c[r][p]);
      out[r][2 * p] = hsum8_low(v);
      out[r][2 * p + 1] = hsum8_high(v);
    }
}

// Six queries' scores against four keys: queries pair-interleaved per 8-float chunk in `qpairs`
// ([3 pairs][n / 8][16]: query 2p's chunk, then 2p + 1's), each key chunk broadcast to both
// halves. Accumulator (p, i) holds the 8-lane accumulators of dot8(q_2p, k_i) and
// dot8(q_2p+1, k_i) lane for lane (a * b == b * a exactly), summed in hsum8's order.
DI_AVX512_TARGET void dot8x4_qpairs_avx512(const float* qpairs, const float* const* keys,
                                           int64_t n, float* const* out) {
  __m512 c[3][4];
  for (int p = 0; p < 3; ++p)
    for (int i = 0; i < 4; ++i) c[p][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += 8) {
    __m512 kb[4];
    for (int i = 0; i < 4; ++i) kb[i] = _mm512_broadcast_f32x8(_mm256_loadu_ps(keys[i] + k));
    for (int p = 0; p < 3; ++p) {
      const __m512 q = _mm512_loadu_ps(qpairs + p * 2 * n + 2 * k);
      for (int i = 0; i < 4; ++i) c[p][i] = _mm512_fmadd_ps(q, kb[i], c[p][i]);
    }
  }
  for (int p = 0; p < 3; ++p)
    for (int i = 0; i < 4; ++i) {
      const __m512 v = hsum8_halves(c[p][i]);
      out[2 * p][i] = hsum8_low(v);
      out[2 * p + 1][i] = hsum8_high(v);
    }
}

// axpy4 on R y rows sharing the four x rows: y[r] gets alpha[r][0..3] in that order per
// element (the same fused steps as axpy4), each x chunk loaded once for all rows; the tail in
// masked lanes.
template <int R>
DI_AVX512_TARGET inline void axpy4_rows_r(const float* const* alpha, const float* x0,
                                          const float* x1, const float* x2, const float* x3,
                                          float* const* y, int64_t n) {
  __m512 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < 4; ++k) a[r][k] = _mm512_set1_ps(alpha[r][k]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v0 = _mm512_loadu_ps(x0 + i), v1 = _mm512_loadu_ps(x1 + i);
    const __m512 v2 = _mm512_loadu_ps(x2 + i), v3 = _mm512_loadu_ps(x3 + i);
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_loadu_ps(y[r] + i);
      v = _mm512_fmadd_ps(a[r][0], v0, v);
      v = _mm512_fmadd_ps(a[r][1], v1, v);
      v = _mm512_fmadd_ps(a[r][2], v2, v);
      v = _mm512_fmadd_ps(a[r][3], v3, v);
      _mm512_storeu_ps(y[r] + i, v);
    }
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v0 = _mm512_maskz_loadu_ps(m, x0 + i), v1 = _mm512_maskz_loadu_ps(m, x1 + i);
    const __m512 v2 = _mm512_maskz_loadu_ps(m, x2 + i), v3 = _mm512_maskz_loadu_ps(m, x3 + i);
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_maskz_loadu_ps(m, y[r] + i);
      v = _mm512_fmadd_ps(a[r][0], v0, v);
      v = _mm512_fmadd_ps(a[r][1], v1, v);
      v = _mm512_fmadd_ps(a[r][2], v2, v);
      v = _mm512_fmadd_ps(a[r][3], v3, v);
      _mm512_mask_storeu_ps(y[r] + i, m, v);
    }
  }
}

DI_AVX512_TARGET void axpy4_avx512(const float* alpha, const float* x0, const float* x1,
                                   const float* x2, const float* x3, float* y, int64_t n) {
  axpy4_rows_r<1>(&alpha, x0, x1, x2, x3, &y, n);
}

DI_AVX512_TARGET void axpy4_rows_avx512(const float* const* alpha, int rows, const float* x0,
                                        const float* x1, const float* x2, const float* x3,
                                        float* const* y, int64_t n) {
  switch (rows) {
    case 3: return axpy4_rows_r<3>(alpha, x0, x1, x2, x3, y, n);
    case 2: return axpy4_rows_r<2>(alpha, x0, x1, x2, x3, y, n);
    default: return axpy4_rows_r<1>(alpha, x0, x1, x2, x3, y, n);
  }
}

}  // namespace deepinfer::cpu
