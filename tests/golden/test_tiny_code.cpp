// The embedded default model (models/deepseek-v3-tiny-code, FP8 128x128 block-scaled)
// against HF transformers: for 5 held-out code prompts, deepinfer's tokenizer gives the
// oracle's prompt ids and deepinfer's greedy decode (CPU backend, paged cache, one
// token per step) gives the same 64 tokens as stock DeepseekV3ForCausalLM on the
// dequantized checkpoint in fp32 (tests/golden/tiny_code_fixture.json, made on the H200
// by tools/train_tiny/train.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/model.h"
#include "paged_driver.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

const std::string kModelDir = std::string(DEEPINFER_SOURCE_DIR) + "/models/deepseek-v3-tiny-code";
const std::string kFixture = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/tiny_code_fixture.json";

int32_t argmax(const std::vector<float>& row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

TEST(TinyCodeModel, GreedyMatchesTransformersOnHeldOutPrompts) {
  ASSERT_TRUE(std::filesystem::exists(kModelDir + "/config.json")) << kModelDir;
  std::ifstream in(kFixture);
  ASSERT_TRUE(in.good()) << kFixture;
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const auto& prompts = fixture.at("prompts");
  ASSERT_GE(prompts.size(), 5u);

  Tokenizer tokenizer = Tokenizer::from_dir(kModelDir);
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Model> model = load_model(kModelDir, *backend);

  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto& prompt = prompts[p];
    const auto want_prompt = prompt.at("prompt_ids").get<std::vector<int32_t>>();
    const auto want_greedy = prompt.at("greedy_ids").get<std::vector<int32_t>>();
    ASSERT_EQ(want_greedy.size(), 64u);

    // The fixture's prompt is [BOS] + encoding of the text: add_bos_token is true.
    EXPECT_EQ(tokenizer.encode(prompt.at("text").get<std::string>(), /*add_special_tokens=*/true),
              want_prompt)
        << "prompt " << p << " (" << prompt.at("source") << ")";

    test::PagedDriver driver(*model, *backend, /*block_size=*/16, /*num_blocks=*/16);
    int seq = driver.add_sequence();
    std::vector<int32_t> got;
    std::vector<std::vector<float>> logits = driver.step({{seq, want_prompt, false}});
    for (size_t i = 0; i < want_greedy.size(); ++i) {
      got.push_back(argmax(logits.at(0)));
      if (i + 1 < want_greedy.size()) logits = driver.step({{seq, {got.back()}, false}});
    }
    EXPECT_EQ(got, want_greedy) << "prompt " << p << " (" << prompt.at("source") << ")";
  }
}

}  // namespace
}  // namespace deepinfer
