// argmax over each logits row (lowest index wins ties; a row with a NaN gets
// sample_rule::kNoToken, -1).
#include "backend/cpu/cpu_backend.h"
#include "backend/sample_rule.h"

namespace deepinfer::cpu {

void CpuBackend::argmax(const Tensor& logits, Tensor& ids) {
  const Rows l = as_rows(logits, "argmax logits");
  check_cpu(ids, DType::I32, "argmax ids");
  DI_CHECK(l.dtype == DType::F32 && l.cols > 0, "argmax: logits must be F32 [R, V>0], got ",
           logits.describe());
  DI_CHECK(ids.numel() == l.rows && ids.is_contiguous(), "argmax: ids ", ids.describe(),
           " must hold ", l.rows, " entries");
  int32_t* out = ids.ptr<int32_t>();
  pool_->parallel_for(l.rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* v = l.f32(r);
      int64_t best = 0;
      bool nan = false;
      for (int64_t i = 0; i < l.cols; ++i) {
        nan |= sample_rule::is_nan(v[i]);
        if (v[i] > v[best]) best = i;
      }
      out[r] = nan ? sample_rule::kNoToken : static_cast<int32_t>(best);
    }
  });
}

}  // namespace deepinfer::cpu
