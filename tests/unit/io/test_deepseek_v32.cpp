// DeepSeek-V3.2 (model/deepseek_v32/): config reading with the indexer fields, errors
// naming the missing/bad field, indexer weight shapes checked at load naming the tensor.
// Shapes follow MODELS.md (DeepSeek's V3.2 reference). quantization_config.scale_fmt
// 'ue8m0' (V3.1 / V3.2) is read, and a checkpoint claiming it must hold power-of-two block
// scales (the error names the tensor). The forward itself: tests/golden (Golden.V32*).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/deepseek_v32/config.h"
#include "model/deepseek_v32/weights.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/weights.h"
#include "expect_error.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

// A tiny V3.2: 2 layers (1 dense, 1 MoE), q_lora 32, 16 indexer heads x 8 (rope 4).
nlohmann::json tiny_v32() {
  return {{"model_type", "deepseek_v32"}, {"vocab_size", 64}, {"hidden_size", 32},
          {"intermediate_size", 48}, {"moe_intermediate_size", 16}, {"num_hidden_layers", 2},
          {"num_attention_heads", 2}, {"q_lora_rank", 24}, {"kv_lora_rank", 16},
          {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 8},
          {"n_routed_experts", 4}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
          {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1},
          {"num_nextn_predict_layers", 0}, {"max_position_embeddings", 128},
          {"index_n_heads", 16}, {"index_head_dim", 8}, {"index_topk", 32}};
}

ModelConfig parse(const nlohmann::json& j) { return parse_model_config(j.dump(), "v32/config.json"); }

using testing::error_of;
using testing::expect_contains;

TEST(DeepseekV32Config, ReadsV3FieldsAndTheIndexer) {
  const ModelConfig c = parse(tiny_v32());
  EXPECT_EQ(c.model_type, "deepseek_v32");
  const IndexerDims& ix = deepseek_v32_indexer(c);
  EXPECT_EQ(ix.n_heads, 16);
  EXPECT_EQ(ix.head_dim, 8);
  EXPECT_EQ(ix.topk, 32);
  EXPECT_EQ(ix.rope_dim, 4);
  ASSERT_TRUE(c.sparse_attention().has_value());  // what bench counts by
  EXPECT_EQ(c.sparse_attention()->topk, 32);
  EXPECT_EQ(c.sparse_attention()->score_heads, 16);
  EXPECT_EQ(c.sparse_attention()->key_dim, 8);
  // V3's defaults and routing rules apply.
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  expect_contains(c.summary(), {"deepseek_v32", "indexer 16 heads x 8", "top 32"});
  // V3 has no indexer.
  nlohmann::json v3 = tiny_v32();
  v3["model_type"] = "deepseek_v3";
  EXPECT_FALSE(parse(v3).sparse_attention().has_value());
  expect_contains(error_of([&] { deepseek_v32_indexer(parse(v3)); }), {"v32/config.json", "deepseek_v3", "indexer"});
  EXPECT_EQ(parse(v3).summary().find("indexer"), std::string::npos);
}

TEST(DeepseekV32Config, MissingOrBadIndexerFieldsNameTheField) {
  for (const char* field : {"index_n_heads", "index_head_dim", "index_topk"}) {
    nlohmann::json j = tiny_v32();
    j.erase(field);
    expect_contains(error_of([&] { parse(j); }), {"v32/config.json", std::string("'") + field + "'", "missing"});
    j[field] = "many";
    expect_contains(error_of([&] { parse(j); }), {std::string("'") + field + "'", "integer"});
    j[field] = 0;
    expect_contains(error_of([&] { parse(j); }), {std::string("'") + field + "'", "> 0"});
  }
  nlohmann::json j = tiny_v32();
  j["index_topk"] = 129;  // > max_position_embeddings 128
  expect_contains(error_of([&] { parse(j); }), {"'index_topk'", "129", "larger than the context", "128"});
  j = tiny_v32();
  j["index_head_dim"] = 2;  // < qk_rope_head_dim 4
  expect_contains(error_of([&] { parse(j); }), {"'index_head_dim'", "qk_rope_head_dim = 4"});
  j = tiny_v32();
  j["q_lora_rank"] = nullptr;
  expect_contains(error_of([&] { parse(j); }), {"'q_lora_rank'", "deepseek_v32"});
  j = tiny_v32();
  j["hidden_size"] = -1;  // V3's checks run too
  expect_contains(error_of([&] { parse(j); }), {"'hidden_size'"});
}

// Host tensors by name: V3's checkpoint layout plus the indexer's, as a TensorSource.
struct Tensors {
  std::map<std::string, HostBuffer> buffers;
  void add(const std::string& name, DType dtype, std::vector<int64_t> dims) {
    HostBuffer b(dtype, std::move(dims));
    std::memset(b.tensor().data, 0, b.tensor().num_bytes());
    buffers[name] = std::move(b);
  }
  TensorSource source() const {
    TensorSource s;
    s.find = [this](const std::string& name) -> std::optional<Tensor> {
      auto it = buffers.find(name);
      if (it == buffers.end()) return std::nullopt;
      return it->second.tensor();
    };
    s.describe = [](const std::string&) { return std::string("mem"); };
    return s;
  }
};

// tiny_v32's checkpoint: V3's tensors in `linear` (BF16, or F8_E4M3 with [1, 1] block scales,
// as wq_b/wk get too), k_norm in `norm`, weights_proj BF16 (as DeepSeek ships it).
// With mtp: the MTP block's tensors too (layer 2), its indexer included.
Tensors v32_tensors(const ModelConfig& c, DType linear = DType::BF16, DType norm = DType::BF16, bool mtp = false) {
  Tensors t;
  for (const TensorSpec& s : checkpoint_layout(c, linear, mtp)) t.add(s.name, s.dtype, s.shape);
  for (int l = 0; l < c.num_hidden_layers + (mtp ? c.num_nextn_predict_layers : 0); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.indexer.";
    t.add(p + "wq_b.weight", linear, {16 * 8, 24});
    t.add(p + "wk.weight", linear, {8, 32});
    if (linear == DType::F8_E4M3) {
      t.add(p + "wq_b.weight_scale_inv", DType::F32, {1, 1});
      t.add(p + "wk.weight_scale_inv", DType::F32, {1, 1});
    }
    t.add(p + "k_norm.weight", norm, {8});
    t.add(p + "k_norm.bias", norm, {8});
    t.add(p + "weights_proj.weight", DType::BF16, {16, 32});
  }
  return t;
}

TEST(DeepseekV32Weights, IndexerShapesAreChecked) {
  const ModelConfig c = parse(tiny_v32());
  Tensors t = v32_tensors(c);
  const std::vector<IndexerWeights> w = assemble_indexer_weights(c, t.source());
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1].wq_b.w.dims(), (std::vector<int64_t>{128, 24}));
  EXPECT_EQ(w[0].weights_proj.w.dims(), (std::vector<int64_t>{16, 32}));

  const std::string p = "model.layers.1.self_attn.indexer.";
  for (const auto& [name, dims] : std::map<std::string, std::vector<int64_t>>{
           {"wq_b.weight", {16 * 8, 32}}, {"wk.weight", {4, 32}}, {"k_norm.bias", {16}},
           {"weights_proj.weight", {32, 16}}}) {
    Tensors bad = v32_tensors(c);
    bad.add(p + name, DType::BF16, dims);
    expect_contains(error_of([&] { assemble_indexer_weights(c, bad.source()); }),
                    {"'" + p + name + "'", "has shape", "expects"});
  }
  Tensors missing = v32_tensors(c);
  missing.buffers.erase("model.layers.0.self_attn.indexer.k_norm.weight");
  expect_contains(error_of([&] { assemble_indexer_weights(c, missing.source()); }),
                  {"'model.layers.0.self_attn.indexer.k_norm.weight'", "missing"});
  Tensors int_weight = v32_tensors(c);
  int_weight.add(p + "wk.weight", DType::I32, {8, 32});
  expect_contains(error_of([&] { assemble_indexer_weights(c, int_weight.source()); }),
                  {"'" + p + "wk.weight'", "dtype"});
}

void write_checkpoint(const Tensors& t, const nlohmann::json& config, const testing::TempDir& dir) {
  SafetensorsWriter writer;
  for (const auto& [name, b] : t.buffers) writer.add(name, b.tensor());
  writer.write(dir.file("model.safetensors"));
  dir.write("config.json", config.dump());
}

TEST(DeepseekV32Weights, LoadChecksTheIndexerAndBuildsTheSparseForward) {
  const ModelConfig c = parse(tiny_v32());
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  {
    testing::TempDir dir;
    write_checkpoint(v32_tensors(c), tiny_v32(), dir);
    std::unique_ptr<Model> model = load_model(dir.path(), *cpu);
    // Two KV layer groups: the latent rows (kv_lora + rope = 16 + 4) and the indexer keys
    // (index_head_dim 8), each with a cache per layer.
    const std::vector<KvGroupSpec> groups = model->kv_groups();
    ASSERT_EQ(groups.size(), 2u);
    EXPECT_EQ(groups[0].name, "latent");
    EXPECT_EQ(groups[0].row_dim, 20);
    EXPECT_EQ(groups[1].name, "indexer_keys");
    EXPECT_EQ(groups[1].row_dim, 8);
    EXPECT_EQ(groups[1].num_layers, 2);
    EXPECT_TRUE(groups[1].activation_dtype);
    EXPECT_EQ(model->num_mtp_layers(), 0);
    // deepinfer info's check of the tensors beyond ModelWeights passes.
    const CheckpointReader reader = CheckpointReader::open(dir.path());
    find_architecture("deepseek_v32", "x").check_extra_weights(c, reader);
  }
  {
    testing::TempDir dir;
    Tensors bad = v32_tensors(c);
    bad.add("model.layers.0.self_attn.indexer.wk.weight", DType::BF16, {8, 31});
    write_checkpoint(bad, tiny_v32(), dir);
    expect_contains(error_of([&] { load_model(dir.path(), *cpu); }),
                    {"'model.layers.0.self_attn.indexer.wk.weight'", "[8, 31]"});
    const CheckpointReader reader = CheckpointReader::open(dir.path());
    expect_contains(error_of([&] { find_architecture("deepseek_v32", "x").check_extra_weights(c, reader); }),
                    {"'model.layers.0.self_attn.indexer.wk.weight'"});
  }
}

// V3.2's MTP block (layer id num_hidden_layers) is V3's with an indexer of its own: it loads
// (so the engine drafts with it by default), takes a cache in both KV groups, and a missing or
// misshapen MTP indexer tensor is an error naming it; without load_mtp it is not read.
TEST(DeepseekV32Weights, TheMtpBlockLoadsWithItsIndexer) {
  nlohmann::json j = tiny_v32();
  j["num_nextn_predict_layers"] = 1;
  const ModelConfig c = parse(j);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  {
    testing::TempDir dir;
    write_checkpoint(v32_tensors(c, DType::BF16, DType::BF16, true), j, dir);
    std::unique_ptr<Model> model = load_model(dir.path(), *cpu);
    EXPECT_EQ(model->num_mtp_layers(), 1);
    EXPECT_EQ(model->mtp_kv_group(), 0);
    EXPECT_EQ(model->num_mtp_kv_groups(), 2);  // latent and indexer keys
    const CheckpointReader reader = CheckpointReader::open(dir.path());
    find_architecture("deepseek_v32", "x").check_extra_weights(c, reader);
  }
  for (const bool misshapen : {false, true}) {
    testing::TempDir dir;
    Tensors bad = v32_tensors(c, DType::BF16, DType::BF16, true);
    const std::string name = "model.layers.2.self_attn.indexer.wk.weight";
    if (misshapen) {
      bad.add(name, DType::BF16, {8, 30});
    } else {
      bad.buffers.erase(name);
    }
    write_checkpoint(bad, j, dir);
    expect_contains(error_of([&] { load_model(dir.path(), *cpu); }), {"'" + name + "'", misshapen ? "[8, 30]" : "missing"});
    const CheckpointReader reader = CheckpointReader::open(dir.path());
    expect_contains(error_of([&] { find_architecture("deepseek_v32", "x").check_extra_weights(c, reader); }),
                    {"'" + name + "'"});
    LoadOptions no_mtp;
    no_mtp.load_mtp = false;
    EXPECT_EQ(load_model(dir.path(), *cpu, no_mtp)->num_mtp_layers(), 0);
  }
}

// The indexer's scores workspace (F32 [token rows, context]) grows 2x within its byte limit and
// refuses a step past it, naming the tokens, the context, the bytes and the limit.
TEST(IndexerWorkspace, ScoresCapacityGrowsWithinTheLimitAndRefusesPastIt) {
  EXPECT_EQ(indexer_scores_capacity(4, 100, 0, 1 << 20), 100);
  EXPECT_EQ(indexer_scores_capacity(4, 101, 100, 1 << 20), 200);           // 2x
  EXPECT_EQ(indexer_scores_capacity(4, 40000, 32768, 1 << 20), 65536);     // 2x capped: 4 x 65536 x 4 B = 1 MiB
  EXPECT_EQ(indexer_scores_capacity(4, 65536, 0, 1 << 20), 65536);        // exactly the limit
  expect_contains(error_of([] { indexer_scores_capacity(4, 65537, 0, 1 << 20); }),
                  {"4 tokens", "65537 positions", "1048592 bytes", "limit of 1048576 bytes", "max_num_batched_tokens"});
  EXPECT_EQ(kIndexerScoresMaxBytes, int64_t{8} << 30);
  EXPECT_EQ(indexer_scores_capacity(16384, 131072, 0), 131072);  // 8 GiB: a full-size step fits
}

// Random indexer weights continue checkpoint_layout's numbering (model/weights.h: tensor k
// from random_hash(seed, k)), in the checkpoint's dtypes: wq_b and wk block-scaled FP8 in an FP8
// layout, weights_proj and the LayerNorm dense. Values recomputed from random_weight_value.
TEST(DeepseekV32Weights, RandomIndexerWeightsFollowTheLayout) {
  nlohmann::json j = tiny_v32();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {16, 16}}};
  const ModelConfig c = parse(j);
  const uint64_t seed = 7;
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    std::vector<std::shared_ptr<const void>> owners;
    const std::vector<IndexerWeights> w = make_random_indexer_weights(c, seed, dt, nullptr, owners);
    ASSERT_EQ(w.size(), 2u);
    const bool fp8 = dt == DType::F8_E4M3;
    EXPECT_EQ(w[0].wq_b.w.dtype, dt);
    EXPECT_EQ(w[0].wq_b.w.dims(), (std::vector<int64_t>{128, 24}));
    EXPECT_EQ(w[1].wk.scale_inv.defined(), fp8);
    if (fp8) {
      EXPECT_EQ(w[1].wk.scale_inv.dims(), (std::vector<int64_t>{1, 2}));  // [8/16, 32/16] blocks
    }
    EXPECT_EQ(w[0].weights_proj.w.dtype, DType::BF16);
    EXPECT_FALSE(w[0].weights_proj.scale_inv.defined());
    // Layer 0's wq_b is the first tensor after V3's layout; element 5 of it:
    const uint64_t first = checkpoint_layout(c, dt, true).size();
    const float bound = std::sqrt(3.0f / 24.0f);
    if (fp8) {
      const float v = random_weight_value(seed, first, 5, {448.0f, 0.0f});
      EXPECT_EQ(w[0].wq_b.w.ptr<uint8_t>()[5], float_to_fp8_e4m3(v));
      // its scales are tensor first + 1, in [base, 2 base) with base = bound / 448
      const float s = w[0].wq_b.scale_inv.ptr<float>()[0];
      EXPECT_EQ(s, random_weight_value(seed, first + 1, 0, {bound / 448 * 0.5f, bound / 448 * 1.5f}));
    } else {
      EXPECT_EQ(w[0].wq_b.w.ptr<uint16_t>()[5], float_to_bf16(random_weight_value(seed, first, 5, {bound, 0.0f})));
      // layer 0: wq_b, wk, k_norm.weight (add 1), k_norm.bias (add 0), weights_proj
      EXPECT_EQ(w[0].k_norm.ptr<uint16_t>()[3], float_to_bf16(random_weight_value(seed, first + 2, 3, {0.1f, 1.0f})));
      EXPECT_EQ(w[0].k_norm_bias.ptr<uint16_t>()[3],
                float_to_bf16(random_weight_value(seed, first + 3, 3, {0.1f, 0.0f})));
    }
  }
  // A random V3.2 model builds (the sparse forward itself: tests/golden ModelConsistency.V32*).
  testing::TempDir dir;
  dir.write("config.json", j.dump());
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  LoadOptions options;
  options.random_weight_dtype = DType::F8_E4M3;
  std::unique_ptr<Model> model = random_model(dir.file("config.json"), *cpu, options);
  EXPECT_EQ(model->kv_groups().size(), 2u);
}

TEST(DeepseekV32Config, ScaleFmtIsReadAndChecked) {
  nlohmann::json j = tiny_v32();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                              {"weight_block_size", {128, 128}}};
  EXPECT_EQ(parse(j).quantization.scale_fmt, "ue8m0");
  j["quantization_config"]["scale_fmt"] = nullptr;
  EXPECT_EQ(parse(j).quantization.scale_fmt, "");
  j["quantization_config"]["scale_fmt"] = "e5m2";
  expect_contains(error_of([&] { parse(j); }), {"'quantization_config.scale_fmt'", "'e5m2'", "ue8m0"});
  j["quantization_config"]["scale_fmt"] = 8;
  expect_contains(error_of([&] { parse(j); }), {"'quantization_config.scale_fmt'", "string"});
}

// An FP8 V3.2 checkpoint whose config says scale_fmt 'ue8m0': power-of-two scales load, any
// other value is refused naming the tensor (at load and by deepinfer info's check).
TEST(DeepseekV32Weights, Ue8m0ScalesMustBePowersOfTwo) {
  nlohmann::json j = tiny_v32();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                              {"weight_block_size", {128, 128}}};
  const ModelConfig c = parse(j);
  Tensors t = v32_tensors(c, DType::F8_E4M3, DType::F32);
  for (auto& [name, b] : t.buffers) {  // every block scale 2^-7
    if (name.size() > 10 && name.substr(name.size() - 10) == "_scale_inv") {
      for (int64_t i = 0; i < b.tensor().numel(); ++i) b.ptr<float>()[i] = 0.0078125f;
    }
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  {
    testing::TempDir dir;
    write_checkpoint(t, j, dir);
    EXPECT_NO_THROW(load_model(dir.path(), *cpu));
  }
  const std::string bad = "model.layers.1.self_attn.indexer.wq_b.weight_scale_inv";
  t.buffers[bad].ptr<float>()[0] = 0.006f;
  testing::TempDir dir;
  write_checkpoint(t, j, dir);
  expect_contains(error_of([&] { load_model(dir.path(), *cpu); }),
                  {"'" + bad + "'", "0.006", "power of two", "ue8m0"});
  const CheckpointReader reader = CheckpointReader::open(dir.path());
  expect_contains(error_of([&] { find_architecture("deepseek_v32", "x").check_extra_weights(c, reader); }),
                  {"'" + bad + "'", "power of two"});
}

}  // namespace
}  // namespace deepinfer
