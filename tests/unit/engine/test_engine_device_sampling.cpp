// EngineConfig::device_sampling on the CPU backend (fake model): sampled requests whose
// parameters Backend::sample covers get their tokens from the op (and run ahead like
// greedy ones); the outputs equal the host sampler's, seeded or not, n > 1, mixed with rows
// that must stay on the host (penalties, logprobs, min_tokens).
#include <gtest/gtest.h>

#include <random>

#include "engine_fixture.h"

namespace deepinfer::testing {
namespace {

struct Workload {
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
};

// only_device: every request is one the op covers (no host rows at all).
Workload sampled_workload(int num_requests, uint32_t seed, bool only_device) {
  std::mt19937 rng(seed);
  Workload w;
  for (int i = 0; i < num_requests; ++i) {
    w.prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + static_cast<int>(rng() % 40))));
    SamplingParams p;
    p.max_tokens = 1 + static_cast<int>(rng() % 30);
    p.temperature = std::vector<float>{0.0f, 0.3f, 0.8f, 1.0f, 2.5f}[rng() % 5];
    p.top_p = std::vector<float>{1.0f, 0.95f, 0.5f}[rng() % 3];
    p.top_k = std::vector<int>{0, 0, 1, 5}[rng() % 4];
    p.min_p = std::vector<float>{0.0f, 0.0f, 0.1f}[rng() % 3];
    p.ignore_eos = i % 3 != 0;
    if (i % 4 == 1) p.n = 3;
    if (i % 2 == 0) p.seed = 1000 + i;  // others: the engine's seed per request number
    if (i % 5 == 2) p.seq_seed = 7;
    if (!only_device) {
      if (i % 7 == 3) p.repetition_penalty = 1.2f;
      if (i % 7 == 5) p.logprobs = 2;
      if (i % 6 == 4) p.min_tokens = 3;
    }
    w.params.push_back(p);
  }
  return w;
}

EngineConfig config(bool device_sampling) {
  EngineConfig cfg;
  cfg.kv_block_size = 8;
  cfg.max_num_seqs = 12;  // requests wait, then join a decoding batch
  cfg.max_num_batched_tokens = 96;
  cfg.seed = 77;
  cfg.device_sampling = device_sampling;
  return cfg;
}

TEST(EngineDeviceSampling, OutputsEqualTheHostSampler) {
  for (bool only_device : {true, false}) {
    const Workload w = sampled_workload(36, only_device ? 11 : 12, only_device);
    auto host = make_fake_engine(config(false));
    const auto want = host->generate(w.prompts, w.params);
    auto device = make_fake_engine(config(true));
    const auto got = device->generate(w.prompts, w.params);
    SCOPED_TRACE(only_device ? "device rows only" : "mixed with host rows");
    expect_same_outputs(want, got);
    // The sampled rows really took the device path: their steps were issued ahead.
    EXPECT_GT(device->stats().num_steps_ahead, host->stats().num_steps_ahead);
  }
}

// A steady batch of sampled sequences: every decode step after the first runs ahead on the
// device path, none on the host path; same tokens.
TEST(EngineDeviceSampling, SampledDecodeRunsAhead) {
  std::mt19937 rng(4);
  std::vector<Prompt> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(Prompt::from_tokens(random_tokens(rng, 10)));
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.max_tokens = 25;
  p.ignore_eos = true;
  p.seed = 3;
  auto host = make_fake_engine(config(false));
  const auto want = host->generate(prompts, {p});
  auto device = make_fake_engine(config(true));
  const auto got = device->generate(prompts, {p});
  expect_same_outputs(want, got);
  EXPECT_EQ(host->stats().num_steps_ahead, 0);
  EXPECT_GE(device->stats().num_steps_ahead, 20);
}

}  // namespace
}  // namespace deepinfer::testing
