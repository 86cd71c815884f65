// Runner::copy_blocks: the device half of KV copy-on-write (kv/block_manager.h).
// Issued on the backend's stream before the step that writes the copies, so the
// step (eager or a replayed graph) sees them without a host wait.
#include <string>

#include "core/error.h"
#include "runner/runner.h"

namespace deepinfer {

void Runner::copy_blocks(std::span<const BlockCopy> copies) {
  if (leads() && !copies.empty()) lead_copies(copies);
  // --dp: this rank's partition of the leader's blocks (b % P), as its blocks b / P.
  const int P = config_.comm != nullptr ? config_.dp_size : 1, own = dp_rank();
  for (BlockCopy c : copies) {
    if (P > 1) {
      if (c.src_block_id % P != own) continue;
      DI_CHECK(c.dst_block_id % P == own, "runner: KV block copy ", c.src_block_id, " -> ", c.dst_block_id,
               " crosses data-parallel partitions");
      c.src_block_id /= P;
      c.dst_block_id /= P;
    }
    DI_CHECK(c.group >= 0 && c.group < static_cast<int>(kv_.size()), "runner: KV block copy in group ", c.group,
             " of ", kv_.size());
    const int n = group_blocks_[static_cast<size_t>(c.group)];
    DI_CHECK(c.src_block_id >= 0 && c.src_block_id < n && c.dst_block_id >= 0 && c.dst_block_id < n &&
                 c.src_block_id != c.dst_block_id,
             "runner: KV block copy ", c.src_block_id, " -> ", c.dst_block_id, " outside [0, ", n,
             ") or onto itself", c.group == 0 ? std::string() : " in KV group " + std::to_string(c.group));
    for (Tensor& layer : kv_[static_cast<size_t>(c.group)]) {  // [num_blocks, block_size, row_dim]
      Tensor dst = layer.row(c.dst_block_id);
      backend_.copy(layer.row(c.src_block_id), dst);
    }
  }
}

}  // namespace deepinfer
