// embedding: out[T, H] = table[ids[t], :] (table F32 or BF16, ids I32).
#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void CpuBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  check_cpu(ids, DType::I32, "embedding ids");
  const Rows tab = as_rows(table, "embedding table");
  const Rows o = as_rows(out, "embedding out");
  DI_CHECK(table.ndim == 2 && (tab.dtype == DType::F32 || tab.dtype == DType::BF16),
           "embedding: table must be F32/BF16 [vocab, hidden], got ", table.describe());
  DI_CHECK(o.dtype == DType::F32 && o.rows == ids.numel() && o.cols == tab.cols,
           "embedding: out must be F32 [", ids.numel(), ", ", tab.cols, "], got ", out.describe());
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < o.rows; ++t) {
    DI_CHECK(id[t] >= 0 && id[t] < tab.rows, "embedding: token id ", id[t], " at row ", t,
             " outside the vocabulary [0, ", tab.rows, ")");
  }
  pool_->parallel_for(o.rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) row_to_float(tab.bytes(id[t]), tab.dtype, tab.cols, o.f32(t));
  });
}

}  // namespace deepinfer::cpu
