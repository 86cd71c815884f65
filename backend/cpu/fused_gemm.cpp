// Default Backend::gemm_pair and Backend::gemm_swiglu: compositions of gemm, silu_mul and
// add. They are the reference for backends that fuse them (tests/ops compares CUDA with
// them) and the CPU implementation.
#include "backend/backend.h"

namespace deepinfer {

void Backend::gemm_pair(const Tensor& x, const Weight& w1, const Weight& w2, Tensor& out1,
                        Tensor& out2) {
  gemm(x, w1, out1);
  gemm(x, w2, out2);
}

void Backend::gemm_swiglu(const Tensor& gate_up, const Weight& w, Tensor& out, bool accumulate) {
  DI_CHECK(gate_up.ndim == 2 && gate_up.size(1) % 2 == 0 && gate_up.size(1) / 2 == w.in_features(),
           "gemm_swiglu: gate_up ", gate_up.describe(), " must be [T, 2 * ", w.in_features(),
           "] for weight ", w.w.describe());
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  DeviceBuffer act = alloc(activation_dtype(), {T, I});  // silu(gate) * up  [T, I]
  silu_mul(gate_up, act.tensor());
  if (!accumulate) {
    gemm(act.tensor(), w, out);
    return;
  }
  DeviceBuffer y = alloc(out.dtype, {T, w.out_features()});  // [T, N]
  gemm(act.tensor(), w, y.tensor());
  add(out, y.tensor());
}

}  // namespace deepinfer
