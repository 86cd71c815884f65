#include "model/deepseek_v41/dspark.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deepinfer {

using v4_family::host_i32;
using v4_family::upload_i32;

DsparkDrafter::DsparkDrafter(const DeepseekV41Config& c, const V41Weights& w, Backend& backend)
    : c_(dspark_stage_config(c)), w_(w), be_(backend), arena_(backend) {
  DI_CHECK(w.dspark.loaded(), c.base.source, ": the DSpark drafter needs its weights (mtp.0.main_proj ...)");
  DI_CHECK(be_.device() == Device::CPU && be_.activation_dtype() == DType::F32, c.base.source,
           ": the DSpark drafter runs on the CPU backend only so far (F32), not on ", be_.name());
}

void DsparkDrafter::context_rows(const Tensor& features, const Tensor& positions, std::vector<DeviceBuffer>& rows) {
  const int64_t T = features.ndim == 2 ? features.size(0) : -1, H = c_.base.hidden_size, D = c_.head_dim,
                rd = c_.rope_dim;
  DI_CHECK(features.dtype == DType::F32 && features.dims() == std::vector<int64_t>({T, num_taps() * H}),
           "DSpark context_rows: features must be F32 [T, ", num_taps(), " * ", H, "], got ", features.describe());
  DI_CHECK(positions.dtype == DType::I32 && positions.dims() == std::vector<int64_t>({T}),
           "DSpark context_rows: positions must be I32 [", T, "], got ", positions.describe());
  const float eps = static_cast<float>(c_.base.rms_norm_eps);
  arena_.reset();
  int64_t max_pos = 0;
  for (int32_t p : host_i32(be_, positions)) {
    DI_CHECK(p >= 0, "DSpark context_rows: negative position ", p);
    max_pos = std::max<int64_t>(max_pos, p);
  }
  rope_.grow(be_, c_, max_pos + 1);
  DeviceBuffer proj = alloc(DType::F32, {T, H}), fused = alloc(DType::F32, {T, H}), kv = alloc(DType::F32, {T, D});
  be_.gemm(features, w_.dspark.main_proj, proj.tensor());
  be_.rms_norm(proj.tensor(), w_.dspark.main_norm, eps, fused.tensor());
  rows.clear();
  for (const V41Layer& L : w_.dspark.stages) {
    DeviceBuffer out = be_.alloc(DType::F32, {T, D});
    be_.gemm(fused.tensor(), L.wkv, kv.tensor());
    be_.rms_norm(kv.tensor(), L.kv_norm, eps, out.tensor());
    Tensor r3 = out.tensor().view({T, 1, D});
    be_.rope(r3, positions, rope_.main.tensor(), static_cast<int>(D - rd), static_cast<int>(rd), true);
    rows.push_back(std::move(out));
  }
}

void DsparkDrafter::propose(std::span<const Block> blocks, int64_t vocab, std::vector<Output>& out,
                            HostBuffer* base_logits) {
  const DeepseekV41Config& c = c_;
  const DsparkWeights& dw = w_.dspark;
  const int64_t nb = static_cast<int64_t>(blocks.size()), B = c.dspark_block_size, T = nb * B;
  const int64_t H = c.base.hidden_size, hc = c.hc_mult, D = c.head_dim, rd = c.rope_dim, V = c.base.vocab_size;
  const int64_t heads = c.base.num_attention_heads, ql = c.base.q_lora_rank, W = c.sliding_window;
  const int64_t r = dw.markov_w1.defined() ? c.dspark_markov_rank : 0;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  DI_CHECK(vocab >= 1 && vocab <= V, "DSpark propose: vocab ", vocab, " outside [1, ", V, "]");
  out.assign(static_cast<size_t>(nb), Output{});
  if (nb == 0) return;
  arena_.reset();
  // The blocks' tokens and positions.
  std::vector<int32_t> rep(static_cast<size_t>(T * hc)), pos(static_cast<size_t>(T));
  int64_t max_pos = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const Block& k = blocks[static_cast<size_t>(b)];
    DI_CHECK(k.anchor >= 0 && k.anchor < V, "DSpark propose: anchor token ", k.anchor, " outside [0, ", V, ")");
    DI_CHECK(static_cast<int>(k.context.size()) == num_stages(), "DSpark propose: block ", b, " has ",
             k.context.size(), " context tensors for ", num_stages(), " stages");
    for (int64_t i = 0; i < B; ++i) {
      const int32_t tok = i == 0 ? k.anchor : static_cast<int32_t>(c.dspark_noise_token_id);
      for (int64_t j = 0; j < hc; ++j) rep[static_cast<size_t>((b * B + i) * hc + j)] = tok;
      pos[static_cast<size_t>(b * B + i)] = static_cast<int32_t>(k.anchor_pos + i);
    }
    max_pos = std::max(max_pos, k.anchor_pos + B);
  }
  rope_.grow(be_, c, max_pos);
  DeviceBuffer rep_ids = upload_i32(be_, rep), positions = upload_i32(be_, pos);
  DeviceBuffer streams = alloc(DType::F32, {T, hc, H}), next = alloc(DType::F32, {T, hc, H});
  {
    Tensor s2 = streams.tensor().view({T * hc, H});
    be_.embedding(rep_ids.tensor(), w_.embed, s2);
  }
  const Backend::HyperConnectionParams hp{c.hc_mult, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), eps};
  DeviceBuffer collapsed = alloc(DType::F32, {T, H}), x = alloc(DType::F32, {T, H}), post = alloc(DType::F32, {T, hc});
  DeviceBuffer comb = alloc(DType::F32, {T, hc, hc}), qa = alloc(DType::F32, {T, ql}), qr = alloc(DType::F32, {T, ql});
  DeviceBuffer q = alloc(DType::F32, {T, heads, D}), kvt = alloc(DType::F32, {T, D}), kv = alloc(DType::F32, {T, D});
  DeviceBuffer attn = alloc(DType::F32, {T, heads, D}), y = alloc(DType::F32, {T, H});
  for (int s = 0; s < num_stages(); ++s) {
    const V41Layer& L = dw.stages[static_cast<size_t>(s)];
    // --- attention site
    be_.hc_pre(streams.tensor(), L.hc_attn.fn, L.hc_attn.base, L.hc_attn.scale, hp, collapsed.tensor(),
               post.tensor(), comb.tensor());
    be_.rms_norm(collapsed.tensor(), L.attn_norm, eps, x.tensor());
    be_.gemm(x.tensor(), L.wq_a, qa.tensor());
    be_.rms_norm(qa.tensor(), L.q_norm, eps, qr.tensor());
    {
      Tensor q2 = q.tensor().view({T, heads * D});
      be_.gemm(qr.tensor(), L.wq_b, q2);
    }
    Tensor qt = q.tensor();
    be_.rope(qt, positions.tensor(), rope_.main.tensor(), static_cast<int>(D - rd), static_cast<int>(rd), true);
    be_.gemm(x.tensor(), L.wkv, kvt.tensor());
    be_.rms_norm(kvt.tensor(), L.kv_norm, eps, kv.tensor());
    {
      Tensor k3 = kv.tensor().view({T, 1, D});
      be_.rope(k3, positions.tensor(), rope_.main.tensor(), static_cast<int>(D - rd), static_cast<int>(rd), true);
    }
    for (int64_t b = 0; b < nb; ++b) {
      const Tensor& ctx = blocks[static_cast<size_t>(b)].context[static_cast<size_t>(s)];
      const int64_t n = ctx.ndim == 2 ? ctx.size(0) : 0;
      DI_CHECK(ctx.ndim == 0 || ctx.numel() == 0 || (ctx.dtype == DType::F32 && ctx.dims() == std::vector<int64_t>({n, D})),
               "DSpark propose: block ", b, " stage ", s, " context must be F32 [n, ", D, "], got ", ctx.describe());
      // Query i (position anchor_pos + i) sees context row j (position anchor_pos - n + j) iff
      // j > n + i - W: only the last W - 1 rows are ever read.
      const int64_t use = std::min<int64_t>(n, std::max<int64_t>(W - 1, 0)), first = n - use;
      DeviceBuffer rows = alloc(DType::F32, {use + B, D});
      if (use > 0) {
        Tensor dst = rows.tensor().slice_rows(0, use);
        be_.copy(ctx.slice_rows(first, n), dst);
      }
      {
        Tensor dst = rows.tensor().slice_rows(use, use + B);
        be_.copy(kv.tensor().slice_rows(b * B, (b + 1) * B), dst);
      }
      std::vector<int32_t> idx(static_cast<size_t>(B * (use + B)), -1);
      for (int64_t i = 0; i < B; ++i) {
        int32_t* row = idx.data() + i * (use + B);
        int64_t m = 0;
        for (int64_t j = first; j < n; ++j)
          if (j > n + i - W) row[m++] = static_cast<int32_t>(j - first);
        for (int64_t j = 0; j < B; ++j) row[m++] = static_cast<int32_t>(use + j);
      }
      DeviceBuffer idxb = upload_i32(be_, idx);
      Tensor out_b = attn.tensor().slice_rows(b * B, (b + 1) * B);
      be_.sink_attention(q.tensor().slice_rows(b * B, (b + 1) * B), rows.tensor(), idxb.tensor().view({B, use + B}),
                         L.sinks, 1.0f / std::sqrt(static_cast<float>(D)), out_b);
    }
    Tensor at = attn.tensor();
    be_.rope(at, positions.tensor(), rope_.main_inv.tensor(), static_cast<int>(D - rd), static_cast<int>(rd), true);
    v4_family::grouped_output(be_, arena_, DType::F32, c, attn.tensor().view({T, heads * D}), L.wo_a, L.wo_b,
                              y.tensor());
    be_.hc_post(streams.tensor(), y.tensor(), post.tensor(), comb.tensor(), next.tensor());
    std::swap(streams, next);
    // --- MoE site
    be_.hc_pre(streams.tensor(), L.hc_ffn.fn, L.hc_ffn.base, L.hc_ffn.scale, hp, collapsed.tensor(), post.tensor(),
               comb.tensor());
    be_.rms_norm(collapsed.tensor(), L.ffn_norm, eps, x.tensor());
    v4_family::moe_site(be_, arena_, DType::F32, c, x.tensor(), L.gate, L.gate_bias, Tensor(), L.experts, L.shared,
                        y.tensor());
    be_.hc_post(streams.tensor(), y.tensor(), post.tensor(), comb.tensor(), next.tensor());
    std::swap(streams, next);
  }
  // h_i (the confidence head's input), then norm and the shared head.
  DeviceBuffer h = alloc(DType::F32, {T, H}), logits = alloc(DType::F32, {T, V});
  be_.hc_head(streams.tensor(), dw.hc_head.fn, dw.hc_head.base, dw.hc_head.scale, hp, h.tensor());
  be_.rms_norm(h.tensor(), dw.norm, eps, x.tensor());
  be_.gemm(x.tensor(), w_.head, logits.tensor());
  HostBuffer lg(DType::F32, {T, V}), hh(DType::F32, {T, H});
  be_.copy(logits.tensor(), lg.tensor());
  be_.copy(h.tensor(), hh.tensor());
  if (base_logits != nullptr) {
    *base_logits = HostBuffer(DType::F32, {T, V});
    std::copy(lg.ptr<float>(), lg.ptr<float>() + T * V, base_logits->ptr<float>());
  }
  // Sequential drafts: the Markov bias of each block's previous token, then the argmax.
  HostBuffer prev_emb(DType::F32, {T, std::max<int64_t>(r, 1)});
  std::vector<int32_t> prev(static_cast<size_t>(nb));
  std::vector<char> alive(static_cast<size_t>(nb), 1);
  for (int64_t b = 0; b < nb; ++b) prev[static_cast<size_t>(b)] = blocks[static_cast<size_t>(b)].anchor;
  DeviceBuffer emb = alloc(DType::F32, {nb, std::max<int64_t>(r, 1)}), bias = alloc(DType::F32, {nb, V});
  HostBuffer eh(DType::F32, {nb, std::max<int64_t>(r, 1)}), bh(DType::F32, {nb, V});
  for (int64_t i = 0; i < B; ++i) {
    if (r > 0) {
      DeviceBuffer ids = upload_i32(be_, prev);
      be_.embedding(ids.tensor(), dw.markov_w1, emb.tensor());
      be_.gemm(emb.tensor(), dw.markov_w2, bias.tensor());
      be_.copy(emb.tensor(), eh.tensor());
      be_.copy(bias.tensor(), bh.tensor());
    }
    for (int64_t b = 0; b < nb; ++b) {
      float* row = lg.ptr<float>() + (b * B + i) * V;
      if (r > 0) {
        const float* add = bh.ptr<float>() + b * V;
        for (int64_t v = 0; v < V; ++v) row[v] += add[v];
        std::copy(eh.ptr<float>() + b * r, eh.ptr<float>() + (b + 1) * r, prev_emb.ptr<float>() + (b * B + i) * r);
      }
      int32_t best = -1;
      for (int64_t v = 0; v < vocab; ++v)
        if (!std::isnan(row[v]) && (best < 0 || row[v] > row[best])) best = static_cast<int32_t>(v);
      if (best < 0) alive[static_cast<size_t>(b)] = 0;  // a NaN row: this block's drafts end
      if (alive[static_cast<size_t>(b)]) out[static_cast<size_t>(b)].drafts.push_back(best);
      prev[static_cast<size_t>(b)] = best < 0 ? 0 : best;
    }
  }
  if (!has_confidence()) return;
  // c_i = sigmoid(proj · [h_i ; markov_w1[prev_i]]).
  const int64_t F = H + (c.dspark_confidence_with_markov ? r : 0);
  HostBuffer feat(DType::F32, {T, F});
  for (int64_t t = 0; t < T; ++t) {
    std::copy(hh.ptr<float>() + t * H, hh.ptr<float>() + (t + 1) * H, feat.ptr<float>() + t * F);
    if (F > H) std::copy(prev_emb.ptr<float>() + t * r, prev_emb.ptr<float>() + (t + 1) * r, feat.ptr<float>() + t * F + H);
  }
  DeviceBuffer fd = alloc(DType::F32, {T, F}), cl = alloc(DType::F32, {T, 1});
  be_.copy(feat.tensor(), fd.tensor());
  be_.gemm(fd.tensor(), dw.confidence, cl.tensor());
  HostBuffer ch(DType::F32, {T, 1});
  be_.copy(cl.tensor(), ch.tensor());
  for (int64_t b = 0; b < nb; ++b)
    for (size_t i = 0; i < out[static_cast<size_t>(b)].drafts.size(); ++i)
      out[static_cast<size_t>(b)].confidences.push_back(
          1.0f / (1.0f + std::exp(-ch.ptr<float>()[b * B + static_cast<int64_t>(i)])));
}

}  // namespace deepinfer
