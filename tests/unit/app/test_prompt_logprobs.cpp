// Engine::prompt_logprobs (teacher forcing, `deepinfer eval ppl`) on the embedded model: each
// entry equals the logprob the sampler reports for the same token when greedy decoding
// produced it (an independent path: decode steps with the KV cache, the host sampler's
// float log-softmax), the engine must be idle, and short prompts are refused.
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
