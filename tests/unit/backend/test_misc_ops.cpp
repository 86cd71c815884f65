// embedding, silu_mul, add, argmax, copy: against direct formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

TEST(CpuMiscOps, EmbeddingBf16) {
  auto backend = make_cpu_backend();
  HostBuffer table(DType::BF16, {9, 6});
  for (int i = 0; i < 54; ++i) table.ptr<uint16_t>()[i] = float_to_bf16(0.1f * i - 2.0f);
  HostBuffer ids = test::i32_buffer({8, 0, 3});
  HostBuffer out = test::f32_buffer({3, 6}, NAN);
  backend->embedding(ids.tensor(), table.tensor(), out.tensor());
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(out.ptr<float>()[t * 6 + i],
                bf16_to_float(table.ptr<uint16_t>()[ids.ptr<int32_t>()[t] * 6 + i]));
    }
  }
  HostBuffer bad = test::i32_buffer({9, 0, 3});
  EXPECT_THROW(backend->embedding(bad.tensor(), table.tensor(), out.tensor()), Error);
}

TEST(CpuMiscOps, SiluMulAndAdd) {
  auto backend = make_cpu_backend();
  const int64_t T = 3, I = 7;
  HostBuffer gu = test::random_f32({T, 2 * I}, 1, 3.0f);
  HostBuffer out = test::f32_buffer({T, I}, NAN);
  backend->silu_mul(gu.tensor(), out.tensor());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      const double g = gu.ptr<float>()[t * 2 * I + i], u = gu.ptr<float>()[t * 2 * I + I + i];
      EXPECT_NEAR(out.ptr<float>()[t * I + i], g / (1 + std::exp(-g)) * u, 1e-5 * (1 + std::fabs(g * u)));
    }
  }
  HostBuffer y = test::random_f32({T, I}, 2);
  std::vector<double> ref(T * I);
  for (int64_t i = 0; i < T * I; ++i) ref[i] = double(out.ptr<float>()[i]) + y.ptr<float>()[i];
  backend->add(out.tensor(), y.tensor());
  EXPECT_LE(test::max_abs_diff(out.ptr<float>(), ref.data(), T * I), 1e-6);
  HostBuffer bad = test::f32_buffer({T, I + 1});
  EXPECT_THROW(backend->add(out.tensor(), bad.tensor()), Error);
}

TEST(CpuMiscOps, ArgmaxLowestIndexOnTies) {
  auto backend = make_cpu_backend();
  HostBuffer logits = test::f32_buffer({3, 5}, 0.0f);
  float* l = logits.ptr<float>();
  l[1] = 2.0f;
  l[3] = 2.0f;          // row 0: tie between 1 and 3
  l[5 + 4] = -1.0f;     // row 1: all zero except a smaller one -> index 0
  l[10 + 2] = NAN;      // row 2: a NaN, so no token (-1, sample_rule::kNoToken)
  l[10 + 3] = 0.5f;
  HostBuffer ids(DType::I32, {3});
  backend->argmax(logits.tensor(), ids.tensor());
  EXPECT_EQ(ids.ptr<int32_t>()[0], 1);
  EXPECT_EQ(ids.ptr<int32_t>()[1], 0);
  EXPECT_EQ(ids.ptr<int32_t>()[2], -1);
}

// Id -1 (a NaN row's "token", read by a step issued ahead) embeds as a NaN row; other ids
// outside the table still throw.
TEST(CpuMiscOps, EmbeddingOfNoTokenIsANanRow) {
  auto backend = make_cpu_backend();
  HostBuffer table = test::f32_buffer({4, 3}, 1.0f);
  HostBuffer ids = test::i32_buffer({2, -1, 0});
  HostBuffer out = test::f32_buffer({3, 3}, 0.0f);
  backend->embedding(ids.tensor(), table.tensor(), out.tensor());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out.ptr<float>()[i], 1.0f);
    EXPECT_TRUE(std::isnan(out.ptr<float>()[3 + i])) << i;
    EXPECT_EQ(out.ptr<float>()[6 + i], 1.0f);
  }
  HostBuffer bad = test::i32_buffer({-2});
  HostBuffer out1 = test::f32_buffer({1, 3}, 0.0f);
  EXPECT_THROW(backend->embedding(bad.tensor(), table.tensor(), out1.tensor()), Error);
}

// The branch-free FP8 decode used by gemm equals core's scalar decode for all 256 codes.
TEST(CpuMiscOps, Fp8DecodeAllCodes) {
  uint8_t codes[256];
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  float out[256];
  cpu::fp8_row_to_float(codes, 256, 2.0f, out);
  for (int i = 0; i < 256; ++i) {
    const float want = fp8_e4m3_to_float(codes[i]) * 2.0f;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
    } else {
      EXPECT_EQ(out[i], want) << i;
    }
  }
}

TEST(CpuMiscOps, CopyContiguousAndStrided) {
  auto backend = make_cpu_backend();
  HostBuffer src = test::random_f32({4, 6}, 3);
  DeviceBuffer dst = backend->alloc(DType::F32, {4, 6});
  backend->copy(src.tensor(), dst.tensor());
  for (int i = 0; i < 24; ++i) EXPECT_EQ(dst.tensor().ptr<float>()[i], src.ptr<float>()[i]);
  Tensor cols = src.tensor();  // [4, 3]: columns 2..4 with row stride 6
  cols.data = src.ptr<float>() + 2;
  cols.shape[1] = 3;
  DeviceBuffer packed = backend->alloc(DType::F32, {4, 3});
  backend->copy(cols, packed.tensor());
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(packed.tensor().ptr<float>()[r * 3 + c], src.ptr<float>()[r * 6 + 2 + c]);
    }
  }
  Tensor transposed = src.tensor();  // [6, 4] view with strides (1, 6): element-wise path
  transposed.shape = {6, 4, 0, 0, 0};
  transposed.stride = {1, 6, 0, 0, 0};
  DeviceBuffer t = backend->alloc(DType::F32, {6, 4});
  backend->copy(transposed, t.tensor());
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(t.tensor().ptr<float>()[r * 4 + c], src.ptr<float>()[c * 6 + r]);
  }
  DeviceBuffer wrong = backend->alloc(DType::BF16, {4, 6});
  EXPECT_THROW(backend->copy(src.tensor(), wrong.tensor()), Error);
}

}  // namespace
}  // namespace deepinfer
