// DeepSeek-V4 config reading (both spellings) and its bad-input errors (issue 16 item 7).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/deepseek_v4/config.h"
#include "model/registry.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

// V4-Flash's checkpoint config as DeepSeek ships it (MODELS.md), 43 layers + 1 MTP.
json flash_official() {
  json ratios = json::array({0, 0});
  for (int i = 0; i < 20; ++i) {
    ratios.push_back(4);
    ratios.push_back(128);
  }
  ratios.push_back(4);
  ratios.push_back(0);  // MTP
  return json{{"model_type", "deepseek_v4"}, {"num_hidden_layers", 43}, {"hidden_size", 4096},
              {"num_attention_heads", 64},   {"head_dim", 512},         {"qk_rope_head_dim", 64},
              {"q_lora_rank", 1024},         {"o_groups", 8},           {"o_lora_rank", 1024},
              {"n_routed_experts", 256},     {"num_experts_per_tok", 6}, {"num_hash_layers", 3},
              {"compress_ratios", ratios},   {"rope_theta", 10000},     {"compress_rope_theta", 160000},
              {"rope_scaling", {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                                {"beta_fast", 32}, {"beta_slow", 1}}},
              {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                                       {"weight_block_size", {128, 128}}}}};
}

std::string error_of(const json& j) {
  try {
    parse_deepseek_v4_config(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeepseekV4Config, ReadsFlashAsDeepSeekShipsIt) {
  DeepseekV4Config c = parse_deepseek_v4_config(flash_official(), "cfg.json");
  ASSERT_EQ(c.attention.size(), 43u);
  EXPECT_EQ(c.attention[0], V4AttentionKind::Window);
  EXPECT_EQ(c.attention[1], V4AttentionKind::Window);
  EXPECT_EQ(c.attention[2], V4AttentionKind::Csa);
  EXPECT_EQ(c.attention[3], V4AttentionKind::Hca);
  EXPECT_EQ(c.attention[42], V4AttentionKind::Csa);
  EXPECT_EQ(c.ratio(3), 128);
  EXPECT_TRUE(c.hash_moe[2]);
  EXPECT_FALSE(c.hash_moe[3]);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_TRUE(c.compress_rope.is_yarn());
  EXPECT_EQ(c.compress_rope.attention_factor, 1.0);  // the V4 reference does not scale cos/sin
  EXPECT_DOUBLE_EQ(c.compress_rope_dims().theta, 160000.0);
  EXPECT_FALSE(c.main_rope_dims().scaling.is_yarn());
  EXPECT_TRUE(c.base.quantization.is_fp8());
  EXPECT_EQ(find_architecture("deepseek_v4", "cfg.json").model_type, "deepseek_v4");
}

TEST(DeepseekV4Config, ReadsTransformersSpelling) {
  json j = {{"model_type", "deepseek_v4"}, {"num_hidden_layers", 3}, {"hidden_size", 64}, {"num_attention_heads", 4},
            {"head_dim", 32}, {"partial_rotary_factor", 0.25}, {"q_lora_rank", 32}, {"o_groups", 2},
            {"o_lora_rank", 16}, {"n_routed_experts", 8}, {"num_experts_per_tok", 2},
            {"layer_types", {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"}},
            {"compress_rates", {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 8}}},
            {"mlp_layer_types", {"hash_moe", "moe", "moe"}},
            {"rope_parameters", {{"main", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
                                 {"compress", {{"rope_type", "yarn"}, {"rope_theta", 160000.0}, {"factor", 4.0},
                                               {"original_max_position_embeddings", 16}, {"attention_factor", 1.0}}}}}};
  DeepseekV4Config c = parse_deepseek_v4_config(j, "cfg.json");
  EXPECT_EQ(c.rope_dim, 8);
  EXPECT_EQ(c.ratio(1), 4);
  EXPECT_EQ(c.ratio(2), 8);
  EXPECT_EQ(c.attention[0], V4AttentionKind::Window);
  EXPECT_TRUE(c.hash_moe[0]);
  EXPECT_FALSE(c.hash_moe[1]);
  EXPECT_EQ(c.compress_rope.original_max_position_embeddings, 16);
}

TEST(DeepseekV4Config, CompressRatiosOfTheWrongLengthNameTheField) {
  json j = flash_official();
  j["compress_ratios"].erase(0);
  j["compress_ratios"].erase(0);
  const std::string e = error_of(j);
  EXPECT_NE(e.find("compress_ratios"), std::string::npos) << e;
  EXPECT_NE(e.find("42 entries"), std::string::npos) << e;
}

TEST(DeepseekV4Config, UnsupportedRatioNamesTheEntry) {
  json j = flash_official();
  j["compress_ratios"][5] = 16;
  const std::string e = error_of(j);
  EXPECT_NE(e.find("compress_ratios"), std::string::npos) << e;
  EXPECT_NE(e.find("entry 5 is 16"), std::string::npos) << e;
}

TEST(DeepseekV4Config, OtherBadFieldsAreNamed) {
  json j = flash_official();
  j["scoring_func"] = "sigmoid";
  EXPECT_NE(error_of(j).find("scoring_func"), std::string::npos);
  j = flash_official();
  j["o_groups"] = 7;
  EXPECT_NE(error_of(j).find("o_groups"), std::string::npos);
  j = flash_official();
  j["num_key_value_heads"] = 2;
  EXPECT_NE(error_of(j).find("num_key_value_heads"), std::string::npos);
  j = flash_official();
  j.erase("compress_ratios");
  j["layer_types"] = json::array();
  for (int i = 0; i < 43; ++i) j["layer_types"].push_back(i == 7 ? "full_attention" : "sliding_attention");
  EXPECT_NE(error_of(j).find("'full_attention' is not a DeepSeek-V4 attention type"), std::string::npos);
  j = flash_official();
  j["compress_ratios"][43] = 4;  // the MTP layer is window-only
  EXPECT_NE(error_of(j).find("MTP"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
