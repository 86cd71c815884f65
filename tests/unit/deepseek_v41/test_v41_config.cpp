// DeepSeek-V4.1 config reading (composite as released, flat as the PR saves it) and its bad-input
// errors (issue 19 item 7): each names the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

// The released layout: the text model under text_config, quantization_config at the top; every
// schedule field absent (the PR's defaults).
json flash() {
  return json{{"model_type", "deepseek_v41"},
              {"text_config",
               {{"model_type", "deepseek_v41_text"},
                {"num_nextn_predict_layers", 3},
                {"rope_scaling",
                 {{"type", "yarn"},
                  {"factor", 16},
                  {"original_max_position_embeddings", 65536},
                  {"beta_fast", 32},
                  {"beta_slow", 1}}}}},
              {"quantization_config",
               {{"quant_method", "fp8"},
                {"fmt", "e4m3"},
                {"scale_fmt", "ue8m0"},
                {"weight_block_size", {32, 32}}}}};
}

// A 7-layer flat config (the golden fixture's schedule).
json tiny() {
  return json{{"model_type", "deepseek_v41_text"},
              {"num_hidden_layers", 7},
              {"hidden_size", 64},
              {"num_attention_heads", 4},
              {"head_dim", 64},
              {"qk_rope_head_dim", 16},
              {"q_lora_rank", 32},
              {"o_groups", 2},
              {"o_lora_rank", 16},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 32},
              {"index_n_heads", 16},
              {"index_head_dim", 32},
              {"num_nextn_predict_layers", 0},
              {"vocab_size", 256},
              {"compress_ratios", {0, 2, 2, 2, 1, 1, 1}},
              {"kv_source_layer_ids", {1, 3, 4}},
              {"index_source_layer_ids", {1, 3, 4, 6}}};
}

std::string error_of(const json& j) {
  try {
    parse_deepseek_v41_config(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const json& j, const std::string& field, const std::string& words) {
  const std::string e = error_of(j);
  EXPECT_NE(e.find("'" + field + "'"), std::string::npos)
      << "field " << field << " not named in: " << e;
  EXPECT_NE(e.find(words), std::string::npos) << "'" << words << "' not in: " << e;
}

TEST(DeepseekV41Config, ReadsTheReleasedCompositeConfigWithThePrDefaults) {
  const DeepseekV41Config c = parse_deepseek_v41_config(flash(), "cfg.json");
  EXPECT_EQ(c.base.model_type, "deepseek_v41");
  EXPECT_EQ(c.base.source, "cfg.json");
  EXPECT_EQ(c.num_layers(), 40);
  EXPECT_EQ(c.base.hidden_size, 5120);
  EXPECT_EQ(c.base.q_lora_rank, 1280);
  EXPECT_EQ(c.base.n_routed_experts, 384);
  EXPECT_EQ(c.base.moe_intermediate_size, 2304);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.base.rms_norm_eps, 1e-20);
  EXPECT_EQ(c.base.quantization.block_n, 32);  // from the top-level quantization_config
  for (int l = 0; l < 40; ++l) EXPECT_EQ(c.ratio(l), l < 2 ? 0 : l < 20 ? 2 : 1) << l;
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.kv_source_of(13), 8);
  EXPECT_EQ(c.kv_source_of(39), 20);
  EXPECT_EQ(c.kv_source_of(1), -1);
  EXPECT_EQ(c.index_source_of(27), 24);
  EXPECT_EQ(c.dspark_target_layers, (std::vector<int>{37, 38, 39}));
  EXPECT_TRUE(c.compress_rope.is_yarn());
}

TEST(DeepseekV41Config, FlatAndCompositeSpellingsReadAlike) {
  const DeepseekV41Config flat = parse_deepseek_v41_config(tiny(), "cfg.json");
  const DeepseekV41Config comp = parse_deepseek_v41_config(
      json{{"model_type", "deepseek_v41"}, {"text_config", tiny()}}, "cfg.json");
  EXPECT_EQ(flat.compress_ratios, comp.compress_ratios);
  EXPECT_EQ(flat.kv_source_layers, (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(flat.candidate_source_layer, 4);  // the last KV source
  EXPECT_EQ(comp.base.model_type, "deepseek_v41");
  EXPECT_EQ(flat.base.model_type, "deepseek_v41_text");
}

TEST(DeepseekV41Config, BadSchedulesNameTheField) {
  json j = flash();
  j["text_config"]["kv_source_layer_ids"] = {2, 8, 14, 40};
  expect_error(j, "kv_source_layer_ids", "layer id 40 does not fit num_hidden_layers = 40");
  j = flash();
  j["text_config"]["index_source_layer_ids"] = {2, 8, 14, 20, 24, 41};
  expect_error(j, "index_source_layer_ids", "layer id 41 does not fit num_hidden_layers = 40");
  j = flash();
  j["text_config"]["kv_source_layer_ids"] = {-1, 2};
  expect_error(j, "kv_source_layer_ids", "layer id -1 does not fit");
  j = flash();
  j["text_config"]["kv_source_layer_ids"] = {8, 2, 14, 20};
  expect_error(j, "kv_source_layer_ids", "strictly ascending");
  j = flash();
  j["text_config"]["kv_source_layer_ids"] = {0, 2, 8, 14, 20};
  j["text_config"]["index_source_layer_ids"] = {0, 2, 8, 14, 20};
  expect_error(j, "kv_source_layer_ids", "layer 0 has compress_ratios entry 0");
  j = flash();
  j["text_config"]["index_source_layer_ids"] = {2, 14, 20, 24};
  expect_error(j, "index_source_layer_ids", "must hold every KV source (layer 8");
  j = flash();
  j["text_config"]["candidate_source_layer_id"] = 21;
  expect_error(j, "candidate_source_layer_id", "must be one of index_source_layer_ids");
  j = flash();
  j["text_config"]["candidate_source_layer_id"] = 40;
  expect_error(j, "candidate_source_layer_id", "does not fit num_hidden_layers = 40");
  j = tiny();
  j["candidate_source_layer_id"] = 1;  // layers 3, 4, 6 read other KV sources' entries
  expect_error(j, "candidate_source_layer_id",
               "index source 3 after candidate source 1 reads the entries of KV "
               "source 3, not those of KV source 1");
  j = tiny();
  j["index_source_layer_ids"] = {0, 1, 3, 4};
  j["compress_ratios"] = {2, 2, 2, 2, 1, 1, 1};
  expect_error(j, "index_source_layer_ids",
               "layer 0 has no kv_source_layer_ids entry at or before it");
  j = tiny();
  j["compress_ratios"] = {0, 2, 1, 2,
                          1, 1, 1};  // layer 2 (ratio 1) would read layer 1's ratio-2 entries
  expect_error(j, "compress_ratios",
               "layer 2 has ratio 1 but reads the compressed KV of source layer 1 (ratio 2)");
  j = tiny();
  j["compress_ratios"] = {0, 2, 2};
  expect_error(j, "compress_ratios", "has 3 entries, expected num_hidden_layers = 7");
  j = tiny();
  j["kv_source_layer_ids"] = {3, 4};
  j["index_source_layer_ids"] = {3, 4, 6};
  expect_error(j, "kv_source_layer_ids",
               "layer 1 has compress_ratios entry 2 but no KV source at or before it");
  j = tiny();
  j.erase("kv_source_layer_ids");
  j.erase("index_source_layer_ids");
  j["compress_ratios"] = {0, 0, 2, 2,
                          2, 2, 2};  // a prefix of the released schedule: its default sources
  expect_error(j, "kv_source_layer_ids",
               "does not fit num_hidden_layers = 7: give kv_source_layer_ids");
  j = tiny();
  j["engram_layer_ids"] = {1, 5};
  j["engram_num_embeddings"] = {1000};
  expect_error(j, "engram_num_embeddings", "has 1 entries but engram_layer_ids [1, 5] has 2");
  j = tiny();
  j["engram_layer_ids"] = {1, 7};
  expect_error(j, "engram_layer_ids", "layer id 7 does not fit num_hidden_layers = 7");
  j = tiny();
  j["head_dim"] = 48;
  expect_error(j, "head_dim", "must be a multiple of 32");
  j = tiny();
  j["gate_temp"] = 0;
  expect_error(j, "gate_temp", "must be > 0");
  j = tiny();
  j["scoring_func"] = "softmax";
  expect_error(j, "scoring_func", "not supported");
}

// Runs `f`, expecting an Error whose message holds `needle`.
template <class F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DeepseekV41Config, BadEngramInputNamesTheFieldOrTensor) {
  const std::string src = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/";
  const std::string dir = src + "v41_engram";
  {  // a layer id outside the layer count
    json root = json::parse(std::ifstream(dir + "/config.json"));
    root["text_config"]["engram_layer_ids"] = {1, 7};
    expect_error([&] { (void)parse_deepseek_v41_config(root, "cfg.json"); }, "'engram_layer_ids'");
    root["text_config"]["engram_layer_ids"] = {1, 5};
    root["text_config"]["engram_num_embeddings"] = {0, 290};
    expect_error([&] { (void)parse_deepseek_v41_config(root, "cfg.json"); },
                 "'engram_num_embeddings'");
  }
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  {  // a hash config that does not match the tables: other primes, other row counts
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    c.engram_vocab_size = 60;
    expect_error([&] { (void)load_v41_weights(c, reader); }, "'engram_num_embeddings'");
  }
  {  // a compressed vocabulary the token map does not have
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    c.engram_compressed_vocab_size -= 1;
    expect_error([&] { (void)load_v41_weights(c, reader); }, "engram_compressed_vocab_size");
  }
  {  // Engram layers on a checkpoint without tables
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    auto tiny = std::make_shared<const CheckpointReader>(CheckpointReader::open(src + "v41_tiny"));
    DeepseekV41Config t = load_deepseek_v41_config(src + "v41_tiny");
    t.engram_layers = c.engram_layers;
    t.engram_num_embeddings = c.engram_num_embeddings;
    t.engram_vocab_size = c.engram_vocab_size;
    t.engram_n_heads = c.engram_n_heads;
    t.engram_head_dim = c.engram_head_dim;
    t.engram_compressed_vocab_size = c.engram_compressed_vocab_size;
    expect_error([&] { (void)load_v41_weights(t, tiny); }, "layers.1.engram.embed.weight");
  }
  {  // no token map beside the checkpoint
    const std::string tmp = ::testing::TempDir() + "/v41_engram_no_map";
    std::filesystem::create_directories(tmp);
    std::filesystem::copy_file(dir + "/model.safetensors", tmp + "/model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    auto r = std::make_shared<const CheckpointReader>(CheckpointReader::open(tmp));
    expect_error([&] { (void)load_v41_weights(c, r); }, "engram_token_map.safetensors");
  }
}

// The DSpark drafter's fields (model/deepseek_v41/dspark.h): the PR's and DeepSeek's `dspark_*`, or
// DeepSpec's unprefixed names under `dspark_config`; bad values name the field.
TEST(DeepseekV41Config, DsparkFieldsReadBothSpellingsAndBadValuesNameTheField) {
  json j = tiny();
  j["num_nextn_predict_layers"] = 3;
  j["dspark_noise_token_id"] = 7;  // the default 128799 is no id of a 256-token vocabulary
  {
    const DeepseekV41Config c = parse_deepseek_v41_config(j, "cfg.json");
    EXPECT_EQ(c.dspark_block_size, 5);
    EXPECT_EQ(c.dspark_markov_rank, 256);
    EXPECT_EQ(c.dspark_target_layers, (std::vector<int>{2, 5, 6}));  // the last 3 non-KV-source layers
    EXPECT_TRUE(c.dspark_confidence_head);
    EXPECT_TRUE(c.dspark_confidence_with_markov);
  }
  {
    json d = j;
    d["dspark_config"] = {{"block_size", 4}, {"mask_token_id", 9}, {"target_layer_ids", {1, 2}},
                          {"markov_rank", 16}, {"markov_head_type", "vanilla"},
                          {"enable_confidence_head", false}};
    d.erase("dspark_noise_token_id");
    const DeepseekV41Config c = parse_deepseek_v41_config(d, "cfg.json");
    EXPECT_EQ(c.dspark_block_size, 4);
    EXPECT_EQ(c.dspark_noise_token_id, 9);
    EXPECT_EQ(c.dspark_target_layers, (std::vector<int>{1, 2}));
    EXPECT_EQ(c.dspark_markov_rank, 16);
    EXPECT_FALSE(c.dspark_confidence_head);
    d["dspark_block_size"] = 4;  // the same value spelled both ways
    EXPECT_EQ(parse_deepseek_v41_config(d, "cfg.json").dspark_block_size, 4);
    d["dspark_block_size"] = 5;
    expect_error(d, "dspark_block_size", "'dspark_config.block_size' is 4");
  }
  auto with = [&](const char* key, const json& value) {
    json d = j;
    d[key] = value;
    return d;
  };
  expect_error(with("dspark_block_size", 0), "dspark_block_size", "expected 1 .. 16");
  expect_error(with("dspark_block_size", 17), "dspark_block_size", "expected 1 .. 16");
  expect_error(with("dspark_noise_token_id", 256), "dspark_noise_token_id", "is not a token id");
  expect_error(with("dspark_markov_rank", -1), "dspark_markov_rank", "-1");
  expect_error(with("dspark_markov_head_type", "rnn"), "dspark_markov_head_type", "'rnn' is not supported");
  expect_error(with("dspark_target_layer_ids", json::array({3, 9})), "dspark_target_layer_ids",
               "does not fit num_hidden_layers");
  expect_error(with("dspark_target_layer_ids", json::array({3, 3})), "dspark_target_layer_ids",
               "strictly ascending");
  expect_error(with("dspark_target_layer_ids", json::array()), "dspark_target_layer_ids",
               "needs at least one target layer");
  expect_error(with("dspark_num_experts_per_tok", 200), "dspark_num_experts_per_tok", "must be in");
  expect_error(with("dspark_n_routed_experts", 0), "dspark_n_routed_experts", "must be > 0");
  {
    json d = with("dspark_markov_rank", 0);
    d["dspark_confidence_head_with_markov"] = true;
    expect_error(d, "dspark_confidence_head_with_markov", "needs a Markov head");
  }
  expect_error(with("dspark_config", 3), "dspark_config", "an object");
  {  // a text-only config (no drafter layers) keeps the defaults whatever its vocabulary
    json d = tiny();
    EXPECT_NO_THROW(parse_deepseek_v41_config(d, "cfg.json"));
  }
}

TEST(DeepseekV41Weights, AMissingOrMisshapenDrafterTensorIsNamed) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_dspark";
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir + "/model.safetensors"));
  {
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    c.base.num_nextn_predict_layers = 4;  // a fourth stage the checkpoint does not have
    V41Weights w;
    expect_error([&] { load_dspark_weights(c, reader, w); }, "mtp.3.");
  }
  {
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    c.dspark_markov_rank = 16;
    V41Weights w;
    expect_error([&] { load_dspark_weights(c, reader, w); }, "mtp.2.markov_head.markov_w1.weight");
  }
  {
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    c.dspark_target_layers = {0, 1, 2};  // main_proj fuses 2 taps, not 3
    V41Weights w;
    expect_error([&] { load_dspark_weights(c, reader, w); }, "mtp.0.main_proj.weight");
  }
  {
    DeepseekV41Config c = load_deepseek_v41_config(dir);
    c.base.num_nextn_predict_layers = 0;
    V41Weights w;
    expect_error([&] { load_dspark_weights(c, reader, w); }, "'num_nextn_predict_layers'");
  }
}

TEST(DeepseekV41Weights, AMissingSourceTensorIsNamed) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_tiny";
  DeepseekV41Config c = load_deepseek_v41_config(dir);
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  c.kv_source_layers = {1, 2, 3, 4};  // layer 2 holds no compressor in the checkpoint
  c.index_source_layers = {1, 2, 3, 4, 6};
  try {
    (void)load_v41_weights(c, reader);
    FAIL() << "loaded a compressor that is not in the checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.2.attn.compressor.wkv.weight"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
