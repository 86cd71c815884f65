// Default Backend::gemm_heads: one gemm per head on 2-D views of the 3-D operands. It is the
// reference for backends that run all heads in one launch (tests/ops compares CUDA with it).
#include "backend/backend.h"

namespace deepinfer {
namespace {

// Head h of a [T, heads, D] view as a [T, D] matrix with the view's row stride.
Tensor head_rows(const Tensor& t, int64_t h) {
  Tensor v = t;
  v.ndim = 2;
  v.shape = {t.shape[0], t.shape[2], 0, 0, 0};
  v.stride = {t.stride[0], 1, 0, 0, 0};
  v.data = static_cast<char*>(t.data) + h * t.stride[1] * static_cast<int64_t>(dtype_size(t.dtype));
  return v;
}

}  // namespace

void check_gemm_heads(const Tensor& x, const Tensor& w, const Tensor& out) {
  DI_CHECK(x.ndim == 3 && out.ndim == 3 && w.ndim == 3 && x.stride[2] == 1 && out.stride[2] == 1 &&
               w.is_contiguous() && x.shape[1] == w.shape[0] && out.shape[1] == w.shape[0] &&
               x.shape[0] == out.shape[0] && x.shape[2] == w.shape[2] && out.shape[2] == w.shape[1],
           "gemm_heads: x ", x.describe(), " (want [T, heads, K], last dim contiguous), w ",
           w.describe(), " (want contiguous [heads, N, K]) and out ", out.describe(),
           " (want [T, heads, N]) do not fit");
}

void Backend::gemm_heads(const Tensor& x, const Tensor& w, Tensor& out) {
  check_gemm_heads(x, w, out);
  for (int64_t h = 0; h < w.shape[0]; ++h) {
    Weight wh;
    wh.w = w.row(h);  // [N, K]
    Tensor oh = head_rows(out, h);
    gemm(head_rows(x, h), wh, oh);
  }
}

}  // namespace deepinfer
