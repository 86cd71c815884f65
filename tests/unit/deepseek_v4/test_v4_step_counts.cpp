// DeepSeek-V4's step counts (model/deepseek_v4/step_counts.h) against independent sums: the
// weight bytes against the bytes of the tensors make_random_v4_weights holds (walked here
// field by field), the linear FLOPs against deepinfer info's parameter count (info.cpp) less
// the parameters that are no multiply-add, the attention FLOPs against rows counted by hand
// for the tiny golden config (window 6, CSA rate 4 with top 3, HCA rate 8).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "app/bench_counts.h"
#include "backend/backend.h"
#include "model/config.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/info.h"
#include "model/deepseek_v4/step_counts.h"
#include "model/deepseek_v4/weights.h"

namespace deepinfer {
namespace {

const std::string kTiny = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v4_tiny";

double bytes(const Tensor& t) { return t.defined() ? static_cast<double>(t.num_bytes()) : 0.0; }
double bytes(const Weight& w) { return bytes(w.w) + bytes(w.scale_inv); }
double bytes(const V4HyperConnection& h) { return bytes(h.fn) + bytes(h.base) + bytes(h.scale); }
double bytes(const V4Compressor& c) { return bytes(c.wkv) + bytes(c.wgate) + bytes(c.ape) + bytes(c.norm); }
double bytes(const ExpertWeights& e) { return bytes(e.gate) + bytes(e.up) + bytes(e.down); }

// Every weight of the layers but the routed experts, plus the final norm and hc_head.
double non_expert_bytes(const V4Weights& w) {
  double b = bytes(w.norm) + bytes(w.hc_head);
  for (const V4Layer& L : w.layers) {
    b += bytes(L.attn_norm) + bytes(L.ffn_norm) + bytes(L.hc_attn) + bytes(L.hc_ffn) + bytes(L.wq_a) +
         bytes(L.q_norm) + bytes(L.wq_b) + bytes(L.wkv) + bytes(L.kv_norm) + bytes(L.wo_a) + bytes(L.wo_b) +
         bytes(L.sinks) + bytes(L.compressor) + bytes(L.index_compressor) + bytes(L.index_wq_b) +
         bytes(L.index_weights_proj) + bytes(L.gate) + bytes(L.gate_bias) + bytes(L.shared);
  }
  return b;
}

class V4StepCounts : public ::testing::TestWithParam<DType> {};

TEST_P(V4StepCounts, DecodeWeightBytesAreTheBytesTheRandomWeightsHold) {
  const DeepseekV4Config c = load_deepseek_v4_config(kTiny);
  auto backend = make_cpu_backend();
  const DType dense = GetParam();
  const V4Weights w = make_random_v4_weights(c, 7, dense, /*fp4_experts=*/dense == DType::F8_E4M3, *backend);
  const double linear_bytes = dense == DType::F8_E4M3 ? 1.0 : dense == DType::BF16 ? 2.0 : 4.0;
  const double H = c.base.hidden_size, V = c.base.vocab_size, E = c.base.n_routed_experts;
  const double K = c.base.num_experts_per_tok;
  for (int batch : {1, 3, 64}) {
    StepQuery q;
    q.kind = StepKind::Decode;
    q.linear_bytes = linear_bytes;
    q.batch = batch;
    q.logits_rows = batch;
    q.context = 20;
    const StepCounts got = count_v4_step(c, q);
    const double distinct = E * (1.0 - std::pow(1.0 - K / E, batch));
    const double want = non_expert_bytes(w) + c.num_layers() * distinct * bytes(w.layers[0].experts[0]) +
                        V * H * 2.0 + batch * H * 2.0;  // head and embedding rows at table_bytes 2
    EXPECT_NEAR(got.weight_bytes, want, 1e-9 * want) << "batch " << batch;
    EXPECT_TRUE(got.modeled);
  }
  if (dense == DType::F8_E4M3) {  // FP8 routed experts (v4_model_bench --experts fp8)
    const V4Weights w8 = make_random_v4_weights(c, 7, dense, /*fp4_experts=*/false, *backend);
    StepQuery q;
    q.linear_bytes = 1.0;
    q.expert_bytes = 1.0;
    q.batch = 2;
    q.logits_rows = 2;
    const double distinct = E * (1.0 - std::pow(1.0 - K / E, 2));
    const double want = non_expert_bytes(w8) + c.num_layers() * distinct * bytes(w8.layers[0].experts[0]) +
                        V * H * 2.0 + 2 * H * 2.0;
    EXPECT_NEAR(count_v4_step(c, q).weight_bytes, want, 1e-9 * want) << "FP8 experts";
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, V4StepCounts, ::testing::Values(DType::F8_E4M3, DType::BF16, DType::F32));

TEST(V4StepCountsFlops, LinearFlopsAreTheActiveParametersThatMultiply) {
  const DeepseekV4Config c = load_deepseek_v4_config(kTiny);
  const ParameterCount p = v4_parameter_count(c);
  const double H = c.base.hidden_size, V = c.base.vocab_size, hc = c.hc_mult, mix = (2 + hc) * hc;
  const double D = c.head_dim, ql = c.base.q_lora_rank, heads = c.base.num_attention_heads;
  const double di = c.index_head_dim;
  // Parameters that are no multiply-add of a token: embed and head (the head counted per logits
  // row), norms, sinks, the hc sites' base and scale, hc_head's base and scale, compressors' ape
  // and norms.
  double not_macs = 2 * V * H + H + hc + 1;
  for (int l = 0; l < c.num_layers(); ++l) {
    not_macs += 2 * H + ql + D + heads + 2 * (mix + 3);
    const int r = c.ratio(l);
    if (c.attention[static_cast<size_t>(l)] == V4AttentionKind::Csa) not_macs += r * 2 * D + D + r * 2 * di + di;
    if (c.attention[static_cast<size_t>(l)] == V4AttentionKind::Hca) not_macs += r * D + D;
  }
  StepQuery q;
  q.kind = StepKind::Decode;
  q.context = 0;  // one row attended per layer (the window's own), no compressed entry yet
  q.logits_rows = 1;
  const StepCounts got = count_v4_step(c, q);
  const double attention = 4 * heads * D * c.num_layers();
  EXPECT_DOUBLE_EQ(got.flops, 2 * (static_cast<double>(p.active_per_token) - not_macs) + 2 * V * H + attention);
}

TEST(V4StepCountsFlops, AttentionRowsByLayerKind) {
  const DeepseekV4Config c = load_deepseek_v4_config(kTiny);
  ASSERT_EQ(c.sliding_window, 6);
  ASSERT_EQ(c.index_topk, 3);
  ASSERT_EQ(c.ratio(1), 4);
  ASSERT_EQ(c.ratio(2), 8);
  const double heads = c.base.num_attention_heads, D = c.head_dim, nh = c.index_n_heads, di = c.index_head_dim;
  StepQuery q;
  q.kind = StepKind::Decode;
  q.logits_rows = 1;
  q.kv_bytes_per_value = 2.0;
  q.context = 0;
  const StepCounts at0 = count_v4_step(c, q);
  q.context = 40;  // position 40: window 6 rows; CSA 41 / 4 = 10 entries, top 3; HCA 41 / 8 = 5
  const StepCounts at40 = count_v4_step(c, q);
  EXPECT_DOUBLE_EQ(at40.flops - at0.flops, 4 * heads * D * ((6 + 9 + 11) - 3) + 2 * nh * di * 10);
  EXPECT_DOUBLE_EQ(at40.kv_bytes, 2.0 * (D * (6 + 9 + 11) + di * 10));
  // Prefill of 40 tokens writes 40 window rows per layer, 10 CSA entries + keys, 5 HCA entries.
  q.kind = StepKind::Prefill;
  q.tokens_per_seq = 40;
  q.context = 20.5;
  EXPECT_DOUBLE_EQ(count_v4_step(c, q).kv_bytes, 2.0 * (3 * 40 * D + 10 * (D + di) + 5 * D));
}

TEST(V4StepCountsFlops, BenchCountsAskTheArchitecture) {
  // The engine bench's count (app/bench_counts.h) answers V4's own, not the MLA count.
  const ModelConfig mc = load_model_config(kTiny);
  const DeepseekV4Config c = load_deepseek_v4_config(kTiny);
  StepQuery q;
  q.context = 33;
  q.batch = 4;
  q.logits_rows = 4;
  const StepCounts own = count_v4_step(c, q), via = app::count_step(mc, q);
  EXPECT_DOUBLE_EQ(via.weight_bytes, own.weight_bytes);
  EXPECT_DOUBLE_EQ(via.flops, own.flops);
  EXPECT_DOUBLE_EQ(via.kv_bytes, own.kv_bytes);
}

}  // namespace
}  // namespace deepinfer
