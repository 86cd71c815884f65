// HttpServer::post_serial, the executor the engine loop hands each step's outputs to: tasks run
// on the I/O threads one at a time, in the order they were posted (a request's updates must not
// overtake each other), from any number of posting threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "server/http.h"

namespace deepinfer::server {
namespace {

TEST(HttpServer, PostSerialRunsTasksOneAtATimeInOrder) {
  HttpOptions options;
  options.port = 0;
  options.num_threads = 4;
  HttpServer http(options, [](HttpRequest&&, std::shared_ptr<Reply>) {});
  http.start();
  constexpr int kTasks = 4000;
  std::vector<int> order;  // touched only by the tasks
  std::atomic<int> running{0}, max_running{0}, done{0};
  for (int i = 0; i < kTasks; ++i) {
    http.post_serial([&, i] {
      const int now = ++running;
      int seen = max_running.load();
      while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
      }
      order.push_back(i);
      --running;
      ++done;
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (done.load() < kTasks && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http.stop();
  ASSERT_EQ(done.load(), kTasks);
  EXPECT_EQ(max_running.load(), 1);
  for (int i = 0; i < kTasks; ++i) ASSERT_EQ(order[static_cast<size_t>(i)], i);
}

}  // namespace
}  // namespace deepinfer::server
