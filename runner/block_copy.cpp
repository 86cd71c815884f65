// Runner::copy_blocks: the device half of KV copy-on-write (kv/block_manager.h).
// Issued on the backend's stream before the step that writes the copies, so the
// step (eager or a replayed graph) sees them without a host wait.
#include "core/error.h"
#include "runner/runner.h"

namespace deepinfer {

void Runner::copy_blocks(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    DI_CHECK(c.src_block_id >= 0 && c.src_block_id < config_.num_kv_blocks && c.dst_block_id >= 0 &&
                 c.dst_block_id < config_.num_kv_blocks && c.src_block_id != c.dst_block_id,
             "runner: KV block copy ", c.src_block_id, " -> ", c.dst_block_id, " outside [0, ",
             config_.num_kv_blocks, ") or onto itself");
    for (Tensor& layer : kv_cache_) {  // [num_blocks, block_size, kv_row_dim]
      Tensor dst = layer.row(c.dst_block_id);
      backend_.copy(layer.row(c.src_block_id), dst);
    }
  }
}

}  // namespace deepinfer
