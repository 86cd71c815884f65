// embedding: out[T, H] = table[ids[t], :] (table F32 or BF16, ids I32).
// Id -1 (sample_rule::kNoToken: a NaN row's "token") gives a NaN row, as the CUDA op gives for
// any id outside the table: a step issued ahead takes its tokens from the previous step's
// device-chosen ids, and a failed row's step must not throw (its request has ended; its row
// is discarded). Other ids outside the table throw.
#include <algorithm>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/sample_rule.h"

namespace deepinfer::cpu {
namespace {
constexpr int32_t kNoTokenId = sample_rule::kNoToken;
}  // namespace

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
    DI_CHECK((id[t] >= 0 && id[t] < tab.rows) || id[t] == kNoTokenId, "embedding: token id ", id[t],
             " at row ", t, " outside the vocabulary [0, ", tab.rows, ")");
  }
  pool_->parallel_for(o.rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      if (id[t] == kNoTokenId) {
        std::fill(o.f32(t), o.f32(t) + o.cols, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      row_to_float(tab.bytes(id[t]), tab.dtype, tab.cols, o.f32(t));
    }
  });
}

}  // namespace deepinfer::cpu
