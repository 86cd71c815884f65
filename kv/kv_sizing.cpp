#include "kv/kv_sizing.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace deepinfer {

int kv_blocks_for_memory(const KvMemoryBudget& b) {
  DI_CHECK(b.utilization > 0.0 && b.utilization <= 1.0,
           "gpu_memory_utilization: expected a fraction in (0, 1], got ", b.utilization);
  DI_CHECK(b.total_bytes > 0 && b.free_bytes >= 0 && b.free_bytes <= b.total_bytes &&
               b.reclaimable_bytes >= 0 && (b.bytes_per_block > 0 || !b.groups.empty()) && b.block_size > 0 &&
               b.max_model_len > 0,
           "KV sizing: bad inputs (total ", b.total_bytes, " B, free ", b.free_bytes, " B, reclaimable ",
           b.reclaimable_bytes, " B, ", b.bytes_per_block, " B per block, block size ", b.block_size,
           ", max_model_len ", b.max_model_len, ")");
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const int64_t in_use = std::max<int64_t>(b.total_bytes - b.free_bytes - b.reclaimable_bytes, 0);
  const int64_t allowed = static_cast<int64_t>(static_cast<double>(b.total_bytes) * b.utilization);
  const int64_t kv_bytes = allowed - in_use;
  const int64_t blocks_per_request = (int64_t{b.max_model_len} + b.block_size - 1) / b.block_size;
  KvPoolLimits limits = b.limits;
  limits.block_size = b.block_size;
  auto bytes_of = [&](int64_t n) {
    return b.groups.empty() ? n * b.bytes_per_block : kv_cache_bytes(b.groups, b.activation, n, limits);
  };
  const int64_t num_blocks = kv_bytes <= 0 ? 0
                             : b.groups.empty() ? kv_bytes / b.bytes_per_block
                                                : kv_blocks_for_bytes(b.groups, b.activation, kv_bytes, limits);
  const int64_t bytes_per_block = num_blocks > 0 ? bytes_of(num_blocks) / num_blocks : bytes_of(1);
  DI_CHECK(num_blocks >= blocks_per_request, "KV cache: gpu_memory_utilization ", b.utilization, " of ",
           b.total_bytes / kGiB, " GiB allows ", allowed / kGiB, " GiB; weights, buffers and other users hold ",
           in_use / kGiB, " GiB, leaving ", std::max<int64_t>(kv_bytes, 0) / kGiB, " GiB = ", num_blocks,
           " blocks of ", bytes_per_block, " B, but one request of max_model_len ", b.max_model_len,
           " tokens needs ", blocks_per_request, " blocks (", bytes_of(blocks_per_request) / kGiB,
           " GiB): raise gpu_memory_utilization, lower max_model_len, or set num_kv_blocks");
  return static_cast<int>(std::min<int64_t>(num_blocks, std::numeric_limits<int32_t>::max() / b.block_size));
}

}  // namespace deepinfer
