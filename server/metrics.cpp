#include "server/metrics.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace deepinfer::server {
namespace p = prometheus;

namespace {
p::Histogram::BucketBoundaries latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
          40.0, 80.0, 160.0, 640.0};
}
}  // namespace

struct Metrics::Impl {
  p::Registry registry;
  p::Gauge& running = p::BuildGauge().Name("deepinfer:num_requests_running")
                          .Help("Requests in the engine that have produced a token").Register(registry).Add({});
  p::Gauge& waiting = p::BuildGauge().Name("deepinfer:num_requests_waiting")
                          .Help("Requests waiting for their first token").Register(registry).Add({});
  p::Gauge& kv_usage = p::BuildGauge().Name("deepinfer:kv_cache_usage_perc")
                           .Help("Fraction of KV cache blocks in use (1 = all)").Register(registry).Add({});
  p::Counter& prompt = p::BuildCounter().Name("deepinfer:prompt_tokens_total")
                           .Help("Prompt tokens of finished requests").Register(registry).Add({});
  p::Counter& generation = p::BuildCounter().Name("deepinfer:generation_tokens_total")
                               .Help("Generated tokens").Register(registry).Add({});
  p::Family<p::Counter>& success = p::BuildCounter().Name("deepinfer:request_success_total")
                                       .Help("Finished requests by finish reason").Register(registry);
  p::Counter& prefix_queries = p::BuildCounter().Name("deepinfer:prefix_cache_queries_total")
                                   .Help("Prompt tokens looked up in the prefix cache").Register(registry).Add({});
  p::Counter& prefix_hits = p::BuildCounter().Name("deepinfer:prefix_cache_hits_total")
                                .Help("Prompt tokens served from the prefix cache").Register(registry).Add({});
  double queries_seen = 0, hits_seen = 0;  // the engine's totals at the last scrape
  // Speculative decoding (vLLM's names; counted from EngineStats::spec at each scrape).
  p::Counter& spec_drafts = p::BuildCounter().Name("deepinfer:spec_decode_num_drafts_total")
                                .Help("Verify steps of a sequence with drafts (one per sequence and step)")
                                .Register(registry).Add({});
  p::Counter& spec_draft_tokens = p::BuildCounter().Name("deepinfer:spec_decode_num_draft_tokens_total")
                                      .Help("Draft tokens verified").Register(registry).Add({});
  p::Counter& spec_accepted = p::BuildCounter().Name("deepinfer:spec_decode_num_accepted_tokens_total")
                                  .Help("Draft tokens accepted").Register(registry).Add({});
  p::Family<p::Counter>& spec_accepted_pos = p::BuildCounter().Name("deepinfer:spec_decode_num_accepted_tokens_per_pos_total")
                                                 .Help("Draft tokens accepted at each draft position")
                                                 .Register(registry);
  SpecDecodeStats spec_seen;
  // The engine thread (deepinfer's own; compare with `deepinfer bench --throughput`'s record).
  p::Family<p::Counter>& steps = p::BuildCounter().Name("deepinfer:engine_steps_total")
                                     .Help("Engine steps: kind=prefill computed prompt tokens (alone or mixed "
                                           "into decode), kind=decode did not")
                                     .Register(registry);
  p::Counter& step_seqs = p::BuildCounter().Name("deepinfer:engine_step_seqs_total")
                              .Help("Sequences over all steps (mean batch: this / the steps)")
                              .Register(registry).Add({});
  p::Family<p::Counter>& thread_seconds =
      p::BuildCounter().Name("deepinfer:engine_thread_seconds_total")
          .Help("The engine thread's time since the first request: state=step (Engine::step), output "
                "(handing outputs to replies), task (adds, aborts, tokenize), idle (no request unfinished)")
          .Register(registry);
  int64_t prefill_steps_seen = 0, decode_steps_seen = 0, step_seqs_seen = 0;
  std::map<std::string, double> seconds_seen;
  p::Histogram& ttft = p::BuildHistogram().Name("deepinfer:time_to_first_token_seconds")
                           .Help("Time to first token").Register(registry).Add({}, latency_buckets());
  p::Histogram& itl = p::BuildHistogram().Name("deepinfer:inter_token_latency_seconds")
                          .Help("Time between two output tokens").Register(registry).Add({}, latency_buckets());
  p::Histogram& e2e = p::BuildHistogram().Name("deepinfer:e2e_request_latency_seconds")
                          .Help("Arrival to last token").Register(registry).Add({}, latency_buckets());
  p::Histogram& queue = p::BuildHistogram().Name("deepinfer:request_queue_time_seconds")
                            .Help("Arrival to the engine thread adding the request (the server's queue; "
                                  "time in the scheduler's waiting queue is in time_to_first_token)")
                            .Register(registry)
                            .Add({}, latency_buckets());
  std::mutex mu;  // Family::Add
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {
  for (const char* r : {"stop", "length", "abort", "error"}) impl_->success.Add({{"finished_reason", r}});
  for (const char* k : {"prefill", "decode"}) impl_->steps.Add({{"kind", k}});
  for (const char* st : {"step", "output", "task", "idle"}) impl_->thread_seconds.Add({{"state", st}});
}
Metrics::~Metrics() = default;

void Metrics::request_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->success.Add({{"finished_reason", reason}}).Increment();
}
void Metrics::prompt_tokens(int n) { impl_->prompt.Increment(n); }
void Metrics::generation_tokens(int n) { impl_->generation.Increment(n); }
void Metrics::time_to_first_token(double s) { impl_->ttft.Observe(s); }
void Metrics::inter_token_latency(double s) { impl_->itl.Observe(s); }
void Metrics::e2e_latency(double s) { impl_->e2e.Observe(s); }
void Metrics::queue_time(double s) { impl_->queue.Observe(s); }

std::string Metrics::render(const EngineStats& stats, const EngineLoop::Times& times, int num_running,
                            int num_waiting) {
  impl_->running.Set(num_running);
  impl_->waiting.Set(num_waiting);
  impl_->kv_usage.Set(stats.num_kv_blocks > 0
                          ? 1.0 - static_cast<double>(stats.num_free_kv_blocks) / stats.num_kv_blocks
                          : 0.0);
  std::lock_guard<std::mutex> lock(impl_->mu);
  const double queries = static_cast<double>(stats.num_prompt_tokens_computed + stats.num_cached_tokens);
  const double hits = static_cast<double>(stats.num_cached_tokens);
  if (queries > impl_->queries_seen) impl_->prefix_queries.Increment(queries - impl_->queries_seen);
  if (hits > impl_->hits_seen) impl_->prefix_hits.Increment(hits - impl_->hits_seen);
  impl_->queries_seen = std::max(impl_->queries_seen, queries);
  impl_->hits_seen = std::max(impl_->hits_seen, hits);
  const SpecDecodeStats& sp = stats.spec;
  SpecDecodeStats& seen = impl_->spec_seen;
  auto bump = [](p::Counter& c, int64_t now, int64_t& before) {
    if (now > before) c.Increment(static_cast<double>(now - before));
    before = std::max(before, now);
  };
  bump(impl_->spec_drafts, sp.num_verify_steps, seen.num_verify_steps);
  bump(impl_->spec_draft_tokens, sp.num_draft_tokens, seen.num_draft_tokens);
  bump(impl_->spec_accepted, sp.num_accepted_tokens, seen.num_accepted_tokens);
  if (seen.accepted_per_position.size() < sp.accepted_per_position.size())
    seen.accepted_per_position.resize(sp.accepted_per_position.size(), 0);
  for (size_t j = 0; j < sp.accepted_per_position.size(); ++j)
    bump(impl_->spec_accepted_pos.Add({{"position", std::to_string(j)}}), sp.accepted_per_position[j],
         seen.accepted_per_position[j]);
  bump(impl_->steps.Add({{"kind", "prefill"}}), stats.num_prefill_steps, impl_->prefill_steps_seen);
  bump(impl_->steps.Add({{"kind", "decode"}}), stats.num_steps - stats.num_prefill_steps, impl_->decode_steps_seen);
  bump(impl_->step_seqs, stats.num_step_seqs, impl_->step_seqs_seen);
  for (const auto& [state, now] : {std::pair<const char*, double>{"step", times.step_s}, {"output", times.output_s},
                                   {"task", times.task_s}, {"idle", times.idle_s}}) {
    double& before = impl_->seconds_seen[state];
    if (now > before) impl_->thread_seconds.Add({{"state", state}}).Increment(now - before);
    before = std::max(before, now);
  }
  return p::TextSerializer().Serialize(impl_->registry.Collect());
}

}  // namespace deepinfer::server
