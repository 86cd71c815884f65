// Prometheus metrics of `deepinfer serve`, vLLM's names under `deepinfer:` (prometheus-cpp core
// and its text serializer). Counters and histograms are thread-safe; gauges are set at scrape.
#pragma once
#include <memory>
#include <string>

#include "deepinfer/engine.h"
#include "server/engine_loop.h"

namespace deepinfer::server {

class Metrics {
 public:
  Metrics();
  ~Metrics();
  void request_finished(const std::string& finished_reason);
  void prompt_tokens(int n);
  void generation_tokens(int n);
  void time_to_first_token(double s);
  void inter_token_latency(double s);
  void e2e_latency(double s);
  void queue_time(double s);
  // The text format; `stats` gives the gauges, prefix-cache and step counters, `times` where the
  // engine thread's time went.
  std::string render(const EngineStats& stats, const EngineLoop::Times& times, int num_running, int num_waiting);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
