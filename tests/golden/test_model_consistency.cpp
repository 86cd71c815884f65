// Forward self-consistency on tiny random models (no oracle needed):
//  - chunked prefill and one-token decode through the paged cache (absorbed MLA; a long chunk:
//    direct MLA over the gathered context) give the same logits as one whole-prompt prefill
//    (direct MLA), within 1e-4 relative;
//  - on a batch-invariant backend a sequence's logits are bit-identical whether it
//    runs alone or shares the step with another sequence;
//  - malformed steps raise Error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/layers/mla.h"
#include "model/model.h"
#include "paged_driver.h"

namespace deepinfer {
namespace {

// V3 features: q_lora, groups with bias, shared expert, a dense layer, YaRN with
// mscale != mscale_all_dim; odd head sizes so nothing lines up with 8 or 128.
constexpr const char* kTinyV3 = R"({
  "model_type": "deepseek_v3", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 72,
  "moe_intermediate_size": 20, "num_hidden_layers": 3, "num_attention_heads": 3,
  "num_key_value_heads": 3, "n_shared_experts": 1, "n_routed_experts": 8,
  "routed_scaling_factor": 2.5, "kv_lora_rank": 36, "q_lora_rank": 40, "qk_rope_head_dim": 8,
  "v_head_dim": 12, "qk_nope_head_dim": 20, "n_group": 4, "topk_group": 2,
  "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": true,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8},
  "topk_method": "noaux_tc", "scoring_func": "sigmoid", "tie_word_embeddings": false})";

// V2 features: no q_lora, softmax routing, no dense layer.
constexpr const char* kTinyV2 = R"({
  "model_type": "deepseek_v2", "vocab_size": 61, "hidden_size": 40, "intermediate_size": 56,
  "moe_intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 2, "n_shared_experts": 2, "n_routed_experts": 6,
  "routed_scaling_factor": 1.5, "kv_lora_rank": 16, "q_lora_rank": null, "qk_rope_head_dim": 6,
  "v_head_dim": 10, "qk_nope_head_dim": 14, "n_group": 1, "topk_group": 1,
  "num_experts_per_tok": 3, "first_k_dense_replace": 0, "norm_topk_prob": false,
  "topk_method": "greedy", "scoring_func": "softmax", "max_position_embeddings": 64,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null})";

// V3.2: kTinyV3 plus a lightning indexer (16 heads, MODELS.md's pitfall: fewer heads tie at the
// cut) whose top 8 positions are fewer than the 23-token prompt, so the sparse selection drops
// positions in prefill (direct form) and decode (absorbed form) alike; mscale == mscale_all_dim
// (the indexer shares MLA's RoPE table, indexer.h); FP8 block scales of 16 x 16.
std::string tiny_v32() {
  nlohmann::json j = nlohmann::json::parse(kTinyV3);
  j["model_type"] = "deepseek_v32";
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  j["index_n_heads"] = 16;
  j["index_head_dim"] = 16;
  j["index_topk"] = 8;
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                              {"weight_block_size", {16, 16}}};
  return j.dump();
}

std::string write_config(const std::string& tag, const char* text) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("deepinfer_consistency_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << text;
  return (dir / "config.json").string();
}

std::vector<int32_t> prompt_ids(int n, int vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % vocab);
  return ids;
}

double max_abs(const std::vector<std::vector<float>>& rows) {
  double m = 1;
  for (const auto& r : rows) {
    for (float v : r) m = std::max(m, std::fabs(double(v)));
  }
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

void check_consistency(const char* config_text, const std::string& tag, DType weight_dtype) {
  const std::string config = write_config(tag, config_text);
  auto backend = make_cpu_backend();
  LoadOptions options;
  options.seed = 1234;
  options.random_weight_dtype = weight_dtype;
  auto model = random_model(config, *backend, options);
  const std::vector<int32_t> prompt = prompt_ids(23, model->vocab_size());

  test::PagedDriver whole_driver(*model, *backend, 4);  // small blocks: many, scattered
  const int w = whole_driver.add_sequence();
  const auto whole = whole_driver.step({{w, prompt, true}});  // direct MLA, all rows
  const double tol = 1e-4 * max_abs(whole);

  test::PagedDriver chunk_driver(*model, *backend, 4);
  const int c = chunk_driver.add_sequence();
  std::vector<std::vector<float>> chunked;
  size_t at = 0;
  for (size_t len : {7, 1, 6, 9}) {  // first chunk direct, the rest absorbed with context
    std::vector<int32_t> part(prompt.begin() + at, prompt.begin() + at + len);
    for (auto& row : chunk_driver.step({{c, part, true}})) chunked.push_back(row);
    at += len;
  }
  ASSERT_EQ(chunked.size(), whole.size());
  for (size_t r = 0; r < whole.size(); ++r) {
    EXPECT_LE(max_diff(chunked[r], whole[r]), tol) << tag << " chunked row " << r;
  }

  // A long second chunk over a short cached prefix: the direct form over the gathered context
  // (mla_context_direct_pays; ModelConsistency.ContextDirectRule checks the choice).
  test::PagedDriver long_driver(*model, *backend, 4);
  const int l = long_driver.add_sequence();
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 3), tail(prompt.begin() + 3, prompt.end());
  std::vector<std::vector<float>> long_chunked = long_driver.step({{l, head, true}});
  for (auto& row : long_driver.step({{l, tail, true}})) long_chunked.push_back(row);
  ASSERT_EQ(long_chunked.size(), whole.size());
  for (size_t r = 0; r < whole.size(); ++r) {
    EXPECT_LE(max_diff(long_chunked[r], whole[r]), tol) << tag << " chunks {3, 20}: row " << r;
  }

  test::PagedDriver decode_driver(*model, *backend, 4);
  const int d = decode_driver.add_sequence();
  for (size_t r = 0; r < prompt.size(); ++r) {
    auto row = decode_driver.step({{d, {prompt[r]}, false}});
    EXPECT_LE(max_diff(row[0], whole[r]), tol) << tag << " decoded row " << r;
  }
}

// The FLOP rule behind check_consistency's chunks: on kTinyV3's and kTinyV2's dims the {3, 20}
// chunking's second chunk takes the direct form over its context, the {7, 1, 6, 9} chunks and
// decode the absorbed one; on the bench model's dims a 4096 chunk after 4096 cached positions is
// direct and a batch of 64 decodes absorbed.
TEST(ModelConsistency, ContextDirectRule) {
  MlaDims v3;
  v3.heads = 3, v3.kv_lora_rank = 36, v3.qk_nope_head_dim = 20, v3.qk_rope_head_dim = 8, v3.v_head_dim = 12;
  MlaDims v2;
  v2.heads = 2, v2.kv_lora_rank = 16, v2.qk_nope_head_dim = 14, v2.qk_rope_head_dim = 6, v2.v_head_dim = 10;
  for (const MlaDims& d : {v3, v2}) {
    EXPECT_TRUE(mla_context_direct_pays(d, {0, 20}, {23}));
    EXPECT_FALSE(mla_context_direct_pays(d, {0, 1}, {8}));
    EXPECT_FALSE(mla_context_direct_pays(d, {0, 6}, {14}));
    EXPECT_FALSE(mla_context_direct_pays(d, {0, 9}, {23}));
    EXPECT_FALSE(mla_context_direct_pays(d, {0, 1}, {23}));
  }
  MlaDims bench;
  bench.heads = 16, bench.kv_lora_rank = 512, bench.qk_nope_head_dim = 128, bench.qk_rope_head_dim = 64,
  bench.v_head_dim = 128;
  EXPECT_TRUE(mla_context_direct_pays(bench, {0, 4096}, {8192}));
  EXPECT_TRUE(mla_context_direct_pays(bench, {0, 512}, {4096}));
  EXPECT_FALSE(mla_context_direct_pays(bench, {0, 64}, {4096}));
  std::vector<int32_t> qs{0}, lens;
  for (int s = 0; s < 64; ++s) qs.push_back(s + 1), lens.push_back(600);
  EXPECT_FALSE(mla_context_direct_pays(bench, qs, lens));
}

TEST(ModelConsistency, V3ChunkedAndDecodeMatchPrefillBf16) {
  check_consistency(kTinyV3, "v3bf16", DType::BF16);
}
TEST(ModelConsistency, V3ChunkedAndDecodeMatchPrefillFp8) {
  check_consistency(kTinyV3, "v3fp8", DType::F8_E4M3);
}
// V3.2 random weights (V3's tensors, then the indexer's) build the sparse forward, whose
// chunked prefill and decode agree with the whole prefill.
TEST(ModelConsistency, V32ChunkedAndDecodeMatchPrefillBf16) {
  check_consistency(tiny_v32().c_str(), "v32bf16", DType::BF16);
}
TEST(ModelConsistency, V32ChunkedAndDecodeMatchPrefillFp8) {
  check_consistency(tiny_v32().c_str(), "v32fp8", DType::F8_E4M3);
}
TEST(ModelConsistency, V2ChunkedAndDecodeMatchPrefill) {
  check_consistency(kTinyV2, "v2", DType::BF16);
}

// With a batch-invariant backend a sequence's logits do not depend on its step-mates.
TEST(ModelConsistency, BatchInvariantAcrossStepMates) {
  const std::string config = write_config("inv", kTinyV3);
  BackendOptions bo;
  bo.batch_invariant = true;
  auto backend = make_cpu_backend(bo);
  LoadOptions options;
  options.seed = 99;
  auto model = random_model(config, *backend, options);
  const std::vector<int32_t> a = prompt_ids(9, model->vocab_size());
  const std::vector<int32_t> b = prompt_ids(14, model->vocab_size());

  test::PagedDriver alone(*model, *backend, 4);
  const int sa = alone.add_sequence();
  auto ref_prefill = alone.step({{sa, a, true}});
  auto ref_decode = alone.step({{sa, {5}, false}});

  test::PagedDriver shared(*model, *backend, 4);
  const int s1 = shared.add_sequence(), s2 = shared.add_sequence();
  shared.step({{s2, std::vector<int32_t>(b.begin(), b.begin() + 6), false}});
  // Step mates: s2's second chunk before s1's prefill, then both decode together.
  auto got = shared.step({{s2, std::vector<int32_t>(b.begin() + 6, b.end()), true}, {s1, a, true}});
  for (size_t r = 0; r < a.size(); ++r) {
    const auto& row = got[b.size() - 6 + r];
    ASSERT_EQ(std::memcmp(row.data(), ref_prefill[r].data(), row.size() * 4), 0) << "row " << r;
  }
  auto dec = shared.step({{s2, {7}, false}, {s1, {5}, false}});
  EXPECT_EQ(std::memcmp(dec[1].data(), ref_decode[0].data(), dec[1].size() * 4), 0);
}

TEST(ModelConsistency, MalformedStepRaisesError) {
  const std::string config = write_config("err", kTinyV2);
  auto backend = make_cpu_backend();
  LoadOptions options;
  auto model = random_model(config, *backend, options);
  StepBatch empty;
  KvCaches caches;
  HostBuffer logits(DType::F32, {1, model->vocab_size()});
  EXPECT_THROW(model->forward(empty, caches, logits.tensor()), Error);
  test::PagedDriver driver(*model, *backend, 4);
  const int s = driver.add_sequence();
  EXPECT_THROW(driver.step({{s, {model->vocab_size()}, false}}), Error);  // id outside vocab
}

}  // namespace
}  // namespace deepinfer
