// Asynchronous scheduling in the engine (EngineConfig::async_scheduling) on the CPU
// backend with the fake model: outputs (tokens, finish reasons, streamed deltas, aborts)
// are identical with it on and off, and steps really were issued ahead.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "../engine/engine_fixture.h"

namespace deepinfer::testing {
namespace {

struct Workload {
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
};

// Greedy requests that stop on EOS, on stop tokens and by length; a few n = 2 and one
// sampled request (the sampler path, which is never issued ahead).
Workload mixed_workload(int num_requests, uint32_t seed) {
  std::mt19937 rng(seed);
  Workload w;
  for (int i = 0; i < num_requests; ++i) {
    w.prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + static_cast<int>(rng() % 60))));
    SamplingParams p = greedy(1 + static_cast<int>(rng() % 40));
    p.ignore_eos = i % 3 == 0;
    if (i % 5 == 1) p.stop_token_ids = {static_cast<int32_t>(2 + rng() % 20)};
    if (i % 11 == 4) p.n = 2;
    if (i == 7) {
      p.temperature = 0.8f;
      p.seed = 1234;
    }
    w.params.push_back(p);
  }
  return w;
}

TEST(EngineAsync, MixedBatchEqualsOneStepAtATime) {
  const Workload w = mixed_workload(40, 5);
  EngineConfig cfg;
  cfg.kv_block_size = 8;
  cfg.max_num_seqs = 16;  // requests wait, then join a decoding batch
  cfg.max_num_batched_tokens = 128;
  cfg.async_scheduling = false;
  auto sync_engine = make_fake_engine(cfg);
  const auto want = sync_engine->generate(w.prompts, w.params);
  EXPECT_EQ(sync_engine->stats().num_steps_ahead, 0);
  cfg.async_scheduling = true;
  auto async_engine = make_fake_engine(cfg);
  const auto got = async_engine->generate(w.prompts, w.params);
  expect_same_outputs(want, got);
  EXPECT_GT(async_engine->stats().num_steps_ahead, 0);
  // Greedy rows also match the reference computed without an engine.
  for (size_t i = 0; i < got.size(); ++i) {
    if (w.params[i].temperature != 0 || !w.params[i].stop_token_ids.empty()) continue;
    EXPECT_EQ(got[i].outputs[0].token_ids,
              reference_greedy(w.prompts[i].token_ids, w.params[i].max_tokens, kVocab, kEos,
                               w.params[i].ignore_eos))
        << "request " << i;
  }
}

TEST(EngineAsync, SteadyDecodeRunsAheadAndEqualsSync) {
  // 8 sequences decoding together for 30 tokens: every decode step after the first can be
  // issued ahead; EOS stops inside the batch are discarded extra steps.
  std::mt19937 rng(3);
  std::vector<Prompt> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(Prompt::from_tokens(random_tokens(rng, 20 + i)));
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  std::vector<RequestOutput> want;
  for (bool async : {false, true}) {
    cfg.async_scheduling = async;
    auto engine = make_fake_engine(cfg);
    auto out = engine->generate(prompts, {greedy(30)});
    if (!async) {
      want = out;
    } else {
      expect_same_outputs(want, out);
      EXPECT_GE(engine->stats().num_steps_ahead, 10);
    }
  }
}

TEST(EngineAsync, StreamingWithAbortEqualsSync) {
  // The same calls on both engines: step, abort one request mid-stream, add another.
  auto run = [](bool async) {
    EngineConfig cfg;
    cfg.kv_block_size = 4;
    cfg.async_scheduling = async;
    auto engine = make_fake_engine(cfg);
    SamplingParams p = greedy(25);
    p.ignore_eos = true;
    std::mt19937 rng(9);
    for (int i = 0; i < 5; ++i)
      engine->add_request(Prompt::from_tokens(random_tokens(rng, 5 + 3 * i)), p,
                          std::string("r").append(std::to_string(i)));
    // Per request: its streamed deltas in order, then "done". (A request added while a
    // step is in flight joins one step later with async scheduling, so step numbers differ.)
    std::map<std::string, std::string> log;
    for (int step = 0; engine->has_unfinished(); ++step) {
      if (step == 6) {
        EXPECT_TRUE(engine->abort("r2"));
      }
      if (step == 9) {
        engine->add_request(Prompt::from_tokens(random_tokens(rng, 7)), greedy(12), "late");
      }
      for (const auto& o : engine->step()) {
        std::string& line = log[o.request_id];
        for (int32_t t : o.outputs[0].delta_token_ids) line.append(" ").append(std::to_string(t));
        if (o.finished) line.append(" done");
      }
    }
    return std::make_pair(log, engine->stats().num_steps_ahead);
  };
  const auto [want, ahead_sync] = run(false);
  const auto [got, ahead_async] = run(true);
  EXPECT_EQ(got, want);
  EXPECT_EQ(ahead_sync, 0);
  EXPECT_GT(ahead_async, 0);
}

TEST(EngineAsync, KvPressureWithPreemptionEqualsSync) {
  const Workload w = mixed_workload(30, 21);
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  cfg.num_kv_blocks = 40;  // 160 tokens for up to 30 requests: preemption
  cfg.max_num_batched_tokens = 64;
  std::vector<RequestOutput> want;
  for (bool async : {false, true}) {
    cfg.async_scheduling = async;
    auto engine = make_fake_engine(cfg);
    auto out = engine->generate(w.prompts, w.params);
    if (!async) {
      want = out;
      EXPECT_GT(engine->stats().num_preemptions, 0);
    } else {
      expect_same_outputs(want, out);
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
