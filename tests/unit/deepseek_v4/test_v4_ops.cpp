// DeepSeek-V4's host reference ops (backend.h, DeepSeek-V4 block) and the FP4 / FP8
// dequantization (core/quant.h) against values computed by the oracle: transformers
// 5.17's own modules (DeepseekV4HyperConnection, HyperHead, TopKRouter, HashRouter,
// Experts, eager_attention_forward, HCA / CSA compressors and the indexer) and torch's
// float8 / e8m0 casts, in tools/golden/make_v4_ops.py -> data/v4_ops.safetensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/quant.h"
#include "io/safetensors.h"

namespace deepinfer {
namespace {

class V4Ops : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reader_ = std::make_unique<CheckpointReader>(
        CheckpointReader::open(std::string(DEEPINFER_SOURCE_DIR) + "/tests/unit/deepseek_v4/data/v4_ops.safetensors"));
    backend_ = make_cpu_backend();
  }
  static void TearDownTestSuite() {
    reader_.reset();
    backend_.reset();
  }
  static Tensor get(const char* name) { return reader_->tensor(name); }
  // Writable F32 copy of a fixture tensor.
  static HostBuffer copy_f32(const char* name) {
    Tensor t = get(name);
    EXPECT_EQ(t.dtype, DType::F32) << name;
    HostBuffer b(DType::F32, t.dims());
    std::copy_n(t.ptr<const float>(), t.numel(), b.ptr<float>());
    return b;
  }
  static void expect_close(const Tensor& got, const char* name, float tol) {
    Tensor want = get(name);
    ASSERT_EQ(got.dims(), want.dims()) << name;
    double worst = 0.0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const float a = got.ptr<const float>()[i], b = want.ptr<const float>()[i];
      worst = std::max(worst, static_cast<double>(std::fabs(a - b)) / (1.0 + std::fabs(b)));
    }
    EXPECT_LE(worst, tol) << name << ": worst relative difference";
  }
  static inline std::unique_ptr<CheckpointReader> reader_;
  static inline std::unique_ptr<Backend> backend_;
};

TEST_F(V4Ops, HyperConnectionPreMatchesOracle) {
  Tensor streams = get("hc_streams");
  const int64_t T = streams.size(0), H = streams.size(2);
  HostBuffer collapsed(DType::F32, {T, H}), post(DType::F32, {T, 4}), comb(DType::F32, {T, 4, 4});
  Backend::HyperConnectionParams p;
  backend_->hc_pre(streams, get("hc_fn"), get("hc_base"), get("hc_scale"), p, collapsed.tensor(), post.tensor(),
                   comb.tensor());
  expect_close(post.tensor(), "hc_post", 1e-5f);
  expect_close(comb.tensor(), "hc_comb", 1e-5f);
  expect_close(collapsed.tensor(), "hc_collapsed", 1e-5f);
  // comb is doubly stochastic after Sinkhorn (columns exactly, rows nearly).
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < 4; ++k) {
      float col = 0.0f;
      for (int j = 0; j < 4; ++j) col += comb.ptr<float>()[(t * 4 + j) * 4 + k];
      EXPECT_NEAR(col, 1.0f, 1e-4f);
    }
}

TEST_F(V4Ops, HyperConnectionPostAndHeadMatchOracle) {
  Tensor streams = get("hc_streams");
  const int64_t T = streams.size(0), H = streams.size(2);
  HostBuffer mixed(DType::F32, {T, 4, H});
  backend_->hc_post(streams, get("hc_f"), get("hc_post"), get("hc_comb"), mixed.tensor());
  expect_close(mixed.tensor(), "hc_mixed", 1e-5f);
  HostBuffer head(DType::F32, {T, H});
  backend_->hc_head(streams, get("head_fn"), get("head_base"), get("head_scale"), {}, head.tensor());
  expect_close(head.tensor(), "head_out", 1e-5f);
}

TEST_F(V4Ops, SqrtSoftplusRoutingWithSelectionBiasMatchesOracle) {
  Tensor logits = get("route_logits");
  const int64_t T = logits.size(0);
  HostBuffer ids(DType::I32, {T, 3}), w(DType::F32, {T, 3});
  backend_->moe_routing_sqrt_softplus(logits, get("route_bias"), Tensor(), 3, 1.5f, ids.tensor(), w.tensor());
  // The oracle's top-k is unsorted (sorted=False): compare (expert, weight) pairs by expert.
  Tensor want_ids = get("route_ids"), want_w = get("route_weights");
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<int32_t, float>> a, b;
    for (int j = 0; j < 3; ++j) {
      a.emplace_back(ids.ptr<int32_t>()[t * 3 + j], w.ptr<float>()[t * 3 + j]);
      b.emplace_back(want_ids.ptr<const int32_t>()[t * 3 + j], want_w.ptr<const float>()[t * 3 + j]);
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(a[j].first, b[j].first) << "token " << t;
      EXPECT_NEAR(a[j].second, b[j].second, 1e-5f) << "token " << t;
    }
  }
  // Without the bias the choice differs somewhere: the bias selects, it is not a weight.
  HostBuffer ids2(DType::I32, {T, 3}), w2(DType::F32, {T, 3});
  backend_->moe_routing_sqrt_softplus(logits, Tensor(), Tensor(), 3, 1.5f, ids2.tensor(), w2.tensor());
  EXPECT_FALSE(std::equal(ids.ptr<int32_t>(), ids.ptr<int32_t>() + T * 3, ids2.ptr<int32_t>()));
}

TEST_F(V4Ops, HashRoutingByTid2eidMatchesOracle) {
  Tensor logits = get("route_logits"), tokens = get("hash_token_ids"), table = get("hash_tid2eid");
  const int64_t T = logits.size(0);
  HostBuffer hash(DType::I32, {T, 3}), ids(DType::I32, {T, 3}), w(DType::F32, {T, 3});
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < 3; ++j)
      hash.ptr<int32_t>()[t * 3 + j] = table.ptr<const int32_t>()[tokens.ptr<const int32_t>()[t] * 3 + j];
  backend_->moe_routing_sqrt_softplus(logits, get("route_bias"), hash.tensor(), 3, 1.5f, ids.tensor(), w.tensor());
  Tensor want = get("hash_ids");
  for (int64_t i = 0; i < T * 3; ++i) EXPECT_EQ(ids.ptr<int32_t>()[i], want.ptr<const int32_t>()[i]);
  expect_close(w.tensor(), "hash_weights", 1e-5f);
  hash.ptr<int32_t>()[4] = 8;  // outside the 8 experts
  EXPECT_THROW(backend_->moe_routing_sqrt_softplus(logits, Tensor(), hash.tensor(), 3, 1.5f, ids.tensor(),
                                                   w.tensor()),
               Error);
}

TEST_F(V4Ops, ClampedSwigluAndRoutedExpertsMatchOracle) {
  Tensor gu = get("swiglu_in");
  HostBuffer h(DType::F32, {gu.size(0), gu.size(1) / 2});
  backend_->silu_mul_clamped(gu, 10.0f, h.tensor());
  expect_close(h.tensor(), "swiglu_out", 1e-5f);
  ASSERT_GT(get("exp_clamp_fraction").ptr<const float>()[0], 0.1f);  // the clamp acts in this fixture
  Tensor gate_up = get("exp_gate_up"), down = get("exp_down");
  const int64_t E = gate_up.size(0), I = gate_up.size(1) / 2;
  std::vector<ExpertWeights> experts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    experts[e].gate.w = gate_up.row(e).slice_rows(0, I);
    experts[e].up.w = gate_up.row(e).slice_rows(I, 2 * I);
    experts[e].down.w = down.row(e);
  }
  Tensor x = get("exp_x");
  HostBuffer y(DType::F32, x.dims());
  backend_->moe_experts_clamped(x, get("route_ids"), get("route_weights"), experts, 10.0f, y.tensor());
  expect_close(y.tensor(), "exp_out", 1e-4f);
}

TEST_F(V4Ops, SinkAttentionMatchesOracleEagerAttention) {
  Tensor q = get("attn_q");
  HostBuffer out(DType::F32, q.dims());
  backend_->sink_attention(q, get("attn_kv"), get("attn_indices"), get("attn_sinks"),
                           1.0f / std::sqrt(static_cast<float>(q.size(2))), out.tensor());
  // The oracle's output is [T, heads, D] (eager_attention_forward transposes back).
  expect_close(out.tensor(), "attn_out", 1e-5f);
  // Query 2 sees no row: only the sink, so its output is 0.
  for (int64_t i = 0; i < q.size(1) * q.size(2); ++i) EXPECT_EQ(out.ptr<float>()[2 * q.size(1) * q.size(2) + i], 0.0f);
}

TEST_F(V4Ops, HcaAndCsaCompressorPoolingMatchOracle) {
  Tensor hkv = get("hca_kv");
  HostBuffer hout(DType::F32, {hkv.size(0) / 8, hkv.size(1)});
  backend_->compressor_pool(hkv, get("hca_gate"), get("hca_ape"), 8, false, Tensor(), Tensor(), hout.tensor());
  expect_close(hout.tensor(), "hca_pooled", 1e-5f);
  Tensor ckv = get("csa_kv");
  HostBuffer cout(DType::F32, {ckv.size(0) / 4, ckv.size(1) / 2});
  backend_->compressor_pool(ckv, get("csa_gate"), get("csa_ape"), 4, true, Tensor(), Tensor(), cout.tensor());
  expect_close(cout.tensor(), "csa_pooled", 1e-5f);
}

TEST_F(V4Ops, IndexerTopkMatchesOracleIndexer) {
  Tensor q = get("idx_q"), want = get("idx_topk");
  const int64_t T = q.size(0), k = want.size(1);
  HostBuffer out(DType::I32, {T, k});
  const float s = 1.0f / std::sqrt(16.0f);
  backend_->indexer_topk(q, get("idx_keys"), get("idx_weights"), get("idx_positions"), 4, s, s, out.tensor());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> a(out.ptr<int32_t>() + t * k, out.ptr<int32_t>() + (t + 1) * k);
    std::vector<int32_t> b(want.ptr<const int32_t>() + t * k, want.ptr<const int32_t>() + (t + 1) * k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b) << "query " << t;
  }
}

TEST_F(V4Ops, Fp4E2m1WithE8m0ScalesDequantizesLikeTorch) {
  Tensor packed = get("fp4_packed"), scales = get("fp4_scale"), want = get("fp4_dequant");
  ASSERT_EQ(scales.dtype, DType::F8_E8M0);
  std::vector<float> out(static_cast<size_t>(want.numel()));
  dequantize_fp4_e2m1(packed, scales, out.data(), "fp4_packed");
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(out[i], want.ptr<const float>()[i]) << i;
  // A scale tensor of the wrong shape is refused, naming the tensor.
  Tensor bad = scales;
  bad.shape[1] = 1;
  try {
    dequantize_fp4_e2m1(packed, bad, out.data(), "layers.0.ffn.experts.3.w1");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.ffn.experts.3.w1"), std::string::npos) << e.what();
  }
}

TEST_F(V4Ops, Fp8WithE8m0BlockScalesDequantizesLikeTorch) {
  Tensor w = get("fp8_weight"), scales = get("fp8_scale"), want = get("fp8_dequant");
  std::vector<float> out(static_cast<size_t>(want.numel()));
  dequantize_fp8_blocks(w, scales, 128, out.data(), "fp8_weight");
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(out[i], want.ptr<const float>()[i]) << i;
  EXPECT_THROW(dequantize_fp8_blocks(w, scales, 64, out.data(), "fp8_weight"), Error);
}

}  // namespace
}  // namespace deepinfer
