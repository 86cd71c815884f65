// Engine::prompt_logprobs (teacher forcing, `deepinfer eval ppl`) on the embedded model: each
// entry equals the logprob the sampler reports for the same token when greedy decoding
// produced it (an independent path: decode steps with the KV cache, the host sampler's
// float log-softmax), the engine must be idle, and short prompts are refused; the request field
// (SamplingParams::prompt_logprobs) under chunked prefill, batch mates and a warm prefix cache.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "deepinfer/engine.h"

namespace deepinfer {
namespace {

TEST(PromptLogprobs, MatchesTheSamplersLogprobsAlongAGreedyDecode) {
  EngineConfig c;
  c.model_dir = DEEPINFER_DEFAULT_MODEL_DIR;
  c.num_threads = 2;
  Engine engine(c);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 12;
  p.ignore_eos = true;
  p.logprobs = 0;
  const Prompt prompt = Prompt::from_text("def add(a, b):\n    return");
  const RequestOutput out = engine.generate({prompt}, {p})[0];
  ASSERT_TRUE(out.error.empty()) << out.error;
  const CompletionOutput& gen = out.outputs[0];
  ASSERT_EQ(gen.logprobs.size(), gen.token_ids.size());
  std::vector<int32_t> all = out.prompt_token_ids;
  all.insert(all.end(), gen.token_ids.begin(), gen.token_ids.end());
  const std::vector<double> lp = engine.prompt_logprobs(Prompt::from_tokens(all));
  ASSERT_EQ(lp.size(), all.size() - 1);
  const size_t first = out.prompt_token_ids.size() - 1;  // entry of the first generated token
  for (size_t j = 0; j < gen.token_ids.size(); ++j) {
    EXPECT_NEAR(lp[first + j], gen.logprobs[j].logprob, 2e-3) << "generated token " << j;
    EXPECT_LE(lp[first + j], 0.0);
  }
  // Greedy picked the most likely token: its logprob is at least log(1/vocab).
  for (size_t j = 0; j < gen.token_ids.size(); ++j) EXPECT_GT(lp[first + j], -std::log(8192.0));
}

// SamplingParams::prompt_logprobs in an engine that chunks the prefill (7 tokens a step), runs
// batch mates beside it and holds the prompt in its prefix cache: at the generated positions the
// values equal the decode steps' logprobs (a token-by-token forward) and the most likely id is
// the greedy token; everywhere they equal the one-step Engine::prompt_logprobs of another engine.
TEST(PromptLogprobs, ChunkedBatchedAndCacheWarmEqualTokenByTokenDecode) {
  EngineConfig c;
  c.model_dir = DEEPINFER_DEFAULT_MODEL_DIR;
  c.num_threads = 2;
  Engine reference(c);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 10;
  p.ignore_eos = true;
  p.logprobs = 0;
  const RequestOutput out = reference.generate({Prompt::from_text("def mul(a, b):\n    return")}, {p})[0];
  ASSERT_TRUE(out.error.empty()) << out.error;
  const CompletionOutput& gen = out.outputs[0];
  std::vector<int32_t> all = out.prompt_token_ids;
  all.insert(all.end(), gen.token_ids.begin(), gen.token_ids.end());
  const std::vector<double> one_step = reference.prompt_logprobs(Prompt::from_tokens(all));

  c.max_num_batched_tokens = 7;
  c.kv_block_size = 4;
  c.max_num_seqs = 3;
  Engine engine(c);
  SamplingParams plain;
  plain.temperature = 0;
  plain.max_tokens = 3;
  engine.generate({Prompt::from_tokens(all)}, {plain});  // warms the prefix cache
  SamplingParams scored = plain;
  scored.prompt_logprobs = 2;
  const std::vector<RequestOutput> outs = engine.generate(
      {Prompt::from_text("x = [1, 2"), Prompt::from_tokens(all), Prompt::from_text("import os\n")},
      {plain, scored, plain});
  const RequestOutput& r = outs[1];
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.num_cached_tokens, 0);
  ASSERT_EQ(r.prompt_logprobs.size(), all.size() - 1);
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    EXPECT_EQ(r.prompt_logprobs[i].token_id, all[i + 1]);
    EXPECT_NEAR(r.prompt_logprobs[i].logprob, one_step[i], 1e-3) << "position " << i;
    ASSERT_EQ(r.prompt_logprobs[i].top.size(), 2u);
    EXPECT_GE(r.prompt_logprobs[i].top[0].second, r.prompt_logprobs[i].logprob - 1e-9);
  }
  const size_t first = out.prompt_token_ids.size() - 1;  // entry of the first generated token
  for (size_t j = 0; j < gen.token_ids.size(); ++j) {
    EXPECT_NEAR(r.prompt_logprobs[first + j].logprob, gen.logprobs[j].logprob, 2e-3) << "generated token " << j;
    EXPECT_EQ(r.prompt_logprobs[first + j].top[0].first, gen.token_ids[j]) << "generated token " << j;
  }
}

TEST(PromptLogprobs, RefusesShortPromptsAndABusyEngine) {
  EngineConfig c;
  c.model_dir = DEEPINFER_DEFAULT_MODEL_DIR;
  c.num_threads = 2;
  Engine engine(c);
  EXPECT_THROW(engine.prompt_logprobs(Prompt::from_tokens({5})), Error);
  SamplingParams p;
  p.max_tokens = 4;
  engine.add_request(Prompt::from_text("x = 1"), p);
  try {
    engine.prompt_logprobs(Prompt::from_text("x = 1"));
    FAIL() << "ran with a request in flight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unfinished requests"), std::string::npos);
  }
}

}  // namespace
}  // namespace deepinfer
