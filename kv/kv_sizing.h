// KV cache size from device memory, as vLLM's --gpu-memory-utilization: the
// engine may hold `utilization` of the device's memory in all; what weights,
// step buffers and workspaces (measured after a profile step) and other
// processes already hold is subtracted, and the rest becomes KV blocks.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_groups.h"

namespace deepinfer {

struct KvMemoryBudget {
  int64_t total_bytes = 0;        // device memory
  int64_t free_bytes = 0;         // free now, after the weights and a profile step
  int64_t reclaimable_bytes = 0;  // held now but given back before the cache is made (the profile's own cache)
  double utilization = 0.9;       // (0, 1]
  int64_t bytes_per_block = 0;    // all layers (unused when `groups` is set)
  int block_size = 0;             // tokens per block
  int max_model_len = 0;          // one request of this many tokens must fit
  // The model's KV groups (kv/kv_groups.h): when set, n blocks cost
  // kv_cache_bytes(groups, activation, n, limits) (every group's pool) instead of n * bytes_per_block.
  std::vector<KvGroupSpec> groups;
  DType activation = DType::F32;
  KvPoolLimits limits;
};

// Number of KV blocks: (total * utilization - in use) / bytes_per_block (with groups: the
// most blocks whose pools fit in total * utilization - in use), with
// in use = total - free - reclaimable. Throws Error naming the sizes when not
// even one request of max_model_len tokens fits, or an input is out of range.
int kv_blocks_for_memory(const KvMemoryBudget& budget);

}  // namespace deepinfer
