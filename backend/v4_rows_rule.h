// DeepSeek-V4 decode addressing (Backend::v4_decode_rows): the per-entry rule, shared by the
// CPU reference (backend/cpu/v4_rows.cpp) and the CUDA kernel (backend/cuda/v4_rows.cu) so
// both give the same integers. Plain integers only: the kinds mirror Backend::V4RowRule::Kind.
#pragma once
#include <cstdint>

#include "backend/backend.h"

#if defined(__CUDACC__)
#define DI_V4ROWS_HD __host__ __device__ __forceinline__
#else
#define DI_V4ROWS_HD inline
#endif

namespace deepinfer::v4_rows_rule {

enum Kind : int { kWindow = 0, kVisible, kGroup, kCompleted, kListed, kGroupStart, kTableRows };

struct Rule {
  int kind = kWindow, ratio = 1, window = 0, overlap = 0;
  int32_t fill = -1;
  int64_t block_size = 1, num_blocks = 0, index_base = 0;
  int64_t n = 0;      // entries per sequence
  int64_t width = 0;  // block table width (TableRows: the table's rows)
};

// The row entry j of sequence s reads (kinds Window .. Listed), or -1 for none. e: the
// sequence's context after the step; listed: rows_in[s, j] (Listed only).
DI_V4ROWS_HD int64_t row_of(const Rule& r, int64_t e, int64_t j, int32_t listed) {
  const bool complete = r.ratio > 0 && e > 0 && e % r.ratio == 0;
  const int64_t k = r.ratio > 0 ? e / r.ratio - 1 : -1;
  switch (r.kind) {
    case kWindow: {
      const int64_t row = e - r.window + j;
      return row >= 0 && row < e ? row : -1;
    }
    case kVisible:
      return j < e / r.ratio ? j : -1;
    case kGroup: {
      if (!complete) return -1;
      const int64_t row = (k - (r.overlap ? 1 : 0)) * r.ratio + j;
      return row >= 0 ? row : -1;
    }
    case kCompleted:
      return complete && j == 0 ? k : -1;
    case kListed:
      return listed;
    default:
      return -1;
  }
}

// slots[s, j] (and index[s, j] through *index, -1 when none) for sequence s with key e
// (context, or token id for TableRows) and its table row (width entries; TableRows: the
// whole table).
DI_V4ROWS_HD int32_t entry(const Rule& r, int64_t s, int64_t j, int64_t e, const int32_t* table_row,
                           int32_t listed, int64_t* index) {
  *index = -1;
  if (r.kind == kGroupStart) {
    const bool complete = r.ratio > 0 && e > 0 && e % r.ratio == 0;
    return complete ? static_cast<int32_t>(e - r.ratio) : 0;
  }
  if (r.kind == kTableRows) return e >= 0 && e < r.width ? table_row[e * r.n + j] : r.fill;
  const int64_t row = row_of(r, e, j, listed);
  if (row < 0) return r.fill;
  const int64_t b = row / r.block_size;
  const int32_t block = b < r.width ? table_row[b] : -1;
  if (block < 0 || block >= r.num_blocks) return r.fill;
  *index = r.index_base + s * r.n + j;
  return static_cast<int32_t>(block * r.block_size + row % r.block_size);
}

// Checks the op's arguments (messages name `op`) and returns the rule of its entries
// (backend/cpu/v4_rows.cpp).
Rule make_rule(const Backend::V4RowRule& rule, const Tensor& keys, const Tensor& rows_in,
               const Tensor& table, const Tensor& slots, const Tensor& index, const char* op);

}  // namespace deepinfer::v4_rows_rule
