// Shared by the speculative-decoding engine tests (test_spec_engine, test_spec_async): the
// embedded model (models/deepseek-v3-tiny-code, its trained MTP layer), its prompts, and the
// bitwise comparison of two runs' outputs.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::spec_test {

inline const std::string kModelDir = std::string(DEEPINFER_SOURCE_DIR) + "/models/deepseek-v3-tiny-code";

inline const std::vector<std::string> kPrompts = {
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n",
};

inline std::vector<Prompt> prompts() {
  std::vector<Prompt> out;
  for (const auto& t : kPrompts) out.push_back(Prompt::from_text(t));
  return out;
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Request ids, token ids, text, finish and stop reasons and logprobs (bit for bit, the top
// alternatives too) of every sample.
inline void expect_same(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].request_id, b[i].request_id) << what;
    ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size()) << what << " request " << i;
    for (size_t s = 0; s < a[i].outputs.size(); ++s) {
      const CompletionOutput &x = a[i].outputs[s], &y = b[i].outputs[s];
      ASSERT_EQ(x.token_ids, y.token_ids) << what << " request " << i << " sample " << s;
      EXPECT_EQ(x.text, y.text) << what << " request " << i;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << what << " request " << i;
      EXPECT_EQ(x.stop_reason, y.stop_reason) << what << " request " << i;
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << what << " request " << i;
      for (size_t t = 0; t < x.logprobs.size(); ++t) {
        ASSERT_EQ(x.logprobs[t].token_id, y.logprobs[t].token_id);
        ASSERT_EQ(bits(x.logprobs[t].logprob), bits(y.logprobs[t].logprob))
            << what << " request " << i << " token " << t;
        ASSERT_EQ(x.logprobs[t].top.size(), y.logprobs[t].top.size());
        for (size_t j = 0; j < x.logprobs[t].top.size(); ++j) {
          EXPECT_EQ(x.logprobs[t].top[j].first, y.logprobs[t].top[j].first);
          EXPECT_EQ(bits(x.logprobs[t].top[j].second), bits(y.logprobs[t].top[j].second));
        }
      }
    }
  }
}

// One engine's generate over the prompts; no request may fail. stats: the engine's, after.
inline std::vector<RequestOutput> run(const EngineConfig& c, const std::vector<Prompt>& p,
                                      const std::vector<SamplingParams>& sp, EngineStats* stats = nullptr) {
  Engine e(c);
  auto out = e.generate(p, sp);
  for (const auto& o : out) EXPECT_TRUE(o.error.empty()) << o.error;
  if (stats) *stats = e.stats();
  return out;
}

// Token-id prompts of the given lengths: prompt of length n holds 2 + (i * a + n * b) % m at i.
inline std::vector<Prompt> token_prompts(std::initializer_list<int> lengths, int a, int b, int m) {
  std::vector<Prompt> out;
  for (int n : lengths) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(2 + (i * a + n * b) % m);
    out.push_back(Prompt::from_tokens(ids));
  }
  return out;
}

// max_tokens tokens whatever the EOS, two logprobs each.
inline SamplingParams seeded(float temperature, uint64_t seed, int max_tokens) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = 2;
  return p;
}

}  // namespace deepinfer::spec_test
