// The load-time NaN/Inf scan (model/weight_check.h): every code of every float dtype against
// an independent float conversion, positions across words, blocks and chunks, the first bad
// tensor named in list order, and load_weights on checkpoints written with a bad element
// (found by default, loaded when the check is off).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/weight_check.h"
#include "model/weights.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

using testing::TempDir;

// Non-finite by value, through core's scalar conversions (not by the scan's bit patterns).
bool non_finite(DType dt, uint32_t code) {
  float f = 0.0f;
  switch (dt) {
    case DType::F32: std::memcpy(&f, &code, 4); break;
    case DType::BF16: f = bf16_to_float(static_cast<uint16_t>(code)); break;
    case DType::F16: f = f16_to_float(static_cast<uint16_t>(code)); break;
    case DType::F8_E4M3: f = fp8_e4m3_to_float(static_cast<uint8_t>(code)); break;
    default: return false;
  }
  return !std::isfinite(f);
}

void put(std::vector<unsigned char>& buf, DType dt, int64_t i, uint32_t code) {
  std::memcpy(buf.data() + i * static_cast<int64_t>(dtype_size(dt)), &code, dtype_size(dt));
}

// Every 8- and 16-bit code (and the F32 codes around the exponent's edges) at several positions
// of a buffer of finite values: found exactly when the value is NaN or Inf.
TEST(WeightCheck, EveryCodeOfEveryFloatDtype) {
  for (DType dt : {DType::F8_E4M3, DType::BF16, DType::F16, DType::F32}) {
    const size_t es = dtype_size(dt);
    std::vector<uint32_t> codes;
    if (es <= 2) {
      for (uint32_t c = 0; c < (1u << (8 * es)); ++c) codes.push_back(c);
    } else {
      for (uint32_t e : {0x00000000u, 0x3F800000u, 0x7F000000u, 0x7F800000u, 0xFF800000u})
        for (uint32_t m : {0u, 1u, 0x400000u, 0x7FFFFFu}) codes.push_back(e | m);
      codes.push_back(0x7F7FFFFFu);  // FLT_MAX
    }
    const int64_t n = 37;  // not a multiple of a word: tail elements too
    std::vector<unsigned char> buf(static_cast<size_t>(n) * es, 0);
    for (int64_t i = 0; i < n; ++i) put(buf, dt, i, 0x1F);  // small finite
    const int64_t positions[] = {0, 5, 14, n - 1};  // word starts, inside, the tail
    for (size_t k = 0; k < codes.size(); ++k) {
      const uint32_t code = codes[k];
      const int64_t at = positions[(k + code / 4) % 4];
      put(buf, dt, at, code);
      const int64_t want = non_finite(dt, code) ? at : -1;
      ASSERT_EQ(find_non_finite(buf.data(), dt, n), want)
          << dtype_name(dt) << " code 0x" << std::hex << code << std::dec << " at " << at;
      put(buf, dt, at, 0x1F);
    }
  }
  // FP8 e4m3fn: 0x7F and 0xFF are its NaNs, 0x7E / 0xFE (+-448) finite.
  EXPECT_TRUE(non_finite(DType::F8_E4M3, 0xFF));
  EXPECT_FALSE(non_finite(DType::F8_E4M3, 0xFE));
}

// The first bad element across word and block boundaries; integer dtypes hold nothing.
TEST(WeightCheck, FirstBadElementAnywhere) {
  const int64_t n = 64 * 4 * 3 + 3;  // three 64-word BF16 blocks and a tail
  for (int64_t at = 0; at < n; at += 7) {
    std::vector<uint16_t> v(static_cast<size_t>(n), float_to_bf16(0.5f));
    v[static_cast<size_t>(at)] = 0xFF80;  // -Inf
    if (at + 9 < n) v[static_cast<size_t>(at + 9)] = 0x7FC0;  // a later NaN
    ASSERT_EQ(find_non_finite(v.data(), DType::BF16, n), at);
  }
  std::vector<int32_t> ints(100, -1);  // 0xFFFFFFFF: a NaN pattern if read as F32
  EXPECT_EQ(find_non_finite(ints.data(), DType::I32, 100), -1);
  EXPECT_EQ(find_non_finite(ints.data(), DType::F32, 100), 0);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Several tensors, several bad: the first in list order is named, with the element index past
// the first 4 MiB chunk; clean tensors pass.
TEST(WeightCheck, NamesTheFirstBadTensorAndElement) {
  ThreadPool pool(3);
  const int64_t big = (int64_t{4} << 20) / 4 + 1000;  // F32 elements: two chunks
  std::vector<float> a(16, 1.0f), b(static_cast<size_t>(big), 2.0f), c(8, 3.0f);
  std::vector<uint8_t> d(40, 0x38);
  std::vector<NamedTensor> ts = {{"a.weight", "s1", Tensor(a.data(), DType::F32, {4, 4})},
                                 {"b.weight", "s2", Tensor(b.data(), DType::F32, {big})},
                                 {"c.weight", "s3", Tensor(c.data(), DType::F32, {8})},
                                 {"d.weight", "s4", Tensor(d.data(), DType::F8_E4M3, {40})}};
  EXPECT_EQ(error_of([&] { check_weights_finite(ts, pool); }), "");
  c[2] = NAN;
  d[1] = 0x7F;
  b[static_cast<size_t>(big - 10)] = INFINITY;
  const std::string e = error_of([&] { check_weights_finite(ts, pool); });
  EXPECT_NE(e.find("'b.weight' in s2"), std::string::npos) << e;
  EXPECT_NE(e.find("Inf at element " + std::to_string(big - 10)), std::string::npos) << e;
  b[static_cast<size_t>(big - 10)] = 2.0f;
  const std::string e2 = error_of([&] { check_weights_finite(ts, pool); });
  EXPECT_NE(e2.find("'c.weight' in s3"), std::string::npos) << e2;
  EXPECT_NE(e2.find("NaN at element 2"), std::string::npos) << e2;
  c[2] = 3.0f;
  const std::string e3 = error_of([&] { check_weights_finite(ts, pool); });
  EXPECT_NE(e3.find("'d.weight' in s4"), std::string::npos) << e3;
  EXPECT_NE(e3.find("NaN at element 1 (bits 0x7F)"), std::string::npos) << e3;
}

nlohmann::json tiny_config_json() {
  return {{"model_type", "deepseek_v3"}, {"vocab_size", 96}, {"hidden_size", 64},
          {"intermediate_size", 80}, {"moe_intermediate_size", 24}, {"num_hidden_layers", 2},
          {"num_attention_heads", 2}, {"q_lora_rank", 32}, {"kv_lora_rank", 16},
          {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 8},
          {"n_routed_experts", 8}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
          {"first_k_dense_replace", 1}, {"n_group", 4}, {"topk_group", 2},
          {"num_nextn_predict_layers", 1}, {"max_position_embeddings", 256}};
}

// Copies dir's checkpoint to `to` with element `index` of tensor `name` set to `code`.
void write_with_bad_element(const std::string& from, const std::string& to, const std::string& name,
                            int64_t index, uint32_t code) {
  CheckpointReader r = CheckpointReader::open(from);
  SafetensorsWriter w;
  bool found = false;
  for (const std::string& n : r.names()) {
    Tensor t = r.tensor(n);
    if (n != name) {
      w.add(n, t);
      continue;
    }
    found = true;
    std::vector<unsigned char> bytes(static_cast<const unsigned char*>(t.data),
                                     static_cast<const unsigned char*>(t.data) + t.num_bytes());
    std::memcpy(bytes.data() + index * static_cast<int64_t>(dtype_size(t.dtype)), &code, dtype_size(t.dtype));
    w.add_bytes(n, t.dtype, t.dims(), bytes.data(), bytes.size());
  }
  ASSERT_TRUE(found) << name;
  w.write(to + "/model.safetensors");
}

struct BadCase {
  const char* dtype;  // random checkpoint dtype
  const char* tensor;
  int64_t index;
  uint32_t code;
  const char* kind;
};

// A checkpoint written with one bad element fails to load, naming the tensor, the shard and
// the element; with check_finite off it loads (trusted checkpoints).
TEST(WeightCheck, LoadWeightsFindsABadElement) {
  const BadCase cases[] = {
      {"bf16", "model.layers.1.mlp.experts.3.up_proj.weight", 77, 0x7FC1, "NaN"},
      {"bf16", "model.embed_tokens.weight", 64 * 5 + 1, 0xFF80, "Inf"},
      {"fp8", "model.layers.0.self_attn.kv_b_proj.weight", 300, 0xFF, "NaN"},
      {"fp8", "model.layers.1.mlp.shared_experts.down_proj.weight_scale_inv", 0, 0x7F800000u, "Inf"},
      {"f32", "model.norm.weight", 63, 0x7FC00000u, "NaN"},
  };
  for (const BadCase& bc : cases) {
    SCOPED_TRACE(std::string(bc.dtype) + " " + bc.tensor);
    nlohmann::json j = tiny_config_json();
    DType dt = DType::BF16;
    if (std::string(bc.dtype) == "fp8") {
      dt = DType::F8_E4M3;
      j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"},
                                  {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 16}}};
    } else if (std::string(bc.dtype) == "f32") {
      dt = DType::F32;
    }
    const ModelConfig c = parse_model_config(j.dump(), "tiny/config.json");
    TempDir good, bad;
    write_random_checkpoint(c, 3, dt, false, good.path());
    EXPECT_NO_THROW(load_weights(good.path(), c));
    write_with_bad_element(good.path(), bad.path(), bc.tensor, bc.index, bc.code);
    const std::string e = error_of([&] { load_weights(bad.path(), c); });
    EXPECT_NE(e.find(std::string("'") + bc.tensor + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(bad.path() + "/model.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string(bc.kind) + " at element " + std::to_string(bc.index)), std::string::npos) << e;
    LoadOptions trusted;
    trusted.check_finite = false;
    EXPECT_NO_THROW(load_weights(bad.path(), c, trusted));
  }
}

}  // namespace
}  // namespace deepinfer
