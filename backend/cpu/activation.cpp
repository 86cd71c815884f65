// silu_mul (SwiGLU gate) and add.
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  const Rows g = as_rows(gate_up, "silu_mul gate_up");
  const Rows o = as_rows(out, "silu_mul out");
  DI_CHECK(g.dtype == DType::F32 && o.dtype == DType::F32 && g.rows == o.rows &&
               g.cols == 2 * o.cols,
           "silu_mul: gate_up ", gate_up.describe(), " must be F32 [T, 2I] for out ",
           out.describe());
  const int64_t I = o.cols;
  pool_->parallel_for(o.rows, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* gate = g.f32(t);  // [I] gate, then [I] up
      float* y = o.f32(t);
      for (int64_t i = 0; i < I; ++i) {
        const float v = gate[i];
        y[i] = v / (1.0f + std::exp(-v)) * gate[I + i];
      }
    }
  });
}

void CpuBackend::add(Tensor& x, const Tensor& y) {
  const Rows a = as_rows(x, "add x");
  const Rows b = as_rows(y, "add y");
  DI_CHECK(a.dtype == DType::F32 && b.dtype == DType::F32 && a.rows == b.rows && a.cols == b.cols,
           "add: x ", x.describe(), " and y ", y.describe(), " must be F32 of one shape");
  pool_->parallel_for(a.rows, 8, [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      float* d = a.f32(r);
      const float* v = b.f32(r);
      for (int64_t i = 0; i < a.cols; ++i) d[i] += v[i];
    }
  });
}

}  // namespace deepinfer::cpu
