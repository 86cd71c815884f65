// Asynchronous scheduling with drafts in flight (issue 13 item 2) on the embedded model
// (models/deepseek-v3-tiny-code, its trained MTP layer) on the CPU backend: verify step N + 1
// is issued before step N is read, its drafts made on the device and its layout fixed up there
// from N's accepted counts (Engine::Impl::spec_run_ahead). Every test checks that path ran
// (EngineStats::num_spec_steps_ahead) and that token ids, text, finish reasons and logprobs are
// bitwise those of k = 0 and of the synchronous speculative engine (async_scheduling off).
#include <gtest/gtest.h>

#include <map>

#include "deepinfer/engine.h"
#include "tests/unit/spec/spec_fixture.h"

namespace deepinfer {
namespace {

using namespace spec_test;  // NOLINT(google-build-using-namespace)

EngineConfig config(int k, bool async = true) {
  EngineConfig c;
  c.model_dir = kModelDir;
  c.num_threads = 2;
  c.kv_block_size = 16;
  c.max_model_len = 512;
  c.num_speculative_tokens = k;
  c.spec_varlen = 0;
  c.async_scheduling = async;
  return c;
}

// Sampled on the device (no logprobs, no penalties): what can run ahead.
SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}
SamplingParams sampled(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.max_tokens = max_tokens;
  p.seed = seed;
  return p;
}

// k = 0, synchronous k, asynchronous k: the same outputs; the asynchronous engine ran ahead
// with drafts (returned: its stats).
EngineStats expect_async_same(const EngineConfig& base_config, const std::vector<Prompt>& p,
                              const std::vector<SamplingParams>& sp, int k, const std::string& what) {
  EngineConfig c0 = base_config, sync = base_config, async = base_config;
  c0.num_speculative_tokens = 0;
  sync.num_speculative_tokens = async.num_speculative_tokens = k;
  sync.async_scheduling = false;
  async.async_scheduling = true;
  EngineStats s_sync, s_async;
  const auto base = run(c0, p, sp);
  expect_same(base, run(sync, p, sp, &s_sync), what + " sync k=" + std::to_string(k));
  expect_same(base, run(async, p, sp, &s_async), what + " async k=" + std::to_string(k));
  EXPECT_EQ(s_sync.num_spec_steps_ahead, 0) << what;
  EXPECT_GT(s_async.num_spec_steps_ahead, 0) << what << " k=" << k << ": the drafts-in-flight path never ran";
  EXPECT_GT(s_async.spec.num_accepted_tokens, 0) << what;
  // Same acceptance as the synchronous engine (drafts are made by the same MTP layer on the
  // same rows; the CPU backend is batch-invariant), fewer host round trips.
  EXPECT_EQ(s_async.spec.accepted_per_position, s_sync.spec.accepted_per_position) << what << " k=" << k;
  return s_async;
}

TEST(SpecAsync, GreedyEqualsNoSpeculationAndSynchronousForK1To5) {
  for (int k = 1; k <= 5; ++k) {
    const EngineStats st = expect_async_same(config(k), prompts(), {greedy(40)}, k, "greedy");
    // Most steps were issued ahead (not the prefill, the first verify step, nor the steps whose
    // sequences could reach max_tokens within two verify steps).
    EXPECT_GT(st.num_spec_steps_ahead * 2, st.num_steps) << "k=" << k << ": " << st.num_spec_steps_ahead << " of "
                                                         << st.num_steps << " steps ahead";
  }
}

TEST(SpecAsync, SeededSampledAndNGreaterThanOneEqualNoSpeculation) {
  std::vector<SamplingParams> sp;
  for (int i = 0; i < 4; ++i) sp.push_back(sampled(36, 40 + i));
  sp[1].top_k = 5;
  sp[2].n = 3;   // three samples share the prompt's blocks (copy-on-write)
  sp[3].min_p = 0.1f;
  for (int k : {1, 3}) expect_async_same(config(k), prompts(), sp, k, "sampled");
}

// Requests finish inside a verify step while the next one is in flight: max_tokens within
// 1 + k of the start, a stop string, a stop token taken from the k = 0 output, and a
// greedy request with logprobs in the batch (host sampling: synchronous until it ends).
TEST(SpecAsync, RequestsFinishingMidRunEqualNoSpeculation) {
  const auto plain = run(config(0), prompts(), {greedy(48)});
  std::vector<SamplingParams> sp = {greedy(48), greedy(48), greedy(48), greedy(5)};
  sp[0].stop_token_ids = {plain[0].outputs[0].token_ids[17]};  // ends at its first occurrence
  sp[1].stop = {"\n"};
  sp[1].max_tokens = 30;
  sp[2].stop = {"self"};
  sp[2].include_stop_str_in_output = true;
  std::vector<Prompt> p = prompts();
  p.push_back(p[0]);
  SamplingParams lp = greedy(9);
  lp.logprobs = 3;
  sp.push_back(lp);
  for (int k : {2, 4}) {
    const auto st = expect_async_same(config(k), p, sp, k, "finishing");
    (void)st;
  }
  for (int max_tokens : {1, 2, 3, 4, 6}) {
    std::vector<SamplingParams> short_sp = {greedy(40), greedy(max_tokens), greedy(40), sampled(max_tokens + 1, 3)};
    expect_async_same(config(3), prompts(), short_sp, 3, "max_tokens " + std::to_string(max_tokens));
  }
}

// A prompt arrives (in chunks: a small token budget) while verify steps run ahead; the engine
// falls back to synchronous steps while it is admitted and runs ahead again after. Outputs are
// those of each request alone under k = 0 (batch-invariant attention: chunking does not change it).
TEST(SpecAsync, ChunkedPromptsArrivingWhileDraftsAreInFlight) {
  auto drive = [](EngineConfig c, int* ahead_before_arrival) {
    c.batch_invariant = true;
    c.max_num_batched_tokens = 20;
    Engine e(c);
    std::map<std::string, RequestOutput> done;
    auto take = [&](std::vector<RequestOutput> outs) {
      for (auto& o : outs)
        if (o.finished) done[o.request_id] = std::move(o);
    };
    e.add_request(Prompt::from_text(kPrompts[0]), greedy(60), "a");
    e.add_request(Prompt::from_text(kPrompts[3]), sampled(60, 11), "b");
    for (int i = 0; i < 12 && e.has_unfinished(); ++i) take(e.step());
    if (ahead_before_arrival) *ahead_before_arrival = static_cast<int>(e.stats().num_spec_steps_ahead);
    e.add_request(Prompt::from_text(kPrompts[2]), greedy(30), "c");  // 3 chunks of <= 20 tokens
    for (int i = 0; i < 3 && e.has_unfinished(); ++i) take(e.step());
    e.add_request(Prompt::from_text(kPrompts[1]), sampled(25, 5), "d");
    while (e.has_unfinished()) take(e.step());
    std::vector<RequestOutput> out;
    for (auto& [id, o] : done) out.push_back(o);
    return std::make_pair(out, e.stats());
  };
  const auto [base, st0] = drive(config(0), nullptr);
  ASSERT_EQ(base.size(), 4u);
  for (int k : {2, 3}) {
    int ahead_before = 0;
    const auto [sync, st_sync] = drive(config(k, false), nullptr);
    const auto [async, st] = drive(config(k), &ahead_before);
    expect_same(base, sync, "arrivals sync k=" + std::to_string(k));
    expect_same(base, async, "arrivals async k=" + std::to_string(k));
    EXPECT_GT(ahead_before, 0) << "k=" << k << ": no drafts were in flight when the prompts arrived";
    EXPECT_GT(st.num_spec_steps_ahead, ahead_before) << "k=" << k << ": never ran ahead again after the arrivals";
  }
}

// A request aborted while the step after its verify step is in flight: the others keep k = 0's
// outputs; the scheduled length (spec_varlen 1: a uniform depth ahead) too.
TEST(SpecAsync, AbortWhileDraftsAreInFlightAndScheduledLengths) {
  const std::vector<SamplingParams> sp = {greedy(40), sampled(40, 3), greedy(40)};
  std::vector<Prompt> p = prompts();
  p.resize(3);
  const auto base = run(config(0), p, sp);
  Engine e(config(3));
  std::map<std::string, RequestOutput> done;
  const std::vector<std::string> ids = {"r0", "r1", "r2"};
  for (size_t i = 0; i < sp.size(); ++i) e.add_request(p[i], sp[i], ids[i]);
  while (e.has_unfinished() && e.stats().num_spec_steps_ahead < 3)
    for (auto& o : e.step()) done[o.request_id] = o;
  ASSERT_GE(e.stats().num_spec_steps_ahead, 3);
  EXPECT_TRUE(e.abort("r1"));
  while (e.has_unfinished())
    for (auto& o : e.step()) done[o.request_id] = o;
  for (const std::string id : {"r0", "r2"}) {
    ASSERT_TRUE(done.count(id));
    const RequestOutput& want = base[id == "r0" ? 0 : 2];
    EXPECT_EQ(done[id].outputs[0].token_ids, want.outputs[0].token_ids) << id;
    EXPECT_TRUE(done[id].finished) << id;
  }
  EngineConfig varlen = config(3);
  varlen.spec_varlen = 1;
  expect_same(base, run(varlen, p, sp), "spec_varlen 1");
}

// A short cache: the scheduler preempts, the engine steps synchronously while blocks are short
// (spec_run_ahead needs free blocks for every sequence's next verify step) and runs ahead
// while they are not.
TEST(SpecAsync, PreemptionFallsBackToSynchronousSteps) {
  EngineConfig c = config(3);
  c.batch_invariant = true;
  c.num_kv_blocks = 14;
  std::vector<Prompt> p = prompts();
  p.push_back(p[2]);
  std::vector<SamplingParams> sp = {greedy(64), sampled(64, 7), greedy(48), sampled(64, 9), greedy(20)};
  const EngineStats st = expect_async_same(c, p, sp, 3, "preemption");
  EXPECT_GT(st.num_preemptions, 0);
}

}  // namespace
}  // namespace deepinfer
