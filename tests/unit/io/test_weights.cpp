// ModelWeights: random checkpoints written and loaded back, both expert
// layouts, FP8 scales, MTP, shape/missing-tensor errors, upload dedupe.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/weights.h"
#include "model/weights.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

using testing::TempDir;

// 3 layers (1 dense, 2 MoE), 8 experts in 4 groups, q_lora, YaRN, 1 MTP layer.
nlohmann::json tiny_config_json() {
  return {{"model_type", "deepseek_v3"}, {"vocab_size", 96}, {"hidden_size", 64},
          {"intermediate_size", 80}, {"moe_intermediate_size", 24}, {"num_hidden_layers", 3},
          {"num_attention_heads", 2}, {"q_lora_rank", 32}, {"kv_lora_rank", 16},
          {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 8},
          {"n_routed_experts", 8}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
          {"first_k_dense_replace", 1}, {"n_group", 4}, {"topk_group", 2},
          {"num_nextn_predict_layers", 1}, {"max_position_embeddings", 256}};
}

ModelConfig tiny_config(nlohmann::json j = tiny_config_json()) {
  return parse_model_config(j.dump(), "tiny/config.json");
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.dims() == b.dims() &&
         std::memcmp(a.data, b.data, a.num_bytes()) == 0;
}

// Every tensor slot of `a` equals the one of `b` with the same name, byte for byte.
void expect_same_weights(ModelWeights& a, ModelWeights& b) {
  std::vector<std::pair<std::string, Tensor>> ta, tb;
  a.for_each_tensor([&](const std::string& n, Tensor& t) { ta.emplace_back(n, t); });
  b.for_each_tensor([&](const std::string& n, Tensor& t) { tb.emplace_back(n, t); });
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].first, tb[i].first);
    EXPECT_TRUE(same_bytes(ta[i].second, tb[i].second)) << ta[i].first;
  }
}

std::string expect_load_error(const std::string& dir, const ModelConfig& c,
                              const std::vector<std::string>& parts) {
  try {
    load_weights(dir, c);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
    return e.what();
  }
  return "";
}

// Copies every tensor of the checkpoint in `from` to `to`/model.safetensors,
// letting `edit` rename/replace/drop entries (return false to drop).
void rewrite_checkpoint(const std::string& from, const std::string& to,
                        const std::function<bool(std::string&, Tensor&, SafetensorsWriter&)>& edit) {
  CheckpointReader r = CheckpointReader::open(from);
  SafetensorsWriter w;
  for (std::string name : r.names()) {
    Tensor t = r.tensor(name);
    if (edit(name, t, w)) w.add(name, t);
  }
  w.write(to + "/model.safetensors");
}

TEST(Weights, RandomCheckpointRoundTripBf16) {
  TempDir dir;
  ModelConfig c = tiny_config();
  write_random_checkpoint(c, 7, DType::BF16, /*include_mtp=*/true, dir.path());
  ModelWeights loaded = load_weights(dir.path(), c);
  ModelWeights made = make_random_weights(c, 7, DType::BF16, /*include_mtp=*/true);
  expect_same_weights(loaded, made);
  ASSERT_EQ(loaded.layers.size(), 3u);
  EXPECT_FALSE(loaded.layers[0].is_moe);
  EXPECT_TRUE(loaded.layers[1].is_moe);
  EXPECT_EQ(loaded.layers[1].moe.experts.size(), 8u);
  EXPECT_TRUE(loaded.layers[1].moe.has_shared());
  EXPECT_EQ(loaded.layers[1].moe.shared.gate.w.dims(), (std::vector<int64_t>{24, 64}));
  EXPECT_EQ(loaded.layers[1].moe.e_score_correction_bias.dtype, DType::F32);
  EXPECT_EQ(loaded.layers[0].attn.q_b_proj.w.dims(), (std::vector<int64_t>{2 * 12, 32}));
  EXPECT_EQ(loaded.layers[0].attn.kv_a_proj_with_mqa.w.dims(), (std::vector<int64_t>{20, 64}));
  ASSERT_EQ(loaded.mtp.size(), 1u);
  EXPECT_EQ(loaded.mtp[0].eh_proj.w.dims(), (std::vector<int64_t>{64, 128}));
  EXPECT_TRUE(loaded.mtp[0].block.is_moe);
  EXPECT_FALSE(loaded.mtp[0].shared_head.w.defined());
  // Views are zero copy into the mapping.
  CheckpointReader r = CheckpointReader::open(dir.path());
  EXPECT_TRUE(same_bytes(loaded.norm, r.tensor("model.norm.weight")));

  LoadOptions no_mtp;
  no_mtp.load_mtp = false;
  EXPECT_TRUE(load_weights(dir.path(), c, no_mtp).mtp.empty());
}

TEST(Weights, RandomValuesAreDeterministicAndScaled) {
  ModelConfig c = tiny_config();
  ModelWeights a = make_random_weights(c, 1, DType::F32);
  ModelWeights b = make_random_weights(c, 1, DType::F32);
  ModelWeights other = make_random_weights(c, 2, DType::F32);
  expect_same_weights(a, b);
  EXPECT_FALSE(same_bytes(a.layers[0].mlp.gate.w, other.layers[0].mlp.gate.w));
  // Linear: uniform with std 1/sqrt(fan_in); norms near 1 (within +-0.1).
  const Tensor& w = a.layers[0].mlp.down.w;  // [64, 80]
  double sum = 0, sum_sq = 0, max_abs = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    double v = w.ptr<float>()[i];
    sum += v;
    sum_sq += v * v;
    max_abs = std::max(max_abs, std::fabs(v));
  }
  const double n = static_cast<double>(w.numel());
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 1.0 / std::sqrt(80.0), 0.01);
  EXPECT_LE(max_abs, std::sqrt(3.0 / 80.0) + 1e-6);
  for (int64_t i = 0; i < a.norm.numel(); ++i) EXPECT_NEAR(a.norm.ptr<float>()[i], 1.0f, 0.1f);
}

TEST(Weights, Fp8RandomCheckpointHasBlockScales) {
  TempDir dir;
  nlohmann::json j = tiny_config_json();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"},
                              {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 16}}};
  ModelConfig c = tiny_config(j);
  write_random_checkpoint(c, 3, DType::F8_E4M3, false, dir.path());
  ModelWeights w = load_weights(dir.path(), c);
  const Weight& kv_a = w.layers[1].attn.kv_a_proj_with_mqa;  // [20, 64]
  EXPECT_EQ(kv_a.w.dtype, DType::F8_E4M3);
  EXPECT_EQ(kv_a.scale_inv.dims(), (std::vector<int64_t>{1, 4}));  // ceil(20/32), ceil(64/16)
  EXPECT_EQ(kv_a.block_n, 32);
  EXPECT_EQ(kv_a.block_k, 16);
  EXPECT_EQ(w.layers[1].moe.experts[0].down.scale_inv.dims(), (std::vector<int64_t>{2, 2}));
  // Router, embeddings, norms and lm_head stay BF16 as in the official checkpoint.
  EXPECT_EQ(w.layers[1].moe.gate.w.dtype, DType::BF16);
  EXPECT_EQ(w.lm_head.w.dtype, DType::BF16);
  EXPECT_EQ(w.embed_tokens.dtype, DType::BF16);
  // Dequantized weights have std ~ 1/sqrt(fan_in) (uniform), scales in [base, 2 base).
  const Weight& down = w.layers[0].mlp.down;  // [64, 80], blocks 32x16
  double sum_sq = 0;
  for (int64_t r = 0; r < 64; ++r) {
    for (int64_t k = 0; k < 80; ++k) {
      float s = down.scale_inv.ptr<float>()[(r / 32) * 5 + k / 16];
      double v = fp8_e4m3_to_float(down.w.ptr<uint8_t>()[r * 80 + k]) * s;
      sum_sq += v * v;
    }
  }
  const double rms = std::sqrt(sum_sq / (64 * 80));
  // Scales average 1.5 base -> rms ~ 1.5 / sqrt(80) give or take the scale spread.
  EXPECT_GT(rms, 0.9 / std::sqrt(80.0));
  EXPECT_LT(rms, 2.0 / std::sqrt(80.0));
}

TEST(Weights, FusedExpertLayoutLoadsAsPerExpertViews) {
  TempDir per_expert, fused;
  ModelConfig c = tiny_config();
  write_random_checkpoint(c, 11, DType::BF16, false, per_expert.path());
  const int64_t E = 8, I = 24, H = 64;
  // Build [E, 2I, H] (gate rows then up rows) and [E, H, I] from per-expert tensors.
  std::vector<std::vector<uint16_t>> gate_up(3), down(3);
  CheckpointReader src = CheckpointReader::open(per_expert.path());
  for (int layer = 1; layer <= 2; ++layer) {
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + ".";
      for (const char* part : {"gate_proj", "up_proj"}) {
        Tensor t = src.tensor(p + part + ".weight");
        gate_up[layer].insert(gate_up[layer].end(), t.ptr<uint16_t>(), t.ptr<uint16_t>() + I * H);
      }
      Tensor d = src.tensor(p + "down_proj.weight");
      down[layer].insert(down[layer].end(), d.ptr<uint16_t>(), d.ptr<uint16_t>() + H * I);
    }
  }
  rewrite_checkpoint(per_expert.path(), fused.path(),
                     [&](std::string& name, Tensor&, SafetensorsWriter& w) {
                       if (name.find(".mlp.experts.") == std::string::npos) return true;
                       // Emit the fused pair once per layer, at expert 0's gate.
                       for (int layer = 1; layer <= 2; ++layer) {
                         const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
                         if (name == p + "0.gate_proj.weight") {
                           w.add_bytes(p + "gate_up_proj", DType::BF16, {E, 2 * I, H},
                                       gate_up[layer].data(), gate_up[layer].size() * 2);
                           w.add_bytes(p + "down_proj", DType::BF16, {E, H, I}, down[layer].data(),
                                       down[layer].size() * 2);
                         }
                       }
                       return false;
                     });
  ModelWeights a = load_weights(per_expert.path(), c);
  ModelWeights b = load_weights(fused.path(), c);
  expect_same_weights(a, b);
  // Zero copy: expert 1's gate starts 2I rows after expert 0's.
  const auto* base = static_cast<const uint16_t*>(b.layers[1].moe.experts[0].gate.w.data);
  EXPECT_EQ(static_cast<const uint16_t*>(b.layers[1].moe.experts[1].gate.w.data), base + 2 * I * H);
  EXPECT_EQ(static_cast<const uint16_t*>(b.layers[1].moe.experts[0].up.w.data), base + I * H);
}

TEST(Weights, ShapeDisagreeingWithConfigNamesTensorShapeAndExpectation) {
  TempDir good, bad;
  ModelConfig c = tiny_config();
  write_random_checkpoint(c, 5, DType::BF16, false, good.path());
  rewrite_checkpoint(good.path(), bad.path(), [](std::string& name, Tensor& t, SafetensorsWriter&) {
    if (name == "model.layers.2.self_attn.o_proj.weight") t = t.view({32, 32});  // [64, 16]
    return true;
  });
  expect_load_error(bad.path(), c,
                    {"model.layers.2.self_attn.o_proj.weight", "[32, 32]", "[64, 16]",
                     bad.file("model.safetensors"), "tiny/config.json"});
  // The same checkpoint against a config with another hidden size.
  nlohmann::json j = tiny_config_json();
  j["intermediate_size"] = 96;
  expect_load_error(good.path(), tiny_config(j), {"model.layers.0.mlp.gate_proj.weight", "[80, 64]", "[96, 64]"});
}

TEST(Weights, MissingTensorNamesTensorAndCheckpoint) {
  TempDir good, bad;
  ModelConfig c = tiny_config();
  write_random_checkpoint(c, 5, DType::BF16, false, good.path());
  rewrite_checkpoint(good.path(), bad.path(), [](std::string& name, Tensor&, SafetensorsWriter&) {
    return name != "model.layers.1.mlp.experts.5.up_proj.weight";
  });
  expect_load_error(bad.path(), c, {"model.layers.1.mlp.experts.5.up_proj.weight", "missing", bad.path()});
}

TEST(Weights, Fp8ScaleWithWrongShapeOrMissing) {
  TempDir good, bad, missing;
  nlohmann::json j = tiny_config_json();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  ModelConfig c = tiny_config(j);
  write_random_checkpoint(c, 5, DType::F8_E4M3, false, good.path());
  const std::string target = "model.layers.0.self_attn.q_a_proj.weight_scale_inv";
  std::vector<float> wrong(2, 1.0f);
  rewrite_checkpoint(good.path(), bad.path(), [&](std::string& name, Tensor&, SafetensorsWriter& w) {
    if (name != target) return true;
    w.add_bytes(name, DType::F32, {1, 2}, wrong.data(), 8);
    return false;
  });
  expect_load_error(bad.path(), c, {target, "[1, 2]", "[1, 1]", "block"});
  rewrite_checkpoint(good.path(), missing.path(),
                     [&](std::string& name, Tensor&, SafetensorsWriter&) { return name != target; });
  expect_load_error(missing.path(), c, {target, "missing"});
}

TEST(Weights, WrongDtypeIsRejected) {
  TempDir good, bad;
  ModelConfig c = tiny_config();
  write_random_checkpoint(c, 5, DType::BF16, false, good.path());
  std::vector<int32_t> ints(8, 0);
  rewrite_checkpoint(good.path(), bad.path(), [&](std::string& name, Tensor&, SafetensorsWriter& w) {
    if (name != "model.layers.1.mlp.gate.e_score_correction_bias") return true;
    w.add_bytes(name, DType::I32, {8}, ints.data(), 32);
    return false;
  });
  expect_load_error(bad.path(), c, {"e_score_correction_bias", "I32", "F32"});
}

TEST(Weights, TiedEmbeddingsAndV2Layout) {
  TempDir dir;
  nlohmann::json j = tiny_config_json();
  j["model_type"] = "deepseek_v2";
  j["q_lora_rank"] = nullptr;
  j["tie_word_embeddings"] = true;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  ModelConfig c = tiny_config(j);
  write_random_checkpoint(c, 9, DType::BF16, false, dir.path());
  ModelWeights w = load_weights(dir.path(), c);
  EXPECT_EQ(w.lm_head.w.data, w.embed_tokens.data);
  EXPECT_TRUE(w.layers[0].attn.q_proj.w.defined());
  EXPECT_FALSE(w.layers[0].attn.q_a_proj.w.defined());
  EXPECT_FALSE(w.layers[1].moe.e_score_correction_bias.defined());
  EXPECT_EQ(w.layers[1].moe.shared.gate.w.dims(), (std::vector<int64_t>{24, 64}));
}

TEST(Weights, ProgressCallbackCoversAllBytes) {
  TempDir dir;
  ModelConfig c = tiny_config();
  write_random_checkpoint(c, 5, DType::BF16, false, dir.path());
  std::pair<uint64_t, uint64_t> last{0, 1};
  LoadOptions o;
  o.progress = [](uint64_t done, uint64_t total, void* user) {
    *static_cast<std::pair<uint64_t, uint64_t>*>(user) = {done, total};
  };
  o.progress_user = &last;
  load_weights(dir.path(), c, o);
  EXPECT_EQ(last.first, last.second);
  EXPECT_EQ(last.second, CheckpointReader::open(dir.path()).total_bytes());
}

// A backend that "uploads" into host buffers so the copy path runs without a GPU.
class FakeDeviceBackend : public Backend {
 public:
  Device device() const override { return Device::CUDA; }
  std::string name() const override { return "fake"; }
  DType activation_dtype() const override { return DType::F32; }
  DeviceBuffer alloc(DType dtype, const std::vector<int64_t>& dims) override {
    auto host = std::make_shared<HostBuffer>(dtype, dims);
    Tensor t = host->tensor();
    t.device = Device::CUDA;
    ++num_allocs;
    return DeviceBuffer(t, host);
  }
  void copy(const Tensor& src, Tensor& dst) override {
    ASSERT_EQ(src.num_bytes(), dst.num_bytes());
    std::memcpy(dst.data, src.data, src.num_bytes());
    num_bytes_copied += src.num_bytes();
  }
  void synchronize() override {}
  void embedding(const Tensor&, const Tensor&, Tensor&) override {}
  void rms_norm(const Tensor&, const Tensor&, float, Tensor&) override {}
  void add_rms_norm(Tensor&, const Tensor&, const Tensor&, float, Tensor&) override {}
  void gemm(const Tensor&, const Weight&, Tensor&) override {}
  void rope(Tensor&, const Tensor&, const Tensor&, int, int, bool) override {}
  void silu_mul(const Tensor&, Tensor&) override {}
  void add(Tensor&, const Tensor&) override {}
  void kv_store(const Tensor&, PagedKV&) override {}
  void mla_attention_paged(const Tensor&, const PagedKV&, float, int, Tensor&) override {}
  void mla_attention_prefill(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, float,
                             Tensor&) override {}
  void moe_routing(const Tensor&, const Tensor&, const MoeRouting&, Tensor&, Tensor&) override {}
  void moe_experts(const Tensor&, const Tensor&, const Tensor&, const std::vector<ExpertWeights>&,
                   Tensor&) override {}
  void argmax(const Tensor&, Tensor&) override {}
  int num_allocs = 0;
  uint64_t num_bytes_copied = 0;
};

TEST(Weights, UploadCopiesEachTensorOnceAndSharesTiedViews) {
  nlohmann::json j = tiny_config_json();
  j["tie_word_embeddings"] = true;
  ModelConfig c = tiny_config(j);
  ModelWeights host = make_random_weights(c, 4, DType::BF16, true);
  FakeDeviceBackend backend;
  ModelWeights dev = upload_weights(host, backend);
  uint64_t host_bytes = 0;
  int distinct = 0;
  host.for_each_tensor([&](const std::string& name, Tensor& t) {
    if (name == "lm_head.weight") return;  // the tied view of the embedding
    host_bytes += t.num_bytes();
    ++distinct;
  });
  EXPECT_EQ(backend.num_bytes_copied, host_bytes);
  EXPECT_EQ(backend.num_allocs, distinct);
  EXPECT_EQ(dev.lm_head.w.data, dev.embed_tokens.data);
  EXPECT_EQ(dev.embed_tokens.device, Device::CUDA);
  host.owners.clear();  // the device copy must not depend on host memory
  EXPECT_TRUE(same_bytes(dev.layers[1].moe.experts[3].down.w, dev.layers[1].moe.experts[3].down.w));
  ModelWeights fresh = make_random_weights(c, 4, DType::BF16, true);
  EXPECT_TRUE(same_bytes(dev.layers[1].moe.experts[3].down.w, fresh.layers[1].moe.experts[3].down.w));
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

TEST(Weights, RandomWeightsMadeOnABackendEqualHostOnes) {
  for (DType dtype : {DType::BF16, DType::F8_E4M3}) {
    ModelConfig c = tiny_config();
    ModelWeights host = make_random_weights(c, 21, dtype, true);
    FakeDeviceBackend backend;  // default Backend::fill_random + copy
    ModelWeights dev = make_random_weights(c, 21, dtype, true, backend);
    EXPECT_EQ(dev.layers[1].moe.experts[0].gate.w.device, Device::CUDA);
    expect_same_weights(host, dev);
    std::unique_ptr<Backend> cpu = make_cpu_backend();
    ModelWeights on_cpu = make_random_weights(c, 21, dtype, true, *cpu);
    expect_same_weights(host, on_cpu);
  }
}

}  // namespace
}  // namespace deepinfer

// DeepSeek-V4.1's random weights in its checkpoint's formats (model/deepseek_v41/weights.h): dense
// FP8 e4m3 with 32x32 E8M0 block scales, routed experts FP4 e2m1 (I8, two per byte) with an E8M0
// scale per 32, made on a device backend (fill_random; here the default host generator behind a
// fake device) equal to the host-made ones, the same bits for the same seed, no NaN code anywhere.
namespace deepinfer {
namespace {

DeepseekV41Config v41_fixture() {
  return load_deepseek_v41_config(std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_fp8_fp4/config.json");
}

std::vector<uint8_t> raw_bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  return {p, p + t.num_bytes()};
}

TEST(Weights, V41RandomFormatsValidAndEqualOnEveryBackend) {
  const DeepseekV41Config c = v41_fixture();
  const std::vector<TensorSpec> specs = v41_random_specs(c, DType::F8_E4M3, /*fp4_experts=*/true);
  const RandomTensors host = make_random_tensors(specs, 5, 0, nullptr);
  const RandomTensors again = make_random_tensors(specs, 5, 0, nullptr);
  const RandomTensors other = make_random_tensors(specs, 6, 0, nullptr);
  FakeDeviceBackend fake;
  const RandomTensors dev = make_random_tensors(specs, 5, 0, &fake);
  int fp4 = 0, fp8 = 0, e8m0 = 0, on_host = 0, differ = 0;
  for (const TensorSpec& s : specs) {
    const Tensor h = *host.source.find(s.name), d = *dev.source.find(s.name);
    EXPECT_EQ(d.device, s.host ? Device::CPU : Device::CUDA) << s.name;
    on_host += s.host;
    const std::vector<uint8_t> b = raw_bytes(h);
    EXPECT_EQ(b, raw_bytes(d)) << s.name << ": made on the backend differs from the host's";
    EXPECT_EQ(b, raw_bytes(*again.source.find(s.name))) << s.name << ": same seed, other bits";
    differ += b != raw_bytes(*other.source.find(s.name));
    if (s.dtype == DType::F8_E4M3) {
      ++fp8;
      for (uint8_t v : b) ASSERT_NE(v & 0x7f, 0x7f) << s.name << ": e4m3 NaN code";
    } else if (s.dtype == DType::F8_E8M0) {
      ++e8m0;
      for (uint8_t v : b) ASSERT_NE(v, 0xff) << s.name << ": E8M0 NaN code";
    } else if (s.dtype == DType::I8) {
      ++fp4;
      ASSERT_NE(s.name.find(".ffn.experts."), std::string::npos) << s.name;  // only routed experts
      const Tensor scale = *host.source.find(s.name.substr(0, s.name.size() - 7) + ".scale");
      ASSERT_EQ(scale.dtype, DType::F8_E8M0) << s.name;
      const int64_t k = s.shape[1] * 2;
      ASSERT_EQ(scale.dims(), (std::vector<int64_t>{s.shape[0], k / 32})) << s.name;
      // The largest e2m1 value (6) times the scale: within a factor 2 below sqrt(3 / k).
      const double top = 6.0 * e8m0_to_float(static_cast<const uint8_t*>(scale.data)[0]),
                   bound = std::sqrt(3.0 / static_cast<double>(k));
      EXPECT_LE(top, bound) << s.name;
      EXPECT_GT(top, bound / 2) << s.name;
      std::vector<int> nibbles(16, 0);
      for (uint8_t v : b) ++nibbles[v & 15], ++nibbles[v >> 4];
      int used = 0;
      for (int n : nibbles) used += n > 0;
      EXPECT_GE(used, 12) << s.name << ": the codes should spread over the e2m1 values";
    }
  }
  EXPECT_EQ(fp4, 3 * c.base.n_routed_experts * c.num_layers());
  EXPECT_GT(fp8, 20);
  EXPECT_GT(e8m0, fp4);  // the experts' and the FP8 blocks' scales
  EXPECT_GT(on_host, 0);
  EXPECT_GT(differ, fp4 + fp8 - 1);  // every drawn weight changes with the seed
}

// The loader over them: packed FP4 experts and FP8 32x32 linears kept as they are for a device
// backend (weights on the device, block scales read on the host), dequantized for the CPU; the
// dequantized experts are the packed codes times their scales.
TEST(Weights, V41RandomWeightsKeepDeviceFormats) {
  const DeepseekV41Config c = v41_fixture();
  FakeDeviceBackend fake;
  const V41Weights dev = random_v41_weights(c, 9, DType::F8_E4M3, true, &fake);
  const V41Weights host = random_v41_weights(c, 9, DType::F8_E4M3, true);
  ASSERT_EQ(dev.layers.size(), static_cast<size_t>(c.num_layers()));
  const Weight& packed = dev.layers[2].experts[1].down;
  EXPECT_EQ(packed.w.dtype, DType::I8);
  EXPECT_EQ(packed.w.device, Device::CUDA);
  EXPECT_EQ(packed.block_n, 1);
  EXPECT_EQ(packed.block_k, 32);
  const Weight& deq = host.layers[2].experts[1].down;
  ASSERT_EQ(deq.w.dtype, DType::F32);
  const int64_t N = deq.w.size(0), K = deq.w.size(1);
  static const float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t byte = static_cast<const uint8_t*>(packed.w.data)[n * K / 2 + k / 2];
      const uint8_t code = k % 2 == 0 ? byte & 15 : byte >> 4;
      const float v = (code & 8 ? -1.0f : 1.0f) * kE2m1[code & 7] *
                      e8m0_to_float(static_cast<const uint8_t*>(packed.scale_inv.data)[n * K / 32 + k / 32]);
      ASSERT_EQ(deq.w.ptr<const float>()[n * K + k], v) << n << ", " << k;
    }
  const Weight& wq = dev.layers[0].wq_a;
  EXPECT_EQ(wq.w.dtype, DType::F8_E4M3);
  EXPECT_EQ(wq.w.device, Device::CUDA);
  EXPECT_EQ(wq.block_k, 32);
  EXPECT_EQ(wq.scale_inv.dtype, DType::F32);  // E8M0 bytes read as their powers of two
  EXPECT_EQ(wq.scale_inv.device, Device::CPU);
  for (int64_t i = 0; i < wq.scale_inv.numel(); ++i) {
    int e = 0;
    EXPECT_EQ(std::frexp(wq.scale_inv.ptr<const float>()[i], &e), 0.5f) << "scale " << i << " is not a power of two";
  }
  EXPECT_EQ(dev.layers[0].gate.w.device, Device::CPU);  // the router, divided by gate_temp on the host
}

// The DSpark drafter's stages take the main layers' device formats (FP4 experts packed, FP8 wo_a): the
// CUDA expert kernels take FP8 experts only in 128x128 blocks, so V4.1's 32x32 FP8 would not run
// (v41spec19). The bench's tiny config with a drafter (3 stages of 4 experts); on the host the same
// codes dequantized.
TEST(Weights, V41RandomDrafterTakesTheMainLayersDeviceFormats) {
  const DeepseekV41Config c =
      load_deepseek_v41_config(std::string(DEEPINFER_SOURCE_DIR) + "/bench/cuda/bench-v41-tiny-dspark.config.json");
  FakeDeviceBackend fake;
  const V41Weights dev = random_v41_weights(c, 9, DType::F8_E4M3, true, &fake);
  const V41Weights host = random_v41_weights(c, 9, DType::F8_E4M3, true);
  ASSERT_TRUE(dev.dspark.loaded());
  ASSERT_EQ(dev.dspark.stages.size(), 3u);
  for (const V41Layer& L : dev.dspark.stages) {
    ASSERT_EQ(L.experts.size(), static_cast<size_t>(c.dspark_n_routed_experts));
    for (const ExpertWeights& e : L.experts)
      for (const Weight* w : {&e.gate, &e.up, &e.down}) {
        EXPECT_EQ(w->w.dtype, DType::I8);
        EXPECT_EQ(w->w.device, Device::CUDA);
        EXPECT_EQ(w->block_n, 1);
        EXPECT_EQ(w->block_k, 32);
      }
    EXPECT_EQ(L.wo_a.w.dtype, DType::F8_E4M3);  // o_lora_rank 32: whole 32x32 blocks per group
    EXPECT_EQ(L.wo_a.w.device, Device::CUDA);
  }
  const Weight& deq = host.dspark.stages[2].experts[3].down;
  EXPECT_EQ(deq.w.dtype, DType::F32);
  EXPECT_EQ(host.dspark.stages[2].wo_a.w.dtype, DType::F32);
}

}  // namespace
}  // namespace deepinfer
