#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

#include <sched.h>

#include "core/settings.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DI_CPU_RELAX() _mm_pause()
#else
#define DI_CPU_RELAX() ((void)0)
#endif

namespace deepinfer {

namespace {
// True on a pool worker and on a thread running a job's chunk: nested loops run inline.
thread_local bool t_inside_job = false;

struct InsideJob {
  bool previous = t_inside_job;
  InsideJob() { t_inside_job = true; }
  ~InsideJob() { t_inside_job = previous; }
};

// Waiting for the next job: ~this many pause loops (tens of microseconds), then yields (which
// give the core away when more threads than cores want it, as under `ctest -j`), then sleep.
constexpr int kSpins = 2000;
constexpr int kYields = 200;

uint64_t generation_of(uint64_t claim) { return claim >> 32; }
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
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(mutex_);
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunks(uint64_t gen) {
  uint64_t claim = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (generation_of(claim) != gen) return;  // that job is over; a newer one is not ours
    const int64_t c = static_cast<int64_t>(claim & 0xffffffffu);
    // The job's fields are read before the claim: a successful claim proves the job (and so
    // these fields) did not change in between, since a job ends only when every chunk ran.
    const auto* fn = job_.load(std::memory_order_relaxed);
    const int64_t n = job_n_.load(std::memory_order_relaxed);
    const int64_t chunk = job_chunk_.load(std::memory_order_relaxed);
    const int64_t num_chunks = job_num_chunks_.load(std::memory_order_relaxed);
    if (c >= num_chunks) return;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;  // `claim` reloaded
    (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
    chunks_done_.fetch_add(1, std::memory_order_acq_rel);
    claim = claim_.load(std::memory_order_acquire);
  }
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
  const int64_t chunk = (n + num_chunks - 1) / num_chunks;
  num_chunks = (n + chunk - 1) / chunk;
  // Close the previous job before its fields change: a worker still in run_chunks for it
  // read those fields before its claim, and its claim (a CAS on the previous value) now
  // fails. The closed state's odd generation is never a job to run. The exchange (acq_rel)
  // orders every earlier successful claim, and the field reads before it, before the writes
  // below.
  const uint64_t closed = generation_of(claim_.load(std::memory_order_relaxed)) + 1;
  claim_.exchange((closed << 32) | 0xffffffffu, std::memory_order_acq_rel);
  job_.store(&fn, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  job_chunk_.store(chunk, std::memory_order_relaxed);
  job_num_chunks_.store(num_chunks, std::memory_order_relaxed);
  chunks_done_.store(0, std::memory_order_relaxed);
  // The next even generation after `closed` (odd): an odd one here (closed + 2, as before
  // 2026-12-03) was never picked up by the workers, so every second loop ran on the caller
  // alone while the workers spun down to sleep.
  const uint64_t gen = closed + 1;
  claim_.store(gen << 32, std::memory_order_seq_cst);  // publishes the fields above
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mutex_); }
    work_cv_.notify_all();
  }
  run_chunks(gen);  // the caller works too
  for (int spins = 0; chunks_done_.load(std::memory_order_acquire) != num_chunks; ++spins) {
    if (spins < kSpins) DI_CPU_RELAX();
    else sched_yield();
  }
}

void ThreadPool::worker_loop(int) {
  t_inside_job = true;
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = seen;
    for (int spins = 0;; ++spins) {
      if (stop_.load(std::memory_order_acquire)) return;
      gen = generation_of(claim_.load(std::memory_order_acquire));
      if (gen != seen && gen % 2 == 0) break;  // odd: a job being set up
      if (spins < kSpins) {
        DI_CPU_RELAX();
      } else if (spins < kSpins + kYields) {
        sched_yield();
      } else {
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        work_cv_.wait(lock, [&] {
          const uint64_t g = generation_of(claim_.load(std::memory_order_seq_cst));
          return stop_.load() || (g != seen && g % 2 == 0);
        });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        spins = 0;
      }
    }
    seen = gen;
    run_chunks(gen);
  }
}

ThreadPool& default_thread_pool() {
  static ThreadPool pool;
  return pool;
}

}  // namespace deepinfer
