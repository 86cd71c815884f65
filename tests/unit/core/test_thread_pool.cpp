#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

namespace deepinfer {
namespace {

// Many short loops back to back, of different sizes, so workers arriving late for one loop
// meet the next one being set up: every index of every loop runs exactly once, and no chunk
// runs after its loop returned (each loop's counters are checked, then reused by the next).
// (The pool's first spinning version let a late claim bind to the next loop's fields: golden
// tests crashed and hung on the H200 host's 16 cores. This test did not catch that on the
// 2-core dev box, where the window between the two stores is rarely hit; it is kept as the
// contract's stress test.)
TEST(ThreadPool, BackToBackLoopsRunEveryIndexOnceUnderContention) {
  ThreadPool pool(9);
  std::vector<std::atomic<int>> hits(200);
  std::atomic<int> late{0};
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = 1 + (job * 37) % 199;
    for (auto& h : hits) h.store(0, std::memory_order_relaxed);
    std::atomic<bool> done{false};
    pool.parallel_for(n, 1, [&, n](int64_t b, int64_t e) {
      if (done.load()) late.fetch_add(1);
      for (int64_t i = b; i < e && i < n; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    done.store(true);
    for (int64_t i = 0; i < 200; ++i) {
      const int want = i < n ? 1 : 0;
      ASSERT_EQ(hits[static_cast<size_t>(i)].load(), want) << "loop " << job << " (n " << n << ") index " << i;
    }
  }
  EXPECT_EQ(late.load(), 0);
}

// Every loop of two chunks gets the worker: each chunk waits (up to 20 s) until both threads
// are inside the loop. A loop the worker never sees (as every second loop was, when a job's
// generation came out odd) runs both chunks on the caller, one after the other, and times out.
TEST(ThreadPool, WorkerJoinsEveryLoop) {
  ThreadPool pool(2);
  for (int loop = 0; loop < 6; ++loop) {
    std::atomic<int> inside{0};
    std::atomic<bool> timed_out{false};
    pool.parallel_for(2, 1, [&](int64_t, int64_t) {
      inside.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (inside.load() < 2) {
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out.store(true);
          return;
        }
        std::this_thread::yield();
      }
    });
    ASSERT_FALSE(timed_out.load()) << "loop " << loop << " ran without the worker";
  }
}

}  // namespace
}  // namespace deepinfer
