// Speculative decoding with DeepSeek-V4.1's DSpark drafter (model/deepseek_v41/dspark.h) on the CPU
// backend: a tiny random V4.1 with its drafter (tests/golden/fixtures/v41_dspark/config.json: 4 layers,
// window 8, 3 drafter stages, block of 5, Markov and confidence heads), a batch of four prompts of
// 9-60 tokens prefilled in chunks of 16, gives bitwise the tokens and logprobs of k = 0 with drafts
// verified at fixed lengths and at lengths scheduled from the confidence head, greedy and seeded
// sampling. The drafter's context rows are written by the target's steps (verify steps included):
// only rows before a block's anchor are read, so rejected drafts leave nothing that is read.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "deepinfer/engine.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/truncation.h"
#include "tests/unit/spec/spec_fixture.h"

namespace deepinfer {
namespace {

using spec_test::expect_same;

const std::string kConfig = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_dspark/config.json";

EngineConfig config(int k, int varlen = 0) {
  EngineConfig c;
  c.random_weights_config = kConfig;
  c.random_weights_seed = 11;
  c.num_threads = 2;
  c.kv_block_size = 16;
  c.max_model_len = 160;
  c.max_num_batched_tokens = 16;  // prompts prefill in chunks
  c.num_speculative_tokens = k;
  c.spec_varlen = varlen;
  return c;
}

std::vector<RequestOutput> run(const EngineConfig& c, const std::vector<SamplingParams>& sp,
                               EngineStats* stats = nullptr) {
  return spec_test::run(c, spec_test::token_prompts({20, 37, 60, 9}, 7, 3, 60), sp, stats);
}

SamplingParams params(float temperature, uint64_t seed) { return spec_test::seeded(temperature, seed, 20); }

TEST(SpecEngineV41Dspark, GreedyAndSeededSamplingEqualNoSpeculation) {
  std::vector<SamplingParams> sp = {params(0, 0), params(0.8f, 101), params(0, 0), params(1.0f, 103)};
  const auto base = run(config(0), sp);
  for (int k : {5, 2}) {
    EngineStats st;
    expect_same(base, run(config(k), sp, &st), "k=" + std::to_string(k));
    EXPECT_EQ(st.num_speculative_tokens, k);
    EXPECT_GT(st.spec.num_draft_tokens, 0) << "k=" << k;  // the drafter drafted, the target verified
    // Fixed lengths: blocks of k drafts (the block of 5 cut to k) were verified.
    EXPECT_EQ(st.spec.drafts_per_position.size(), static_cast<size_t>(k)) << "k=" << k;
  }
  // Lengths scheduled from the confidence head's confidences.
  EngineStats st;
  expect_same(base, run(config(5, 1), sp, &st), "k=5 scheduled");
}

// With compact prefill truncation the drafter reads context rows of kept positions only:
// speculation still gives bitwise the tokens and logprobs of k = 0 under the same truncation.
// v41_tiny's layer schedule (7 layers, the last KV source 4: layers 5 and 6 truncated) with the
// drafter of v41_dspark tapping layers 1 and 5; keep 20 (the floor: window 8 + 2 x (5 + 1)), so
// the prompts of 37 and 60 tokens run their upper layers on their last 20 rows.
TEST(SpecEngineV41Dspark, CompactPrefillTruncationEqualsNoSpeculation) {
  const std::string fixtures = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/";
  nlohmann::json root = nlohmann::json::parse(std::ifstream(fixtures + "v41_tiny/config.json"));
  const nlohmann::json drafter = nlohmann::json::parse(std::ifstream(fixtures + "v41_dspark/config.json"));
  nlohmann::json& t = root["text_config"];
  for (const char* key : {"num_nextn_predict_layers", "dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank",
                          "dspark_n_routed_experts", "dspark_num_experts_per_tok"})
    t[key] = drafter.at(key);
  t["dspark_target_layer_ids"] = {1, 5};
  const std::string path = ::testing::TempDir() + "v41_tiny_dspark_config.json";
  std::ofstream(path) << root.dump();
  const V41PrefillTruncation trunc = v41_prefill_truncation(load_deepseek_v41_config(path), "compact", 20);
  ASSERT_TRUE(trunc.active() && trunc.first_layer == 5) << "nothing to truncate: the test proves nothing";
  std::vector<SamplingParams> sp = {params(0, 0), params(0.8f, 101), params(0, 0), params(1.0f, 103)};
  auto truncated = [&](EngineConfig c) {
    c.random_weights_config = path;
    c.prefill_truncation_mode = "compact";
    c.prefill_keep_tokens = 20;
    return c;
  };
  const auto base = run(truncated(config(0)), sp);
  EngineStats st;
  expect_same(base, run(truncated(config(5, 1)), sp, &st), "k=5 scheduled, compact");
  EXPECT_GT(st.spec.num_draft_tokens, 0);
}

}  // namespace
}  // namespace deepinfer
