// The engine over a model with four KV layer groups (GroupedFakeModel: full rows of two
// widths, compressed rows at 1 per 4 tokens, an 8-token window): every group's rows are
// checked by the model at each step, so outputs equal the reference only if every
// group's tables, slots, window freeing, prefix hits, forks and preemptions are right.
#include <gtest/gtest.h>

#include <random>

#include "engine_fixture.h"
#include "grouped_fake_model.h"

namespace deepinfer::testing {
namespace {

std::unique_ptr<Engine> make_grouped_engine(const EngineConfig& cfg) {
  BackendOptions bo;
  bo.num_threads = 1;
  auto impl = std::make_unique<Engine::Impl>(cfg, make_cpu_backend(bo),
                                             std::make_unique<GroupedFakeModel>(kVocab, kEos), nullptr);
  return std::make_unique<Engine>(std::move(impl));
}

TEST(EngineKvGroups, ShortCacheBatchWithPreemptionEqualsReference) {
  std::mt19937 rng(41);
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 40; ++i) {
    prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + static_cast<int>(rng() % 60))));
    params.push_back(greedy(24));
  }
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  cfg.num_kv_blocks = 48;
  cfg.max_num_seqs = 8;
  cfg.max_num_batched_tokens = 64;
  auto engine = make_grouped_engine(cfg);
  auto out = engine->generate(prompts, params);
  ASSERT_EQ(out.size(), prompts.size());
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i].outputs[0].token_ids, reference_greedy(prompts[i].token_ids, 24, kVocab, kEos)) << i;
  EXPECT_GT(engine->stats().num_preemptions, 0);
}

TEST(EngineKvGroups, PrefixHitServedByEveryGroup) {
  std::mt19937 rng(42);
  auto prefix = random_tokens(rng, 200);
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_grouped_engine(cfg);
  auto first = engine->generate({Prompt::from_tokens(prefix)}, {greedy(8)});
  EXPECT_EQ(first[0].num_cached_tokens, 0);
  EXPECT_EQ(first[0].outputs[0].token_ids, reference_greedy(prefix, 8, kVocab, kEos));
  auto second_prompt = prefix;
  second_prompt.push_back(9);
  auto second = engine->generate({Prompt::from_tokens(second_prompt)}, {greedy(8)});
  // A multiple of the compressed group's 4 rows x 4 tokens per block; the window group's
  // blocks 46 and 47 (tokens 184..191) were freed by the first request but stay cached.
  EXPECT_EQ(second[0].num_cached_tokens, 192);
  EXPECT_EQ(second[0].outputs[0].token_ids, reference_greedy(second_prompt, 8, kVocab, kEos));
}

TEST(EngineKvGroups, ForkedSamplesCopyEachGroupsSharedBlock) {
  std::mt19937 rng(43);
  auto prompt = random_tokens(rng, 100);
  SamplingParams p = greedy(10);
  p.n = 4;
  p.ignore_eos = true;
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_grouped_engine(cfg);
  auto out = engine->generate({Prompt::from_tokens(prompt)}, {p});
  ASSERT_EQ(out[0].outputs.size(), 4u);
  const auto ref = reference_greedy(prompt, 10, kVocab, kEos, true);
  for (const auto& c : out[0].outputs) EXPECT_EQ(c.token_ids, ref);
  EXPECT_EQ(out[0].num_cached_tokens, 99);  // samples 1..3 fork all but the last prompt token
  // Each fork writes token 99 into the shared block of tokens 96..99 in "latent", "keys" and
  // "window"; its compressed row 24 starts a block of its own (nothing to copy).
  EXPECT_EQ(engine->stats().num_kv_block_copies, 3 * 3);
}

}  // namespace
}  // namespace deepinfer::testing
