// Dequantized references of the block-scaled formats DeepSeek-V4 ships (CPU, scalar):
// FP4 e2m1 routed experts with E8M0 scales per 32 along K, FP8 e4m3 dense weights with
// 128x128 block scales (F32, or E8M0 "ue8m0" bytes).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace deepinfer {

// Packed FP4 rows as DeepSeek-V4 ships routed experts: `packed` [N, K/2] (I8 or U8;
// element k of a row is the low nibble of byte k/2 when k is even, the high nibble when
// odd) times `scales` [N, K/32] (F8_E8M0 or U8 exponent bytes, or F32 values), one per 32
// consecutive k. Writes F32 [N, K] into `out` (N*K floats). Throws Error naming `what`
// when the shapes do not match.
void dequantize_fp4_e2m1(const Tensor& packed, const Tensor& scales, float* out, const char* what);
// FP8 e4m3 [N, K] with block scales `scales` [ceil(N/block), ceil(K/block)] (F32 values
// or F8_E8M0/U8 exponent bytes) -> F32 [N, K] into `out`.
void dequantize_fp8_blocks(const Tensor& w, const Tensor& scales, int block, float* out,
                           const char* what);
// One scale element as a float (F32 value, or F8_E8M0 / U8 exponent byte).
float scale_value(const Tensor& scales, int64_t index);

}  // namespace deepinfer
