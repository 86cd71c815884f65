// ModelConfig: official and transformers-5 configs, derived values checked
// against transformers 5.17 (numbers printed by the oracle, see comments), and
// every invalid-field error.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/config.h"

namespace deepinfer {
namespace {

std::string data_path(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/unit/io/data/" + name;
}

nlohmann::json load_json(const std::string& name) {
  return nlohmann::json::parse(read_text_file(data_path(name)));
}

ModelConfig parse(const nlohmann::json& j) { return parse_model_config(j.dump(), "test/config.json"); }

void expect_config_error(const nlohmann::json& j, const std::vector<std::string>& parts) {
  try {
    parse(j);
    FAIL() << "expected an error for " << j.dump();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test/config.json"), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(ModelConfig, OfficialDeepSeekV3) {
  ModelConfig c = load_model_config(data_path("deepseek_v3_official_config.json"));
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_row_dim(), 576);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_TRUE(c.rope_scaling.is_yarn());
  EXPECT_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_TRUE(c.rope_interleave);  // absent: transformers default
  EXPECT_TRUE(c.quantization.is_fp8());
  EXPECT_EQ(c.quantization.block_n, 128);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_EQ(c.num_moe_layers(), 58);
  // transformers 5.17: yarn_apply_mscale(rope_parameters, 192 ** -0.5).
  EXPECT_NEAR(c.softmax_scale(), 0.13523377886088009, 1e-15);
  // _compute_yarn_parameters' attention_factor for mscale = mscale_all_dim = 1.
  EXPECT_DOUBLE_EQ(c.yarn_attention_factor(), 1.0);
  // sum(p.numel()) of DeepseekV3ForCausalLM(config) on the meta device (no MTP there).
  ParameterCount p = c.parameter_count();
  EXPECT_EQ(p.total, 671026404352);
  // DeepSeek reports 37B activated parameters per token.
  EXPECT_GT(p.active_per_token, 36'500'000'000);
  EXPECT_LT(p.active_per_token, 38'000'000'000);
  // MTP module: ~11.5B beyond the shared embedding and head (DeepSeek: 685B - 671B incl. them).
  EXPECT_GT(p.mtp_total, 11'000'000'000);
  EXPECT_LT(p.mtp_total, 12'500'000'000);

  MoeRouting r = c.moe_routing();
  EXPECT_EQ(r.scoring, MoeRouting::Scoring::Sigmoid);
  EXPECT_TRUE(r.use_bias);
  EXPECT_TRUE(r.group_limited);
  EXPECT_TRUE(r.normalize);
  EXPECT_EQ(r.num_groups, 8);
  EXPECT_EQ(r.top_k_groups, 4);
  EXPECT_FLOAT_EQ(r.scaling, 2.5f);
  EXPECT_NE(c.summary().find("deepseek_v3"), std::string::npos);
}

TEST(ModelConfig, BothRopeSpellingsAgree) {
  nlohmann::json official = load_json("deepseek_v3_official_config.json");
  nlohmann::json v5 = official;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40},
                           {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
                           {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  ModelConfig a = parse(official), b = parse(v5);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.mscale_all_dim, b.rope_scaling.mscale_all_dim);
  EXPECT_EQ(a.softmax_scale(), b.softmax_scale());
  // "rope_type" inside rope_scaling is accepted as well as "type".
  nlohmann::json alt = official;
  alt["rope_scaling"].erase("type");
  alt["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_EQ(parse(alt).softmax_scale(), a.softmax_scale());
  // No rope scaling: plain qk_head_dim^-0.5.
  nlohmann::json plain = official;
  plain.erase("rope_scaling");
  EXPECT_DOUBLE_EQ(parse(plain).softmax_scale(), 1.0 / std::sqrt(192.0));
  EXPECT_FALSE(parse(plain).rope_scaling.is_yarn());
}

TEST(ModelConfig, YarnWithoutMscaleAllDimUsesPlainAttentionFactor) {
  nlohmann::json j = load_json("deepseek_v3_official_config.json");
  j["rope_scaling"].erase("mscale_all_dim");
  ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / std::sqrt(192.0));
  EXPECT_DOUBLE_EQ(c.yarn_attention_factor(), 0.1 * std::log(40.0) + 1.0);
}

TEST(ModelConfig, DeepSeekV2Lite) {
  ModelConfig c = load_model_config(data_path("deepseek_v2_lite_config.json"));
  EXPECT_EQ(c.model_type, "deepseek_v2");
  EXPECT_FALSE(c.has_q_lora());
  EXPECT_EQ(c.scoring_func, "softmax");
  EXPECT_EQ(c.topk_method, "greedy");
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.shared_intermediate_size(), 2 * 1408);
  // transformers 5.17 on the meta device.
  EXPECT_EQ(c.parameter_count().total, 15706484224);
  EXPECT_NEAR(c.softmax_scale(), 0.11472138679292609, 1e-15);
  MoeRouting r = c.moe_routing();
  EXPECT_EQ(r.scoring, MoeRouting::Scoring::Softmax);
  EXPECT_FALSE(r.use_bias);
  EXPECT_FALSE(r.group_limited);
  EXPECT_FALSE(r.normalize);
}

TEST(ModelConfig, TinyConfigsSavedByTransformers5) {
  ModelConfig v3 = load_model_config(data_path("tiny_v3_transformers5_config.json"));
  EXPECT_EQ(v3.rope_scaling.factor, 4.0);
  EXPECT_EQ(v3.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(v3.num_nextn_predict_layers, 1);
  // sum(p.numel()) and yarn_apply_mscale from transformers 5.17 for these configs.
  EXPECT_EQ(v3.parameter_count().total, 30760);
  EXPECT_NEAR(v3.softmax_scale(), 0.37426067039004857, 1e-15);
  ModelConfig v2 = load_model_config(data_path("tiny_v2_transformers5_config.json"));
  EXPECT_EQ(v2.n_group, 1);  // null
  EXPECT_EQ(v2.topk_group, 1);
  EXPECT_FALSE(v2.has_q_lora());
  EXPECT_EQ(v2.parameter_count().total, 22064);
  EXPECT_NEAR(v2.softmax_scale(), 0.28867513459481287, 1e-15);
  EXPECT_EQ(v2.bos_token_id, 1);
}

TEST(ModelConfig, ErrorsNameTheField) {
  const nlohmann::json base = load_json("deepseek_v3_official_config.json");
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = base;
    j[key] = std::move(value);
    return j;
  };
  auto without = [&](const char* key) {
    nlohmann::json j = base;
    j.erase(key);
    return j;
  };
  expect_config_error(with("model_type", "llama"), {"model_type", "'llama'"});
  expect_config_error(without("model_type"), {"model_type"});
  expect_config_error(without("hidden_size"), {"'hidden_size'", "missing"});
  expect_config_error(with("hidden_size", "big"), {"'hidden_size'", "integer", "\"big\""});
  expect_config_error(with("hidden_size", 0), {"'hidden_size'", "> 0"});
  expect_config_error(with("hidden_size", -5), {"'hidden_size'"});
  expect_config_error(with("num_experts_per_tok", 300), {"'num_experts_per_tok'", "256"});
  expect_config_error(with("topk_group", 9), {"'topk_group'", "n_group = 8"});
  expect_config_error(with("n_group", 7), {"'n_group'", "divisible"});
  expect_config_error(with("qk_rope_head_dim", 63), {"'qk_rope_head_dim'", "even"});
  expect_config_error(with("scoring_func", "softmax"), {"'scoring_func'"});
  expect_config_error(with("norm_topk_prob", 1), {"'norm_topk_prob'", "true or false"});
  expect_config_error(with("eos_token_id", "x"), {"'eos_token_id'"});
  expect_config_error(with("hidden_act", "gelu"), {"'hidden_act'"});
  {
    nlohmann::json j = base;
    j["rope_scaling"]["type"] = "dynamic";
    expect_config_error(j, {"rope_scaling.rope_type", "'dynamic'"});
  }
  {
    nlohmann::json j = base;
    j["quantization_config"]["weight_block_size"] = {128};
    expect_config_error(j, {"quantization_config.weight_block_size"});
  }
  {
    nlohmann::json j = base;
    j["quantization_config"]["quant_method"] = "gptq";
    expect_config_error(j, {"quantization_config.quant_method", "'gptq'"});
  }
  {
    // Top-8 cannot come from 1 group of 2 experts.
    nlohmann::json j = with("topk_group", 1);
    j["n_group"] = 128;
    expect_config_error(j, {"'num_experts_per_tok'"});
  }
  EXPECT_THROW(parse_model_config("{not json", "x.json"), Error);
  EXPECT_THROW(load_model_config("/nonexistent/config.json"), Error);
}

TEST(ModelConfig, DeeplyNestedOrMalformedJsonIsAClearError) {
  // Nested 200,000 deep (built here): used to overflow the stack (SIGSEGV) in `info --model`.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  auto error_of = [](const std::string& text) {
    try {
      parse_model_config(text, "test/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string msg = error_of(R"({"model_type": "deepseek_v3", "vocab_size": )" + deep + "}");
  EXPECT_NE(msg.find("test/config.json: JSON nested deeper than the limit of 256"), std::string::npos) << msg;
  EXPECT_NE(error_of("{\"model_type\": \"deepseek_v3\xff\"}").find("invalid UTF-8 at byte offset"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "deepseek_v3", "model_type": "deepseek_v2"})").find("'model_type' appears twice"),
            std::string::npos);
  // A field of the wrong type, nested within the limit: its value is shown cut short.
  const std::string d200 = std::string(200, '[') + std::string(200, ']');
  const std::string wrong = error_of(R"({"model_type": "deepseek_v3", "vocab_size": )" + d200 + "}");
  EXPECT_NE(wrong.find("field 'vocab_size'"), std::string::npos) << wrong;
  EXPECT_LT(wrong.size(), 400u) << wrong;
}

TEST(ModelConfig, MoeLayerFrequencyAndDenseModels) {
  nlohmann::json j = load_json("deepseek_v3_official_config.json");
  j["moe_layer_freq"] = 2;
  ModelConfig c = parse(j);
  EXPECT_FALSE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(4));
  j["n_routed_experts"] = nullptr;
  ModelConfig dense = parse(j);
  EXPECT_EQ(dense.n_routed_experts, 0);
  EXPECT_EQ(dense.num_moe_layers(), 0);
  EXPECT_EQ(dense.parameter_count().total, dense.parameter_count().active_per_token +
                                               0);  // nothing inactive in a dense model
}

}  // namespace
}  // namespace deepinfer
