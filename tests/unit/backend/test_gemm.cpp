// gemm vs a double-precision reference: F32, BF16 and FP8 (block scales with partial
// edge blocks) weights; batch invariance and thread-count invariance bit-exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

struct TestWeight {
  HostBuffer w, scale;
  Weight weight;
  std::vector<double> dequant;  // [N, K] real values
};

TestWeight make_weight(DType dtype, int64_t N, int64_t K, uint64_t seed, int block = 128) {
  TestWeight t;
  HostBuffer src = test::random_f32({N, K}, seed, 0.5f);
  t.w = HostBuffer(dtype, {N, K});
  t.dequant.resize(N * K);
  const float* s = src.ptr<float>();
  if (dtype == DType::F32) {
    std::memcpy(t.w.tensor().data, s, N * K * 4);
    for (int64_t i = 0; i < N * K; ++i) t.dequant[i] = s[i];
  } else if (dtype == DType::BF16) {
    for (int64_t i = 0; i < N * K; ++i) {
      t.w.ptr<uint16_t>()[i] = float_to_bf16(s[i]);
      t.dequant[i] = bf16_to_float(t.w.ptr<uint16_t>()[i]);
    }
  } else {
    const int64_t nb = (N + block - 1) / block, kb = (K + block - 1) / block;
    t.scale = HostBuffer(DType::F32, {nb, kb});
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (int64_t i = 0; i < nb * kb; ++i) t.scale.ptr<float>()[i] = 0.001f + 0.01f * (rng() % 7);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const float sc = t.scale.ptr<float>()[(n / block) * kb + k / block];
        const uint8_t q = float_to_fp8_e4m3(s[n * K + k] / sc);
        t.w.ptr<uint8_t>()[n * K + k] = q;
        t.dequant[n * K + k] = static_cast<double>(fp8_e4m3_to_float(q)) * sc;
      }
    }
    t.weight.scale_inv = t.scale.tensor();
    t.weight.block_n = t.weight.block_k = block;
  }
  t.weight.w = t.w.tensor();
  return t;
}

void check_gemm(DType dtype, int64_t M, int64_t N, int64_t K, int block = 128) {
  auto backend = make_cpu_backend();
  TestWeight tw = make_weight(dtype, N, K, 7 + N, block);
  HostBuffer x = test::random_f32({M, K}, 11 + M);
  HostBuffer out = test::f32_buffer({M, N}, NAN);
  backend->gemm(x.tensor(), tw.weight, out.tensor());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += static_cast<double>(x.ptr<float>()[m * K + k]) * tw.dequant[n * K + k];
        mag += std::fabs(static_cast<double>(x.ptr<float>()[m * K + k]) * tw.dequant[n * K + k]);
      }
      // fp32 accumulation over K terms: error bounded by ~K * 2^-24 * sum|terms|.
      ASSERT_NEAR(out.ptr<float>()[m * N + n], ref, 2e-6 * mag + 1e-7)
          << dtype_name(dtype) << " m=" << m << " n=" << n;
    }
  }
}

TEST(CpuGemm, F32OddSizes) { check_gemm(DType::F32, 5, 37, 301); }
TEST(CpuGemm, Bf16OddSizes) { check_gemm(DType::BF16, 3, 70, 259); }
TEST(CpuGemm, Fp8PartialBlocks) { check_gemm(DType::F8_E4M3, 4, 200, 300); }
TEST(CpuGemm, Fp8SmallBlocks) { check_gemm(DType::F8_E4M3, 2, 45, 70, 16); }
TEST(CpuGemm, SingleRowAndColumn) { check_gemm(DType::F32, 1, 1, 1); }

// A row's result is bit-identical whatever M is and however many threads run (M = 8: the
// buffered path's 3-, 3- and 2-row passes; 9: three 3-row passes; 4: 3 + 1).
TEST(CpuGemm, BatchAndThreadInvariant) {
  const int64_t N = 97, K = 515;
  TestWeight tw = make_weight(DType::F8_E4M3, N, K, 3);
  BackendOptions one;
  one.num_threads = 1;
  BackendOptions three;
  three.num_threads = 3;
  auto b1 = make_cpu_backend(one), b3 = make_cpu_backend(three);
  for (int64_t M : {4, 8, 9}) {
    HostBuffer x = test::random_f32({M, K}, 5);
    HostBuffer full = test::f32_buffer({M, N});
    b3->gemm(x.tensor(), tw.weight, full.tensor());
    for (int64_t m = 0; m < M; ++m) {
      HostBuffer single = test::f32_buffer({1, N});
      b1->gemm(x.tensor().slice_rows(m, m + 1), tw.weight, single.tensor());
      ASSERT_EQ(std::memcmp(single.ptr<float>(), full.ptr<float>() + m * N, N * 4), 0) << "M " << M << " row " << m;
    }
  }
}

// Up to two rows take the direct path (weights converted in registers), more rows the
// buffered one: the same bits for every weight dtype, every FP8 code (subnormals, -0 and the
// largest values included), scale blocks of 128 and 16, and K with a partial last chunk.
TEST(CpuGemm, DirectPathMatchesBufferedBits) {
  struct Case { DType dtype; int64_t N, K; int block; };
  for (const Case c : {Case{DType::F8_E4M3, 37, 515, 128}, Case{DType::F8_E4M3, 20, 264, 16},
                       Case{DType::BF16, 33, 301, 128}, Case{DType::F32, 9, 260, 128},
                       Case{DType::F8_E4M3, 5, 1024, 128}}) {
    TestWeight tw = make_weight(c.dtype, c.N, c.K, 19, c.block);
    if (c.dtype == DType::F8_E4M3) {  // every code but the two NaNs, in a scrambled order
      uint8_t* q = tw.w.ptr<uint8_t>();
      for (int64_t i = 0; i < c.N * c.K; ++i) {
        const uint8_t b = static_cast<uint8_t>((i * 37 + 11) % 256);
        q[i] = (b & 0x7f) == 0x7f ? static_cast<uint8_t>(b ^ 1) : b;
      }
    }
    const int64_t M = 7;
    HostBuffer x = test::random_f32({M, c.K}, 23);
    auto backend = make_cpu_backend();
    HostBuffer full = test::f32_buffer({M, c.N}, NAN);
    backend->gemm(x.tensor(), tw.weight, full.tensor());  // buffered (M > 2)
    for (int64_t rows : {1, 2}) {
      for (int64_t m = 0; m + rows <= M; m += 3) {
        HostBuffer part = test::f32_buffer({rows, c.N}, NAN);
        backend->gemm(x.tensor().slice_rows(m, m + rows), tw.weight, part.tensor());  // direct
        ASSERT_EQ(std::memcmp(part.ptr<float>(), full.ptr<float>() + m * c.N, rows * c.N * 4), 0)
            << dtype_name(c.dtype) << " K=" << c.K << " rows " << m << "+" << rows;
      }
    }
  }
}

// The two NaN codes and huge or tiny block scales: still the buffered path's bits.
TEST(CpuGemm, DirectPathNanCodesAndExtremeScales) {
  const int64_t N = 6, K = 300, M = 5;
  for (float extreme : {0x1p110f, 0x1p-140f, -0.5f}) {
    TestWeight tw = make_weight(DType::F8_E4M3, N, K, 29);
    tw.scale.ptr<float>()[1] = extreme;  // the block at columns 128..255
    uint8_t* q = tw.w.ptr<uint8_t>();
    q[3 * K + 5] = 0x7f;   // row 3 becomes NaN, the other rows stay finite
    q[3 * K + 200] = 0xff;
    HostBuffer x = test::random_f32({M, K}, 31);
    auto backend = make_cpu_backend();
    HostBuffer full = test::f32_buffer({M, N}, 0.0f);
    backend->gemm(x.tensor(), tw.weight, full.tensor());
    ASSERT_TRUE(std::isnan(full.ptr<float>()[3]));
    ASSERT_FALSE(std::isnan(full.ptr<float>()[2]));
    for (int64_t m = 0; m < M; ++m) {
      HostBuffer one = test::f32_buffer({1, N}, 0.0f);
      backend->gemm(x.tensor().slice_rows(m, m + 1), tw.weight, one.tensor());
      ASSERT_EQ(std::memcmp(one.ptr<float>(), full.ptr<float>() + m * N, N * 4), 0) << extreme << " row " << m;
    }
  }
}

// Every finite FP8 code, under four block scales (one past the F16C converter's range, one
// that makes subnormal products), read back one weight at a time through one-hot x rows: each
// output is code x scale rounded once, against core/dtype.h's independent decoder, on the
// direct path (1 row) and the buffered one (many rows).
TEST(CpuGemm, EveryFp8CodeIsItsValueTimesTheScale) {
  const int64_t K = 512, N = 3;
  const float scales[4] = {0.0123f, -0.5f, 0x1p-140f, 0x1p110f};
  HostBuffer w(DType::F8_E4M3, {N, K});
  HostBuffer sc(DType::F32, {1, 4});
  for (int b = 0; b < 4; ++b) sc.ptr<float>()[b] = scales[b];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t code = static_cast<uint8_t>((k * 3 + 7 * n) % 256);  // every code in each half
      w.ptr<uint8_t>()[n * K + k] = (code & 0x7f) == 0x7f ? 0 : code;    // NaN codes: their own test
    }
  Weight weight;
  weight.w = w.tensor();
  weight.scale_inv = sc.tensor();
  weight.block_n = weight.block_k = 128;
  HostBuffer x = test::f32_buffer({K, K}, 0.0f);
  for (int64_t k = 0; k < K; ++k) x.ptr<float>()[k * K + k] = 1.0f;
  auto backend = make_cpu_backend();
  HostBuffer many = test::f32_buffer({K, N}, NAN);
  backend->gemm(x.tensor(), weight, many.tensor());  // buffered
  for (int64_t k = 0; k < K; ++k) {
    HostBuffer one = test::f32_buffer({1, N}, NAN);
    backend->gemm(x.tensor().slice_rows(k, k + 1), weight, one.tensor());  // direct
    for (int64_t n = 0; n < N; ++n) {
      const float want = fp8_e4m3_to_float(w.ptr<uint8_t>()[n * K + k]) * scales[k / 128];
      ASSERT_EQ(many.ptr<float>()[k * N + n], want) << "k " << k << " n " << n;
      ASSERT_EQ(one.ptr<float>()[n], want) << "k " << k << " n " << n;
    }
  }
}

// One and two x rows (the direct path) against the buffered path's rows of the same M-row
// gemm, bitwise; returns the buffered [M, N] result.
HostBuffer expect_direct_matches_buffered(const TestWeight& tw, int64_t M, int64_t N, int64_t K,
                                          uint64_t seed, const std::string& what) {
  HostBuffer x = test::random_f32({M, K}, seed);
  auto backend = make_cpu_backend();
  HostBuffer full = test::f32_buffer({M, N}, 0.0f);
  backend->gemm(x.tensor(), tw.weight, full.tensor());  // buffered
  for (int64_t rows : {1, 2}) {
    for (int64_t m = 0; m + rows <= M; ++m) {
      HostBuffer part = test::f32_buffer({rows, N}, 0.0f);
      backend->gemm(x.tensor().slice_rows(m, m + rows), tw.weight, part.tensor());  // direct
      EXPECT_EQ(std::memcmp(part.ptr<float>(), full.ptr<float>() + m * N, rows * N * 4), 0)
          << what << " rows " << m << "+" << rows;
    }
  }
  return full;
}

// Where the CPU has AVX-512, one or two rows take it for groups of 16 (8) weight rows, lane for
// lane the AVX2 path's sums: the buffered path's bits for every code (subnormals and -0
// included) under ordinary, subnormal and negative scales; a group with a NaN code or a scale
// of 2^7 or more falls back to the AVX2 path (the same bits, NaN where the code is). K = 392:
// 32-code steps and single 8-code chunks; N = 53: three groups of 16 plus five rows.
TEST(CpuGemm, DirectPathRowGroupsMatchBufferedBits) {
  const int64_t N = 53, K = 392, M = 5;
  for (int variant = 0; variant < 3; ++variant) {
    TestWeight tw = make_weight(DType::F8_E4M3, N, K, 61);
    uint8_t* q = tw.w.ptr<uint8_t>();
    for (int64_t i = 0; i < N * K; ++i) {
      const uint8_t b = static_cast<uint8_t>((i * 53 + 7) % 256);
      q[i] = (b & 0x7f) == 0x7f ? static_cast<uint8_t>(b ^ 2) : b;
    }
    float* sc = tw.scale.ptr<float>();  // [1, 4]
    sc[0] = 0x1p-140f;                  // subnormal products
    sc[1] = -0.375f;
    sc[2] = 0.0123f;
    sc[3] = 3.5f;
    if (variant == 1) sc[2] = 0x1p7f;  // out of the folded scale's range: every group falls back
    if (variant == 2) q[20 * K + 300] = 0xff;  // a NaN code in the second group
    HostBuffer full =
        expect_direct_matches_buffered(tw, M, N, K, 67, "variant " + std::to_string(variant));
    if (variant == 2) {
      ASSERT_TRUE(std::isnan(full.ptr<float>()[20]));
      ASSERT_FALSE(std::isnan(full.ptr<float>()[19]));
    }
  }
}

// The BF16 direct path's AVX-512 row groups (16 rows, 8 with two x rows; four rows' chunks per
// zmm): the buffered path's bits, with zeros, -0 and subnormal weights among random ones.
TEST(CpuGemm, Bf16DirectRowGroupsMatchBufferedBits) {
  const int64_t N = 53, K = 392, M = 5;
  TestWeight tw = make_weight(DType::BF16, N, K, 71);
  uint16_t* q = tw.w.ptr<uint16_t>();
  for (int64_t i = 0; i < N * K; i += 7)
    q[i] = static_cast<uint16_t>((i % 3 == 0 ? 0x8000 : 0) | (i % 5));
  expect_direct_matches_buffered(tw, M, N, K, 73, "bf16");
}

// The F32 direct path's AVX-512 row groups (16 rows, 8 with two x rows; two rows per zmm; the
// absorbed attention heads): the buffered path's bits. K = 392: a full 256 block and a
// partial one; N = 53: three groups of 16 plus five rows on the AVX2 path.
TEST(CpuGemm, F32DirectRowGroupsMatchBufferedBits) {
  const int64_t N = 53, K = 392, M = 5;
  TestWeight tw = make_weight(DType::F32, N, K, 81);
  expect_direct_matches_buffered(tw, M, N, K, 83, "f32");
}

// Where the CPU has AVX-512 the buffered path runs its 16-lane form (two weight rows per zmm,
// up to eight x rows per weight load, passes balanced): the 8-lane form's bits, every element
// written, for 1-13 and 64 rows, every weight dtype, N = 37 (a 5-row tile padded to 8) and
// K = 515 (a partial block ending in a partial 8-chunk), whole and from column 3.
TEST(CpuGemm, BufferedAvx512MatchesEightLaneBits) {
  if (!cpu::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  struct Case { DType dtype; int64_t N, K; int block; };
  for (const Case c : {Case{DType::F32, 37, 515, 128}, Case{DType::BF16, 37, 515, 128},
                       Case{DType::F8_E4M3, 37, 515, 128}, Case{DType::F8_E4M3, 70, 264, 16}}) {
    TestWeight tw = make_weight(c.dtype, c.N, c.K, 29, c.block);
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 64}) {
      for (int64_t n0 : {int64_t{0}, int64_t{3}}) {
        HostBuffer x = test::random_f32({M, c.K}, 31 + M);
        HostBuffer got = test::f32_buffer({M, c.N}, NAN), want = test::f32_buffer({M, c.N}, NAN);
        const cpu::Rows xr = cpu::as_rows(x.tensor(), "x");
        cpu::gemm_columns_buffered(xr, tw.weight, cpu::as_rows(got.tensor(), "got"), n0, c.N);
        cpu::gemm_columns_buffered_8lane(xr, tw.weight, cpu::as_rows(want.tensor(), "want"), n0, c.N);
        const std::string what = std::string(dtype_name(c.dtype)) + " N=" + std::to_string(c.N) +
                                 " M=" + std::to_string(M) + " n0=" + std::to_string(n0);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = n0; n < c.N; ++n)
            ASSERT_TRUE(std::isfinite(got.ptr<float>()[m * c.N + n])) << what << " m " << m << " n " << n;
        ASSERT_EQ(std::memcmp(got.ptr<float>(), want.ptr<float>(), M * c.N * 4), 0) << what;
      }
    }
  }
}

// The CPU gemm_heads (every head's column tiles in one threaded loop) gives the bits of the
// Backend default, one gemm per head, on strided [T, heads, D] views (T = 1, 2 and 5).
TEST(CpuGemm, GemmHeadsMatchesOneGemmPerHead) {
  const int64_t H = 3, N = 70, K = 40, D_in = 48, D_out = 80;
  HostBuffer w = test::random_f32({H, N, K}, 31);
  BackendOptions two;
  two.num_threads = 2;
  auto backend = make_cpu_backend(two);
  for (int64_t T : {1, 2, 5}) {
    HostBuffer x = test::random_f32({T, H, D_in}, 37);
    Tensor xv = x.tensor();  // [T, H, K] inside rows of D_in
    xv.shape[2] = K;
    HostBuffer fused = test::f32_buffer({T, H, D_out}, NAN), ref = test::f32_buffer({T, H, D_out}, NAN);
    Tensor fv = fused.tensor(), rv = ref.tensor();
    fv.shape[2] = N;
    rv.shape[2] = N;
    backend->gemm_heads(xv, w.tensor(), fv);
    backend->Backend::gemm_heads(xv, w.tensor(), rv);
    for (int64_t i = 0; i < T * H; ++i)
      ASSERT_EQ(std::memcmp(fused.ptr<float>() + i * D_out, ref.ptr<float>() + i * D_out, N * 4), 0)
          << "T " << T << " row " << i;
  }
}

// The CPU gemm_pair (both weights' column tiles in one threaded loop) gives the bits of two
// gemms (FP8 and BF16 weights of different widths, 1, 2 and 5 rows, two threads).
TEST(CpuGemm, GemmPairMatchesTwoGemms) {
  BackendOptions two;
  two.num_threads = 2;
  auto backend = make_cpu_backend(two);
  const int64_t K = 300;
  TestWeight a = make_weight(DType::F8_E4M3, 200, K, 41), b = make_weight(DType::BF16, 70, K, 43);
  for (int64_t M : {1, 2, 5}) {
    HostBuffer x = test::random_f32({M, K}, 47);
    HostBuffer p1 = test::f32_buffer({M, 200}, NAN), p2 = test::f32_buffer({M, 70}, NAN);
    HostBuffer r1 = test::f32_buffer({M, 200}, NAN), r2 = test::f32_buffer({M, 70}, NAN);
    Tensor p1t = p1.tensor(), p2t = p2.tensor(), r1t = r1.tensor(), r2t = r2.tensor();
    backend->gemm_pair(x.tensor(), a.weight, b.weight, p1t, p2t);
    backend->gemm(x.tensor(), a.weight, r1t);
    backend->gemm(x.tensor(), b.weight, r2t);
    ASSERT_EQ(std::memcmp(p1.ptr<float>(), r1.ptr<float>(), M * 200 * 4), 0) << "M " << M;
    ASSERT_EQ(std::memcmp(p2.ptr<float>(), r2.ptr<float>(), M * 70 * 4), 0) << "M " << M;
  }
  HostBuffer x = test::random_f32({2, K}, 47);
  HostBuffer bad = test::f32_buffer({2, 69}), ok = test::f32_buffer({2, 200});
  Tensor bad_t = bad.tensor(), ok_t = ok.tensor();
  EXPECT_THROW(backend->gemm_pair(x.tensor(), a.weight, b.weight, ok_t, bad_t), Error);
}

TEST(CpuGemm, StridedRowsAndBadShapes) {
  auto backend = make_cpu_backend();
  TestWeight tw = make_weight(DType::F32, 8, 16, 1);
  HostBuffer wide = test::random_f32({3, 40}, 2);
  // x = columns [4, 20) of a wider buffer: a strided row view.
  Tensor x = wide.tensor();
  x.data = wide.ptr<float>() + 4;
  x.shape[1] = 16;
  HostBuffer out = test::f32_buffer({3, 8});
  backend->gemm(x, tw.weight, out.tensor());
  for (int64_t m = 0; m < 3; ++m) {
    for (int64_t n = 0; n < 8; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < 16; ++k) ref += wide.ptr<float>()[m * 40 + 4 + k] * tw.dequant[n * 16 + k];
      EXPECT_NEAR(out.ptr<float>()[m * 8 + n], ref, 1e-5);
    }
  }
  HostBuffer bad_out = test::f32_buffer({3, 7});
  EXPECT_THROW(backend->gemm(x, tw.weight, bad_out.tensor()), Error);
  HostBuffer bad_x = test::f32_buffer({3, 15});
  EXPECT_THROW(backend->gemm(bad_x.tensor(), tw.weight, out.tensor()), Error);
  TestWeight f8 = make_weight(DType::F8_E4M3, 8, 16, 1);
  f8.weight.scale_inv = Tensor();  // missing scales
  EXPECT_THROW(backend->gemm(x, f8.weight, out.tensor()), Error);
}

}  // namespace
}  // namespace deepinfer
