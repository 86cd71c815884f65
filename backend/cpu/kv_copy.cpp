// kv_store: writes each token's latent row into its paged-cache slot
// (slot = block_id * block_size + offset; -1 skips the token).
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void CpuBackend::kv_store(const Tensor& rows, PagedKV& kv) {
  const Rows r = as_rows(rows, "kv_store rows");
  check_cpu(kv.cache, "kv_store cache");
  check_cpu(kv.slot_mapping, DType::I32, "kv_store slot_mapping");
  DI_CHECK(r.dtype == DType::F32, "kv_store: rows must be F32, got ", rows.describe());
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() && kv.cache.size(2) == r.cols &&
               (kv.cache.dtype == DType::F32 || kv.cache.dtype == DType::BF16),
           "kv_store: cache must be contiguous F32/BF16 [blocks, block_size, ", r.cols, "], got ",
           kv.cache.describe());
  DI_CHECK(kv.slot_mapping.numel() == r.rows, "kv_store: slot_mapping ",
           kv.slot_mapping.describe(), " must have one slot per row (", r.rows, ")");
  const int64_t num_slots = kv.cache.size(0) * kv.cache.size(1);
  const int32_t* slots = kv.slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < r.rows; ++t) {
    DI_CHECK(slots[t] >= -1 && slots[t] < num_slots, "kv_store: slot ", slots[t], " of token ", t,
             " outside the cache's ", num_slots, " slots");
  }
  for (int64_t t = 0; t < r.rows; ++t) {
    if (slots[t] < 0) continue;
    const float* src = r.f32(t);
    if (kv.cache.dtype == DType::F32) {
      std::memcpy(kv.cache.ptr<float>() + static_cast<int64_t>(slots[t]) * r.cols, src,
                  static_cast<size_t>(r.cols) * 4);
    } else {
      uint16_t* dst = kv.cache.ptr<uint16_t>() + static_cast<int64_t>(slots[t]) * r.cols;
      for (int64_t i = 0; i < r.cols; ++i) dst[i] = float_to_bf16(src[i]);
    }
  }
}

}  // namespace deepinfer::cpu
