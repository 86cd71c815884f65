// Small helpers shared by the model layers: views into workspace buffers.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace deepinfer {

// The first `cols` columns of the first `rows` rows of a 2-D buffer (row stride kept).
inline Tensor cols_view(const Tensor& buffer, int64_t rows, int64_t cols, int64_t col_offset = 0) {
  DI_CHECK(buffer.ndim == 2 && rows <= buffer.shape[0] && col_offset + cols <= buffer.shape[1],
           "cols_view [", rows, ", ", col_offset, ":", col_offset + cols, "] outside ",
           buffer.describe());
  Tensor t = buffer;
  t.data = static_cast<char*>(buffer.data) +
           col_offset * static_cast<int64_t>(dtype_size(buffer.dtype));
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

// A [rows, heads, dim] view of a buffer whose rows are [heads * head_stride]
// (dim <= head_stride), starting at column `offset` of each head.
inline Tensor heads_view(const Tensor& buffer, int64_t rows, int64_t heads, int64_t head_stride,
                         int64_t dim, int64_t offset = 0) {
  DI_CHECK(buffer.ndim == 2 && rows <= buffer.shape[0] && heads * head_stride <= buffer.shape[1] &&
               offset + dim <= head_stride,
           "heads_view [", rows, ", ", heads, " x ", head_stride, "] outside ", buffer.describe());
  Tensor t;
  t.data = static_cast<char*>(buffer.data) + offset * static_cast<int64_t>(dtype_size(buffer.dtype));
  t.dtype = buffer.dtype;
  t.device = buffer.device;
  t.ndim = 3;
  t.shape = {rows, heads, dim, 0, 0};
  t.stride = {buffer.stride[0], head_stride, 1, 0, 0};
  return t;
}

}  // namespace deepinfer
