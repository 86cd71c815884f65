#include "server/engine_loop.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>

namespace deepinfer::server {

EngineLoop::EngineLoop(EngineConfig config, const std::string& step_log) {
  if (!step_log.empty()) {
    step_log_ = std::fopen(step_log.c_str(), "w");
    if (step_log_ == nullptr) throw std::runtime_error("--step-log: cannot write " + step_log);
    std::setvbuf(step_log_, nullptr, _IOLBF, 1 << 16);  // readable while the server runs
    std::fprintf(step_log_, "# t_s call_ms steps seqs prompt_tokens tasks running waiting\n");
  }
  thread_ = std::thread([this, config] { run(config); });
}

EngineLoop::~EngineLoop() {
  stop();
  if (step_log_ != nullptr) std::fclose(step_log_);
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  thread_.join();
  if (num_steps_ == 0) return;
  const Times t = times();
  const EngineStats s = stats();
  std::fprintf(stderr,
               "deepinfer serve: engine thread: %lld steps (%lld with prefill, mean batch %.1f), %.3f s in steps, "
               "%.3f s handing %lld outputs to replies (%.2f us each), %.3f s in tasks, %.3f s idle\n",
               static_cast<long long>(t.num_steps), static_cast<long long>(s.num_prefill_steps),
               s.num_steps > 0 ? static_cast<double>(s.num_step_seqs) / static_cast<double>(s.num_steps) : 0.0,
               t.step_s, t.output_s, static_cast<long long>(t.num_outputs),
               t.num_outputs > 0 ? t.output_s * 1e6 / static_cast<double>(t.num_outputs) : 0.0, t.task_s, t.idle_s);
}

EngineLoop::Times EngineLoop::times() const {
  Times t;
  t.step_s = static_cast<double>(step_ns_.load()) * 1e-9;
  t.output_s = static_cast<double>(output_ns_.load()) * 1e-9;
  t.task_s = static_cast<double>(task_ns_.load()) * 1e-9;
  std::lock_guard<std::mutex> lock(mu_);  // the wait going on now counts too
  int64_t idle = idle_ns_.load();
  if (idle_since_ != std::chrono::steady_clock::time_point{})
    idle += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - idle_since_).count();
  t.idle_s = static_cast<double>(idle) * 1e-9;
  t.num_steps = num_steps_.load();
  t.num_outputs = num_outputs_.load();
  return t;
}

std::string EngineLoop::load_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_error_;
}

std::string EngineLoop::chat_format() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chat_format_;
}

EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EngineLoop::post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void EngineLoop::set_output_executor(Executor executor) {
  std::lock_guard<std::mutex> lock(mu_);
  executor_ = std::move(executor);
}

void EngineLoop::add(Engine& engine, const Prompt& prompt, const SamplingParams& params,
                     const std::string& id, Sink sink) {
  engine.add_request(prompt, params, id);
  sinks_[id] = std::make_shared<Sink>(std::move(sink));
  num_unfinished_ = static_cast<int>(sinks_.size());
}

void EngineLoop::abort(Engine& engine, const std::string& id) {
  engine.abort(id);
  sinks_.erase(id);
  num_unfinished_ = static_cast<int>(sinks_.size());
}

void EngineLoop::run(EngineConfig config) {
  std::unique_ptr<Engine> engine;
  try {
    engine = std::make_unique<Engine>(config);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    load_error_ = e.what();
    failed_ = true;
    std::fprintf(stderr, "deepinfer serve: error: loading the model: %s\n", e.what());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = engine->stats();
    chat_format_ = engine->chat_format();
  }
  ready_ = true;
  using Clock = std::chrono::steady_clock;
  auto ns = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
  };
  // Fault injection for tests/server: DEEPINFER_SERVE_FAIL_STEP=N makes the N-th step (from 1)
  // throw, as a device failure would (the running requests end with an error, the server goes on).
  const char* fail_env = std::getenv("DEEPINFER_SERVE_FAIL_STEP");
  const int64_t fail_step = fail_env != nullptr ? std::atoll(fail_env) : 0;
  bool started = false;  // idle time counts from the first request on
  Clock::time_point first_request;
  for (;;) {
    std::deque<Task> tasks;
    Executor executor;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (started) idle_since_ = Clock::now();
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty() || engine->has_unfinished(); });
      if (started) idle_ns_ += ns(idle_since_, Clock::now());
      idle_since_ = {};
      if (stopping_) break;
      tasks.swap(tasks_);
      executor = executor_;
    }
    const auto k0 = Clock::now();
    for (Task& t : tasks) {
      try {
        t(*engine);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "deepinfer serve: task failed: %s\n", e.what());
      }
    }
    if (!tasks.empty()) task_ns_ += ns(k0, Clock::now());
    if (!started && engine->has_unfinished()) {
      started = true;
      first_request = k0;
    }
    if (!engine->has_unfinished()) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = engine->stats();
      continue;
    }
    std::vector<RequestOutput> outputs;
    const EngineStats before = step_log_ != nullptr ? engine->stats() : EngineStats{};
    const auto t0 = Clock::now();
    try {
      if (fail_step > 0 && num_steps_ + 1 == fail_step)
        throw std::runtime_error("injected failure (DEEPINFER_SERVE_FAIL_STEP)");
      outputs = engine->step();
    } catch (const std::exception& e) {
      // The step failed: every running request ends with the error (a data: error chunk when
      // streaming); the engine goes on with new requests.
      std::fprintf(stderr, "deepinfer serve: engine step failed: %s\n", e.what());
      outputs.clear();
      for (auto& [id, sink] : sinks_) {
        engine->abort(id);
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.error = std::string("engine step failed: ") + e.what();
        outputs.push_back(std::move(out));
      }
    }
    const auto t1 = Clock::now();
    if (step_log_ != nullptr) {
      const EngineStats& after = engine->stats();
      std::fprintf(step_log_, "%.6f %.3f %lld %lld %lld %zu %d %d\n", static_cast<double>(ns(first_request, t0)) * 1e-9,
                   static_cast<double>(ns(t0, t1)) * 1e-6, static_cast<long long>(after.num_steps - before.num_steps),
                   static_cast<long long>(after.num_step_seqs - before.num_step_seqs),
                   static_cast<long long>(after.num_prompt_tokens_computed - before.num_prompt_tokens_computed),
                   tasks.size(), after.num_running_seqs, after.num_waiting_seqs);
    }
    // The step's updates with their sinks (finished requests leave sinks_ here).
    auto batch = std::make_shared<std::vector<std::pair<std::shared_ptr<Sink>, RequestOutput>>>();
    batch->reserve(outputs.size());
    for (RequestOutput& out : outputs) {
      auto it = sinks_.find(out.request_id);
      if (it == sinks_.end()) continue;
      batch->emplace_back(it->second, std::move(out));
      if (batch->back().second.finished) sinks_.erase(it);
    }
    auto deliver = [batch] {
      for (auto& [sink, out] : *batch) {
        try {
          (*sink)(std::move(out));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "deepinfer serve: request %s: %s\n", out.request_id.c_str(), e.what());
        }
      }
    };
    if (!batch->empty()) {
      if (executor) executor(std::move(deliver));
      else deliver();
    }
    const auto t2 = Clock::now();
    step_ns_ += ns(t0, t1);
    output_ns_ += ns(t1, t2);
    num_steps_ += 1;
    num_outputs_ += static_cast<int64_t>(outputs.size());
    num_unfinished_ = static_cast<int>(sinks_.size());
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = engine->stats();
  }
}

}  // namespace deepinfer::server
