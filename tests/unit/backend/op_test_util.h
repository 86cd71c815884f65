// Helpers for the CPU op tests: random host tensors and naive double references.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace deepinfer::test {

inline HostBuffer random_f32(std::vector<int64_t> dims, uint64_t seed, float scale = 1.0f) {
  HostBuffer b(DType::F32, std::move(dims));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < b.tensor().numel(); ++i) b.ptr<float>()[i] = d(rng);
  return b;
}

inline HostBuffer i32_buffer(const std::vector<int32_t>& v) {
  HostBuffer b(DType::I32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) b.ptr<int32_t>()[i] = v[i];
  return b;
}

inline HostBuffer f32_buffer(std::vector<int64_t> dims, float value = 0.0f) {
  HostBuffer b(DType::F32, std::move(dims));
  for (int64_t i = 0; i < b.tensor().numel(); ++i) b.ptr<float>()[i] = value;
  return b;
}

// Largest |a - b| over n floats.
inline double max_abs_diff(const float* a, const double* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace deepinfer::test
