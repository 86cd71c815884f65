// Helpers for the CPU op tests: random host tensors and naive double references.
#pragma once
#include <algorithm>
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

// A PagedKV over host tensors (cache [blocks, block_size, row], block_tables I32 [S, max],
// seq_lens I32 [S], query_start I32 [S + 1]).
inline PagedKV paged_kv(const Tensor& cache, const Tensor& block_tables, const Tensor& seq_lens,
                        const Tensor& query_start, int num_seqs, int max_query_len,
                        int max_seq_len) {
  PagedKV kv;
  kv.cache = cache;
  kv.block_tables = block_tables;
  kv.seq_lens = seq_lens;
  kv.query_start = query_start;
  kv.num_seqs = num_seqs;
  kv.max_query_len = max_query_len;
  kv.max_seq_len = max_seq_len;
  return kv;
}

// out[D_v] = softmax_j(q·k_j * scale) v_j over the given keys/values (double).
inline std::vector<double> naive_attention(const float* q, const std::vector<const float*>& keys,
                                           const std::vector<const float*>& values, int64_t dk,
                                           int64_t dv, double scale) {
  std::vector<double> s(keys.size());
  double m = -1e300;
  for (size_t j = 0; j < keys.size(); ++j) {
    double d = 0;
    for (int64_t i = 0; i < dk; ++i) d += double(q[i]) * keys[j][i];
    s[j] = d * scale;
    m = std::max(m, s[j]);
  }
  double sum = 0;
  for (double& v : s) sum += (v = std::exp(v - m));
  std::vector<double> out(dv, 0.0);
  for (size_t j = 0; j < keys.size(); ++j) {
    for (int64_t i = 0; i < dv; ++i) out[i] += s[j] / sum * values[j][i];
  }
  return out;
}

}  // namespace deepinfer::test
