#include "model/deepseek_v4/step_counts.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

namespace {

// Bytes of an [n, k] linear in each format class (weights_random.cpp's layouts).
struct LinearBytes {
  double linear_bytes, expert_bytes;
  double dense(double n, double k) const {  // FP8 + F32 scale per 128 x 128 block, or plain
    if (linear_bytes > 1.0) return n * k * linear_bytes;
    return n * k + std::ceil(n / 128) * std::ceil(k / 128) * 4.0;
  }
  double expert(double n, double k) const {  // FP4 e2m1 + one scale byte per 32, or as the dense linears
    if (expert_bytes > 0.0) return LinearBytes{expert_bytes, 0.0}.dense(n, k);
    return linear_bytes > 1.0 ? n * k * linear_bytes : n * k / 2 + n * k / 32;
  }
  double bf16(double n, double k) const { return n * k * (linear_bytes >= 4.0 ? 4.0 : 2.0); }
};

// Rows the token at position p attends on layer l, and compressed entries its indexer scores.
struct Rows {
  double attended = 0, scored = 0, compressed = 0;
};

Rows rows_at(const DeepseekV4Config& c, int l, double p) {
  Rows r;
  r.attended = std::min(static_cast<double>(c.sliding_window), p + 1);
  const int ratio = c.ratio(l);
  if (ratio == 0) return r;
  r.compressed = std::floor((p + 1) / ratio);
  if (c.attention[static_cast<size_t>(l)] == V4AttentionKind::Csa) {
    r.scored = r.compressed;
    r.attended += std::min(static_cast<double>(c.index_topk), r.compressed);
  } else {
    r.attended += r.compressed;
  }
  return r;
}

}  // namespace

StepCounts count_v4_step(const DeepseekV4Config& c, const StepQuery& q) {
  const double H = c.base.hidden_size, heads = c.base.num_attention_heads, D = c.head_dim, ql = c.base.q_lora_rank;
  const double G = c.o_groups, ol = c.o_lora_rank, E = c.base.n_routed_experts, K = c.base.num_experts_per_tok;
  const double S = c.base.n_shared_experts, nh = c.index_n_heads, di = c.index_head_dim, hc = c.hc_mult;
  const double V = c.base.vocab_size, expert = 3.0 * H * c.base.moe_intermediate_size;
  const double mix = (2 + hc) * hc, hc_site = mix * hc * H + mix + 3;
  const LinearBytes b{q.linear_bytes, q.expert_bytes};
  const double tokens = static_cast<double>(q.batch) * q.tokens_per_seq;
  const double distinct = E > 0 ? E * (1.0 - std::pow(1.0 - K / E, tokens)) : 0.0;
  const double I = c.base.moe_intermediate_size, expert_bytes = 3 * b.expert(I, H);
  const double shared_bytes = S * (2 * b.dense(I, H) + b.dense(H, I));

  StepCounts r;
  double macs_per_token = 0;  // linears a token runs, all layers
  for (int l = 0; l < c.num_layers(); ++l) {
    const int ratio = c.ratio(l);
    const V4AttentionKind kind = c.attention[static_cast<size_t>(l)];
    // wq_a, wq_b, wkv, wo_b and the shared expert (FP8 class); wo_a and the router (BF16 class);
    // norms, hc mixes, q_norm, kv_norm and sinks (F32).
    double bytes = b.dense(ql, H) + b.dense(heads * D, ql) + b.dense(D, H) + b.dense(H, G * ol) + shared_bytes +
                   b.bf16(G * ol, heads * D / G) + b.bf16(E, H) + 4.0 * (2 * H + 2 * hc_site + ql + D + heads);
    if (!c.hash_moe[static_cast<size_t>(l)]) bytes += 4.0 * E;  // the selection bias (hash layers: tid2eid on the host)
    double macs = ql * H + heads * D * ql + D * H + H * G * ol + S * expert + G * ol * (heads * D / G) + E * H +
                  2 * mix * hc * H + K * expert;
    if (kind == V4AttentionKind::Csa) {  // overlapping compressor (2D) and the indexer's (2 di), q and weights
      bytes += 2 * b.bf16(2 * D, H) + 2 * b.bf16(2 * di, H) + b.bf16(nh * di, ql) + b.bf16(nh, H) +
               4.0 * (ratio * 2 * D + D + ratio * 2 * di + di);  // ape, norms
      macs += 2 * (2 * D * H) + 2 * (2 * di * H) + nh * di * ql + nh * H;
    } else if (kind == V4AttentionKind::Hca) {
      bytes += 2 * b.bf16(D, H) + 4.0 * (ratio * D + D);
      macs += 2 * (D * H);
    }
    r.weight_bytes += bytes + distinct * expert_bytes;
    macs_per_token += macs;
  }
  r.weight_bytes += (H + hc * hc * H + hc + 1) * 4.0;  // final norm, hc_head
  macs_per_token += hc * hc * H;                       // hc_head's mix
  if (q.logits_rows > 0) r.weight_bytes += V * H * q.table_bytes;
  r.weight_bytes += tokens * H * q.table_bytes;
  r.flops = 2 * macs_per_token * tokens + 2 * V * H * q.logits_rows;

  // Attention and KV, per sequence, over its new positions (a decode or verify step's from the
  // context on, a prefill's from 0); decode reads the rows of its last position once.
  double attn_flops = 0, kv_values = 0;
  const bool decode = q.kind == StepKind::Decode;
  const double first = decode ? std::floor(q.context) : 0.0;
  const int n = q.tokens_per_seq;
  for (int l = 0; l < c.num_layers(); ++l) {
    const int ratio = c.ratio(l);
    const bool csa = c.attention[static_cast<size_t>(l)] == V4AttentionKind::Csa;
    for (int i = 0; i < n; ++i) {
      const Rows rows = rows_at(c, l, first + i);
      attn_flops += 4 * heads * D * rows.attended + 2 * nh * di * rows.scored;
      if (decode && i == n - 1) kv_values += D * rows.attended + di * rows.scored;
    }
    if (!decode) {  // rows written: window rows, compressed entries, indexer keys
      const double entries = ratio > 0 ? std::floor(static_cast<double>(n) / ratio) : 0.0;
      kv_values += D * n + D * entries + (csa ? di * entries : 0.0);
    }
  }
  r.flops += attn_flops * q.batch;
  r.kv_bytes = kv_values * q.batch * q.kv_bytes_per_value;
  return r;
}

}  // namespace deepinfer
