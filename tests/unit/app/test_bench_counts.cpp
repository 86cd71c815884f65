// The one byte/FLOP count of `deepinfer bench`, checked on the bench model against sums made by
// hand from its architecture (bench/NOTES.md "Counting"), not from ModelConfig::parameter_count:
// per layer attention 15,337,472 linear parameters (q_a 2048x1536, q_a_norm 1536, q_b 1536x3072,
// kv_a 2048x576, kv_a_norm 512, kv_b 512x4096, o 2048x2048) + 2 norms of 2048; layer 0 a dense MLP
// of 3x2048x11264; layers 1-11 a router 64x2048, 2 shared experts as one MLP of 3x2048x2816 and
// top-6 of 64 experts of 3x2048x1408; final norm 2048: 1,016,014,848 linear parameters a token
// touches. lm_head and embed_tokens: 129,280 x 2048 = 264,765,440 each.
#include <gtest/gtest.h>

#include "app/bench_counts.h"
#include "model/config.h"

namespace deepinfer::app {
namespace {

constexpr double kLinear = 1016014848.0, kTable = 264765440.0, kExpert = 3.0 * 2048 * 1408;

ModelConfig bench_model() { return load_model_config(DEEPINFER_SOURCE_DIR "/bench/cuda/bench-v3-7b.config.json"); }

void expect_near_rel(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-6 * want) << what;  // the router bias (64 per layer) may be counted
}

TEST(BenchCounts, DecodeBatch1ReadsLinearWeightsAndLmHeadNotTheEmbeddingTable) {
  const StepCounts c = count_step(bench_model(), StepKind::Decode, 2.0, 2.0, 1, 1, 1, 576.0, 2.0);
  expect_near_rel(c.weight_bytes, kLinear * 2 + kTable * 2 + 2048 * 2, "weight bytes");
  // Absorbed attention: 16 heads x (576 + 512) x 576 context x 12 layers x 2.
  expect_near_rel(c.flops, 2 * kLinear + 2.0 * 16 * (576 + 512) * 576 * 12 + 2 * kTable, "flops");
  EXPECT_DOUBLE_EQ(c.kv_bytes, 576.0 * 12 * 576 * 2);
}

TEST(BenchCounts, PrefillCountsTheDirectFormAndOneLogitsRow) {
  const StepCounts c = count_step(bench_model(), StepKind::Prefill, 2.0, 2.0, 1, 4096, 1, 2048.5, 2.0);
  // Direct-form attention: 16 heads x (192 + 128) x mean causal context 2048.5 x 12 layers x 2.
  const double per_token = 2 * kLinear + 2.0 * 16 * 320 * 2048.5 * 12;
  expect_near_rel(c.flops, 4096 * per_token + 2 * kTable, "flops");
  // 4096 tokens touch all 64 experts of each of the 11 MoE layers (58 more than top-6).
  expect_near_rel(c.weight_bytes, (kLinear + 11 * 58 * kExpert) * 2 + kTable * 2 + 4096 * 2048 * 2.0,
                  "weight bytes");
  EXPECT_DOUBLE_EQ(c.kv_bytes, 4096.0 * 12 * 576 * 2);  // rows written
  // ~2.28 GFLOP per prompt token (not 3.95 as bench counted before: embeddings and lm_head per
  // token, absorbed-form attention).
  EXPECT_NEAR(c.flops / 4096 / 1e9, 2.284, 0.001);
}

TEST(BenchCounts, Fp8HalvesTheLinearBytesOnly) {
  const ModelConfig m = bench_model();
  const StepCounts bf16 = count_step(m, StepKind::Decode, 2.0, 2.0, 8, 1, 8, 600.0, 2.0);
  const StepCounts fp8 = count_step(m, StepKind::Decode, 1.0, 2.0, 8, 1, 8, 600.0, 2.0);
  expect_near_rel(bf16.weight_bytes - fp8.weight_bytes, (bf16.weight_bytes - kTable * 2 - 8 * 2048 * 2) / 2,
                  "fp8 saving");
  EXPECT_DOUBLE_EQ(bf16.flops, fp8.flops);
}

// DeepSeek sparse attention (V3.2 at full width, 4 layers): MLA reads min(context, 2048) latent
// rows, the indexer one 128-wide key per position; attention FLOPs over the chosen rows plus
// 2 x 64 heads x 128 per position for the scores. Below index_topk everything is attended.
TEST(BenchCounts, SparseAttentionCountsTheChosenRowsAndTheIndexerKeys) {
  const ModelConfig v32 = load_model_config(DEEPINFER_SOURCE_DIR "/bench/cuda/bench-v32-full-width-4l.config.json");
  const ModelConfig v3 = load_model_config(DEEPINFER_SOURCE_DIR "/bench/cuda/bench-v3-full-width-4l.config.json");
  const StepCounts s = count_step(v32, StepKind::Decode, 1.0, 2.0, 2, 1, 2, 131072.0, 2.0);
  const StepCounts d = count_step(v3, StepKind::Decode, 1.0, 2.0, 2, 1, 2, 131072.0, 2.0);
  EXPECT_DOUBLE_EQ(s.kv_bytes, 2 * 4 * (2048.0 * 576 + 131072.0 * 128) * 2);
  EXPECT_DOUBLE_EQ(d.kv_bytes, 2 * 4 * 131072.0 * 576 * 2);
  // Same linears but the indexer's (wq_b 8192x1536, wk 128x7168, k_norm 2x128, weights_proj
  // 64x7168 per layer), read once per step at 1 byte.
  expect_near_rel(s.weight_bytes - d.weight_bytes, 4 * (8192.0 * 1536 + 128 * 7168 + 256 + 64 * 7168), "indexer");
  const double linear_flops = s.flops - 2 * (2.0 * 128 * (576 + 512) * 2048 + 2.0 * 64 * 128 * 131072) * 4;
  expect_near_rel(linear_flops, d.flops - 2 * 2.0 * 128 * (576 + 512) * 131072 * 4 +
                                    2 * 2 * 4 * (8192.0 * 1536 + 128 * 7168 + 256 + 64 * 7168),
                  "linear flops");
  const StepCounts short_ctx = count_step(v32, StepKind::Decode, 1.0, 2.0, 1, 1, 1, 1000.0, 2.0);
  EXPECT_DOUBLE_EQ(short_ctx.kv_bytes, 4 * (1000.0 * 576 + 1000.0 * 128) * 2);
}

TEST(BenchCounts, AnArchitectureWithoutItsOwnCountIsNotGivenTheMlaCount) {
  // V4.1 (shared compressed KV, Engram) has no count yet: bench reports no roofline for it
  // rather than the MLA count of its shared fields. V4's own count: test_v4_step_counts.cpp.
  const ModelConfig v41 = load_model_config(DEEPINFER_SOURCE_DIR "/tests/golden/fixtures/v41_tiny");
  const StepCounts c = count_step(v41, StepKind::Decode, 1.0, 2.0, 1, 1, 1, 100.0, 2.0);
  EXPECT_FALSE(c.modeled);
  EXPECT_TRUE(count_step(bench_model(), StepKind::Decode, 1.0, 2.0, 1, 1, 1, 100.0, 2.0).modeled);
}

}  // namespace
}  // namespace deepinfer::app
