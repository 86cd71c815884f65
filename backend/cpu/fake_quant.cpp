// fake_quant: DeepSeek-V4.1's cache formats (FP8 window KV, FP4 indexer keys and queries, FP4
// compressed KV) applied to F32 rows in place (host reference; backend.h spells out the math).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/backend.h"
#include "core/dtype.h"

namespace deepinfer {

namespace {

// 2^ceil(log2(t)) for a normal t > 0 (exponent field plus one unless the mantissa is zero).
float pow2_ceil(float t) {
  uint32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  const int k = static_cast<int>((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
  return std::ldexp(1.0f, k);
}

// Round to nearest even onto the e2m1 grid of a value already clamped to [-6, 6].
float e2m1_round(float q) {
  static const float kBoundary[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  static const float kValue[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = std::fabs(q);
  int code = 0;
  for (int i = 0; i < 7; ++i)
    code +=
        (i % 2 == 1 ? m >= kBoundary[i] : m > kBoundary[i]) ? 1 : 0;  // a tie goes to the even code
  return std::signbit(q) ? -kValue[code] : kValue[code];
}

}  // namespace

void Backend::fake_quant(Tensor& x, FakeQuant kind) {
  const int64_t block = kind == FakeQuant::Fp4E4m3x16 ? 16 : 32;
  DI_CHECK(x.defined() && x.device == Device::CPU && x.dtype == DType::F32 && x.ndim == 2 &&
               x.stride[1] == 1,
           "fake_quant: x must be host F32 rows [R, C] (the CPU reference), got ", x.describe());
  const int64_t R = x.size(0), C = x.size(1), ld = R > 1 ? x.stride[0] : C;
  DI_CHECK(C % block == 0, "fake_quant: ", C, " channels are not whole blocks of ", block);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t b0 = 0; b0 < C; b0 += block) {
      float* v = x.ptr<float>() + r * ld + b0;
      float amax = 0.0f;
      for (int64_t i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(v[i]));
      float scale, qmax;
      switch (kind) {
        case FakeQuant::Fp8Ue8m0x32:
          scale = pow2_ceil(std::fmax(amax, 1e-4f) * (1.0f / 448.0f));
          qmax = 448.0f;
          break;
        case FakeQuant::Fp4Ue8m0x32:
          scale = pow2_ceil(std::fmax(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
          qmax = 6.0f;
          break;
        default:
          scale = fp8_e4m3_to_float(float_to_fp8_e4m3(std::fmax(amax, 6.0f * 0x1p-9f) / 6.0f));
          qmax = 6.0f;
          break;
      }
      for (int64_t i = 0; i < block; ++i) {
        const float q = std::fmin(std::fmax(v[i] / scale, -qmax), qmax);
        v[i] = (kind == FakeQuant::Fp8Ue8m0x32 ? fp8_e4m3_to_float(float_to_fp8_e4m3(q))
                                               : e2m1_round(q)) *
               scale;
      }
    }
  }
}

}  // namespace deepinfer
