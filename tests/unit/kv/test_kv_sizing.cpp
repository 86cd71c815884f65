// kv_blocks_for_memory against the arithmetic written out by hand for a few
// device sizes, and the errors it must give.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "kv/kv_sizing.h"

namespace deepinfer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

KvMemoryBudget h200_like() {
  KvMemoryBudget b;
  b.total_bytes = 140 * kGiB;
  b.free_bytes = 120 * kGiB;  // 20 GiB held: weights, buffers, workspaces
  b.reclaimable_bytes = 0;
  b.utilization = 0.9;
  b.bytes_per_block = 12 * 64 * 576 * 2;  // 12 layers, 64 tokens, 576 bf16 values
  b.block_size = 64;
  b.max_model_len = 8192;
  return b;
}

TEST(KvSizing, UsableMemoryOverBytesPerBlock) {
  KvMemoryBudget b = h200_like();
  // 0.9 * 140 GiB = 126 GiB allowed, 20 GiB in use -> 106 GiB of KV.
  const int64_t expected = (static_cast<int64_t>(140.0 * kGiB * 0.9) - 20 * kGiB) / b.bytes_per_block;
  EXPECT_EQ(kv_blocks_for_memory(b), expected);
  // The profile's own cache is given back first: it counts as available.
  b.free_bytes -= 2 * kGiB;
  b.reclaimable_bytes = 2 * kGiB;
  EXPECT_EQ(kv_blocks_for_memory(b), expected);
  // A lower utilization leaves less; 1.0 takes everything free.
  b.utilization = 0.5;
  EXPECT_EQ(kv_blocks_for_memory(b), (70 * kGiB - 20 * kGiB) / b.bytes_per_block);
  b.utilization = 1.0;
  EXPECT_EQ(kv_blocks_for_memory(b), 120 * kGiB / b.bytes_per_block);
}

TEST(KvSizing, ErrorNamesTheSizesWhenOneRequestDoesNotFit) {
  KvMemoryBudget b = h200_like();
  b.utilization = 0.15;  // 21 GiB allowed, 20 GiB in use: 1 GiB < ...
  b.max_model_len = 1 << 20;  // ... one 1M-token request (~13 GiB)
  try {
    kv_blocks_for_memory(b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("gpu_memory_utilization 0.15"), std::string::npos) << m;
    EXPECT_NE(m.find("max_model_len 1048576"), std::string::npos) << m;
    EXPECT_NE(m.find("16384 blocks"), std::string::npos) << m;
  }
  b.utilization = 0.1;  // less than what is already in use
  b.max_model_len = 64;
  EXPECT_THROW(kv_blocks_for_memory(b), Error);
  b.utilization = 0.15;  // exactly enough for one request of 64 tokens and more
  EXPECT_GT(kv_blocks_for_memory(b), 1);
}

TEST(KvSizing, RejectsBadInputs) {
  for (double u : {0.0, -0.5, 1.5}) {
    KvMemoryBudget b = h200_like();
    b.utilization = u;
    EXPECT_THROW(kv_blocks_for_memory(b), Error) << u;
  }
  KvMemoryBudget b = h200_like();
  b.free_bytes = b.total_bytes + 1;
  EXPECT_THROW(kv_blocks_for_memory(b), Error);
  b = h200_like();
  b.bytes_per_block = 0;
  EXPECT_THROW(kv_blocks_for_memory(b), Error);
}

}  // namespace
}  // namespace deepinfer
