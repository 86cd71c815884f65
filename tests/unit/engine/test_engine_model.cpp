// The engine on the real CPU model (tiny DeepSeek-V3 config, random weights),
// batch-invariant kernels: batched greedy output equals solo output, prefix
// reuse gives identical output, and preemption under a small KV cache changes
// nothing.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "deepinfer/engine.h"

namespace deepinfer {
namespace {

EngineConfig tiny_config() {
  EngineConfig c;
  c.random_weights_config = DEEPINFER_SOURCE_DIR "/tests/data/tiny_v3/config.json";
  c.random_weights_seed = 5;
  c.random_weights_dtype = "bf16";
  c.batch_invariant = true;
  c.num_threads = 2;
  c.kv_block_size = 16;
  return c;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int len) {
  std::vector<int32_t> t(len);
  for (auto& x : t) x = 2 + static_cast<int32_t>(rng() % 500);
  return t;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

void expect_batch_equals_solo(int num_requests, int max_prompt, EngineConfig batch_cfg, bool expect_preemption) {
  std::mt19937 rng(31);
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < num_requests; ++i) {
    prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + static_cast<int>(rng() % max_prompt))));
    params.push_back(greedy(1 + static_cast<int>(rng() % 12)));
  }
  Engine batched(batch_cfg);
  auto out = batched.generate(prompts, params);
  if (expect_preemption) {
    EXPECT_GT(batched.stats().num_preemptions, 0);
  }
  EngineConfig solo_cfg = tiny_config();
  solo_cfg.enable_prefix_caching = false;
  solo_cfg.max_num_seqs = 1;
  Engine solo(solo_cfg);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto one = solo.generate({prompts[i]}, {params[i]});
    ASSERT_EQ(out[i].outputs[0].token_ids, one[0].outputs[0].token_ids) << "request " << i;
  }
}


// As vLLM: a context above the model's max_position_embeddings (4096 here) is refused at
// construction (before: a long prompt failed mid-run on the RoPE table, taking the batch down).
TEST(EngineModel, RefusesMaxModelLenAboveThePositions) {
  EngineConfig c = tiny_config();
  c.max_model_len = 4097;
  try {
    Engine e(c);
    FAIL() << "max_model_len above max_position_embeddings was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings 4096"), std::string::npos) << e.what();
  }
  c.max_model_len = 0;
  c.max_num_seqs = 0;
  EXPECT_THROW(Engine{c}, Error);
}

TEST(EngineModel, BatchOf200EqualsSolo) {
  EngineConfig c = tiny_config();
  c.max_num_seqs = 64;
  c.max_num_batched_tokens = 256;
  expect_batch_equals_solo(200, 120, c, false);
}

TEST(EngineModel, PreemptionUnderSmallKvEqualsSolo) {
  EngineConfig c = tiny_config();
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 128;
  c.num_kv_blocks = 24;  // 384 token slots
  expect_batch_equals_solo(60, 150, c, true);
}

TEST(EngineModel, SharedPrefixOf1000TokensIsReused) {
  std::mt19937 rng(32);
  auto prefix = random_tokens(rng, 1000);
  EngineConfig c = tiny_config();
  Engine engine(c);
  auto first = engine.generate({Prompt::from_tokens(prefix)}, {greedy(10)});
  auto again = engine.generate({Prompt::from_tokens(prefix)}, {greedy(10)});
  EXPECT_EQ(first[0].num_cached_tokens, 0);
  EXPECT_EQ(again[0].num_cached_tokens, 992);
  EXPECT_EQ(again[0].outputs[0].token_ids, first[0].outputs[0].token_ids);
  auto longer = prefix;
  longer.insert(longer.end(), {7, 8, 9});
  auto third = engine.generate({Prompt::from_tokens(longer)}, {greedy(10)});
  EXPECT_EQ(third[0].num_cached_tokens, 992);
  EngineConfig cold = c;
  cold.enable_prefix_caching = false;
  Engine fresh(cold);
  EXPECT_EQ(fresh.generate({Prompt::from_tokens(longer)}, {greedy(10)})[0].outputs[0].token_ids,
            third[0].outputs[0].token_ids);
}

}  // namespace
}  // namespace deepinfer
