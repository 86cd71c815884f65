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

void EngineLoop::add(Engine& engine, const Prompt& prompt, const SamplingParams& params,
                     const std::string& id, Sink sink) {
  engine.add_request(prompt, params, id);
  sinks_[id] = std::move(sink);
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
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty() || engine->has_unfinished(); });
      if (stopping_) break;
      tasks.swap(tasks_);
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
      auto sinks = std::move(sinks_);
      sinks_.clear();
      for (auto& [id, sink] : sinks) {
        engine->abort(id);
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.error = std::string("engine step failed: ") + e.what();
        sink(out);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (const RequestOutput& out : outputs) {
      auto it = sinks_.find(out.request_id);
      if (it == sinks_.end()) continue;
      try {
        it->second(out);  // a sink only hands the update over (server.cpp builds the reply elsewhere)
      } catch (const std::exception& e) {
        std::fprintf(stderr, "deepinfer serve: request %s: %s\n", out.request_id.c_str(), e.what());
      }
      if (out.finished) sinks_.erase(out.request_id);  // `it` may be stale if the sink aborted others
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
