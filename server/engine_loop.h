// The engine's own thread: the Engine is built there (the server answers /health with 503
// until it is ready) and used only there. Other threads post tasks; between two engine steps
// the loop runs every queued task (adds, aborts, tokenize), so an abort takes effect before the
// next step. Step outputs go to the sink registered with the request, on the engine thread.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "deepinfer/engine.h"

namespace deepinfer::server {

class EngineLoop {
 public:
  using Task = std::function<void(Engine&)>;
  using Sink = std::function<void(RequestOutput&&)>;  // the update is the sink's to keep

  // `step_log` (optional): a file that gets one line per Engine::step call (serve --step-log):
  // seconds since the first request, the call's milliseconds, then the steps it issued, their
  // sequences and prompt tokens, the tasks run before it, and the running and waiting sequences
  // after it.
  explicit EngineLoop(EngineConfig config, const std::string& step_log = "");
  ~EngineLoop();  // stops the thread; queued tasks are dropped

  bool ready() const { return ready_.load(); }
  bool failed() const { return failed_.load(); }
  std::string load_error() const;
  // Engine::chat_format() (set before ready() turns true; "" before).
  std::string chat_format() const;

  // Runs `task` on the engine thread before the next step (dropped if the loop stops first).
  void post(Task task);

  // Where sinks run. Unset: on the engine thread, after each step. Set (before the first request):
  // each step's outputs go to `executor` as one task that calls their sinks in order; `executor`
  // must run tasks one at a time in call order (HttpServer::post_serial), so a request's updates
  // keep their order and the engine thread only moves the step's outputs.
  using Executor = std::function<void(std::function<void()>)>;
  void set_output_executor(Executor executor);

  // On the engine thread (inside a task): adds a request whose updates go to `sink` (the last one
  // has finished set; where it runs: set_output_executor). Throws what Engine::add_request throws.
  void add(Engine& engine, const Prompt& prompt, const SamplingParams& params, const std::string& id,
           Sink sink);
  // On the engine thread: aborts a request; its sink gets no further update.
  void abort(Engine& engine, const std::string& id);

  int num_unfinished() const { return num_unfinished_.load(); }
  // Where the engine thread's time went (seconds since the first request; any thread): in
  // Engine::step, handing step outputs to the replies, running posted tasks (adds, aborts,
  // tokenize), and idle, waiting with no request unfinished (a server that keeps up with its
  // clients idles only between bursts). /metrics shows them (deepinfer:engine_*); printed when
  // the loop stops, with EngineStats' step counts.
  struct Times {
    double step_s = 0, output_s = 0, task_s = 0, idle_s = 0;
    int64_t num_steps = 0, num_outputs = 0;
  };
  Times times() const;
  // Engine counters copied after each step (any thread).
  EngineStats stats() const;

  void stop();

 private:
  void run(EngineConfig config);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  std::atomic<bool> ready_{false};
  std::atomic<bool> failed_{false};
  std::string load_error_;
  std::string chat_format_;
  EngineStats stats_;
  std::unordered_map<std::string, std::shared_ptr<Sink>> sinks_;  // engine thread only
  Executor executor_;  // under mu_
  std::atomic<int> num_unfinished_{0};
  std::chrono::steady_clock::time_point idle_since_{};  // under mu_: the idle wait going on (else {})
  std::FILE* step_log_ = nullptr;  // engine thread
  std::thread thread_;  // last: started once every other member is constructed
  std::atomic<int64_t> step_ns_{0}, output_ns_{0}, task_ns_{0}, idle_ns_{0}, num_steps_{0}, num_outputs_{0};
};

}  // namespace deepinfer::server
