#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

namespace deepinfer {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 rounds up to 1 + 2^-6.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, Fp8E4m3KnownCodes) {
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);    // exp 7, mant 0
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);  // max finite
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
}

TEST(DType, Fp8E4m3RoundTripAllCodes) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    float v = fp8_e4m3_to_float(static_cast<uint8_t>(code));
    uint8_t back = float_to_fp8_e4m3(v);
    EXPECT_EQ(fp8_e4m3_to_float(back), v) << "code " << code;
  }
  EXPECT_EQ(fp8_e4m3_to_float(float_to_fp8_e4m3(1e6f)), 448.0f);  // saturates
}

TEST(DType, F16RoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(f16_to_float(float_to_f16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(1e6f))));
}

TEST(DType, ParseNames) {
  DType d;
  ASSERT_TRUE(parse_dtype("F8_E4M3", &d));
  EXPECT_EQ(d, DType::F8_E4M3);
  EXPECT_EQ(dtype_size(d), 1u);
  EXPECT_FALSE(parse_dtype("F7", &d));
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// Nearest-even rounding checked against an exhaustive search over all codes, on
// every midpoint between neighbouring codes and points just either side of it.
TEST(DType, Fp8E4m3RoundsToNearestEven) {
  auto brute = [](float a) {
    uint8_t best = 0;
    float best_err = INFINITY;
    for (uint8_t code = 0; code < 0x7f; ++code) {
      float err = std::fabs(fp8_e4m3_to_float(code) - a);
      if (err < best_err || (err == best_err && (code & 1) == 0)) {
        best_err = err;
        best = code;
      }
    }
    return best;
  };
  for (uint8_t code = 0; code < 0x7e; ++code) {
    float lo = fp8_e4m3_to_float(code), hi = fp8_e4m3_to_float(static_cast<uint8_t>(code + 1));
    float mid = 0.5f * (lo + hi);
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f), hi}) {
      ASSERT_EQ(float_to_fp8_e4m3(v), brute(v)) << v;
      ASSERT_EQ(float_to_fp8_e4m3(-v), brute(v) | 0x80) << -v;
    }
  }
}

}  // namespace
}  // namespace deepinfer
