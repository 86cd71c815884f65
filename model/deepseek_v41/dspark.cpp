#include "model/deepseek_v41/dspark.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deepinfer {

using v4_family::host_i32;
using v4_family::upload_i32;

DsparkDrafter::DsparkDrafter(const DeepseekV41Config& c, const V41Weights& w, Backend& backend)
    : c_(dspark_stage_config(c)), w_(w), be_(backend), act_(backend.activation_dtype()), arena_(backend) {
  DI_CHECK(w.dspark.loaded(), c.base.source, ": the DSpark drafter needs its weights (mtp.0.main_proj ...)");
  DI_CHECK(be_.device() != Device::CPU || act_ == DType::F32, c.base.source,
           ": the DSpark drafter on the CPU backend computes in F32");
  if (!has_confidence()) return;
  // The confidence head's [1, H (+ rank)] row as the F32 vector dspark_confidence reads (read where
  // it lies: host weights, or the device copy the model uploaded).
  const Tensor& cw = w.dspark.confidence.w;
  DI_CHECK(cw.ndim == 2 && cw.size(0) == 1 && (cw.dtype == DType::F32 || cw.dtype == DType::BF16) &&
               cw.is_contiguous(),
           c.base.source, ": DSpark confidence head weight must be F32 or BF16 [1, n], got ", cw.describe());
  const int64_t n = cw.size(1);
  HostBuffer raw(cw.dtype, {n}), f(DType::F32, {n});
  be_.copy(cw.view({n}), raw.tensor());
  for (int64_t i = 0; i < n; ++i)
    f.ptr<float>()[i] = cw.dtype == DType::F32 ? raw.ptr<float>()[i] : bf16_to_float(raw.ptr<uint16_t>()[i]);
  confidence_w_ = be_.alloc(DType::F32, {n});
  be_.copy(f.tensor(), confidence_w_.tensor());
}

void DsparkDrafter::context_rows(const Tensor& features, const Tensor& positions, std::vector<DeviceBuffer>& rows) {
  const int64_t T = features.ndim == 2 ? features.size(0) : -1, H = c_.base.hidden_size, D = c_.head_dim,
                rd = c_.rope_dim;
  DI_CHECK(features.dtype == act_ && features.dims() == std::vector<int64_t>({T, num_taps() * H}),
           "DSpark context_rows: features must be ", dtype_name(act_), " [T, ", num_taps(), " * ", H,
           "] (the activation dtype), got ", features.describe());
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
  DeviceBuffer proj = alloc(act_, {T, H}), fused = alloc(act_, {T, H}), kv = alloc(act_, {T, D});
  be_.gemm(features, w_.dspark.main_proj, proj.tensor());
  be_.rms_norm(proj.tensor(), w_.dspark.main_norm, eps, fused.tensor());
  rows.clear();
  for (const V41Layer& L : w_.dspark.stages) {
    DeviceBuffer out = be_.alloc(act_, {T, D});
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
  // As the V4.1 forward's blocks: the streams, pre / post / comb and the collapse F32, the rest in the
  // activation dtype (F32 on the CPU, BF16 on CUDA).
  DeviceBuffer collapsed = alloc(DType::F32, {T, H}), x = alloc(act_, {T, H}), post = alloc(DType::F32, {T, hc});
  DeviceBuffer comb = alloc(DType::F32, {T, hc, hc}), qa = alloc(act_, {T, ql}), qr = alloc(act_, {T, ql});
  DeviceBuffer q = alloc(act_, {T, heads, D}), kvt = alloc(act_, {T, D}), kv = alloc(act_, {T, D});
  DeviceBuffer attn = alloc(act_, {T, heads, D}), y = alloc(act_, {T, H});
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
      DI_CHECK(ctx.ndim == 0 || ctx.numel() == 0 ||
                   (ctx.dtype == act_ && ctx.device == be_.device() && ctx.dims() == std::vector<int64_t>({n, D})),
               "DSpark propose: block ", b, " stage ", s, " context must be ", dtype_name(act_), " [n, ", D,
               "] on the backend's device, got ", ctx.describe());
      // Query i (position anchor_pos + i) sees context row j (position anchor_pos - n + j) iff
      // j > n + i - W: only the last W - 1 rows are ever read.
      const int64_t use = std::min<int64_t>(n, std::max<int64_t>(W - 1, 0)), first = n - use;
      DeviceBuffer rows = alloc(act_, {use + B, D});
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
    v4_family::grouped_output(be_, arena_, act_, c, attn.tensor().view({T, heads * D}), L.wo_a, L.wo_b,
                              y.tensor());
    be_.hc_post(streams.tensor(), y.tensor(), post.tensor(), comb.tensor(), next.tensor());
    std::swap(streams, next);
    // --- MoE site
    be_.hc_pre(streams.tensor(), L.hc_ffn.fn, L.hc_ffn.base, L.hc_ffn.scale, hp, collapsed.tensor(), post.tensor(),
               comb.tensor());
    be_.rms_norm(collapsed.tensor(), L.ffn_norm, eps, x.tensor());
    v4_family::moe_site(be_, arena_, act_, c, x.tensor(), L.gate, L.gate_bias, Tensor(), L.experts, L.shared,
                        y.tensor());
    be_.hc_post(streams.tensor(), y.tensor(), post.tensor(), comb.tensor(), next.tensor());
    std::swap(streams, next);
  }
  // h_i (the confidence head's input), then norm and the shared head.
  DeviceBuffer h = alloc(act_, {T, H}), logits = alloc(DType::F32, {T, V});
  be_.hc_head(streams.tensor(), dw.hc_head.fn, dw.hc_head.base, dw.hc_head.scale, hp, h.tensor());
  be_.rms_norm(h.tensor(), dw.norm, eps, x.tensor());
  be_.gemm(x.tensor(), w_.head, logits.tensor());
  if (base_logits != nullptr) {
    *base_logits = HostBuffer(DType::F32, {T, V});
    be_.copy(logits.tensor(), base_logits->tensor());
  }
  // Sequential drafts on the device: the Markov bias of each block's previous token (its anchor,
  // then its last draft), then the argmax (markov_argmax).
  std::vector<int32_t> anchors(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) anchors[static_cast<size_t>(b)] = blocks[static_cast<size_t>(b)].anchor;
  DeviceBuffer prev = upload_i32(be_, anchors), drafts = alloc(DType::I32, {nb, B});
  DeviceBuffer emb, bias;
  if (r > 0) {
    emb = alloc(act_, {nb, r});
    bias = alloc(DType::F32, {nb, V});
  }
  const Tensor lg3 = logits.tensor().view({nb, B, V});
  for (int64_t i = 0; i < B; ++i) {
    if (r > 0) {
      be_.embedding(prev.tensor(), dw.markov_w1, emb.tensor());
      be_.gemm(emb.tensor(), dw.markov_w2, bias.tensor());
    }
    Tensor d = drafts.tensor(), p = prev.tensor();
    be_.markov_argmax(lg3, i, r > 0 ? bias.tensor() : Tensor(), vocab, d, p);
  }
  const std::vector<int32_t> got = host_i32(be_, drafts.tensor());
  // A block's drafts end at its first row without an id (every sum NaN).
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < B && got[static_cast<size_t>(b * B + i)] >= 0; ++i)
      out[static_cast<size_t>(b)].drafts.push_back(got[static_cast<size_t>(b * B + i)]);
  if (!has_confidence()) return;
  // c_i = sigmoid(proj · [h_i ; markov_w1[prev_i]]) (dspark_confidence), prev_i as the Markov head
  // read it: the anchor, then max(draft_{i-1}, 0).
  DeviceBuffer pe, conf = alloc(DType::F32, {T});
  if (c.dspark_confidence_with_markov && r > 0) {
    std::vector<int32_t> prevs(static_cast<size_t>(T));
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t i = 0; i < B; ++i)
        prevs[static_cast<size_t>(b * B + i)] =
            i == 0 ? anchors[static_cast<size_t>(b)] : std::max(got[static_cast<size_t>(b * B + i - 1)], 0);
    DeviceBuffer ids = upload_i32(be_, prevs);
    pe = alloc(act_, {T, r});
    be_.embedding(ids.tensor(), dw.markov_w1, pe.tensor());
  }
  Tensor ct = conf.tensor();
  be_.dspark_confidence(h.tensor(), pe.tensor(), confidence_w_.tensor(), ct);
  HostBuffer ch(DType::F32, {T});
  be_.copy(conf.tensor(), ch.tensor());
  for (int64_t b = 0; b < nb; ++b)
    for (size_t i = 0; i < out[static_cast<size_t>(b)].drafts.size(); ++i)
      out[static_cast<size_t>(b)].confidences.push_back(ch.ptr<float>()[b * B + static_cast<int64_t>(i)]);
}

}  // namespace deepinfer
