// rms_norm and add_rms_norm (HF DeepseekV3RMSNorm: x * rsqrt(mean(x^2) + eps) * weight,
// all in fp32), and layer_norm (torch.nn.LayerNorm: V3.2's indexer keys). The sum of squares of a row runs in 8 fixed lanes, so a row's result
// never depends on the other rows of the call.
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {
namespace {

// Sum of squares in 8 lanes (lane i takes elements i, i+8, ...), fixed pairwise finish.
float sum_squares(const float* x, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int i = 0; i < 8; ++i) lane[i] += x[k + i] * x[k + i];
  }
  for (int i = 0; k + i < n; ++i) lane[i] += x[k + i] * x[k + i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

void norm_row(const float* x, const float* w, float eps, int64_t n, float* out) {
  const float inv = 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

std::vector<float> weight_to_float(const Tensor& weight, int64_t cols, const char* what) {
  check_cpu(weight, what);
  DI_CHECK(weight.numel() == cols && weight.is_contiguous() &&
               (weight.dtype == DType::F32 || weight.dtype == DType::BF16),
           what, ": norm weight must be F32/BF16 [", cols, "], got ", weight.describe());
  std::vector<float> w(static_cast<size_t>(cols));
  row_to_float(weight.data, weight.dtype, cols, w.data());
  return w;
}

// out's rows, checked to be F32 of x's shape (x's rows xr F32 too); op names the op.
Rows same_shape_f32_out(const Rows& xr, const Tensor& x, const Tensor& out, const std::string& op) {
  const Rows o = as_rows(out, (op + " out").c_str());
  DI_CHECK(xr.dtype == DType::F32 && o.dtype == DType::F32 && o.rows == xr.rows &&
               o.cols == xr.cols,
           op, ": x ", x.describe(), " and out ", out.describe(), " must be F32 of one shape");
  return o;
}

}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const Rows xr = as_rows(x, "rms_norm x");
  const Rows o = same_shape_f32_out(xr, x, out, "rms_norm");
  const std::vector<float> w = weight_to_float(weight, xr.cols, "rms_norm weight");
  pool_->parallel_for(xr.rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) norm_row(xr.f32(r), w.data(), eps, xr.cols, o.f32(r));
  });
}

void CpuBackend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                              Tensor& out) {
  const Rows res = as_rows(residual, "add_rms_norm residual");
  const Rows xr = as_rows(x, "add_rms_norm x");
  const Rows o = as_rows(out, "add_rms_norm out");
  DI_CHECK(res.dtype == DType::F32 && xr.dtype == DType::F32 && o.dtype == DType::F32 &&
               xr.rows == res.rows && xr.cols == res.cols && o.rows == res.rows &&
               o.cols == res.cols,
           "add_rms_norm: residual ", residual.describe(), ", x ", x.describe(), " and out ",
           out.describe(), " must be F32 of one shape");
  const std::vector<float> w = weight_to_float(weight, res.cols, "add_rms_norm weight");
  pool_->parallel_for(res.rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* h = res.f32(r);
      const float* d = xr.f32(r);
      for (int64_t i = 0; i < res.cols; ++i) h[i] += d[i];
      norm_row(h, w.data(), eps, res.cols, o.f32(r));
    }
  });
}

void CpuBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                            Tensor& out) {
  const Rows xr = as_rows(x, "layer_norm x");
  const Rows o = same_shape_f32_out(xr, x, out, "layer_norm");
  const std::vector<float> w = weight_to_float(weight, xr.cols, "layer_norm weight");
  const std::vector<float> bv = weight_to_float(bias, xr.cols, "layer_norm bias");
  const int64_t n = xr.cols;
  pool_->parallel_for(xr.rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* in = xr.f32(r);
      float mean = 0.0f;
      for (int64_t i = 0; i < n; ++i) mean += in[i];
      mean /= static_cast<float>(n);
      float var = 0.0f;
      for (int64_t i = 0; i < n; ++i) var += (in[i] - mean) * (in[i] - mean);
      const float inv = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
      float* y = o.f32(r);
      for (int64_t i = 0; i < n; ++i) y[i] = (in[i] - mean) * inv * w[i] + bv[i];
    }
  });
}

}  // namespace deepinfer::cpu
