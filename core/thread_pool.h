// ThreadPool: a fixed set of workers for the CPU backend's data-parallel loops.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deepinfer {

class ThreadPool {
 public:
  // num_threads 0 means std::thread::hardware_concurrency() (or DEEPINFER_NUM_THREADS).
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n); the chunking
  // depends only on n and grain, never on timing, so results are reproducible.
  // Safe to call from several threads at once (jobs run one after another) and
  // from inside fn (the nested loop runs inline on the calling thread).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  // Runs chunks of the job of generation `gen` until none is left to claim.
  void run_chunks(uint64_t gen);

  // Workers wait for a job by spinning briefly (a decode step issues a loop every few
  // microseconds; a futex wake-up per loop cost more than the loop), then yielding, then
  // sleeping on work_cv_. The claim counter carries the job's generation in its top 32 bits
  // (even: a job; odd: the previous job closed while the next one's fields are written), so a
  // worker that arrives late can never claim a chunk of the next job with the last one's fields
  // or the last job's chunk with the next one's.
  std::vector<std::thread> workers_;
  std::mutex job_mutex_;  // one job at a time
  std::mutex mutex_;      // sleepers and work_cv_
  std::condition_variable work_cv_;
  std::atomic<uint64_t> claim_{0};  // (generation << 32) | next chunk
  std::atomic<int64_t> chunks_done_{0};
  std::atomic<const std::function<void(int64_t, int64_t)>*> job_{nullptr};
  std::atomic<int64_t> job_n_{0}, job_chunk_{0}, job_num_chunks_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Process-wide pool for the CPU backend (created on first use).
ThreadPool& default_thread_pool();

}  // namespace deepinfer
