#include "model/deepseek_v4/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "core/dtype.h"
#include "core/error.h"

namespace deepinfer {

namespace {

// Every weight tensor of the model on a device backend: linears (F32 become BF16; BF16 and
// FP8 with their F32 scales as they are) and the F32 small tensors (norms, hc, ape, sinks,
// bias) as they are.
class Uploader {
 public:
  Uploader(Backend& be, std::vector<std::shared_ptr<void>>& owners) : be_(be), owners_(owners) {}
  void tensor(Tensor& t) {
    if (!t.defined() || t.device == be_.device()) return;
    DI_CHECK(t.is_contiguous(), "deepseek_v4: cannot upload non-contiguous ", t.describe());
    auto buf = std::make_shared<DeviceBuffer>(be_.alloc(t.dtype, t.dims()));
    be_.copy(t, buf->tensor());
    t = buf->tensor();
    owners_.push_back(buf);
  }
  void linear(Weight& w) {
    if (w.w.defined() && w.w.device == Device::CPU && w.w.dtype == DType::F32) {
      auto h = std::make_shared<HostBuffer>(DType::BF16, w.w.dims());
      for (int64_t i = 0; i < w.w.numel(); ++i) h->ptr<uint16_t>()[i] = float_to_bf16(w.w.ptr<const float>()[i]);
      w.w = h->tensor();
      owners_.push_back(h);
    }
    tensor(w.w);
    tensor(w.scale_inv);
  }
  void hc(V4HyperConnection& h) {
    tensor(h.fn);
    tensor(h.base);
    tensor(h.scale);
  }
  void layer(V4Layer& L) {
    for (Tensor* t : {&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.kv_norm, &L.sinks, &L.gate_bias,
                      &L.compressor.ape, &L.compressor.norm, &L.index_compressor.ape, &L.index_compressor.norm})
      tensor(*t);
    hc(L.hc_attn);
    hc(L.hc_ffn);
    for (Weight* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.index_wq_b, &L.index_weights_proj, &L.gate,
                      &L.shared.gate, &L.shared.up, &L.shared.down, &L.compressor.wkv, &L.compressor.wgate,
                      &L.index_compressor.wkv, &L.index_compressor.wgate})
      linear(*w);
    for (ExpertWeights& e : L.experts)
      for (Weight* w : {&e.gate, &e.up, &e.down}) linear(*w);
  }

 private:
  Backend& be_;
  std::vector<std::shared_ptr<void>>& owners_;
};

}  // namespace

using v4_family::cache_rows;
using v4_family::columns;
using v4_family::host_i32;
using v4_family::store_rows;
using StepHost = v4_family::StepHost;

DeviceBuffer DeepseekV4Model::upload(const std::vector<int32_t>& v) { return stage_.upload(v); }

DeepseekV4Model::DeepseekV4Model(DeepseekV4Config config, V4Weights weights, Backend& backend)
    : config_(std::move(config)), w_(std::move(weights)), be_(backend), act_(backend.activation_dtype()),
      layout_(v4_kv_layout(config_)), arena_(backend), stage_(backend, arena_) {
  DI_CHECK(be_.device() != Device::CPU || act_ == DType::F32, config_.base.source,
           ": deepseek_v4 on the CPU backend computes in F32");
  HostBuffer ones(DType::F32, {config_.head_dim});
  std::fill(ones.ptr<float>(), ones.ptr<float>() + config_.head_dim, 1.0f);
  ones_ = be_.alloc(DType::F32, {config_.head_dim});
  be_.copy(ones.tensor(), ones_.tensor());
  if (be_.device() != Device::CPU) {
    Uploader up(be_, w_.owners);
    up.tensor(w_.embed);
    up.hc(w_.hc_head);
    up.tensor(w_.norm);
    up.linear(w_.head);
    for (V4Layer& L : w_.layers) up.layer(L);
    for (V4MtpBlock& B : w_.mtp) {
      up.layer(B.block);
      up.linear(B.e_proj);
      up.linear(B.h_proj);
      for (Tensor* t : {&B.enorm, &B.hnorm, &B.norm}) up.tensor(*t);
      up.hc(B.hc_head);
    }
    be_.synchronize();
  }
}

void DeepseekV4Model::check_step(const StepBatch& batch, const KvCaches& kv) const {
  v4_family::check_step(be_, layout_.groups, act_, batch, kv, config_.base.max_position_embeddings, "deepseek_v4");
}

void DeepseekV4Model::check_positions(const StepBatch& batch) const {
  v4_family::check_positions(batch, config_.base.max_position_embeddings, "deepseek_v4");
}

namespace {

// Pools the compression groups that one sequence's tokens [p0, end) complete (groups
// [p0 / ratio, end / ratio)) from its pending rows (columns [kv_col, + width) and
// [gate_col, + width); this step's rows already stored), norms them, rotates group k at its
// first token's position k * ratio and writes it to row k of the entry cache. overlap (CSA):
// each window also reads the previous group's first halves, so the group before the step's
// first one is pooled along and its output dropped.
struct CompressJob {
  const V4Compressor* cp;
  int ratio;
  bool overlap;
  int64_t d, rope_dim;
  const Tensor* table;
  float eps;
  const Tensor* pending;  // cache of the pending group's layer
  int64_t kv_col, gate_col;
  const Tensor* entries;  // cache of the entry group's layer
};

template <typename RowsT>
void compress_groups(Backend& be, StepArena& arena, UploadStage& stage, DType act, const CompressJob& j,
                     const RowsT& pend, const RowsT& ent, int64_t p0, int64_t end) {
  const int64_t r = j.ratio, k0 = p0 / r, k1 = end / r, n = k1 - k0, width = j.overlap ? 2 * j.d : j.d;
  if (n <= 0) return;
  const int64_t extra = j.overlap && k0 > 0 ? 1 : 0, first = (k0 - extra) * r, used = (n + extra) * r;
  std::vector<int32_t> ids(static_cast<size_t>(used)), pos(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < used; ++i) ids[i] = pend.slot(first + i);
  for (int64_t w = 0; w < n; ++w) {
    pos[w] = static_cast<int32_t>((k0 + w) * r);
    slots[w] = ent.slot(k0 + w);
  }
  DeviceBuffer idb = stage.upload(ids), posb = stage.upload(pos), slotb = stage.upload(slots);
  DeviceBuffer rows = arena.alloc(act, {used, j.pending->size(2)});
  be.embedding(idb.tensor(), cache_rows(*j.pending), rows.tensor());
  DeviceBuffer pooled = arena.alloc(act, {n + extra, j.d}), normed = arena.alloc(act, {n, j.d});
  be.compressor_pool(columns(rows.tensor(), j.kv_col, width), columns(rows.tensor(), j.gate_col, width), j.cp->ape,
                     j.ratio, j.overlap, Tensor(), Tensor(), pooled.tensor());
  be.rms_norm(pooled.tensor().slice_rows(extra, n + extra), j.cp->norm, j.eps, normed.tensor());
  be.rope(normed.tensor(), posb.tensor(), *j.table, static_cast<int>(j.d - j.rope_dim), static_cast<int>(j.rope_dim),
          true);
  store_rows(be, normed.tensor(), *j.entries, slotb.tensor());
}

}  // namespace

void DeepseekV4Model::attention(const V4Layer& L, int l, const StepBatch& batch, const StepHost& sh,
                                KvCaches& kv, const Tensor& window_cache, int window_group, const Tensor& x,
                                const Tensor& qr, const Tensor& q, Tensor& out) {
  const DeepseekV4Config& c = config_;
  const V4KvLayout& lay = layout_;
  const int64_t T = x.size(0), D = c.head_dim, rd = c.rope_dim, W = c.sliding_window;
  const int64_t nh = c.index_n_heads, di = c.index_head_dim;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  const bool csa = L.kind == V4AttentionKind::Csa, hca = L.kind == V4AttentionKind::Hca;
  DI_CHECK(l >= 0 || L.kind == V4AttentionKind::Window, "deepseek_v4: an MTP block must be window-only");
  const int ratio = l >= 0 ? c.ratio(l) : 0, gl = l >= 0 ? lay.layer_in_group[static_cast<size_t>(l)] : -1;
  const Tensor& table = csa || hca ? rope_.compress.tensor() : rope_.main.tensor();
  const Tensor& positions = batch.positions;
  const std::vector<KvGroupSpec>& groups = lay.groups;

  // This step's K=V rows -> the window cache.
  DeviceBuffer kv_raw = alloc(act_, {T, D}), kvn = alloc(act_, {T, D});
  be_.gemm(x, L.wkv, kv_raw.tensor());
  be_.rms_norm(kv_raw.tensor(), L.kv_norm, eps, kvn.tensor());
  be_.rope(kvn.tensor(), positions, table, static_cast<int>(D - rd), static_cast<int>(rd), true);
  store_rows(be_, kvn.tensor(), window_cache, batch.kv_groups[static_cast<size_t>(window_group)].slot_mapping);

  // Compressor inputs of this step's tokens (each GEMM into its columns of the pending rows)
  // -> the pending cache; CSA: the indexer's queries and head weights.
  const int pending = csa ? lay.csa_pending : lay.hca_pending, entries = csa ? lay.csa_entries : lay.hca_entries;
  DeviceBuffer iq, iw;
  if (csa || hca) {
    DeviceBuffer rows = alloc(act_, {T, csa ? lay.csa_row : lay.hca_row});
    auto put = [&](const Weight& w, int64_t col) {
      Tensor dst = columns(rows.tensor(), col, w.out_features());
      be_.gemm(x, w, dst);
    };
    put(L.compressor.wkv, csa ? lay.csa_kv : lay.hca_kv);
    put(L.compressor.wgate, csa ? lay.csa_gate : lay.hca_gate);
    if (csa) {
      put(L.index_compressor.wkv, lay.csa_index_kv);
      put(L.index_compressor.wgate, lay.csa_index_gate);
      iq = alloc(act_, {T, nh, di});
      iw = alloc(DType::F32, {T, nh});
      Tensor iq2 = iq.tensor().view({T, nh * di});
      be_.gemm(qr, L.index_wq_b, iq2);
      be_.rope(iq.tensor(), positions, table, static_cast<int>(di - rd), static_cast<int>(rd), true);
      be_.gemm(x, L.index_weights_proj, iw.tensor());
    }
    store_rows(be_, rows.tensor(), kv[pending][gl], batch.kv_groups[pending].slot_mapping);
  }

  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1], nq = t1 - t0;
    if (nq == 0) continue;
    ArenaScope scope(arena_);  // this sequence's row lists and gathered rows
    const int64_t end = batch.host_seq_lens[s], p0 = end - nq;
    const StepHost::Rows window = sh.rows(window_group, s, window_cache, groups[lay.window].name);
    // The groups this step completes, pooled into the entry caches.
    int64_t nc = 0;  // entries visible to the sequence's last token
    if (csa || hca) {
      const Tensor& pend_cache = kv[pending][gl];
      const Tensor& ent_cache = kv[entries][gl];
      const StepHost::Rows pend = sh.rows(pending, s, pend_cache, groups[pending].name);
      const StepHost::Rows ent = sh.rows(entries, s, ent_cache, groups[entries].name);
      compress_groups(be_, arena_, stage_, act_,
                      CompressJob{&L.compressor, ratio, csa, D, rd, &table, eps, &pend_cache,
                                  csa ? lay.csa_kv : lay.hca_kv, csa ? lay.csa_gate : lay.hca_gate, &ent_cache},
                      pend, ent, p0, end);
      if (csa) {
        const Tensor& key_cache = kv[lay.indexer_keys][gl];
        const StepHost::Rows keys = sh.rows(lay.indexer_keys, s, key_cache, groups[lay.indexer_keys].name);
        compress_groups(be_, arena_, stage_, act_,
                        CompressJob{&L.index_compressor, ratio, true, di, rd, &table, eps, &pend_cache,
                                    lay.csa_index_kv, lay.csa_index_gate, &key_cache},
                        pend, keys, p0, end);
      }
      nc = end / ratio;
    }
    // Rows read: entries [0, nc), then the window rows of tokens [w0, end).
    int64_t w0 = std::max<int64_t>(0, p0 - W + 1);
    // The MTP block (l < 0) runs after the target step freed the window blocks its next
    // query no longer reads: a pass's rows before its last read only the rows still held.
    // Only their K=V rows (which attention does not change) and the last row's output are
    // used, and the last row's window is held (the runner keeps one row more, runner.cpp).
    if (l < 0)
      while (w0 < p0 && !window.held(w0)) ++w0;
    const int64_t nw = end - w0;
    std::vector<int32_t> row_ids;
    DeviceBuffer rows = alloc(act_, {nc + nw, D});
    if (nc > 0) {
      const StepHost::Rows ent = sh.rows(entries, s, kv[entries][gl], groups[entries].name);
      for (int64_t i = 0; i < nc; ++i) row_ids.push_back(ent.slot(i));
      DeviceBuffer ids = upload(row_ids);
      Tensor dst = rows.tensor().slice_rows(0, nc);
      be_.embedding(ids.tensor(), cache_rows(kv[entries][gl]), dst);
    }
    {
      row_ids.clear();
      for (int64_t r = 0; r < nw; ++r) row_ids.push_back(window.slot(w0 + r));
      DeviceBuffer ids = upload(row_ids);
      Tensor dst = rows.tensor().slice_rows(nc, nc + nw);
      be_.embedding(ids.tensor(), cache_rows(window_cache), dst);
    }
    // Each query's rows: its window, then the visible (HCA) or indexer-chosen (CSA) entries.
    const int64_t topk = csa ? std::min<int64_t>(c.index_topk, nc) : 0;
    const int64_t nwin = std::min(W, nw), slots = std::max<int64_t>(nwin + (csa ? topk : nc), 1);
    std::vector<int32_t> idx(static_cast<size_t>(nq * slots), -1);
    for (int64_t t = 0; t < nq; ++t) {
      const int64_t p = p0 + t;
      int32_t* r = idx.data() + t * slots;
      int64_t n = 0;
      for (int64_t a = std::max<int64_t>(w0, p - W + 1); a <= p; ++a) r[n++] = static_cast<int32_t>(nc + a - w0);
      if (hca)
        for (int64_t i = 0; i < std::min<int64_t>(nc, (p + 1) / ratio); ++i) r[n++] = static_cast<int32_t>(i);
    }
    DeviceBuffer idxb = upload(idx);
    Tensor idx2 = idxb.tensor().view({nq, slots});
    // CSA: the indexer's top entries among those each query sees, straight into the last
    // topk slots of each query's list (entry e is row e; a -1 is an empty slot).
    if (topk > 0) {
      const StepHost::Rows keys = sh.rows(lay.indexer_keys, s, kv[lay.indexer_keys][gl], groups[lay.indexer_keys].name);
      row_ids.clear();
      for (int64_t i = 0; i < nc; ++i) row_ids.push_back(keys.slot(i));
      DeviceBuffer ids = upload(row_ids);
      DeviceBuffer key_rows = alloc(act_, {nc, di}), sel = alloc(DType::I32, {nq, topk});
      be_.embedding(ids.tensor(), cache_rows(kv[lay.indexer_keys][gl]), key_rows.tensor());
      be_.indexer_topk(iq.tensor().slice_rows(t0, t1), key_rows.tensor(), iw.tensor().slice_rows(t0, t1),
                       positions.slice_rows(t0, t1), ratio, 1.0f / std::sqrt(static_cast<float>(di)),
                       1.0f / std::sqrt(static_cast<float>(nh)), sel.tensor());
      Tensor chosen = columns(idx2, nwin, topk);
      be_.copy(sel.tensor(), chosen);
    }
    Tensor out_s = out.slice_rows(t0, t1);
    be_.sink_attention(q.slice_rows(t0, t1), rows.tensor(), idx2, L.sinks, 1.0f / std::sqrt(static_cast<float>(D)),
                       out_s);
  }
}

void DeepseekV4Model::block(const V4Layer& L, int l, const StepBatch& batch, const StepHost& sh,
                            KvCaches& kv, const Tensor& window_cache, int window_group, DeviceBuffer& streams,
                            DeviceBuffer& next) {
  const DeepseekV4Config& c = config_;
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, rd = c.rope_dim;
  const int64_t ql = c.base.q_lora_rank, K = c.base.num_experts_per_tok;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  Backend::HyperConnectionParams hp{c.hc_mult, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), eps};
  ArenaScope scope(arena_);  // the block's temporaries (streams and next are the caller's)
  DeviceBuffer collapsed = alloc(DType::F32, {T, H}), post = alloc(DType::F32, {T, hc});
  DeviceBuffer comb = alloc(DType::F32, {T, hc, hc}), x = alloc(act_, {T, H});
  const bool compressed = L.kind != V4AttentionKind::Window;
  const Tensor& table = compressed ? rope_.compress.tensor() : rope_.main.tensor();
  const Tensor& inv = compressed ? rope_.compress_inv.tensor() : rope_.main_inv.tensor();
  // --- attention site
  be_.hc_pre(streams.tensor(), L.hc_attn.fn, L.hc_attn.base, L.hc_attn.scale, hp, collapsed.tensor(), post.tensor(),
             comb.tensor());
  be_.rms_norm(collapsed.tensor(), L.attn_norm, eps, x.tensor());
  DeviceBuffer qa = alloc(act_, {T, ql}), qr = alloc(act_, {T, ql}), q = alloc(act_, {T, heads * D});
  DeviceBuffer qn = alloc(act_, {T, heads, D});
  be_.gemm(x.tensor(), L.wq_a, qa.tensor());
  be_.rms_norm(qa.tensor(), L.q_norm, eps, qr.tensor());
  be_.gemm(qr.tensor(), L.wq_b, q.tensor());
  {
    Tensor q2 = q.tensor().view({T * heads, D}), qn2 = qn.tensor().view({T * heads, D});
    be_.rms_norm(q2, ones_.tensor(), eps, qn2);  // unweighted per-head RMS norm
  }
  be_.rope(qn.tensor(), batch.positions, table, static_cast<int>(D - rd), static_cast<int>(rd), true);
  DeviceBuffer attn = alloc(act_, {T, heads, D});
  attention(L, l, batch, sh, kv, window_cache, window_group, x.tensor(), qr.tensor(), qn.tensor(), attn.tensor());
  be_.rope(attn.tensor(), batch.positions, inv, static_cast<int>(D - rd), static_cast<int>(rd), true);
  DeviceBuffer o = alloc(act_, {T, H});
  v4_family::grouped_output(be_, arena_, act_, c, attn.tensor().view({T, heads * D}), L.wo_a, L.wo_b, o.tensor());
  be_.hc_post(streams.tensor(), o.tensor(), post.tensor(), comb.tensor(), next.tensor());
  std::swap(streams, next);
  // --- MoE site
  be_.hc_pre(streams.tensor(), L.hc_ffn.fn, L.hc_ffn.base, L.hc_ffn.scale, hp, collapsed.tensor(), post.tensor(),
             comb.tensor());
  be_.rms_norm(collapsed.tensor(), L.ffn_norm, eps, x.tensor());
  DeviceBuffer y = alloc(act_, {T, H}), hash;
  if (L.hash) {  // the tid2eid rows of the step's tokens
    std::vector<int32_t> rows(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(L.tid2eid.data() + static_cast<size_t>(sh.token_ids[t]) * K, K, rows.data() + t * K);
    hash = upload(rows);
  }
  v4_family::moe_site(be_, arena_, act_, c, x.tensor(), L.gate, L.gate_bias, L.hash ? hash.tensor().view({T, K}) : Tensor(),
                      L.experts, L.shared, y.tensor());
  be_.hc_post(streams.tensor(), y.tensor(), post.tensor(), comb.tensor(), next.tensor());
  std::swap(streams, next);
}

// Logits of batch.logits_indices' rows of `streams` [T, hc, H]: hc_head, norm and head are per row.
void DeepseekV4Model::head_logits(const StepBatch& batch, const Tensor& streams, const V4HyperConnection& hc_head,
                                  const Tensor& norm, Tensor& logits) {
  const DeepseekV4Config& c = config_;
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult, V = c.base.vocab_size;
  const int64_t R = batch.logits_indices.numel();
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  DI_CHECK(logits.dims() == std::vector<int64_t>({R, V}), "deepseek_v4: logits must be [", R, ", ", V, "], got ",
           logits.describe());
  if (R == 0) return;
  for (int32_t r : host_i32(be_, batch.logits_indices))
    DI_CHECK(r >= 0 && r < T, "deepseek_v4: logits index ", r, " outside the step's ", T, " tokens");
  Backend::HyperConnectionParams hp{c.hc_mult, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), eps};
  DeviceBuffer picked = alloc(DType::F32, {R, hc, H}), h = alloc(act_, {R, H}), hn = alloc(act_, {R, H});
  Tensor picked2 = picked.tensor().view({R, hc * H});
  be_.embedding(batch.logits_indices, streams.view({T, hc * H}), picked2);
  be_.hc_head(picked.tensor(), hc_head.fn, hc_head.base, hc_head.scale, hp, h.tensor());
  be_.rms_norm(h.tensor(), norm, eps, hn.tensor());
  be_.gemm(hn.tensor(), w_.head, logits);
}

void DeepseekV4Model::forward(const StepBatch& batch, KvCaches& kv, Tensor& logits, Tensor* hidden_out) {
  check_step(batch, kv);
  const DeepseekV4Config& c = config_;
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult, V = c.base.vocab_size;
  if (hidden_out != nullptr)
    DI_CHECK(hidden_out->device == be_.device() && hidden_out->dtype == DType::F32 && hidden_out->is_contiguous() &&
                 hidden_out->dims() == std::vector<int64_t>({T, hc * H}),
             "deepseek_v4: hidden_out must be F32 [", T, ", ", hc * H,
             "] on the backend's device (the hyper-connection streams after the last layer), got ",
             hidden_out->describe());
  arena_.reset();
  stage_.reset();
  StepHost sh = StepHost::read(be_, batch, V, "deepseek_v4");
  rope_.grow(be_, config_, batch.max_seq_len);
  // Embedding, copied into every stream: row t * hc + k of the streams is token t's.
  std::vector<int32_t> rep(static_cast<size_t>(T * hc));
  for (int64_t i = 0; i < T * hc; ++i) rep[i] = sh.token_ids[i / hc];
  DeviceBuffer rep_ids = upload(rep);
  DeviceBuffer streams = alloc(DType::F32, {T, hc, H}), next = alloc(DType::F32, {T, hc, H});
  Tensor s2 = streams.tensor().view({T * hc, H});
  be_.embedding(rep_ids.tensor(), w_.embed, s2);
  for (int l = 0; l < c.num_layers(); ++l)
    block(w_.layers[static_cast<size_t>(l)], l, batch, sh, kv,
          kv[layout_.window][static_cast<size_t>(l)], layout_.window, streams, next);
  if (hidden_out != nullptr) be_.copy(streams.tensor().view({T, hc * H}), *hidden_out);
  head_logits(batch, streams.tensor(), w_.hc_head, w_.norm, logits);
}

void DeepseekV4Model::mtp_forward(const StepBatch& batch, std::span<Tensor> kv, const Tensor& hidden_in,
                                  Tensor& hidden_out, Tensor& logits) {
  const DeepseekV4Config& c = config_;
  DI_CHECK(kv.size() == 1, "mtp_forward: deepseek_v4's MTP layer has one cache (its window group), got ", kv.size());
  Tensor& kv_cache = kv[0];
  DI_CHECK(!w_.mtp.empty(), c.base.source, ": deepseek_v4 mtp_forward without an MTP block loaded");
  const V4MtpBlock& B = w_.mtp.front();
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult, V = c.base.vocab_size;
  const KvGroupSpec& wg = layout_.groups[static_cast<size_t>(layout_.window)];
  DI_CHECK(!batch.kv_groups.empty(), "mtp_forward: deepseek_v4 needs the block tables of KV group '", wg.name, "'");
  DI_CHECK(kv_cache.device == be_.device() && kv_cache.dtype == act_ && kv_cache.ndim == 3 &&
               kv_cache.is_contiguous() && kv_cache.size(2) == wg.row_dim,
           "mtp_forward: deepseek_v4 MTP cache ", kv_cache.describe(), " must be ", dtype_name(act_),
           " [blocks, block_size, ", wg.row_dim, "] on the ", be_.name(), " backend (a layer of KV group '", wg.name,
           "')");
  for (const Tensor* t : {&hidden_in, static_cast<const Tensor*>(&hidden_out)})
    DI_CHECK(t->device == be_.device() && t->dtype == DType::F32 && t->is_contiguous() &&
                 t->dims() == std::vector<int64_t>({T, hc * H}),
             "mtp_forward: deepseek_v4 hidden rows must be F32 [", T, ", ", hc * H,
             "] on the backend's device (hyper-connection streams), got ", t->describe());
  check_positions(batch);
  arena_.reset();
  stage_.reset();
  StepHost sh;
  sh.model = "deepseek_v4";
  sh.token_ids = host_i32(be_, batch.token_ids);
  for (int64_t t = 0; t < T; ++t)
    DI_CHECK(sh.token_ids[t] >= 0 && sh.token_ids[t] < V, "deepseek_v4: token id ", sh.token_ids[t],
             " outside the vocabulary of ", V);
  sh.tables.push_back({host_i32(be_, batch.kv_groups.front().block_tables),
                       batch.kv_groups.front().block_tables.ndim == 2 ? batch.kv_groups.front().block_tables.size(1) : 0});
  rope_.grow(be_, config_, batch.max_seq_len);
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  // Block input: stream k of row t = e_proj(enorm(embed(t_{i+1}))) + h_proj(hnorm(h_i stream k)).
  DeviceBuffer emb = alloc(act_, {T, H}), en = alloc(act_, {T, H}), ep = alloc(DType::F32, {T, H});
  be_.embedding(batch.token_ids, w_.embed, emb.tensor());
  be_.rms_norm(emb.tensor(), B.enorm, eps, en.tensor());
  be_.gemm(en.tensor(), B.e_proj, ep.tensor());
  DeviceBuffer hn = alloc(act_, {T * hc, H}), streams = alloc(DType::F32, {T, hc, H}), next = alloc(DType::F32, {T, hc, H});
  DeviceBuffer eps_rows = alloc(DType::F32, {T * hc, H});
  be_.rms_norm(hidden_in.view({T * hc, H}), B.hnorm, eps, hn.tensor());
  Tensor s2 = streams.tensor().view({T * hc, H});
  be_.gemm(hn.tensor(), B.h_proj, s2);
  std::vector<int32_t> rep(static_cast<size_t>(T * hc));
  for (int64_t i = 0; i < T * hc; ++i) rep[i] = static_cast<int32_t>(i / hc);
  DeviceBuffer rep_ids = upload(rep);
  be_.embedding(rep_ids.tensor(), ep.tensor(), eps_rows.tensor());  // e_proj's row t for each stream
  be_.add(s2, eps_rows.tensor());
  KvCaches none;  // a window-only block reads no other group
  block(B.block, -1, batch, sh, none, kv_cache, 0, streams, next);
  be_.copy(streams.tensor().view({T * hc, H}), hidden_out);
  head_logits(batch, streams.tensor(), B.hc_head, B.norm, logits);
}

}  // namespace deepinfer
