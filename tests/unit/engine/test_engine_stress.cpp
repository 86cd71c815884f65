// 1,000 requests with prompts of 1 to 2,000 tokens under a KV cache far too
// small for them all: preemption by recompute must happen and every request
// must still give its solo (reference) output. Runs under ASan in CI.
#include <gtest/gtest.h>

#include <random>

#include "engine_fixture.h"

namespace deepinfer::testing {
namespace {

TEST(EngineStress, ThousandRequestsUnderKvPressureMatchSoloRuns) {
  std::mt19937 rng(21);
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 1000; ++i) {
    std::vector<int32_t> t(1 + rng() % 2000);
    for (auto& x : t) x = 2 + static_cast<int32_t>(rng() % (kVocab - 2));
    prompts.push_back(Prompt::from_tokens(std::move(t)));
    SamplingParams p = greedy(1 + static_cast<int>(rng() % 24));
    p.ignore_eos = rng() % 2;
    params.push_back(p);
  }
  EngineConfig cfg;
  cfg.kv_block_size = 16;
  cfg.num_kv_blocks = 200;  // 3,200 token slots
  cfg.max_num_seqs = 32;
  cfg.max_num_batched_tokens = 1024;
  auto engine = make_fake_engine(cfg);
  auto out = engine->generate(prompts, params);
  EXPECT_GT(engine->stats().num_preemptions, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(out[i].finished) << i;
    ASSERT_EQ(out[i].outputs[0].token_ids,
              reference_greedy(prompts[i].token_ids, params[i].max_tokens, kVocab, kEos,
                               params[i].ignore_eos))
        << "request " << i;
  }
}

}  // namespace
}  // namespace deepinfer::testing
