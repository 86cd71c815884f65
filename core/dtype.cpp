#include "core/dtype.h"

#include <array>
#include <cmath>

namespace deepinfer {

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 11> kInfo{{
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::I64, "I64", 8},
    {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
    {DType::F8_E8M0, "F8_E8M0", 1},
}};
}  // namespace

size_t dtype_size(DType dtype) { return kInfo[static_cast<size_t>(dtype)].size; }
std::string_view dtype_name(DType dtype) { return kInfo[static_cast<size_t>(dtype)].name; }

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& info : kInfo) {
    if (info.name == name) {
      *out = info.dtype;
      return true;
    }
  }
  return false;
}

float f16_to_float(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    value = mant ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -value : value;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < std::ldexp(1.0f, -14)) {  // subnormal: multiples of 2^-24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  int exp = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    ++exp;
  }
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
}

float fp8_e4m3_to_float(uint8_t b) {
  uint32_t sign = b >> 7, exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  float value;
  if (exp == 0xf && mant == 0x7) return NAN;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x8u), static_cast<int>(exp) - 10);
  }
  return sign ? -value : value;
}

uint8_t float_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fmin(std::fabs(f), 448.0f);
  if (a == 0.0f) return sign;
  // Normal codes have exponent e in [-6, 8] and 3 mantissa bits: spacing 2^(e-3).
  // Below 2^-6 everything is subnormal with spacing 2^-9. Scale so the spacing
  // becomes 1, round half to even with nearbyint (default rounding mode), rebuild.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  const int exp = std::max(e - 1, -6);
  const float q = std::nearbyint(std::ldexp(a, 3 - exp));  // in [0, 16]
  uint32_t mant = static_cast<uint32_t>(q);
  int biased;
  if (exp == -6 && mant < 8) {
    biased = 0;  // subnormal (or zero)
  } else {
    int ex = exp;
    if (mant >= 16) {  // rounded up into the next binade
      mant >>= 1;
      ++ex;
    }
    biased = ex + 7;
    mant -= 8;
  }
  uint8_t code = static_cast<uint8_t>((biased << 3) | mant);
  if (code > 0x7e) code = 0x7e;  // 448 saturates (0x7f is NaN)
  return static_cast<uint8_t>(sign | code);
}

}  // namespace deepinfer

namespace deepinfer {

float e8m0_to_float(uint8_t bits) {
  if (bits == 0xff) return NAN;
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

float fp4_e2m1_to_float(uint8_t nibble) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[nibble & 0x7u];
  return (nibble & 0x8u) ? -m : m;
}

}  // namespace deepinfer
