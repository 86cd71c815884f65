// The non-finite scan of loaded weights: a NaN or Inf in a checkpoint makes every request's
// logits NaN, so load_weights looks for them once, by bit pattern (no float conversion), over
// all threads, and names the first bad tensor and element. Trusted checkpoints can skip it
// (LoadOptions::check_finite, EngineConfig::skip_weight_check, --skip-weight-check).
//
// Patterns (the sign bit ignored): F32 exponent all ones (0x7F800000), BF16 0x7F80, F16 0x7C00,
// FP8 e4m3fn 0x7F (its only NaN codes are 0x7F and 0xFF; it has no Inf). Integer dtypes hold
// nothing to find.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

class ThreadPool;

// Index of the first of the n elements at `data` (dtype `dtype`) that is NaN or Inf; -1 if
// none. Eight bytes at a time; the element is found within its word only on a hit.
int64_t find_non_finite(const void* data, DType dtype, int64_t n);

struct NamedTensor {
  std::string name;    // the checkpoint's tensor name
  std::string source;  // where it comes from (its shard), for the error
  Tensor tensor;       // contiguous host view
};

// Throws Error naming the first tensor (in list order) holding a NaN or Inf: its name, source,
// dtype, shape, the first bad element's index and its bits. Splits the bytes into chunks over
// `pool` (the result does not depend on the chunking).
void check_weights_finite(const std::vector<NamedTensor>& tensors, ThreadPool& pool);

}  // namespace deepinfer
