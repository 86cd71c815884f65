#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace deepinfer {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, RepeatedJobs) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 200; ++rep) {
    pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
  }
  EXPECT_EQ(sum.load(), 200 * 4950);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

TEST(ThreadPool, ConcurrentCallersAndNestedLoops) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  auto job = [&] {
    for (int rep = 0; rep < 50; ++rep) {
      pool.parallel_for(64, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          pool.parallel_for(4, 1, [&](int64_t bb, int64_t ee) { total += ee - bb; });
        }
      });
    }
  };
  std::thread a(job), b(job);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 50 * 64 * 4);
}

}  // namespace
}  // namespace deepinfer
