// ForwardingBackend: a Backend that runs every op on an inner backend; test backends derive from
// it and override the ops they watch or change (RoutingReplayBackend: routing and top-k record /
// replay; Bf16EmulationBackend: BF16 activations on the CPU reference).
#pragma once
#include <string>
#include <vector>

#include "backend/backend.h"

namespace deepinfer::test {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

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
                   Tensor& topk_ids, Tensor& topk_weights) override {
    inner_.moe_routing(logits, bias, routing, topk_ids, topk_weights);
  }
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
  void indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) override {
    inner_.indexer_topk(scores, kv, indices);
  }
  void moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias, const Tensor& hash_ids, int top_k,
                                 float scaling, Tensor& topk_ids, Tensor& topk_weights) override {
    inner_.moe_routing_sqrt_softplus(logits, bias, hash_ids, top_k, scaling, topk_ids, topk_weights);
  }
  void indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions, int ratio,
                    float softmax_scale, float weights_scale, Tensor& out) override {
    inner_.indexer_topk(q, keys, weights, positions, ratio, softmax_scale, weights_scale, out);
  }
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
  void topk_finite(const Tensor& scores, Tensor& out) override { inner_.topk_finite(scores, out); }
  void candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio, int64_t topk_blocks,
                        int64_t block_size, Tensor& bias) override {
    inner_.candidate_blocks(scores, positions, ratio, topk_blocks, block_size, bias);
  }
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
  void argmax(const Tensor& logits, Tensor& ids) override { inner_.argmax(logits, ids); }
  void spec_accept(const Tensor& ids, const Tensor& tokens, int q, Tensor& accepted, Tensor& last) override {
    inner_.spec_accept(ids, tokens, q, accepted, last);
  }
  void spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, Tensor& out_ids, Tensor& out_rows) override {
    inner_.spec_select_rows(ids, accepted, q, out_ids, out_rows);
  }
  void spec_shift(const SpecShift& shift) override { inner_.spec_shift(shift); }
  void markov_argmax(const Tensor& logits, int64_t step, const Tensor& bias, int64_t vocab, Tensor& drafts,
                     Tensor& next) override {
    inner_.markov_argmax(logits, step, bias, vocab, drafts, next);
  }
  void dspark_confidence(const Tensor& h, const Tensor& e, const Tensor& w, Tensor& out) override {
    inner_.dspark_confidence(h, e, w, out);
  }
  void fill_random(Tensor& t, uint64_t seed, float scale) override {
    inner_.fill_random(t, seed, scale);
  }

 protected:
  Backend& inner_;
};

}  // namespace deepinfer::test
