#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

#include "core/settings.h"

namespace deepinfer {

namespace {
// True on a pool worker and on a thread running a job's chunk: nested loops run inline.
thread_local bool t_inside_job = false;

struct InsideJob {
  bool previous = t_inside_job;
  InsideJob() { t_inside_job = true; }
  ~InsideJob() { t_inside_job = previous; }
};
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(env_settings().get_int("DEEPINFER_NUM_THREADS"));
    if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t max_chunks = (n + grain - 1) / grain;
  int64_t num_chunks = std::min<int64_t>(max_chunks, num_threads() * 4);
  if (workers_.empty() || num_chunks <= 1 || t_inside_job) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> job_lock(job_mutex_);
  InsideJob inside;
  int64_t chunk = (n + num_chunks - 1) / num_chunks;
  num_chunks = (n + chunk - 1) / chunk;
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  job_num_chunks_ = num_chunks;
  next_chunk_ = 0;
  chunks_done_ = 0;
  ++generation_;
  work_cv_.notify_all();
  // The caller works too.
  while (next_chunk_ < job_num_chunks_) {
    int64_t c = next_chunk_++;
    lock.unlock();
    fn(c * chunk, std::min(n, (c + 1) * chunk));
    lock.lock();
    ++chunks_done_;
  }
  done_cv_.wait(lock, [&] { return chunks_done_ == job_num_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  t_inside_job = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_num_chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t n = job_n_, chunk = job_chunk_;
      lock.unlock();
      (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
      lock.lock();
      if (++chunks_done_ == job_num_chunks_) done_cv_.notify_all();
    }
  }
}

ThreadPool& default_thread_pool() {
  static ThreadPool pool;
  return pool;
}

}  // namespace deepinfer
