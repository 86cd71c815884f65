#include "server/engine_loop.h"

#include <chrono>
#include <cstdio>
#include <exception>

namespace deepinfer::server {

EngineLoop::EngineLoop(EngineConfig config) : thread_([this, config] { run(config); }) {}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  thread_.join();
  if (num_steps_ > 0)
    std::fprintf(stderr,
                 "deepinfer serve: engine thread: %lld steps, %.3f s in steps, %.3f s handing %lld outputs to "
                 "replies (%.2f us each)\n",
                 static_cast<long long>(num_steps_.load()), step_seconds(), output_seconds(),
                 static_cast<long long>(num_outputs_.load()),
                 num_outputs_ > 0 ? output_seconds() * 1e6 / static_cast<double>(num_outputs_.load()) : 0.0);
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
  for (;;) {
    std::deque<Task> tasks;
    Executor executor;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty() || engine->has_unfinished(); });
      if (stopping_) break;
      tasks.swap(tasks_);
      executor = executor_;
    }
    for (Task& t : tasks) {
      try {
        t(*engine);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "deepinfer serve: task failed: %s\n", e.what());
      }
    }
    if (!engine->has_unfinished()) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = engine->stats();
      continue;
    }
    std::vector<RequestOutput> outputs;
    const auto t0 = std::chrono::steady_clock::now();
    try {
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
    const auto t1 = std::chrono::steady_clock::now();
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
          (*sink)(out);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "deepinfer serve: request %s: %s\n", out.request_id.c_str(), e.what());
        }
      }
    };
    if (!batch->empty()) {
      if (executor) executor(std::move(deliver));
      else deliver();
    }
    const auto t2 = std::chrono::steady_clock::now();
    step_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    output_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
    num_steps_ += 1;
    num_outputs_ += static_cast<int64_t>(outputs.size());
    num_unfinished_ = static_cast<int>(sinks_.size());
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = engine->stats();
  }
}

}  // namespace deepinfer::server
