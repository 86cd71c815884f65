#include "model/deepseek_v4/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/layers/rope_table.h"

namespace deepinfer {

namespace {

HostBuffer buf(std::vector<int64_t> dims) { return HostBuffer(DType::F32, std::move(dims)); }

// The same angles with sin negated: rotation by -position (V4's inverse RoPE on the output).
HostBuffer inverse_table(const HostBuffer& table) {
  const Tensor& t = table.tensor();
  HostBuffer inv(DType::F32, t.dims());
  const int64_t rows = t.size(0), dim = t.size(1), half = dim / 2;
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t i = 0; i < dim; ++i)
      inv.ptr<float>()[p * dim + i] = (i < half ? 1.0f : -1.0f) * t.ptr<const float>()[p * dim + i];
  return inv;
}

}  // namespace

DeepseekV4Model::DeepseekV4Model(DeepseekV4Config config, V4Weights weights, Backend& backend)
    : config_(std::move(config)), w_(std::move(weights)), be_(backend) {
  DI_CHECK(be_.device() == Device::CPU && be_.activation_dtype() == DType::F32,
           config_.base.source, ": deepseek_v4 runs on the CPU backend only so far (its ops have no CUDA kernels yet)");
}

std::vector<KvGroupSpec> DeepseekV4Model::kv_groups() const {
  KvGroupSpec window;
  window.name = "window";
  window.num_layers = config_.num_layers();
  window.row_dim = config_.head_dim;
  window.window = static_cast<int>(config_.sliding_window);
  return {window};
}

void DeepseekV4Model::forward(const StepBatch& batch, KvCaches&, Tensor& logits, Tensor* hidden_out) {
  DI_CHECK(batch.num_seqs == 1 && batch.host_seq_lens.size() == 1 && batch.host_seq_lens[0] == batch.num_tokens,
           config_.base.source, ": deepseek_v4 runs one whole sequence per step so far (no cached context, "
           "no batching: its KV layer groups are later work)");
  DI_CHECK(hidden_out == nullptr, "deepseek_v4: hidden_out (MTP) is not supported yet");
  const int T = batch.num_tokens;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  std::copy_n(batch.token_ids.ptr<const int32_t>(), T, ids.data());
  HostBuffer all(DType::F32, {T, config_.base.vocab_size});
  prefill(ids, all.tensor());
  const int64_t n = batch.logits_indices.numel(), V = config_.base.vocab_size;
  DI_CHECK(logits.dims() == std::vector<int64_t>({n, V}), "deepseek_v4: logits must be [", n, ", ", V, "]");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = batch.logits_indices.ptr<const int32_t>()[i];
    DI_CHECK(r >= 0 && r < T, "deepseek_v4: logits index ", r, " outside the step's ", T, " tokens");
    std::copy_n(all.ptr<float>() + r * V, V, logits.ptr<float>() + i * V);
  }
}

void DeepseekV4Model::prefill(const std::vector<int32_t>& ids, Tensor& logits) {
  V4SequenceState state;
  step(state, ids, logits);
}

namespace {

// One compressor over the step's new rows: projections appended to the pending rows, every
// full group pooled (overlap: with the previous window's first halves), normed, rotated at
// its first token's position and appended to st.entries; the rest stays pending.
void compress_step(Backend& be, const V4Compressor& cp, const Tensor& x, int ratio, bool overlap, int64_t d,
                   int64_t rope_dim, const Tensor& table, float eps, V4CompressorState& st) {
  const int64_t T = x.size(0), width = overlap ? 2 * d : d;
  HostBuffer kv(DType::F32, {T, width}), gate(DType::F32, {T, width});
  be.gemm(x, cp.wkv, kv.tensor());
  be.gemm(x, cp.wgate, gate.tensor());
  st.pending_kv.insert(st.pending_kv.end(), kv.ptr<float>(), kv.ptr<float>() + T * width);
  st.pending_gate.insert(st.pending_gate.end(), gate.ptr<float>(), gate.ptr<float>() + T * width);
  st.n_pending += T;
  const int64_t n = st.n_pending / ratio;
  if (n == 0) return;
  const int64_t used = n * ratio;
  Tensor pkv(st.pending_kv.data(), DType::F32, {used, width}), pg(st.pending_gate.data(), DType::F32, {used, width});
  Tensor prior_kv, prior_gate;
  if (overlap && !st.prior_kv.empty()) {
    prior_kv = Tensor(st.prior_kv.data(), DType::F32, {ratio, d});
    prior_gate = Tensor(st.prior_gate.data(), DType::F32, {ratio, d});
  }
  HostBuffer pooled(DType::F32, {n, d}), normed(DType::F32, {n, d});
  be.compressor_pool(pkv, pg, cp.ape, ratio, overlap, prior_kv, prior_gate, pooled.tensor());
  be.rms_norm(pooled.tensor(), cp.norm, eps, normed.tensor());
  HostBuffer pos(DType::I32, {n});
  for (int64_t w = 0; w < n; ++w) pos.ptr<int32_t>()[w] = static_cast<int32_t>((st.n_entries + w) * ratio);
  be.rope(normed.tensor(), pos.tensor(), table, static_cast<int>(d - rope_dim), static_cast<int>(rope_dim), true);
  st.entries.insert(st.entries.end(), normed.ptr<float>(), normed.ptr<float>() + n * d);
  st.n_entries += n;
  if (overlap) {  // the last full window's first halves, gate + ape, for the next group
    st.prior_kv.assign(static_cast<size_t>(ratio * d), 0.0f);
    st.prior_gate.assign(static_cast<size_t>(ratio * d), 0.0f);
    for (int64_t j = 0; j < ratio; ++j) {
      const int64_t row = (n - 1) * ratio + j;
      for (int64_t c = 0; c < d; ++c) {
        st.prior_kv[j * d + c] = st.pending_kv[row * width + c];
        st.prior_gate[j * d + c] = st.pending_gate[row * width + c] + cp.ape.ptr<const float>()[j * width + c];
      }
    }
  }
  st.pending_kv.erase(st.pending_kv.begin(), st.pending_kv.begin() + used * width);
  st.pending_gate.erase(st.pending_gate.begin(), st.pending_gate.begin() + used * width);
  st.n_pending -= used;
}

}  // namespace

void DeepseekV4Model::step(V4SequenceState& state, const std::vector<int32_t>& ids, Tensor& logits) {
  const DeepseekV4Config& c = config_;
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.base.hidden_size, hc = c.hc_mult;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, rd = c.rope_dim, V = c.base.vocab_size;
  const int64_t ql = c.base.q_lora_rank, G = c.o_groups, gin = heads * D / G, ol = c.o_lora_rank;
  const int64_t E = c.base.n_routed_experts, K = c.base.num_experts_per_tok, W = c.sliding_window;
  const int64_t p0 = state.length, end = p0 + T;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  DI_CHECK(T > 0, "deepseek_v4 step: no tokens");
  DI_CHECK(logits.dims() == std::vector<int64_t>({T, V}), "deepseek_v4 step: logits must be [", T, ", ", V, "]");
  DI_CHECK(end <= c.base.max_position_embeddings, c.base.source, ": position ", end - 1,
           " is beyond max_position_embeddings = ", c.base.max_position_embeddings);
  for (int32_t id : ids) DI_CHECK(id >= 0 && id < V, "deepseek_v4: token id ", id, " outside the vocabulary of ", V);
  if (state.layers.empty()) state.layers.resize(static_cast<size_t>(c.num_layers()));
  Backend::HyperConnectionParams hp{c.hc_mult, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), eps};

  HostBuffer main_table = rope_cos_sin_table(c.main_rope_config(), end);
  HostBuffer comp_table = rope_cos_sin_table(c.compress_rope_config(), end);
  HostBuffer main_inv = inverse_table(main_table), comp_inv = inverse_table(comp_table);
  HostBuffer pos(DType::I32, {T});
  for (int64_t t = 0; t < T; ++t) pos.ptr<int32_t>()[t] = static_cast<int32_t>(p0 + t);
  HostBuffer ones = buf({D});
  std::fill(ones.ptr<float>(), ones.ptr<float>() + D, 1.0f);

  // Embedding, copied into every stream.
  HostBuffer tok(DType::I32, {T});
  std::copy(ids.begin(), ids.end(), tok.ptr<int32_t>());
  HostBuffer emb = buf({T, H});
  be_.embedding(tok.tensor(), w_.embed, emb.tensor());
  HostBuffer streams = buf({T, hc, H}), next = buf({T, hc, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k) std::copy_n(emb.ptr<float>() + t * H, H, streams.ptr<float>() + (t * hc + k) * H);

  HostBuffer collapsed = buf({T, H}), post = buf({T, hc}), comb = buf({T, hc, hc}), x = buf({T, H});
  for (int l = 0; l < c.num_layers(); ++l) {
    const V4Layer& L = w_.layers[static_cast<size_t>(l)];
    V4LayerState& S = state.layers[static_cast<size_t>(l)];
    const bool compressed = L.kind != V4AttentionKind::Window, csa = L.kind == V4AttentionKind::Csa;
    const Tensor& table = compressed ? comp_table.tensor() : main_table.tensor();
    const Tensor& inv = compressed ? comp_inv.tensor() : main_inv.tensor();
    // --- attention site
    be_.hc_pre(streams.tensor(), L.hc_attn.fn, L.hc_attn.base, L.hc_attn.scale, hp, collapsed.tensor(),
               post.tensor(), comb.tensor());
    be_.rms_norm(collapsed.tensor(), L.attn_norm, eps, x.tensor());
    HostBuffer qa = buf({T, ql}), qr = buf({T, ql}), q = buf({T, heads * D}), qn = buf({T, heads, D});
    be_.gemm(x.tensor(), L.wq_a, qa.tensor());
    be_.rms_norm(qa.tensor(), L.q_norm, eps, qr.tensor());
    be_.gemm(qr.tensor(), L.wq_b, q.tensor());
    {
      Tensor q2 = q.tensor().view({T * heads, D}), qn2 = qn.tensor().view({T * heads, D});
      be_.rms_norm(q2, ones.tensor(), eps, qn2);  // unweighted per-head RMS norm
    }
    be_.rope(qn.tensor(), pos.tensor(), table, static_cast<int>(D - rd), static_cast<int>(rd), true);
    HostBuffer kv = buf({T, D}), kvn = buf({T, D});
    be_.gemm(x.tensor(), L.wkv, kv.tensor());
    be_.rms_norm(kv.tensor(), L.kv_norm, eps, kvn.tensor());
    be_.rope(kvn.tensor(), pos.tensor(), table, static_cast<int>(D - rd), static_cast<int>(rd), true);
    const int ratio = c.ratio(l);
    std::vector<int32_t> chosen;  // CSA: [T, topk] entries picked by the indexer
    int64_t topk = 0;
    if (compressed) {
      compress_step(be_, L.compressor, x.tensor(), ratio, csa, D, rd, comp_table.tensor(), eps, S.compressor);
      if (csa) {
        const int64_t di = c.index_head_dim, nh = c.index_n_heads;
        compress_step(be_, L.index_compressor, x.tensor(), ratio, true, di, rd, comp_table.tensor(), eps, S.indexer);
        const int64_t n = S.indexer.n_entries;
        if (n > 0) {
          HostBuffer iq = buf({T, nh * di}), iw = buf({T, nh});
          be_.gemm(qr.tensor(), L.index_wq_b, iq.tensor());
          Tensor iq3 = iq.tensor().view({T, nh, di});
          be_.rope(iq3, pos.tensor(), comp_table.tensor(), static_cast<int>(di - rd), static_cast<int>(rd), true);
          be_.gemm(x.tensor(), L.index_weights_proj, iw.tensor());
          topk = std::min<int64_t>(c.index_topk, n);
          HostBuffer sel(DType::I32, {T, topk});
          Tensor keys(S.indexer.entries.data(), DType::F32, {n, di});
          be_.indexer_topk(iq3, keys, iw.tensor(), pos.tensor(), ratio, 1.0f / std::sqrt(static_cast<float>(di)),
                           1.0f / std::sqrt(static_cast<float>(nh)), sel.tensor());
          chosen.assign(sel.ptr<int32_t>(), sel.ptr<int32_t>() + T * topk);
        }
      }
    }
    // Rows: [kept window rows | this step's rows | compressed entries].
    const int64_t nw = S.n_window, nc = compressed ? S.compressor.n_entries : 0;
    HostBuffer rows = buf({nw + T + nc, D});
    std::copy(S.window.begin(), S.window.end(), rows.ptr<float>());
    std::copy_n(kvn.ptr<float>(), T * D, rows.ptr<float>() + nw * D);
    if (nc > 0) std::copy(S.compressor.entries.begin(), S.compressor.entries.end(), rows.ptr<float>() + (nw + T) * D);
    // Each query's rows: its window, then the visible (HCA) or chosen (CSA) entries.
    const int64_t slots = std::min<int64_t>(W, nw + T) + (csa ? topk : nc);
    HostBuffer idx(DType::I32, {T, std::max<int64_t>(slots, 1)});
    std::fill(idx.ptr<int32_t>(), idx.ptr<int32_t>() + idx.tensor().numel(), -1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = p0 + t;
      int32_t* r = idx.ptr<int32_t>() + t * idx.tensor().size(1);
      int64_t s = 0;
      for (int64_t a = std::max<int64_t>(0, p - W + 1); a <= p; ++a) r[s++] = static_cast<int32_t>(a - (p0 - nw));
      if (L.kind == V4AttentionKind::Hca) {
        for (int64_t i = 0; i < std::min<int64_t>(nc, (p + 1) / ratio); ++i) r[s++] = static_cast<int32_t>(nw + T + i);
      } else if (csa) {
        for (int64_t j = 0; j < topk; ++j)
          if (chosen[t * topk + j] >= 0) r[s++] = static_cast<int32_t>(nw + T + chosen[t * topk + j]);
      }
    }
    // The window for the next step: the last sliding_window - 1 rows.
    const int64_t keep = std::min<int64_t>(W - 1, nw + T);
    S.window.assign(rows.ptr<float>() + (nw + T - keep) * D, rows.ptr<float>() + (nw + T) * D);
    S.n_window = keep;
    HostBuffer attn = buf({T, heads, D});
    be_.sink_attention(qn.tensor(), rows.tensor(), idx.tensor(), L.sinks, 1.0f / std::sqrt(static_cast<float>(D)),
                       attn.tensor());
    be_.rope(attn.tensor(), pos.tensor(), inv, static_cast<int>(D - rd), static_cast<int>(rd), true);
    // Grouped output projection: group g's heads [T, heads*D/G] through wo_a rows [g*ol, (g+1)*ol).
    HostBuffer grouped = buf({T, G * ol}), part = buf({T, gin}), og = buf({T, ol}), o = buf({T, H});
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(attn.ptr<float>() + t * heads * D + g * gin, gin, part.ptr<float>() + t * gin);
      Weight wg;
      wg.w = L.wo_a.w.slice_rows(g * ol, (g + 1) * ol);
      be_.gemm(part.tensor(), wg, og.tensor());
      for (int64_t t = 0; t < T; ++t) std::copy_n(og.ptr<float>() + t * ol, ol, grouped.ptr<float>() + t * G * ol + g * ol);
    }
    be_.gemm(grouped.tensor(), L.wo_b, o.tensor());
    be_.hc_post(streams.tensor(), o.tensor(), post.tensor(), comb.tensor(), next.tensor());
    std::swap(streams, next);
    // --- MoE site
    be_.hc_pre(streams.tensor(), L.hc_ffn.fn, L.hc_ffn.base, L.hc_ffn.scale, hp, collapsed.tensor(), post.tensor(),
               comb.tensor());
    be_.rms_norm(collapsed.tensor(), L.ffn_norm, eps, x.tensor());
    HostBuffer rl = buf({T, E}), tw = buf({T, K}), y = buf({T, H});
    HostBuffer tid(DType::I32, {T, K}), hash(DType::I32, {T, K});
    be_.gemm(x.tensor(), L.gate, rl.tensor());
    if (L.hash)
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(L.tid2eid.data() + static_cast<size_t>(ids[t]) * K, K, hash.ptr<int32_t>() + t * K);
    be_.moe_routing_sqrt_softplus(rl.tensor(), L.hash ? Tensor() : L.gate_bias, L.hash ? hash.tensor() : Tensor(),
                                  static_cast<int>(K), static_cast<float>(c.base.routed_scaling_factor), tid.tensor(),
                                  tw.tensor());
    be_.moe_experts_clamped(x.tensor(), tid.tensor(), tw.tensor(), L.experts, static_cast<float>(c.swiglu_limit),
                            y.tensor());
    if (L.shared.gate.w.defined()) {
      const int64_t I = L.shared.gate.out_features();
      HostBuffer g = buf({T, I}), u = buf({T, I}), gu = buf({T, 2 * I}), h = buf({T, I}), s = buf({T, H});
      be_.gemm(x.tensor(), L.shared.gate, g.tensor());
      be_.gemm(x.tensor(), L.shared.up, u.tensor());
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(g.ptr<float>() + t * I, I, gu.ptr<float>() + t * 2 * I);
        std::copy_n(u.ptr<float>() + t * I, I, gu.ptr<float>() + t * 2 * I + I);
      }
      be_.silu_mul_clamped(gu.tensor(),
                           c.clamp_shared_expert ? static_cast<float>(c.swiglu_limit)
                                                 : std::numeric_limits<float>::infinity(),
                           h.tensor());
      be_.gemm(h.tensor(), L.shared.down, s.tensor());
      be_.add(y.tensor(), s.tensor());
    }
    be_.hc_post(streams.tensor(), y.tensor(), post.tensor(), comb.tensor(), next.tensor());
    std::swap(streams, next);
  }
  HostBuffer h = buf({T, H}), hn = buf({T, H});
  be_.hc_head(streams.tensor(), w_.hc_head.fn, w_.hc_head.base, w_.hc_head.scale, hp, h.tensor());
  be_.rms_norm(h.tensor(), w_.norm, eps, hn.tensor());
  be_.gemm(hn.tensor(), w_.head, logits);
  state.length = end;
}

}  // namespace deepinfer
