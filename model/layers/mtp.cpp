#include "model/layers/mtp.h"

#include "model/model.h"

#include <algorithm>

#include "model/layers/common.h"

namespace deepinfer {

MtpLayer::MtpLayer(const MtpDims& dims, const MtpWeights& w, MlaAbsorbedWeights absorbed,
                   const Tensor& embed, const Weight& head, Backend& backend)
    : dims_(dims), w_(w), absorbed_(std::move(absorbed)),
      embed_(w.embed_tokens.defined() ? w.embed_tokens : embed),
      head_(w.shared_head.w.defined() ? w.shared_head : head), backend_(backend) {
  DI_CHECK(w.block.is_moe || w.block.mlp.gate.w.defined(),
           "MTP block has neither MoE nor dense MLP weights");
}

void MtpLayer::ensure_workspace(int64_t num_tokens) {
  if (num_tokens <= capacity_) return;
  const int64_t cap = std::max<int64_t>(num_tokens, std::min<int64_t>(2 * capacity_, 1 << 16));
  const DType dt = backend_.activation_dtype();
  const int64_t H = dims_.hidden;
  buffers_.clear();
  for (Tensor* t : {&emb_, &x_, &xn_, &delta_, &gathered_}) {
    buffers_.push_back(backend_.alloc(dt, {cap, H}));
    *t = buffers_.back().tensor();
  }
  buffers_.push_back(backend_.alloc(dt, {cap, 2 * H}));
  cat_ = buffers_.back().tensor();
  mla_ws_ = make_mla_workspace(dims_.mla, backend_, cap);
  ffn_ws_ = make_ffn_workspace(dims_.ffn, backend_, cap);
  capacity_ = cap;
  ++workspace_epoch_;
}

void MtpLayer::forward(const StepBatch& batch, std::span<Tensor> kv, const Tensor& cos_sin,
                       const Tensor& hidden_in, Tensor& hidden_out, Tensor& logits) {
  const int64_t T = batch.num_tokens, H = dims_.hidden;
  const float eps = dims_.rms_norm_eps;
  DI_CHECK(T > 0 && hidden_in.ndim == 2 && hidden_in.size(0) == T && hidden_in.size(1) == H &&
               hidden_out.ndim == 2 && hidden_out.size(0) == T && hidden_out.size(1) == H,
           "mtp forward: hidden_in ", hidden_in.describe(), " and hidden_out ", hidden_out.describe(),
           " must be [", T, ", ", H, "]");
  DI_CHECK(!kv.empty() && kv[0].ndim == 3 && kv[0].size(2) == dims_.mla.kv_row_dim(), "mtp forward: KV cache ",
           kv.empty() ? std::string("(none)") : kv[0].describe(), " must be [blocks, block_size, ",
           dims_.mla.kv_row_dim(), "]");
  const int64_t R = batch.logits_indices.numel();
  DI_CHECK(logits.ndim == 2 && logits.size(0) == R && logits.size(1) == dims_.vocab,
           "mtp forward: logits ", logits.describe(), " must be [", R, ", ", dims_.vocab, "]");
  ensure_workspace(T);

  MlaStep step = make_mla_step(batch, cos_sin, backend_.batch_invariant());

  Tensor emb = emb_.slice_rows(0, T);                 // [T, H] embed(t_{i+1})
  Tensor cat_e = cols_view(cat_, T, H, 0);            // [T, H] enorm(emb): first half
  Tensor cat_h = cols_view(cat_, T, H, H);            // [T, H] hnorm(h): second half
  Tensor cat = cols_view(cat_, T, 2 * H);             // [T, 2H]
  Tensor x = x_.slice_rows(0, T), xn = xn_.slice_rows(0, T), delta = delta_.slice_rows(0, T);
  backend_.embedding(batch.token_ids, embed_, emb);
  backend_.rms_norm(emb, w_.enorm, eps, cat_e);
  backend_.rms_norm(hidden_in, w_.hnorm, eps, cat_h);
  backend_.gemm(cat, w_.eh_proj, x);  // [T, H]
  const LayerWeights& b = w_.block;
  backend_.rms_norm(x, b.input_layernorm, eps, xn);
  if (attention_) {
    attention_(batch, step, kv, b.attn, absorbed_, xn, mla_ws_, delta);
  } else {
    step.kv.cache = kv[0];
    mla_forward(backend_, dims_.mla, b.attn, absorbed_, step, xn, mla_ws_, delta);
  }
  backend_.add_rms_norm(x, delta, b.post_attention_layernorm, eps, xn);  // x += attn
  if (b.is_moe) {
    moe_forward(backend_, dims_.routing, b.moe, xn, ffn_ws_, delta);
  } else {
    mlp_forward(backend_, b.mlp, xn, ffn_ws_, delta);
  }
  backend_.add(x, delta);
  backend_.rms_norm(x, w_.shared_head_norm, eps, hidden_out);  // [T, H]
  if (R == 0) return;
  Tensor gathered = gathered_.slice_rows(0, R);  // [R, H]
  backend_.embedding(batch.logits_indices, hidden_out, gathered);
  backend_.gemm(gathered, head_, logits);
}

}  // namespace deepinfer
