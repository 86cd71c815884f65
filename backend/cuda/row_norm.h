// Plain data of the norms that finish a GEMM in its own launch (the row epilogue, gemm_pipe.cu)
// and of the standalone norm kernels' rows (elementwise.cu, fused_mla.cu): one description, one
// device function (row_norm.cuh), so every form gives the same bits.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace deepinfer::cuda {

// rms_norm of rows [rows, H]: out = x * rsqrt(mean(x^2) + eps) * w, or with res (add_rms_norm):
// res += x (rounded to res's dtype), out = the norm of res. Strides in elements; kinds as
// float_kind (0 = F32, 1 = BF16). threads: the block size rms_norm launches for H
// (norm_row_threads), which fixes the summation order.
struct NormRows {
  const void* x = nullptr;
  void* res = nullptr;
  const void* w = nullptr;
  void* out = nullptr;
  int64_t ldx = 0, ldr = 0, ldo = 0, H = 0;
  int x_kind = 0, res_kind = 0, w_kind = 0, out_kind = 0, threads = 128;
};

// The threads a norm row of H columns takes (rms_norm's block size).
inline int norm_row_threads(int64_t H) { return H >= 1024 ? 256 : 128; }

// NormRows of x -> out with weight w (and res when given: add_rms_norm), each checked as
// rms_norm / add_rms_norm check theirs (float dtypes, equal rows and columns, contiguous weight);
// errors name `what`. (fused_mla.cu)
NormRows norm_rows_of(const Tensor& x, const Tensor& w, const Tensor& out, const Tensor* res, const char* what);

// A row epilogue: after every block of a GEMM grid has stored its outputs, the rows [0, rows)
// of each side (1: add_rms_norm of o_proj; 2: rms_norm_pair of q_a | c_kv) are normalized in the
// same launch. Each block arrives on `counter` (zero between launches); the last `workers`
// blocks to arrive wait for the rest, then take the (row, side) items round-robin; the last of
// them to leave sets the counter back to 0 (so a graph replays it). (gemm_pipe.cu)
struct RowEpilogue {
  NormRows side[2];
  int sides = 0;  // 0: none
  int rows = 0;
  float eps = 0.0f;
  int workers = 1;  // blocks that run the items (at most the grid)
  unsigned* counter = nullptr;
};

}  // namespace deepinfer::cuda
