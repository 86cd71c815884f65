// rms_norm, add_rms_norm and rope vs double-precision formulas.
#include <gtest/gtest.h>

#include "op_test_util.h"

namespace deepinfer {
namespace {

TEST(CpuNorm, RmsNormStridedRows) {
  auto backend = make_cpu_backend();
  const int64_t R = 5, D = 67, W = 80;
  HostBuffer wide = test::random_f32({R, W}, 1);
  Tensor x = wide.tensor();  // [R, D] view with row stride W
  x.shape[1] = D;
  HostBuffer weight(DType::BF16, {D});
  for (int64_t i = 0; i < D; ++i) weight.ptr<uint16_t>()[i] = float_to_bf16(0.5f + 0.01f * i);
  HostBuffer out = test::f32_buffer({R, D}, NAN);
  const float eps = 1e-6f;
  backend->rms_norm(x, weight.tensor(), eps, out.tensor());
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(wide.ptr<float>()[r * W + i]) * wide.ptr<float>()[r * W + i];
    const double inv = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t i = 0; i < D; ++i) {
      const double ref = wide.ptr<float>()[r * W + i] * inv * bf16_to_float(weight.ptr<uint16_t>()[i]);
      ASSERT_NEAR(out.ptr<float>()[r * D + i], ref, 1e-5 * (1 + std::fabs(ref)));
    }
  }
}

TEST(CpuNorm, AddRmsNorm) {
  auto backend = make_cpu_backend();
  const int64_t R = 3, D = 33;
  HostBuffer res = test::random_f32({R, D}, 2), x = test::random_f32({R, D}, 3);
  HostBuffer weight = test::random_f32({D}, 4);
  std::vector<double> sum(R * D);
  for (int64_t i = 0; i < R * D; ++i) sum[i] = double(res.ptr<float>()[i]) + x.ptr<float>()[i];
  HostBuffer out = test::f32_buffer({R, D}, NAN);
  backend->add_rms_norm(res.tensor(), x.tensor(), weight.tensor(), 1e-5f, out.tensor());
  EXPECT_LE(test::max_abs_diff(res.ptr<float>(), sum.data(), R * D), 1e-6);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += sum[r * D + i] * sum[r * D + i];
    const double inv = 1.0 / std::sqrt(ss / D + 1e-5);
    for (int64_t i = 0; i < D; ++i) {
      const double ref = sum[r * D + i] * inv * weight.ptr<float>()[i];
      ASSERT_NEAR(out.ptr<float>()[r * D + i], ref, 1e-5 * (1 + std::fabs(ref)));
    }
  }
  HostBuffer bad = test::f32_buffer({D + 1});
  EXPECT_THROW(backend->rms_norm(x.tensor(), bad.tensor(), 1e-5f, out.tensor()), Error);
}

void check_rope(bool interleave) {
  auto backend = make_cpu_backend();
  const int64_t T = 4, H = 3, D = 24, offset = 8, rd = 16, P = 50;
  HostBuffer x = test::random_f32({T, H, D}, 9);
  std::vector<float> orig(x.ptr<float>(), x.ptr<float>() + T * H * D);
  HostBuffer table(DType::F32, {P, rd});
  std::vector<double> freq(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i) freq[i] = std::pow(10000.0, -2.0 * i / rd);
  const double scale = 1.3;  // a YaRN-style attention factor folded into the table
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t i = 0; i < rd / 2; ++i) {
      table.ptr<float>()[p * rd + i] = float(std::cos(p * freq[i]) * scale);
      table.ptr<float>()[p * rd + rd / 2 + i] = float(std::sin(p * freq[i]) * scale);
    }
  }
  HostBuffer pos = test::i32_buffer({0, 7, 49, 3});
  backend->rope(x.tensor(), pos.tensor(), table.tensor(), offset, rd, interleave);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float* o = orig.data() + (t * H + h) * D;
      const float* y = x.ptr<float>() + (t * H + h) * D;
      for (int64_t i = 0; i < offset; ++i) ASSERT_EQ(y[i], o[i]);  // untouched nope part
      for (int64_t i = 0; i < rd / 2; ++i) {
        const int64_t a = offset + (interleave ? 2 * i : i);
        const int64_t b = offset + (interleave ? 2 * i + 1 : i + rd / 2);
        const double ang = pos.ptr<int32_t>()[t] * freq[i];
        const double c = float(std::cos(ang) * scale), s = float(std::sin(ang) * scale);
        ASSERT_NEAR(y[a], o[a] * c - o[b] * s, 1e-5);
        ASSERT_NEAR(y[b], o[b] * c + o[a] * s, 1e-5);
      }
    }
  }
  HostBuffer bad_pos = test::i32_buffer({0, 7, 50, 3});
  EXPECT_THROW(backend->rope(x.tensor(), bad_pos.tensor(), table.tensor(), offset, rd, interleave),
               Error);
}

TEST(CpuRope, Interleaved) { check_rope(true); }
TEST(CpuRope, Halves) { check_rope(false); }

}  // namespace
}  // namespace deepinfer
