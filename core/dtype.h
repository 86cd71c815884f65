// Element types, including the quantized formats DeepSeek checkpoints use,
// and scalar conversions to and from float (the CPU reference path).
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace deepinfer {

// F8_E8M0: an unsigned power-of-two scale byte (OCP MX "E8M0", safetensors "F8_E8M0").
enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U8, BOOL, F8_E8M0 };

// Bytes per element.
size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
// Parses a safetensors dtype string; returns false when unknown.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float f);

// FP8 e4m3fn (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities,
// 0x7f/0xff are NaN; max finite 448.
float fp8_e4m3_to_float(uint8_t bits);
// Round to nearest even with saturation to +-448 (the way torch casts after clamping).
uint8_t float_to_fp8_e4m3(float f);

// E8M0 scale (DeepSeek-V4 "ue8m0"): value 2^(bits - 127); 0xff is NaN.
float e8m0_to_float(uint8_t bits);
// FP4 e2m1 (OCP MXFP4): bit 3 sign, 2 exponent bits (bias 1), 1 mantissa bit; values
// +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}. `nibble` uses its low 4 bits.
float fp4_e2m1_to_float(uint8_t nibble);

}  // namespace deepinfer
