#include "kv/kv_groups.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace deepinfer {

int64_t kv_pool_blocks(const KvGroupSpec& g, int64_t num_blocks, const KvPoolLimits& lim) {
  g.validate();
  DI_CHECK(lim.block_size > 0 && lim.max_num_seqs > 0 && lim.max_num_batched_tokens > 0 && num_blocks >= 0,
           "KV group '", g.name, "': bad pool limits (block size ", lim.block_size, ", max_num_seqs ",
           lim.max_num_seqs, ", max_num_batched_tokens ", lim.max_num_batched_tokens, ", ", num_blocks, " blocks)");
  if (num_blocks == 0) return 0;
  const int64_t bs = lim.block_size, seqs = lim.max_num_seqs;
  if (g.window > 0) {
    const int64_t per_seq = (g.window - 1 + bs - 1) / bs + 3;
    return std::min(num_blocks, seqs * per_seq + (lim.max_num_batched_tokens + bs - 1) / bs);
  }
  if (g.tokens_per_row == 1) return num_blocks;
  return (num_blocks + g.tokens_per_row - 1) / g.tokens_per_row + seqs;
}

std::vector<KvGroupPool> kv_group_pools(std::span<const KvGroupSpec> groups, int64_t num_blocks,
                                        const KvPoolLimits& limits) {
  std::vector<KvGroupPool> out;
  for (const KvGroupSpec& g : groups) {
    const int64_t n = kv_pool_blocks(g, num_blocks, limits);
    DI_CHECK(n <= std::numeric_limits<int32_t>::max(), "KV group '", g.name, "': ", n, " blocks");
    out.push_back({static_cast<int>(n), g.tokens_per_row, g.window});
  }
  return out;
}

int64_t kv_cache_bytes(std::span<const KvGroupSpec> groups, DType activation, int64_t num_blocks,
                       const KvPoolLimits& limits) {
  int64_t bytes = 0;
  for (const KvGroupSpec& g : groups)
    bytes += kv_pool_blocks(g, num_blocks, limits) * g.num_layers * limits.block_size * g.row_bytes(activation);
  return bytes;
}

int64_t kv_blocks_for_bytes(std::span<const KvGroupSpec> groups, DType activation, int64_t bytes,
                            const KvPoolLimits& limits) {
  DI_CHECK(!groups.empty(), "KV sizing: the model declares no KV group");
  // kv_cache_bytes grows with num_blocks: the largest count that fits, by bisection.
  int64_t lo = 0, hi = 1;
  while (hi < (int64_t{1} << 40) && kv_cache_bytes(groups, activation, hi, limits) <= bytes) hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (kv_cache_bytes(groups, activation, mid, limits) <= bytes ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace deepinfer
