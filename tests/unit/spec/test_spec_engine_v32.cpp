// Speculative decoding on DeepSeek-V3.2 (model/deepseek_v32: its MTP block has an indexer and
// caches in both KV groups, latent and indexer keys) on the CPU backend: a tiny random V3.2
// with one MTP layer (v32_mtp.config.json: index_topk 8, prompts of 20-60 tokens, so the
// indexer drops positions in the main and the MTP layers) gives bitwise the tokens and
// logprobs of k = 0 with k = 1..3 drafts, greedy and seeded sampling.
#include <gtest/gtest.h>

#include "deepinfer/engine.h"
#include "tests/unit/spec/spec_fixture.h"

namespace deepinfer {
namespace {

using spec_test::expect_same;

const std::string kConfig = std::string(DEEPINFER_SOURCE_DIR) + "/tests/unit/spec/v32_mtp.config.json";

EngineConfig config(int k) {
  EngineConfig c;
  c.random_weights_config = kConfig;
  c.random_weights_seed = 7;
  c.num_threads = 2;
  c.kv_block_size = 16;
  c.max_model_len = 256;
  c.num_speculative_tokens = k;
  c.spec_varlen = 0;
  return c;
}

// Token-id prompts longer than index_topk (8); different lengths so that sequences of a batch
// reach their cut at different steps.
std::vector<Prompt> prompts() { return spec_test::token_prompts({20, 37, 60, 9}, 37, 11, 500); }

std::vector<RequestOutput> run(const EngineConfig& c, const std::vector<SamplingParams>& sp,
                               EngineStats* stats = nullptr) {
  return spec_test::run(c, prompts(), sp, stats);
}

SamplingParams params(float temperature, uint64_t seed) { return spec_test::seeded(temperature, seed, 24); }

TEST(SpecEngineV32, GreedyMtpEqualsNoSpeculation) {
  const auto base = run(config(0), {params(0, 0)});
  for (int k = 1; k <= 3; ++k) {
    EngineStats st;
    const auto spec = run(config(k), {params(0, 0)}, &st);
    expect_same(base, spec, "greedy k=" + std::to_string(k));
    EXPECT_EQ(st.num_speculative_tokens, k);
    EXPECT_GT(st.spec.num_draft_tokens, 0) << "k=" << k;  // the MTP layer drafted
  }
}

TEST(SpecEngineV32, SeededSamplingEqualsNoSpeculation) {
  std::vector<SamplingParams> sp;
  for (int i = 0; i < 4; ++i) sp.push_back(params(0.8f, 100 + i));
  const auto base = run(config(0), sp);
  EngineStats st;
  expect_same(base, run(config(3), sp, &st), "sampled k=3");
  EXPECT_GT(st.spec.num_draft_tokens, 0);
}

}  // namespace
}  // namespace deepinfer
