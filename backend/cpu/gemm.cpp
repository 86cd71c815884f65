// gemm: out[M, N] = x[M, K] · W[N, K]^T with W in F32, BF16 or F8_E4M3 (128x128 block
// scales, partial edge blocks allowed), x and out F32, fp32 accumulation.
//
// Kernel: the output columns are cut into tiles of kTileN weight rows; per tile the
// K axis is walked in blocks of kBlockK: the weight block is converted to fp32 (FP8
// times its block scale) into a small padded buffer, then every x row is dotted with
// every weight row of the block (8 fp32 lanes, fixed horizontal sum).
//
// Few rows (decode: one token, or the one or two a MoE expert gets) take a direct path
// instead: the weight bytes are converted in registers, 8 at a time, right before their
// FMA, so no weight block is written to and read back from a buffer (the conversion was
// most of batch-1 decode). Both paths compute every element and every sum the same way,
// in the same order, so they give the same bits (`CpuGemm.DirectPathMatchesBufferedBits`).
//
// Batch invariance by construction: out[m, n] = (((0 + d_0) + d_1) + ...) where d_b is
// the 8-lane dot of block b of x row m and weight row n. Neither the block sizes nor the
// lane order depend on M, on the row's place in the batch, or on how columns are split
// among threads, so a row's result is bit-identical whatever else shares the call.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if (defined(__AVX2__) && defined(__F16C__)) || defined(__x86_64__)
// GCC 12 reports the AVX-512 intrinsics' own _mm512_undefined_* as (maybe) uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd_avx512.h"

namespace deepinfer::cpu {
namespace {

// 8 x fp32 lanes: cpu_backend.h's v8f_lanes (AVX2 with -march=x86-64-v3; emulated without
// it). The helpers taking v8f are internal to this file and never called with one from the
// AVX-512 functions (cpu_backend.h says why), so the psabi note is moot.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef v8f_lanes v8f;

constexpr int64_t kTileN = 32;    // weight rows per tile (a threading unit)
constexpr int64_t kBlockK = 256;  // reduction block; a multiple of 8

inline v8f load8(const float* p) { return load8_lanes(p); }
inline float hsum(v8f v) { return hsum8_lanes(v); }
inline v8f fma8(v8f a, v8f b, v8f acc) { return fma8_lanes(a, b, acc); }

// Four dot products of x with w0..w3 (n a multiple of 8); each equals dot8(x, wi, n).
inline void dot8x4(const float* x, const float* w0, const float* w1, const float* w2,
                   const float* w3, int64_t n, float* out4) {
  dot8x4_rows(x, w0, w1, w2, w3, n, out4);
}

typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint8_t v8b __attribute__((vector_size(8)));
typedef uint16_t v8h __attribute__((vector_size(16)));

inline v8f bits_to_float(v8u u) {
  v8f f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

#if defined(__AVX2__) && defined(__F16C__)
// fp8_row_to_float of 8 codes, in registers, through the F16C converter: e4m3's exponent and
// mantissa bits placed at fp16's top (s eeee mmm -> s 0eeee mmm0000000) are the same number
// times 2^-8 (normals and subnormals alike: fp16 holds every e4m3 value exactly), so
// half_to_float(bits) * (scale * 256) is the exact product code * scale rounded once, the same
// float fp8_row_to_float stores. The two NaN codes become fp16 NaN, hence the same f32 NaN.
// `scale256` = scale * 256 (exact: a power-of-two multiple).
inline v8f fp8x8_to_float_f16c(const uint8_t* src, float scale256) {
  __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
  const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
  __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
  const __m128i is_nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f));
  h = _mm_or_si128(h, _mm_and_si128(is_nan, _mm_set1_epi16(0x7e00)));
  const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(scale256));
  v8f out;
  std::memcpy(&out, &f, sizeof(out));
  return out;
}

// fp8x8_to_float_f16c of 16 codes at once (lanes 0-7 and 8-15), in half the integer
// instructions: with the code in a 16-bit lane's top byte (s eeee mmm 0...), an arithmetic
// shift by one and clearing bit 14 give s 0eeee mmm0000000, the same fp16 bits as the 8-code
// form; the NaN codes get the same NaN bits.
inline void fp8x16_to_float_f16c(const uint8_t* src, float scale256, v8f& lo, v8f& hi) {
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 1), _mm256_set1_epi16(static_cast<short>(0xbf80)));
  const __m256i nan_pattern = _mm256_set1_epi16(0x3f80);
  const __m256i is_nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, nan_pattern), nan_pattern);
  h = _mm256_or_si256(h, _mm256_and_si256(is_nan, _mm256_set1_epi16(0x7e00)));
  const __m256 s = _mm256_set1_ps(scale256);
  const __m256 l = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s);
  const __m256 u = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s);
  std::memcpy(&lo, &l, sizeof(lo));
  std::memcpy(&hi, &u, sizeof(hi));
}
#endif

// fp8_row_to_float of 8 codes, in registers: the same integer steps and the same final
// multiply by the scale, so each lane equals what the buffered path stores.
inline v8f fp8x8_to_float(const uint8_t* src, float scale) {
  v8b raw;
  std::memcpy(&raw, src, sizeof(raw));
  const v8u b = __builtin_convertvector(raw, v8u);
  const v8u normal_bits = ((b & 0x7fu) << 20) + (120u << 23);
  const v8f subnormal = __builtin_convertvector(b & 7u, v8f) * 0x1p-9f;
  v8u subnormal_bits;
  std::memcpy(&subnormal_bits, &subnormal, sizeof(subnormal_bits));
  const v8u normal_mask = 0u - (((b & 0x78u) + 0x78u) >> 7);
  const v8u nan_bits = (((b & 0x7fu) + 1u) >> 7) * 0x7fc00000u;
  v8u bits = (normal_bits & normal_mask) | (subnormal_bits & ~normal_mask);
  bits |= nan_bits | ((b & 0x80u) << 24);
  return bits_to_float(bits) * scale;
}

inline v8f bf16x8_to_float(const uint16_t* src) {
  v8h raw;
  std::memcpy(&raw, src, sizeof(raw));
  return bits_to_float(__builtin_convertvector(raw, v8u) << 16);
}

// dot8x4 for two x rows at once (8 accumulators: twice the FMAs per weight load); each of
// the eight sums is computed exactly as dot8x4 computes it.
inline void dot8x4x2(const float* x0, const float* x1, const float* w0, const float* w1,
                     const float* w2, const float* w3, int64_t n, float* out0, float* out1) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
  for (int64_t k = 0; k < n; k += 8) {
    const v8f xv = load8(x0 + k), yv = load8(x1 + k);
    const v8f v0 = load8(w0 + k), v1 = load8(w1 + k), v2 = load8(w2 + k), v3 = load8(w3 + k);
    a0 = fma8(xv, v0, a0);
    b0 = fma8(yv, v0, b0);
    a1 = fma8(xv, v1, a1);
    b1 = fma8(yv, v1, b1);
    a2 = fma8(xv, v2, a2);
    b2 = fma8(yv, v2, b2);
    a3 = fma8(xv, v3, a3);
    b3 = fma8(yv, v3, b3);
  }
  out0[0] = hsum(a0);
  out0[1] = hsum(a1);
  out0[2] = hsum(a2);
  out0[3] = hsum(a3);
  out1[0] = hsum(b0);
  out1[1] = hsum(b1);
  out1[2] = hsum(b2);
  out1[3] = hsum(b3);
}

// Converts W[n, k0 : k0 + kb] to fp32 (with its FP8 block scale) into dst[0, kb_pad).
void weight_row_block(const Weight& w, int64_t n, int64_t k0, int64_t kb, int64_t kb_pad,
                      float* dst) {
  const int64_t row_stride = w.w.stride[0];
  const char* row = static_cast<const char*>(w.w.data) +
                    (n * row_stride + k0) * static_cast<int64_t>(dtype_size(w.w.dtype));
  if (w.w.dtype == DType::F8_E4M3) {
    // scale_inv [ceil(N / block_n), ceil(K / block_k)]; one scale per 128x128 block.
    const float* scales = w.scale_inv.ptr<float>() + (n / w.block_n) * w.scale_inv.stride[0];
    const auto* bytes = reinterpret_cast<const uint8_t*>(row);
    int64_t k = 0;
    while (k < kb) {
      const int64_t kk = k0 + k;
      const int64_t seg_end = std::min<int64_t>(kb, (kk / w.block_k + 1) * w.block_k - k0);
      const float scale = scales[kk / w.block_k];
#if defined(__AVX2__) && defined(__F16C__)
      if (scale < 0x1p100f && scale > -0x1p100f) {  // the direct path's converter, same floats
        for (; k + 16 <= seg_end; k += 16) {
          v8f lo, hi;
          fp8x16_to_float_f16c(bytes + k, scale * 256.0f, lo, hi);
          std::memcpy(dst + k, &lo, sizeof(lo));
          std::memcpy(dst + k + 8, &hi, sizeof(hi));
        }
      }
#endif
      fp8_row_to_float(bytes + k, seg_end - k, scale, dst + k);
      k = seg_end;
    }
  } else {
    row_to_float(row, w.w.dtype, kb, dst);
  }
  for (int64_t i = kb; i < kb_pad; ++i) dst[i] = 0.0f;
}

}  // namespace

void check_weight(const Weight& w, int64_t in_features, const char* what) {
  check_cpu(w.w, what);
  DI_CHECK(w.w.ndim == 2, what, ": weight must be 2-D [out, in], got ", w.w.describe());
  DI_CHECK(w.w.stride[1] == 1, what, ": weight rows must be contiguous, got ", w.w.describe());
  DI_CHECK(w.w.dtype == DType::F32 || w.w.dtype == DType::BF16 || w.w.dtype == DType::F8_E4M3,
           what, ": weight dtype must be F32, BF16 or F8_E4M3, got ", w.w.describe());
  DI_CHECK(in_features < 0 || w.w.shape[1] == in_features, what, ": weight ", w.w.describe(),
           " expects ", w.w.shape[1], " input features, got ", in_features);
  if (w.w.dtype == DType::F8_E4M3) {
    DI_CHECK(w.block_n > 0 && w.block_k > 0, what, ": FP8 block sizes must be positive");
    check_cpu(w.scale_inv, DType::F32, what);
    const int64_t nb = (w.w.shape[0] + w.block_n - 1) / w.block_n;
    const int64_t kb = (w.w.shape[1] + w.block_k - 1) / w.block_k;
    DI_CHECK(w.scale_inv.ndim == 2 && w.scale_inv.shape[0] == nb && w.scale_inv.shape[1] == kb &&
                 w.scale_inv.stride[1] == 1,
             what, ": FP8 scale_inv must be F32 [", nb, ", ", kb, "] for weight ", w.w.describe(),
             ", got ", w.scale_inv.describe());
  }
}

namespace {

constexpr int64_t kDirectMaxRows = 2;  // at most this many x rows: the direct path

bool direct_path_applies(const Rows& x, const Weight& w) {
  if (x.rows > kDirectMaxRows) return false;
  // An 8-wide chunk must lie inside one FP8 scale block.
  return w.w.dtype != DType::F8_E4M3 || w.block_k % 8 == 0;
}

// 8 weights of a row at column k for the direct path, the dtype and (FP8) the converter fixed
// at compile time, the FP8 scale given for the chunk's scale block: no division, no branch in
// the loop. Each lane is what weight8 / the buffered path computes.
template <DType D, bool kF16c>
inline v8f direct_weight8(const char* row, int64_t k, float scale, float scale256) {
  if constexpr (D == DType::F8_E4M3) {
#if defined(__AVX2__) && defined(__F16C__)
    if constexpr (kF16c) return fp8x8_to_float_f16c(reinterpret_cast<const uint8_t*>(row) + k, scale256);
#endif
    (void)scale256;
    return fp8x8_to_float(reinterpret_cast<const uint8_t*>(row) + k, scale);
  } else if constexpr (D == DType::BF16) {
    return bf16x8_to_float(reinterpret_cast<const uint16_t*>(row) + k);
  } else {
    return load8(reinterpret_cast<const float*>(row) + k);
  }
}

// Chunks [k, k_end) of one kBlockK block, within one FP8 scale block: every chunk's four
// weight vectors converted once and used for each of the M <= 2 x rows.
template <DType D, bool kF16c, int M>
inline void direct_chunks(const float* const* xr, const char* const* rows, int64_t k0, int64_t k,
                          int64_t k_end, const float* sc, const float* sc256, v8f* a) {
#if defined(__AVX2__) && defined(__F16C__)
  if constexpr (D == DType::F8_E4M3 && kF16c) {
    // Two chunks per step, 16 codes converted together; each accumulator still takes chunk k
    // before chunk k + 8.
    for (; k + 16 <= k_end; k += 16) {
      const v8f x0 = load8(xr[0] + k), x1 = load8(xr[0] + k + 8);
      v8f y0 = {}, y1 = {};
      if constexpr (M == 2) y0 = load8(xr[1] + k), y1 = load8(xr[1] + k + 8);
      for (int j = 0; j < 4; ++j) {
        v8f lo, hi;
        fp8x16_to_float_f16c(reinterpret_cast<const uint8_t*>(rows[j]) + k0 + k, sc256[j], lo, hi);
        a[j] = fma8(x1, hi, fma8(x0, lo, a[j]));
        if constexpr (M == 2) a[4 + j] = fma8(y1, hi, fma8(y0, lo, a[4 + j]));
      }
    }
  }
#endif
  for (; k < k_end; k += 8) {
    const v8f w0 = direct_weight8<D, kF16c>(rows[0], k0 + k, sc[0], sc256[0]);
    const v8f w1 = direct_weight8<D, kF16c>(rows[1], k0 + k, sc[1], sc256[1]);
    const v8f w2 = direct_weight8<D, kF16c>(rows[2], k0 + k, sc[2], sc256[2]);
    const v8f w3 = direct_weight8<D, kF16c>(rows[3], k0 + k, sc[3], sc256[3]);
    const v8f xv = load8(xr[0] + k);
    a[0] = fma8(xv, w0, a[0]);
    a[1] = fma8(xv, w1, a[1]);
    a[2] = fma8(xv, w2, a[2]);
    a[3] = fma8(xv, w3, a[3]);
    if constexpr (M == 2) {
      const v8f yv = load8(xr[1] + k);
      a[4] = fma8(yv, w0, a[4]);
      a[5] = fma8(yv, w1, a[5]);
      a[6] = fma8(yv, w2, a[6]);
      a[7] = fma8(yv, w3, a[7]);
    }
  }
}

// The direct path: for each group of 4 weight rows and each kBlockK block, 8-lane partial
// sums from weights converted in registers (the tail chunk of the last block converted
// into a zero-padded buffer, as the buffered path pads it), then the fixed horizontal sum.
// Both x rows (M = 2) share each converted weight vector; FP8 scales are read once per scale
// block. Every sum is formed in the same order as the buffered path forms it.
template <DType D, int M>
void gemm_columns_direct_m(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                           int64_t n_end) {
  const int64_t K = x.cols;
  const int64_t row_stride = w.w.stride[0] * static_cast<int64_t>(dtype_size(w.w.dtype));
  const char* wbase = static_cast<const char*>(w.w.data);
  float* xbuf = scratch_floats(2, static_cast<size_t>(M * kBlockK));  // [M, kBlockK]
  float* wtail = scratch_floats(1, 4 * 8);
  const int64_t k_full = K / 8 * 8;  // chunks below this come straight from the weights
  const int64_t seg = D == DType::F8_E4M3 ? w.block_k : kBlockK;  // columns of one scale
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 4) {
    const int64_t nr = std::min<int64_t>(4, n_end - n0);
    const char* rows[4];
    const float* scales[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t n = n0 + std::min<int64_t>(j, nr - 1);  // padding rows repeat the last row
      rows[j] = wbase + n * row_stride;
      if (D == DType::F8_E4M3) scales[j] = w.scale_inv.ptr<float>() + (n / w.block_n) * w.scale_inv.stride[0];
    }
    float acc[M][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
      const int64_t kb = std::min(kBlockK, K - k0);
      const int64_t kb_pad = (kb + 7) / 8 * 8;
      const float* xr[M];
      for (int m = 0; m < M; ++m) {
        xr[m] = x.f32(m) + k0;
        if (kb_pad != kb) {
          float* buf = xbuf + m * kBlockK;
          std::memcpy(buf, xr[m], static_cast<size_t>(kb) * 4);
          std::fill(buf + kb, buf + kb_pad, 0.0f);
          xr[m] = buf;
        }
      }
      v8f a[4 * M] = {};
      const int64_t k_direct = std::min(kb_pad, k_full - k0);  // full chunks of this block
      int64_t k = 0;
      while (k < k_direct) {
        const int64_t kk = k0 + k;
        const int64_t k_end = std::min(k_direct, (kk / seg + 1) * seg - k0);
        float sc[4] = {1.0f, 1.0f, 1.0f, 1.0f}, sc256[4] = {256.0f, 256.0f, 256.0f, 256.0f};
        bool f16c = true;
        if constexpr (D == DType::F8_E4M3) {
          for (int j = 0; j < 4; ++j) {
            sc[j] = scales[j][kk / w.block_k];
            sc256[j] = sc[j] * 256.0f;
            f16c = f16c && sc[j] < 0x1p100f && sc[j] > -0x1p100f;  // scale * 256 exact (finite)
          }
        }
        if (f16c) direct_chunks<D, true, M>(xr, rows, k0, k, k_end, sc, sc256, a);
        else direct_chunks<D, false, M>(xr, rows, k0, k, k_end, sc, sc256, a);
        k = k_end;
      }
      if (k < kb_pad) {  // the last, partial chunk: through weight_row_block's zero padding
        for (int64_t j = 0; j < 4; ++j)
          weight_row_block(w, n0 + std::min<int64_t>(j, nr - 1), k0 + k, kb - k, 8, wtail + 8 * j);
        for (int m = 0; m < M; ++m) {
          const v8f xv = load8(xr[m] + k);
          for (int j = 0; j < 4; ++j) a[4 * m + j] = fma8(xv, load8(wtail + 8 * j), a[4 * m + j]);
        }
      }
      for (int m = 0; m < M; ++m)
        for (int j = 0; j < 4; ++j) acc[m][j] += hsum(a[4 * m + j]);
    }
    for (int m = 0; m < M; ++m) std::memcpy(out.f32(m) + n0, acc[m], static_cast<size_t>(nr) * 4);
  }
}

// x row m's K block [k0, k0 + kb) for a pass over kb_pad columns: the row itself, or copied
// and zero-padded into `slot` (kBlockK floats) when the block is partial.
const float* x_block_padded(const Rows& x, int64_t m, int64_t k0, int64_t kb, int64_t kb_pad,
                            float* slot) {
  const float* xr = x.f32(m) + k0;
  if (kb_pad == kb) return xr;
  std::memcpy(slot, xr, static_cast<size_t>(kb) * 4);
  std::fill(slot + kb, slot + kb_pad, 0.0f);
  return slot;
}

#if defined(__x86_64__) && defined(__GNUC__)
// The register-array loops below unrolled in full, so the accumulators stay in zmm registers
// (otherwise GCC kept them in memory: a store and a reload in every FMA's dependency chain).
#define DI_UNROLL _Pragma("GCC unroll 16")

// The direct FP8 path on AVX-512 (chosen at run time where the CPU has it): 2 * P weight rows
// at once, each zmm holding the 8 lanes of two rows (low half: row 2p, high half: row 2p + 1),
// so every 8-lane accumulator of the AVX2 path is kept lane for lane and takes the same chunks
// in the same order (the same bits, and twice the weights per instruction). The conversion
// needs no F16C: a code's sign-extended byte shifted left by 20 and masked to 0x87F00000 is an
// fp32 (subnormal for e4m3's subnormals) equal to the code's value times 2^-120 exactly, and
// 2^120 folds into the block scale (exact: a power of two, for |scale| < 2^7), so each weight is
// code * scale rounded once, the float the other paths form. Returns false, having written
// nothing, when a scale is out of that range or a chunk holds a NaN code (0x7f / 0xff): the
// caller then runs the AVX2 path on these rows, which gives NaN codes their bits.
template <int P, int M>
DI_AVX512_TARGET bool fp8_rows_avx512(const Rows& x, const Weight& w, const Rows& out, int64_t n0) {
  constexpr int R = 2 * P;
  const int64_t K = x.cols;
  const int64_t row_stride = w.w.stride[0];
  const uint8_t* base = static_cast<const uint8_t*>(w.w.data) + n0 * row_stride;
  const float* scales[R];
  for (int j = 0; j < R; ++j)
    scales[j] = w.scale_inv.ptr<float>() + ((n0 + j) / w.block_n) * w.scale_inv.stride[0];
  const __m512i mask = _mm512_set1_epi32(static_cast<int>(0x87F00000u));
  const __m512i high = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i ones = _mm512_set1_epi8(-1);
  float acc[M][R] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
    const int64_t kb = std::min(kBlockK, K - k0);
    __m512 a[M][P];
    DI_UNROLL
    for (int m = 0; m < M; ++m)
      DI_UNROLL
      for (int p = 0; p < P; ++p) a[m][p] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kb;) {
      const int64_t kk = k0 + k;
      const int64_t k_end = std::min(kb, (kk / w.block_k + 1) * w.block_k - k0);
      __m512 sc[P];
      DI_UNROLL
      for (int p = 0; p < P; ++p) {
        const float s0 = scales[2 * p][kk / w.block_k], s1 = scales[2 * p + 1][kk / w.block_k];
        if (!(std::fabs(s0) < 0x1p7f && std::fabs(s1) < 0x1p7f)) return false;
        sc[p] = _mm512_insertf32x8(_mm512_set1_ps(s0 * 0x1p120f), _mm256_set1_ps(s1 * 0x1p120f), 1);
      }
      __mmask64 nan = 0;
      // Four chunks (32 codes) of every row per step.
      for (; k + 32 <= k_end; k += 32) {
        __m512 xv[M][4];
        DI_UNROLL
        for (int m = 0; m < M; ++m)
          DI_UNROLL
          for (int q = 0; q < 4; ++q)
            xv[m][q] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.f32(m) + k0 + k + 8 * q));
        DI_UNROLL
        for (int p = 0; p < P; ++p) {
          const uint8_t* r0 = base + 2 * p * row_stride + k0 + k;
          const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
          const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + row_stride));
          const __m256i lo = _mm256_unpacklo_epi64(c0, c1), hi = _mm256_unpackhi_epi64(c0, c1);
          const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
          nan |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(both, high), ones);
          const __m128i ch[4] = {_mm256_castsi256_si128(lo), _mm256_castsi256_si128(hi),
                                 _mm256_extracti128_si256(lo, 1), _mm256_extracti128_si256(hi, 1)};
          DI_UNROLL
          for (int q = 0; q < 4; ++q) {
            const __m512i bits =
                _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(ch[q]), 20), mask);
            const __m512 wv = _mm512_mul_ps(_mm512_castsi512_ps(bits), sc[p]);
            DI_UNROLL
            for (int m = 0; m < M; ++m) a[m][p] = _mm512_fmadd_ps(xv[m][q], wv, a[m][p]);
          }
        }
      }
      for (; k < k_end; k += 8) {  // single chunks
        __m512 xv[M];
        DI_UNROLL
        for (int m = 0; m < M; ++m)
          xv[m] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.f32(m) + k0 + k));
        DI_UNROLL
        for (int p = 0; p < P; ++p) {
          const uint8_t* r0 = base + 2 * p * row_stride + k0 + k;
          const __m128i c = _mm_unpacklo_epi64(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r0)),
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r0 + row_stride)));
          nan |= _mm_cmpeq_epi8_mask(_mm_or_si128(c, _mm512_castsi512_si128(high)),
                                     _mm512_castsi512_si128(ones));
          const __m512i bits =
              _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(c), 20), mask);
          const __m512 wv = _mm512_mul_ps(_mm512_castsi512_ps(bits), sc[p]);
          DI_UNROLL
          for (int m = 0; m < M; ++m) a[m][p] = _mm512_fmadd_ps(xv[m], wv, a[m][p]);
        }
      }
      if (nan != 0) return false;
    }
    DI_UNROLL
    for (int m = 0; m < M; ++m)
      DI_UNROLL
      for (int p = 0; p < P; ++p) {
        // In registers, never hsum(v8f): a v8f argument to a function built for the base ISA
        // is passed another way where that ISA has no AVX (cpu_backend.h).
        const __m512 v = hsum8_halves(a[m][p]);
        acc[m][2 * p] += hsum8_low(v);
        acc[m][2 * p + 1] += hsum8_high(v);
      }
  }
  for (int m = 0; m < M; ++m) std::memcpy(out.f32(m) + n0, acc[m], sizeof(acc[m]));
  return true;
}

// The direct BF16 path on AVX-512: 4 * Q weight rows at once. Four rows' 8-value chunks fill
// the four 128-bit lanes of a zmm (a transpose of 128-bit lanes); unpacking with zero words
// puts each bf16 in the top half of a dword (its fp32 value, as bf16x8_to_float) for values
// 0-3 (lo) and 4-7 (hi) of every chunk, so accumulator lane (row r, value i) takes the same
// chunks in the same order as lane i of row r's 8-lane AVX2 accumulator, and the fixed
// horizontal sum reads lo's four lanes of a row then hi's: the AVX2 path's bits.
template <int M, int Q>
DI_AVX512_TARGET inline void bf16_chunk_fma(__m512i t, const Rows& x, int64_t kx,
                                            __m512 (&lo)[M][Q], __m512 (&hi)[M][Q], int g) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512 wl = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, t));
  const __m512 wh = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, t));
  DI_UNROLL
  for (int m = 0; m < M; ++m) {
    lo[m][g] = _mm512_fmadd_ps(_mm512_broadcast_f32x4(_mm_loadu_ps(x.f32(m) + kx)), wl, lo[m][g]);
    hi[m][g] =
        _mm512_fmadd_ps(_mm512_broadcast_f32x4(_mm_loadu_ps(x.f32(m) + kx + 4)), wh, hi[m][g]);
  }
}

template <int Q, int M>
DI_AVX512_TARGET void bf16_rows_avx512(const Rows& x, const Weight& w, const Rows& out,
                                       int64_t n0) {
  constexpr int R = 4 * Q;
  const int64_t K = x.cols;
  const int64_t row_stride = w.w.stride[0];
  const uint16_t* base = static_cast<const uint16_t*>(w.w.data) + n0 * row_stride;
  float acc[M][R] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
    const int64_t kb = std::min(kBlockK, K - k0);
    __m512 lo[M][Q], hi[M][Q];
    DI_UNROLL
    for (int m = 0; m < M; ++m)
      DI_UNROLL
      for (int g = 0; g < Q; ++g) lo[m][g] = hi[m][g] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= kb; k += 32) {  // four chunks of every row per step
      DI_UNROLL
      for (int g = 0; g < Q; ++g) {
        const uint16_t* r = base + 4 * g * row_stride + k0 + k;
        const __m512i A = _mm512_loadu_si512(r), B = _mm512_loadu_si512(r + row_stride);
        const __m512i C = _mm512_loadu_si512(r + 2 * row_stride),
                      D = _mm512_loadu_si512(r + 3 * row_stride);
        const __m512i t0 = _mm512_shuffle_i64x2(A, B, 0x44), t1 = _mm512_shuffle_i64x2(A, B, 0xEE);
        const __m512i t2 = _mm512_shuffle_i64x2(C, D, 0x44), t3 = _mm512_shuffle_i64x2(C, D, 0xEE);
        bf16_chunk_fma<M, Q>(_mm512_shuffle_i64x2(t0, t2, 0x88), x, k0 + k, lo, hi, g);
        bf16_chunk_fma<M, Q>(_mm512_shuffle_i64x2(t0, t2, 0xDD), x, k0 + k + 8, lo, hi, g);
        bf16_chunk_fma<M, Q>(_mm512_shuffle_i64x2(t1, t3, 0x88), x, k0 + k + 16, lo, hi, g);
        bf16_chunk_fma<M, Q>(_mm512_shuffle_i64x2(t1, t3, 0xDD), x, k0 + k + 24, lo, hi, g);
      }
    }
    for (; k < kb; k += 8) {  // single chunks
      DI_UNROLL
      for (int g = 0; g < Q; ++g) {
        const uint16_t* r = base + 4 * g * row_stride + k0 + k;
        __m512i t = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r)));
        t = _mm512_inserti32x4(t, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + row_stride)),
                               1);
        t = _mm512_inserti32x4(
            t, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * row_stride)), 2);
        t = _mm512_inserti32x4(
            t, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 3 * row_stride)), 3);
        bf16_chunk_fma<M, Q>(t, x, k0 + k, lo, hi, g);  // chunk t into group g
      }
    }
    DI_UNROLL
    for (int m = 0; m < M; ++m)
      DI_UNROLL
      for (int g = 0; g < Q; ++g) {
        // Row r's sum ((l0 + l1) + (l2 + l3)) + ((h0 + h1) + (h2 + h3)) lands in lane 4 r.
        const __m512 t = _mm512_add_ps(hsum4_quads(lo[m][g]), hsum4_quads(hi[m][g]));
        const __m128 sums = _mm512_castps512_ps128(
            _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), t));
        float* dst = &acc[m][4 * g];
        _mm_storeu_ps(dst, _mm_add_ps(_mm_loadu_ps(dst), sums));
      }
  }
  for (int m = 0; m < M; ++m) std::memcpy(out.f32(m) + n0, acc[m], sizeof(acc[m]));
}

// The direct F32 path on AVX-512 (the absorbed attention heads): 2 * P weight rows at once,
// each zmm holding the 8 lanes of two rows (low half: row 2p, high half: row 2p + 1), so every
// 8-lane accumulator of the AVX2 path is kept lane for lane and takes the same chunks in the
// same order: the same bits. K % 8 == 0 (no zero-padded tail chunk).
template <int P, int M>
DI_AVX512_TARGET void f32_rows_avx512(const Rows& x, const Weight& w, const Rows& out, int64_t n0) {
  constexpr int R = 2 * P;
  const int64_t K = x.cols;
  const int64_t row_stride = w.w.stride[0];
  const float* base = static_cast<const float*>(w.w.data) + n0 * row_stride;
  float acc[M][R] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
    const int64_t kb = std::min(kBlockK, K - k0);
    __m512 a[M][P];
    DI_UNROLL
    for (int m = 0; m < M; ++m)
      DI_UNROLL
      for (int p = 0; p < P; ++p) a[m][p] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kb; k += 8) {
      __m512 xv[M];
      DI_UNROLL
      for (int m = 0; m < M; ++m) xv[m] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x.f32(m) + k0 + k));
      DI_UNROLL
      for (int p = 0; p < P; ++p) {
        const float* r0 = base + 2 * p * row_stride + k0 + k;
        const __m512 wv = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(r0)),
                                             _mm256_loadu_ps(r0 + row_stride), 1);
        DI_UNROLL
        for (int m = 0; m < M; ++m) a[m][p] = _mm512_fmadd_ps(xv[m], wv, a[m][p]);
      }
    }
    DI_UNROLL
    for (int m = 0; m < M; ++m)
      DI_UNROLL
      for (int p = 0; p < P; ++p) {
        const __m512 v = hsum8_halves(a[m][p]);  // as fp8_rows_avx512 sums
        acc[m][2 * p] += hsum8_low(v);
        acc[m][2 * p + 1] += hsum8_high(v);
      }
  }
  for (int m = 0; m < M; ++m) std::memcpy(out.f32(m) + n0, acc[m], sizeof(acc[m]));
}

// Rows [n_begin, n_end) of the FP8 direct path on AVX-512 where it applies, in groups of
// 16 rows (8 with two x rows); returns the first row left to the AVX2 path.
template <int M>
int64_t fp8_direct_avx512(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                          int64_t n_end,
                          void (*avx2_rows)(const Rows&, const Weight&, const Rows&, int64_t,
                                            int64_t)) {
  // Full 8-wide chunks only (K % 8 == 0, chunks inside one scale block); DAZ off, so the
  // subnormal stand-ins of e4m3's subnormals keep their value.
  if (!cpu_has_avx512() || x.cols % 8 != 0 || w.block_k % 8 != 0 || (_mm_getcsr() & 0x40) != 0)
    return n_begin;
  constexpr int P = M == 1 ? 8 : 4;
  int64_t n0 = n_begin;
  for (; n0 + 2 * P <= n_end; n0 += 2 * P)
    if (!fp8_rows_avx512<P, M>(x, w, out, n0)) avx2_rows(x, w, out, n0, n0 + 2 * P);
  return n0;
}

// Rows [n_begin, n_end) of the BF16 / F32 direct path on AVX-512, `group` on each R rows (16,
// or 8 with two x rows); returns the first row left to the AVX2 path.
template <int R>
int64_t rows_direct_avx512(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                           int64_t n_end, void (*group)(const Rows&, const Weight&, const Rows&, int64_t)) {
  if (!cpu_has_avx512() || x.cols % 8 != 0) return n_begin;
  int64_t n0 = n_begin;
  for (; n0 + R <= n_end; n0 += R) group(x, w, out, n0);
  return n0;
}
// The buffered path on AVX-512 (chosen at run time where the CPU has it). The weight block is
// written pair-interleaved: per 8-float chunk, weight row j's chunk then row j + 1's, so one
// zmm load carries both. Each zmm accumulator holds the 8-lane accumulators of (x row m,
// weight row j) in its low half and (m, j + 1) in its high half, lane for lane, each taking
// the same chunks in the same order and summed by the same hsum8 into the same per-block
// `acc +=`: the bits of the AVX2 passes, with R x rows sharing every weight load.
template <int R>
DI_AVX512_TARGET inline void buffered_rows_avx512(const float* const* xs, const float* wt2,
                                                  int64_t kb_pad, int64_t nt4, float* const* acc) {
  for (int64_t j = 0; j < nt4; j += 4) {  // weight rows j .. j + 3: two pairs
    const float* p0 = wt2 + j * kb_pad;   // pair j / 2 starts at (j / 2) * 2 * kb_pad
    const float* p1 = p0 + 2 * kb_pad;
    __m512 c[R][2];
    DI_UNROLL for (int r = 0; r < R; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kb_pad; k += 8) {
      const __m512 b0 = _mm512_loadu_ps(p0 + 2 * k), b1 = _mm512_loadu_ps(p1 + 2 * k);
      DI_UNROLL for (int r = 0; r < R; ++r) {
        const __m512 a = _mm512_broadcast_f32x8(_mm256_loadu_ps(xs[r] + k));
        c[r][0] = _mm512_fmadd_ps(a, b0, c[r][0]);
        c[r][1] = _mm512_fmadd_ps(a, b1, c[r][1]);
      }
    }
    DI_UNROLL for (int r = 0; r < R; ++r) {
      DI_UNROLL for (int q = 0; q < 2; ++q) {
        const __m512 v = hsum8_halves(c[r][q]);
        acc[r][j + 2 * q] += hsum8_low(v);
        acc[r][j + 2 * q + 1] += hsum8_high(v);
      }
    }
  }
}

constexpr int kBufferedRowsAvx512 = 8;  // x rows per pass: 16 zmm accumulators

DI_AVX512_TARGET void gemm_columns_buffered_avx512(const Rows& x, const Weight& w, const Rows& out,
                                                   int64_t n_begin, int64_t n_end) {
  constexpr int R = kBufferedRowsAvx512;
  const int64_t M = x.rows, K = x.cols;
  float* xbuf = scratch_floats(2, R * kBlockK);  // [R, kBlockK]: partial x blocks
  float* row = scratch_floats(5, kBlockK);       // one weight row's block, before interleaving
  for (int64_t t0 = n_begin; t0 < n_end; t0 += kTileN) {
    const int64_t nt = std::min(kTileN, n_end - t0);
    const int64_t nt4 = (nt + 3) / 4 * 4;
    float* acc = scratch_floats(0, static_cast<size_t>(M * nt4));  // [M, nt4]
    std::fill(acc, acc + M * nt4, 0.0f);
    float* wt2 = scratch_floats(1, static_cast<size_t>(nt4 * kBlockK));  // [nt4 / 2, kb_pad / 8, 16]
    for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
      const int64_t kb = std::min(kBlockK, K - k0);
      const int64_t kb_pad = (kb + 7) / 8 * 8;
      for (int64_t j = 0; j < nt4; ++j) {
        if (j < nt) weight_row_block(w, t0 + j, k0, kb, kb_pad, row);
        else std::fill(row, row + kb_pad, 0.0f);
        float* dst = wt2 + (j / 2) * 2 * kb_pad + (j % 2) * 8;
        for (int64_t c = 0; c < kb_pad; c += 8) std::memcpy(dst + 2 * c, row + c, 32);
      }
      const float* xs[R];
      float* as[R];
      // As few passes as R rows allow, their rows balanced (10 rows: 5 + 5, not 8 + 2).
      const int64_t passes = (M + R - 1) / R, per_pass = (M + passes - 1) / passes;
      int64_t m = 0;
      while (m < M) {
        const int rows = static_cast<int>(std::min<int64_t>(per_pass, M - m));
        for (int r = 0; r < rows; ++r) {
          xs[r] = x_block_padded(x, m + r, k0, kb, kb_pad, xbuf + r * kBlockK);
          as[r] = acc + (m + r) * nt4;
        }
        switch (rows) {
          case 8: buffered_rows_avx512<8>(xs, wt2, kb_pad, nt4, as); break;
          case 7: buffered_rows_avx512<7>(xs, wt2, kb_pad, nt4, as); break;
          case 6: buffered_rows_avx512<6>(xs, wt2, kb_pad, nt4, as); break;
          case 5: buffered_rows_avx512<5>(xs, wt2, kb_pad, nt4, as); break;
          case 4: buffered_rows_avx512<4>(xs, wt2, kb_pad, nt4, as); break;
          case 3: buffered_rows_avx512<3>(xs, wt2, kb_pad, nt4, as); break;
          case 2: buffered_rows_avx512<2>(xs, wt2, kb_pad, nt4, as); break;
          default: buffered_rows_avx512<1>(xs, wt2, kb_pad, nt4, as); break;
        }
        m += rows;
      }
    }
    for (int64_t m = 0; m < M; ++m) std::memcpy(out.f32(m) + t0, acc + m * nt4, nt * 4);
  }
}
#endif

template <DType D>
void gemm_columns_direct_d(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin, int64_t n_end) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (D == DType::F8_E4M3) {
    if (x.rows == 2)
      n_begin = fp8_direct_avx512<2>(x, w, out, n_begin, n_end, gemm_columns_direct_m<D, 2>);
    if (x.rows == 1)
      n_begin = fp8_direct_avx512<1>(x, w, out, n_begin, n_end, gemm_columns_direct_m<D, 1>);
    if (n_begin >= n_end) return;
  }
  if constexpr (D == DType::BF16) {
    if (x.rows == 2) n_begin = rows_direct_avx512<8>(x, w, out, n_begin, n_end, bf16_rows_avx512<2, 2>);
    if (x.rows == 1) n_begin = rows_direct_avx512<16>(x, w, out, n_begin, n_end, bf16_rows_avx512<4, 1>);
    if (n_begin >= n_end) return;
  }
  if constexpr (D == DType::F32) {
    if (x.rows == 2) n_begin = rows_direct_avx512<8>(x, w, out, n_begin, n_end, f32_rows_avx512<4, 2>);
    if (x.rows == 1) n_begin = rows_direct_avx512<16>(x, w, out, n_begin, n_end, f32_rows_avx512<8, 1>);
    if (n_begin >= n_end) return;
  }
#endif
  if (x.rows == 2) return gemm_columns_direct_m<D, 2>(x, w, out, n_begin, n_end);
  if (x.rows == 1) gemm_columns_direct_m<D, 1>(x, w, out, n_begin, n_end);
}

void gemm_columns_direct(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                         int64_t n_end) {
  switch (w.w.dtype) {
    case DType::F8_E4M3: return gemm_columns_direct_d<DType::F8_E4M3>(x, w, out, n_begin, n_end);
    case DType::BF16: return gemm_columns_direct_d<DType::BF16>(x, w, out, n_begin, n_end);
    default: return gemm_columns_direct_d<DType::F32>(x, w, out, n_begin, n_end);
  }
}

}  // namespace

void gemm_columns(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                  int64_t n_end) {
  if (direct_path_applies(x, w)) return gemm_columns_direct(x, w, out, n_begin, n_end);
  gemm_columns_buffered(x, w, out, n_begin, n_end);
}

void gemm_columns_buffered(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                           int64_t n_end) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has_avx512()) return gemm_columns_buffered_avx512(x, w, out, n_begin, n_end);
#endif
  gemm_columns_buffered_8lane(x, w, out, n_begin, n_end);
}

void gemm_columns_buffered_8lane(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                                 int64_t n_end) {
  const int64_t M = x.rows, K = x.cols;
  float* xbuf = scratch_floats(2, 3 * kBlockK);  // [3, kBlockK]: partial x blocks
  for (int64_t t0 = n_begin; t0 < n_end; t0 += kTileN) {
    const int64_t nt = std::min(kTileN, n_end - t0);
    const int64_t nt4 = (nt + 3) / 4 * 4;  // padded to 4 rows for dot8x4
    float* acc = scratch_floats(0, static_cast<size_t>(M * nt4));  // [M, nt4]
    std::fill(acc, acc + M * nt4, 0.0f);
    float* wt = scratch_floats(1, static_cast<size_t>(nt4 * kBlockK));  // [nt4, kb_pad]
    for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
      const int64_t kb = std::min(kBlockK, K - k0);
      const int64_t kb_pad = (kb + 7) / 8 * 8;
      for (int64_t j = 0; j < nt; ++j) weight_row_block(w, t0 + j, k0, kb, kb_pad, wt + j * kb_pad);
      for (int64_t j = nt; j < nt4; ++j) std::fill(wt + j * kb_pad, wt + (j + 1) * kb_pad, 0.0f);
      // x row m's block, zero-padded into xbuf slot `s` when the block is partial.
      auto x_block = [&](int64_t m, int s) { return x_block_padded(x, m, k0, kb, kb_pad, xbuf + s * kBlockK); };
      int64_t m = 0;
      for (; m + 3 <= M; m += 3) {  // three rows per pass over the weight block
        const float* xs[3] = {x_block(m, 0), x_block(m + 1, 1), x_block(m + 2, 2)};
        float* a[3] = {acc + m * nt4, acc + (m + 1) * nt4, acc + (m + 2) * nt4};
        for (int64_t j = 0; j < nt4; j += 4) {
          float d[3][4];
          float* dp[3] = {d[0], d[1], d[2]};
          const float* wj = wt + j * kb_pad;
          const float* ws[4] = {wj, wj + kb_pad, wj + 2 * kb_pad, wj + 3 * kb_pad};
          dot8x4x3_rows(xs, ws, kb_pad, dp);
          for (int r = 0; r < 3; ++r)
            for (int i = 0; i < 4; ++i) a[r][j + i] += d[r][i];
        }
      }
      for (; m + 2 <= M; m += 2) {  // two rows per pass over the weight block
        const float* x0 = x_block(m, 0);
        const float* x1 = x_block(m + 1, 1);
        float* a = acc + m * nt4;
        float* b = a + nt4;
        for (int64_t j = 0; j < nt4; j += 4) {
          float d[4], e[4];
          const float* wj = wt + j * kb_pad;
          dot8x4x2(x0, x1, wj, wj + kb_pad, wj + 2 * kb_pad, wj + 3 * kb_pad, kb_pad, d, e);
          for (int i = 0; i < 4; ++i) {
            a[j + i] += d[i];
            b[j + i] += e[i];
          }
        }
      }
      for (; m < M; ++m) {
        const float* xr = x_block(m, 0);
        float* a = acc + m * nt4;
        for (int64_t j = 0; j < nt4; j += 4) {
          float d[4];
          const float* wj = wt + j * kb_pad;
          dot8x4(xr, wj, wj + kb_pad, wj + 2 * kb_pad, wj + 3 * kb_pad, kb_pad, d);
          a[j] += d[0];
          a[j + 1] += d[1];
          a[j + 2] += d[2];
          a[j + 3] += d[3];
        }
      }
    }
    for (int64_t m = 0; m < M; ++m) std::memcpy(out.f32(m) + t0, acc + m * nt4, nt * 4);
  }
}

void gemm_threaded(ThreadPool& pool, const Rows& x, const Weight& w, const Rows& out) {
  const int64_t N = w.w.shape[0];
  const int64_t num_tiles = (N + kTileN - 1) / kTileN;
  pool.parallel_for(num_tiles, 1, [&](int64_t b, int64_t e) {
    gemm_columns(x, w, out, b * kTileN, std::min(N, e * kTileN));
  });
}

void gemm_threaded_many(ThreadPool& pool, const std::vector<GemmJob>& jobs) {
  std::vector<int64_t> first_tile(jobs.size() + 1, 0);  // prefix sums of the jobs' tiles
  for (size_t i = 0; i < jobs.size(); ++i)
    first_tile[i + 1] = first_tile[i] + (jobs[i].w->w.shape[0] + kTileN - 1) / kTileN;
  pool.parallel_for(first_tile.back(), 1, [&](int64_t b, int64_t e) {
    size_t j = static_cast<size_t>(std::upper_bound(first_tile.begin(), first_tile.end(), b) -
                                   first_tile.begin() - 1);
    for (int64_t t = b; t < e; ++t) {
      while (t >= first_tile[j + 1]) ++j;
      const GemmJob& job = jobs[j];
      const int64_t N = job.w->w.shape[0], n0 = (t - first_tile[j]) * kTileN;
      gemm_columns(job.x, *job.w, job.out, n0, std::min(N, n0 + kTileN));
    }
  });
}

void CpuBackend::gemm_pair(const Tensor& x, const Weight& w1, const Weight& w2, Tensor& out1,
                           Tensor& out2) {
  const Rows xr = as_rows(x, "gemm_pair x");
  const Rows o1 = as_rows(out1, "gemm_pair out1");
  const Rows o2 = as_rows(out2, "gemm_pair out2");
  DI_CHECK(xr.dtype == DType::F32 && o1.dtype == DType::F32 && o2.dtype == DType::F32,
           "gemm_pair: x and outs must be F32, got ", x.describe(), ", ", out1.describe(), ", ",
           out2.describe());
  check_weight(w1, xr.cols, "gemm_pair weight 1");
  check_weight(w2, xr.cols, "gemm_pair weight 2");
  DI_CHECK(o1.rows == xr.rows && o1.cols == w1.w.shape[0] && o2.rows == xr.rows &&
               o2.cols == w2.w.shape[0],
           "gemm_pair: outs ", out1.describe(), " and ", out2.describe(), " must be [", xr.rows,
           ", ", w1.w.shape[0], "] and [", xr.rows, ", ", w2.w.shape[0], "]");
  gemm_threaded_many(*pool_, {GemmJob{xr, &w1, o1}, GemmJob{xr, &w2, o2}});
}

void CpuBackend::gemm(const Tensor& x, const Weight& w, Tensor& out) {
  const Rows xr = as_rows(x, "gemm x");
  const Rows orows = as_rows(out, "gemm out");
  DI_CHECK(xr.dtype == DType::F32 && orows.dtype == DType::F32, "gemm: x and out must be F32, got ",
           x.describe(), " and ", out.describe());
  check_weight(w, xr.cols, "gemm weight");
  DI_CHECK(orows.rows == xr.rows && orows.cols == w.w.shape[0], "gemm: out ", out.describe(),
           " must be [", xr.rows, ", ", w.w.shape[0], "] for x ", x.describe(), " and weight ",
           w.w.describe());
  gemm_threaded(*pool_, xr, w, orows);
}

void CpuBackend::gemm_heads(const Tensor& x, const Tensor& w, Tensor& out) {
  check_gemm_heads(x, w, out);
  check_cpu(x, DType::F32, "gemm_heads x");
  check_cpu(out, DType::F32, "gemm_heads out");
  const int64_t heads = w.shape[0], N = w.shape[1], K = w.shape[2], T = x.shape[0];
  std::vector<Weight> wh(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    wh[h].w = w.row(h);  // [N, K]
    check_weight(wh[h], K, "gemm_heads weight");
  }
  // Head h of a [T, heads, D] view as rows [T, D] with the view's row stride.
  auto head_rows = [](const Tensor& t, int64_t h) {
    return Rows{static_cast<char*>(t.data) + h * t.stride[1] * 4, DType::F32, t.shape[0],
                t.shape[2], t.stride[0]};
  };
  const int64_t tiles = (N + kTileN - 1) / kTileN;  // per head, as gemm_threaded cuts them
  if (T == 0) return;
  pool_->parallel_for(heads * tiles, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t h = i / tiles, t0 = (i % tiles) * kTileN;
      gemm_columns(head_rows(x, h), wh[h], head_rows(out, h), t0, std::min(N, t0 + kTileN));
    }
  });
}

}  // namespace deepinfer::cpu
