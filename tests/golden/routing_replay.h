// RoutingReplayBackend: a Backend that runs every op on an inner backend, and either records
// the MoE routing decisions (the fp32 CPU reference) or replays them into another backend's
// forward (CUDA), so a bf16 golden run is checked op for op without expert flips at near-ties.
//
// Why: with BF16 activations a token whose fp32 routing is a near-tie (choice-score gap ~1e-3
// between the k-th and the next expert) can pick the other expert; that moves its logits by
// 2-4 (v3_tiny token 5 layer 2: gap 0.0023, flipping it in the fp32 oracle changes position 5
// by 3.33; v2_lite token 11 layer 1: softmax gap 1e-4, HF's own bf16 run is off by 0.40 there).
// Such a flip is not an error of the backend, but a logit tolerance cannot tell it from one.
// In replay mode each routing call still runs on the inner backend; its choice is compared
// with the recorded one token by token: a token may differ only when the recorded (fp32) scores
// make the difference a near-tie (every expert it chose instead scores within max_margin of the
// recorded k-th choice, and its group within max_margin of the kept groups'); such tokens then
// take the recorded ids and weights so the rest of the forward is comparable. A larger
// difference throws (a routing bug). The V3.2 indexer's top-k is replayed likewise: a row may
// keep other positions than the fp32 reference only where each one it kept instead scores
// (in the recorded fp32 scores) within max_topk_margin of the reference's k-th, relative to
// the row's largest |score| (the fixtures' cut margins go down to 1.5e-4; BF16 scores carry
// ~1e-2), and then takes the recorded positions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace deepinfer::test {

// The routing calls of one or more forward steps, in call order (layer by layer).
struct RoutingLog {
  struct Call {
    MoeRouting routing;
    bool sqrt_softplus = false;  // V4's moe_routing_sqrt_softplus (choice = sqrt(softplus(l)) + bias)
    int64_t num_tokens = 0;
    std::vector<float> logits;   // [T, E] router logits of the recording backend
    std::vector<float> bias;     // [E] when routing.use_bias
    std::vector<int32_t> ids;    // [T, k]
    std::vector<float> weights;  // [T, k]
  };
  std::vector<Call> calls;
  size_t next = 0;  // next call to replay
  // Replay statistics.
  int64_t compared_tokens = 0;
  int64_t flipped_tokens = 0;
  double max_flip_margin = 0;  // largest accepted near-tie gap (choice-score units)

  // DeepSeek-V3.2's indexer top-k (Backend::indexer_topk over the paged keys), the same way:
  // the recording backend's scores and chosen positions per call.
  struct TopkCall {
    int64_t num_tokens = 0, num_cols = 0, k = 0;
    std::vector<float> scores;    // [T, num_cols]
    std::vector<int32_t> indices;  // [T, k]
  };
  std::vector<TopkCall> topk_calls;
  size_t next_topk = 0;
  // DeepSeek-V4.1's candidate source (Backend::candidate_blocks): the recording backend's scores
  // and 0 / -inf bias per call; a replayed row may keep other blocks only where each one it kept
  // instead has a block score (its max, in the recorded scores) within max_topk_margin of the
  // reference's k-th kept block, relative to the row's largest |finite block score|.
  struct BlockCall {
    int64_t num_tokens = 0, num_cols = 0, topk_blocks = 0, block_size = 0;
    int ratio = 1;
    std::vector<float> scores, bias;  // [T, num_cols]
    std::vector<int32_t> positions;   // [T]
  };
  std::vector<BlockCall> block_calls;
  size_t next_block = 0;
  int64_t compared_rows = 0;
  int64_t flipped_rows = 0;
  double max_topk_margin = 0;  // largest accepted gap, relative to the row's largest |score|

  void clear_calls() {
    calls.clear();
    next = 0;
    topk_calls.clear();
    next_topk = 0;
    block_calls.clear();
    next_block = 0;
  }
};

class RoutingReplayBackend final : public Backend {
 public:
  enum class Mode { Record, Replay };
  // max_margin: the largest choice-score gap a replayed token may differ by.
  RoutingReplayBackend(Backend& inner, RoutingLog& log, Mode mode, double max_margin = 0.02,
                       double max_topk_margin = 0.05)
      : inner_(inner), log_(log), mode_(mode), max_margin_(max_margin),
        max_topk_margin_(max_topk_margin) {}

  Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  bool batch_invariant() const override { return inner_.batch_invariant(); }

  DeviceBuffer alloc(DType dtype, const std::vector<int64_t>& dims) override {
    return inner_.alloc(dtype, dims);
  }
  void copy(const Tensor& src, Tensor& dst) override { inner_.copy(src, dst); }
  void synchronize() override { inner_.synchronize(); }

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override {
    inner_.embedding(ids, table, out);
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    inner_.rms_norm(x, weight, eps, out);
  }
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                    Tensor& out) override {
    inner_.add_rms_norm(residual, x, weight, eps, out);
  }
  void gemm(const Tensor& x, const Weight& w, Tensor& out) override { inner_.gemm(x, w, out); }
  void gemm_heads(const Tensor& x, const Tensor& w, Tensor& out) override {
    inner_.gemm_heads(x, w, out);
  }
  void gemm_pair(const Tensor& x, const Weight& w1, const Weight& w2, Tensor& out1,
                 Tensor& out2) override {
    inner_.gemm_pair(x, w1, w2, out1, out2);
  }
  void gemm_swiglu(const Tensor& gate_up, const Weight& w, Tensor& out, bool accumulate) override {
    inner_.gemm_swiglu(gate_up, w, out, accumulate);
  }
  void rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset,
            int rope_dim, bool interleave) override {
    inner_.rope(x, positions, cos_sin, rope_offset, rope_dim, interleave);
  }
  void rms_norm_pair(const Tensor& x1, const Tensor& w1, Tensor& out1, const Tensor& x2,
                     const Tensor& w2, Tensor& out2, float eps) override {
    inner_.rms_norm_pair(x1, w1, out1, x2, w2, out2, eps);
  }
  void mla_rope_store(Tensor& q, Tensor& kv_rows, const Tensor& positions, const Tensor& cos_sin,
                      int q_rope_offset, int kv_rope_offset, int rope_dim, bool interleave,
                      PagedKV& kv, Tensor& q_rope_out) override {
    inner_.mla_rope_store(q, kv_rows, positions, cos_sin, q_rope_offset, kv_rope_offset, rope_dim,
                          interleave, kv, q_rope_out);
  }
  void silu_mul(const Tensor& gate_up, Tensor& out) override { inner_.silu_mul(gate_up, out); }
  void add(Tensor& x, const Tensor& y) override { inner_.add(x, y); }
  void kv_store(const Tensor& rows, PagedKV& kv) override { inner_.kv_store(rows, kv); }
  void mla_attention_paged(const Tensor& q, const PagedKV& kv, float softmax_scale, int v_dim,
                           Tensor& out) override {
    inner_.mla_attention_paged(q, kv, softmax_scale, v_dim, out);
  }
  void mla_attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& query_start, int num_seqs, float softmax_scale,
                             Tensor& out) override {
    inner_.mla_attention_prefill(q, k, v, query_start, num_seqs, softmax_scale, out);
  }
  void moe_routing(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                   Tensor& topk_ids, Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                   const std::vector<ExpertWeights>& experts, Tensor& out) override {
    inner_.moe_experts(x, topk_ids, topk_weights, experts, out);
  }
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  Tensor& out) override {
    inner_.layer_norm(x, weight, bias, eps, out);
  }
  void indexer_scores(const Tensor& q, const Tensor& weights, const PagedKV& kv, float scale,
                      Tensor& scores) override {
    inner_.indexer_scores(q, weights, kv, scale, scores);
  }
  void indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) override;
  // DeepSeek-V4: routing and the CSA indexer's top-k recorded / replayed as above (the recorded
  // indexer scores are recomputed on the host from the recording backend's inputs); the
  // other V4 ops run on the inner backend.
  void moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias, const Tensor& hash_ids, int top_k,
                                 float scaling, Tensor& topk_ids, Tensor& topk_weights) override;
  void indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions, int ratio,
                    float softmax_scale, float weights_scale, Tensor& out) override;
  void hc_pre(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
              const HyperConnectionParams& params, Tensor& collapsed, Tensor& post, Tensor& comb) override {
    inner_.hc_pre(streams, fn, base, scale, params, collapsed, post, comb);
  }
  void hc_post(const Tensor& streams, const Tensor& f, const Tensor& post, const Tensor& comb,
               Tensor& out) override {
    inner_.hc_post(streams, f, post, comb, out);
  }
  void hc_head(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
               const HyperConnectionParams& params, Tensor& out) override {
    inner_.hc_head(streams, fn, base, scale, params, out);
  }
  // DeepSeek-V4.1: topk_finite (its indexer's top-k) recorded / replayed as the paged
  // indexer_topk (best first: ordered = false), candidate_blocks as BlockCall says; the other V4.1
  // ops run on the inner backend.
  void topk_finite(const Tensor& scores, Tensor& out) override;
  void candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio, int64_t topk_blocks,
                        int64_t block_size, Tensor& bias) override;
  void fake_quant(Tensor& x, FakeQuant kind) override { inner_.fake_quant(x, kind); }
  void store_packed_rows(const Tensor& x, FakeQuant kind, const PagedKV& kv) override {
    inner_.store_packed_rows(x, kind, kv);
  }
  void gather_packed_rows(const Tensor& ids, const Tensor& cache, FakeQuant kind, Tensor& out) override {
    inner_.gather_packed_rows(ids, cache, kind, out);
  }
  void hc_mix(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
              const HyperConnectionParams& params, Tensor& pre, Tensor& post, Tensor& comb) override {
    inner_.hc_mix(streams, fn, base, scale, params, pre, post, comb);
  }
  void hc_collapse(const Tensor& streams, const Tensor& pre, Tensor& out) override {
    inner_.hc_collapse(streams, pre, out);
  }
  void engram_gate(const Tensor& streams, const Tensor& kv, const Tensor& weight, float eps, Tensor& out) override {
    inner_.engram_gate(streams, kv, weight, eps, out);
  }
  void embedding_fp8_rows(const Tensor& ids, const Tensor& table, const Tensor& scales, Tensor& out) override {
    inner_.embedding_fp8_rows(ids, table, scales, out);
  }
  void markov_argmax(const Tensor& logits, int64_t step, const Tensor& bias, int64_t vocab, Tensor& drafts,
                     Tensor& next) override {
    inner_.markov_argmax(logits, step, bias, vocab, drafts, next);
  }
  void dspark_confidence(const Tensor& h, const Tensor& e, const Tensor& w, Tensor& out) override {
    inner_.dspark_confidence(h, e, w, out);
  }
  void indexer_scores_visible(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                              int ratio, float softmax_scale, float weights_scale, Tensor& scores) override {
    inner_.indexer_scores_visible(q, keys, weights, positions, ratio, softmax_scale, weights_scale, scores);
  }
  void silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) override {
    inner_.silu_mul_clamped(gate_up, limit, out);
  }
  void moe_experts_clamped(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                           const std::vector<ExpertWeights>& experts, float limit, Tensor& out) override {
    inner_.moe_experts_clamped(x, topk_ids, topk_weights, experts, limit, out);
  }
  void sink_attention(const Tensor& q, const Tensor& kv, const Tensor& indices, const Tensor& sinks, float scale,
                      Tensor& out) override {
    inner_.sink_attention(q, kv, indices, sinks, scale, out);
  }
  void compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                       const Tensor& prior_kv, const Tensor& prior_gate, Tensor& out) override {
    inner_.compressor_pool(kv, gate, ape, ratio, overlap, prior_kv, prior_gate, out);
  }
  void mla_attention_prefill_context(const Tensor& q, const Tensor& k, const Tensor& v, const PagedKV& kv,
                                     float softmax_scale, Tensor& out) override {
    inner_.mla_attention_prefill_context(q, k, v, kv, softmax_scale, out);
  }
  void kv_gather(const PagedKV& kv, Tensor& rows) override { inner_.kv_gather(kv, rows); }
  void compressor_pool_rows(const Tensor& kv, const Tensor& gate, const Tensor& ape, const Tensor& row_ids, int ratio,
                            bool overlap, Tensor& out) override {
    inner_.compressor_pool_rows(kv, gate, ape, row_ids, ratio, overlap, out);
  }
  void v4_decode_rows(const Tensor& keys, const Tensor& rows_in, const Tensor& table, const V4RowRule& rule,
                      Tensor& slots, Tensor& index) override {
    inner_.v4_decode_rows(keys, rows_in, table, rule, slots, index);
  }
  void mla_attention_paged_sparse(const Tensor& q, const PagedKV& kv, const Tensor& indices,
                                  float softmax_scale, int v_dim, Tensor& out) override {
    inner_.mla_attention_paged_sparse(q, kv, indices, softmax_scale, v_dim, out);
  }
  void mla_attention_prefill_sparse(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& query_start, int num_seqs, const Tensor& indices,
                                    float softmax_scale, Tensor& out) override {
    inner_.mla_attention_prefill_sparse(q, k, v, query_start, num_seqs, indices, softmax_scale, out);
  }
  void moe_localize_ids(Tensor& topk_ids, int first, int count) override {
    inner_.moe_localize_ids(topk_ids, first, count);
  }
  void argmax(const Tensor& logits, Tensor& ids) override { inner_.argmax(logits, ids); }
  void spec_accept(const Tensor& ids, const Tensor& tokens, int q, Tensor& accepted, Tensor& last) override {
    inner_.spec_accept(ids, tokens, q, accepted, last);
  }
  void spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, Tensor& out_ids, Tensor& out_rows) override {
    inner_.spec_select_rows(ids, accepted, q, out_ids, out_rows);
  }
  void spec_shift(const SpecShift& shift) override { inner_.spec_shift(shift); }
  void fill_random(Tensor& t, uint64_t seed, float scale) override {
    inner_.fill_random(t, seed, scale);
  }

 private:
  template <typename T>
  std::vector<T> download(const Tensor& t);
  template <typename T>
  void upload(const std::vector<T>& values, Tensor& t);
  // The paged indexer_topk and topk_finite (ordered: the kept positions ascending, else best
  // first): record the scores and indices, or replay them (op names the call in errors).
  void topk_of_scores(const Tensor& scores, Tensor& indices, bool ordered, const char* op);
  // Replay of one top-k call (both indexer forms): rows of `got` that differ from the recorded
  // ones by a near-tie take the recorded positions (uploaded into indices).
  void replay_topk(const RoutingLog::TopkCall& want, std::vector<int32_t>& got, Tensor& indices, bool ordered);
  // Replay of one routing call: likewise for experts (and their weights).
  void replay_routing(const RoutingLog::Call& want, int64_t T, int64_t K, Tensor& topk_ids, Tensor& topk_weights);

  Backend& inner_;
  RoutingLog& log_;
  Mode mode_;
  double max_margin_;
  double max_topk_margin_;
};

// Gap by which `chosen` (k positions of row t, -1 = none) falls short of the recorded top-k of
// `call`, relative to the row's largest |score| (0 when they are the same set). Exposed for tests.
double topk_flip_margin(const RoutingLog::TopkCall& call, int64_t t, const int32_t* chosen);

// Choice-score gap by which `chosen` (k experts of token t) falls short of the recorded choice
// of `call` (0 when they are the same set): max over experts chosen instead of the expert gap
// (recorded k-th choice score - its score) and, group-limited, the group gap. Exposed for tests.
double routing_flip_margin(const RoutingLog::Call& call, int64_t t, const int32_t* chosen);

}  // namespace deepinfer::test
