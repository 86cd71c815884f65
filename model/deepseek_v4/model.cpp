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

// Every weight tensor of the model on a device backend (v4_family::DeviceUploader says how).
class Uploader : public v4_family::DeviceUploader {
 public:
  Uploader(Backend& be, std::vector<std::shared_ptr<void>>& owners) : DeviceUploader(be, owners, "deepseek_v4") {}
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
  const int64_t K = config_.base.num_experts_per_tok;
  for (const V4Layer& L : w_.layers) {
    tid2eid_.emplace_back();
    if (!L.hash) continue;
    DI_CHECK(static_cast<int64_t>(L.tid2eid.size()) % K == 0, config_.base.source, ": tid2eid of ",
             L.tid2eid.size(), " ids is not whole rows of ", K);
    tid2eid_.back() = v4_family::upload_i32(be_, L.tid2eid);  // viewed [vocab, K] where used
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
                                const DecodeRows* dr, KvCaches& kv, const Tensor& window_cache, int window_group,
                                const Tensor& x, const Tensor& qr, const Tensor& q, Tensor& out) {
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
  if (dr != nullptr) {
    decode_attention(L, l, batch, *dr, kv, window_cache, iq.tensor(), iw.tensor(), q, out);
    return;
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
    // Each query's rows (the layout decode_attention builds on the device, so both give the
    // same bits): slot j < W its window row p - W + 1 + j, then the visible (HCA) or
    // indexer-chosen (CSA) entries from slot W on; -1 where none.
    const int64_t topk = csa ? std::min<int64_t>(c.index_topk, nc) : 0;
    const int64_t slots = W + (csa ? topk : nc);
    std::vector<int32_t> idx(static_cast<size_t>(nq * slots), -1);
    for (int64_t t = 0; t < nq; ++t) {
      const int64_t p = p0 + t;
      int32_t* r = idx.data() + t * slots;
      for (int64_t j = 0; j < W; ++j) {
        const int64_t a = p - W + 1 + j;
        if (a >= w0) r[j] = static_cast<int32_t>(nc + a - w0);
      }
      if (hca)
        for (int64_t i = 0; i < std::min<int64_t>(nc, (p + 1) / ratio); ++i) r[W + i] = static_cast<int32_t>(i);
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
      Tensor chosen = columns(idx2, W, topk);
      be_.copy(sel.tensor(), chosen);
    }
    Tensor out_s = out.slice_rows(t0, t1);
    be_.sink_attention(q.slice_rows(t0, t1), rows.tensor(), idx2, L.sinks, 1.0f / std::sqrt(static_cast<float>(D)),
                       out_s);
  }
}

bool DeepseekV4Model::is_decode(const StepBatch& batch) const {
  for (int64_t s = 0; s < batch.num_seqs; ++s)
    if (batch.host_query_start[s + 1] - batch.host_query_start[s] != 1) return false;
  return batch.num_seqs > 0;
}

DeepseekV4Model::DecodeRows DeepseekV4Model::decode_rows(const StepBatch& batch, KvCaches& kv) {
  using Rule = Backend::V4RowRule;
  using Kind = Rule::Kind;
  const DeepseekV4Config& c = config_;
  const V4KvLayout& lay = layout_;
  DecodeRows dr;
  const int64_t S = batch.num_seqs, W = c.sliding_window;
  dr.S = S;
  dr.W = W;
  // Entries of group g's rows by `kind` into slots [S, n] (and index columns when defined).
  auto rows = [&](Kind kind, int g, int ratio, bool overlap, int32_t fill, int64_t n, const Tensor& index = Tensor(),
                  int64_t base = 0) {
    DeviceBuffer out = alloc(DType::I32, {S, n});
    Rule r;
    r.kind = kind;
    r.ratio = ratio;
    r.window = static_cast<int>(W);
    r.overlap = overlap;
    r.fill = fill;
    const Tensor& cache = kv[static_cast<size_t>(g)].front();  // every layer of a group has its geometry
    r.num_blocks = cache.size(0);
    r.block_size = cache.size(1);
    r.index_base = base;
    Tensor ix = index;
    be_.v4_decode_rows(batch.seq_lens, Tensor(), batch.kv_groups[static_cast<size_t>(g)].block_tables, r, out.tensor(),
                       ix);
    return out;
  };
  auto window_part = [&](DeviceBuffer& idx, int64_t E) {
    idx = alloc(DType::I32, {S, W + E});
    return rows(Kind::Window, lay.window, 1, false, 0, W, columns(idx.tensor(), 0, W), 0);
  };
  dr.win_slots = window_part(dr.idx_win, 0);
  const int64_t max_len = batch.max_seq_len;
  if (lay.hca_entries != V4KvLayout::kNone) {
    const int r = c.hca_rate;
    dr.hca_entries = max_len / r;
    window_part(dr.idx_hca, dr.hca_entries);
    dr.hca_pool = rows(Kind::Group, lay.hca_pending, r, false, -1, r);
    dr.hca_out = rows(Kind::Completed, lay.hca_entries, r, false, -1, 1);
    dr.hca_pos = rows(Kind::GroupStart, lay.hca_entries, r, false, 0, 1);
    if (dr.hca_entries > 0)
      dr.hca_vis = rows(Kind::Visible, lay.hca_entries, r, false, 0, dr.hca_entries,
                        columns(dr.idx_hca.tensor(), W, dr.hca_entries), S * W);
  }
  if (lay.csa_entries != V4KvLayout::kNone) {
    const int r = c.csa_rate;
    dr.csa_keys = max_len / r;
    dr.topk = std::min<int64_t>(c.index_topk, dr.csa_keys);
    window_part(dr.idx_csa, dr.topk);
    dr.csa_pool = rows(Kind::Group, lay.csa_pending, r, true, -1, 2 * r);
    dr.csa_out = rows(Kind::Completed, lay.csa_entries, r, false, -1, 1);
    dr.key_out = rows(Kind::Completed, lay.indexer_keys, r, false, -1, 1);
    dr.csa_pos = rows(Kind::GroupStart, lay.csa_entries, r, false, 0, 1);
    if (dr.csa_keys > 0) dr.key_ids = rows(Kind::Visible, lay.indexer_keys, r, false, 0, dr.csa_keys);
  }
  return dr;
}

void DeepseekV4Model::decode_attention(const V4Layer& L, int l, const StepBatch& batch, const DecodeRows& dr,
                                       KvCaches& kv, const Tensor& window_cache, const Tensor& iq, const Tensor& iw,
                                       const Tensor& q, Tensor& out) {
  const DeepseekV4Config& c = config_;
  const V4KvLayout& lay = layout_;
  const int64_t S = dr.S, W = dr.W, D = c.head_dim, rd = c.rope_dim, di = c.index_head_dim;
  const int64_t nh = c.index_n_heads;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  const bool csa = L.kind == V4AttentionKind::Csa, hca = L.kind == V4AttentionKind::Hca;
  const int ratio = c.ratio(l), gl = lay.layer_in_group[static_cast<size_t>(l)];
  const Tensor& table = csa || hca ? rope_.compress.tensor() : rope_.main.tensor();
  ArenaScope scope(arena_);
  // The group this step completes (if any) of each sequence, pooled into the entry caches
  // (slot -1: none completed, nothing stored).
  if (csa || hca) {
    const int pending = csa ? lay.csa_pending : lay.hca_pending, entries = csa ? lay.csa_entries : lay.hca_entries;
    const Tensor pend = cache_rows(kv[static_cast<size_t>(pending)][static_cast<size_t>(gl)]);
    auto pool = [&](const V4Compressor& cp, int64_t d, int64_t kv_col, int64_t gate_col, const DeviceBuffer& ids,
                    const DeviceBuffer& pos, const DeviceBuffer& slots, const Tensor& dst) {
      ArenaScope inner(arena_);
      const int64_t width = csa ? 2 * d : d;
      DeviceBuffer pooled = alloc(act_, {S, d}), normed = alloc(act_, {S, d});
      be_.compressor_pool_rows(columns(pend, kv_col, width), columns(pend, gate_col, width), cp.ape, ids.tensor(),
                               ratio, csa, pooled.tensor());
      be_.rms_norm(pooled.tensor(), cp.norm, eps, normed.tensor());
      be_.rope(normed.tensor(), pos.tensor().view({S}), table, static_cast<int>(d - rd), static_cast<int>(rd), true);
      store_rows(be_, normed.tensor(), dst, slots.tensor().view({S}));
    };
    const DeviceBuffer& ids = csa ? dr.csa_pool : dr.hca_pool;
    const DeviceBuffer& pos = csa ? dr.csa_pos : dr.hca_pos;
    pool(L.compressor, D, csa ? lay.csa_kv : lay.hca_kv, csa ? lay.csa_gate : lay.hca_gate, ids, pos,
         csa ? dr.csa_out : dr.hca_out, kv[static_cast<size_t>(entries)][static_cast<size_t>(gl)]);
    if (csa)
      pool(L.index_compressor, di, lay.csa_index_kv, lay.csa_index_gate, ids, pos, dr.key_out,
           kv[static_cast<size_t>(lay.indexer_keys)][static_cast<size_t>(gl)]);
  }
  // Rows read: [S * W window rows | S * E entries], through the step's indices.
  const int64_t E = hca ? dr.hca_entries : csa ? dr.topk : 0;
  const Tensor& idx = hca ? dr.idx_hca.tensor() : csa ? dr.idx_csa.tensor() : dr.idx_win.tensor();
  DeviceBuffer rows = alloc(act_, {S * (W + E), D});
  {
    Tensor dst = rows.tensor().slice_rows(0, S * W);
    be_.embedding(dr.win_slots.tensor().view({S * W}), cache_rows(window_cache), dst);
  }
  if (E > 0) {
    const int entries = csa ? lay.csa_entries : lay.hca_entries;
    const Tensor& ent_cache = kv[static_cast<size_t>(entries)][static_cast<size_t>(gl)];
    Tensor dst = rows.tensor().slice_rows(S * W, S * (W + E));
    if (hca) {
      be_.embedding(dr.hca_vis.tensor().view({S * E}), cache_rows(ent_cache), dst);
    } else {
      // The indexer's top entries among each sequence's visible keys, then their rows.
      const int64_t K = dr.csa_keys;
      const Tensor& key_cache = kv[static_cast<size_t>(lay.indexer_keys)][static_cast<size_t>(gl)];
      DeviceBuffer keys = alloc(act_, {S * K, di}), sel = alloc(DType::I32, {S, E}), ent = alloc(DType::I32, {S, E});
      be_.embedding(dr.key_ids.tensor().view({S * K}), cache_rows(key_cache), keys.tensor());
      be_.indexer_topk(iq, keys.tensor().view({S, K, di}), iw, batch.positions, ratio,
                       1.0f / std::sqrt(static_cast<float>(di)), 1.0f / std::sqrt(static_cast<float>(nh)),
                       sel.tensor());
      Backend::V4RowRule r;
      r.kind = Backend::V4RowRule::Kind::Listed;
      r.fill = 0;
      r.num_blocks = ent_cache.size(0);
      r.block_size = ent_cache.size(1);
      r.index_base = S * W;
      Tensor ix = columns(dr.idx_csa.tensor(), W, E);
      be_.v4_decode_rows(batch.seq_lens, sel.tensor(), batch.kv_groups[static_cast<size_t>(entries)].block_tables, r,
                         ent.tensor(), ix);
      be_.embedding(ent.tensor().view({S * E}), cache_rows(ent_cache), dst);
    }
  }
  be_.sink_attention(q, rows.tensor(), idx, L.sinks, 1.0f / std::sqrt(static_cast<float>(D)), out);
}

void DeepseekV4Model::block(const V4Layer& L, int l, const StepBatch& batch, const StepHost& sh, const DecodeRows* dr,
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
  attention(L, l, batch, sh, dr, kv, window_cache, window_group, x.tensor(), qr.tensor(), qn.tensor(), attn.tensor());
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
  if (L.hash && dr != nullptr) {  // the tid2eid rows of the step's tokens, gathered on the device
    hash = alloc(DType::I32, {T, K});
    Backend::V4RowRule r;
    r.kind = Backend::V4RowRule::Kind::TableRows;
    r.fill = 0;
    const Tensor& ids = tid2eid_[static_cast<size_t>(l)].tensor();
    Tensor none;
    be_.v4_decode_rows(batch.token_ids, Tensor(), ids.view({ids.numel() / K, K}), r, hash.tensor(), none);
  } else if (L.hash) {  // the tid2eid rows of the step's tokens
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
                                  const Tensor& norm, Tensor& logits, bool check_rows) {
  const DeepseekV4Config& c = config_;
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult, V = c.base.vocab_size;
  const int64_t R = batch.logits_indices.numel();
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  DI_CHECK(logits.dims() == std::vector<int64_t>({R, V}), "deepseek_v4: logits must be [", R, ", ", V, "], got ",
           logits.describe());
  if (R == 0) return;
  for (int32_t r : check_rows ? host_i32(be_, batch.logits_indices) : std::vector<int32_t>())
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
  // A decode step reads nothing back and uploads nothing (a CUDA graph replays it): its row
  // lists are built on the device; other steps build theirs on the host (StepHost).
  const bool decode = is_decode(batch);
  arena_.reset();
  StepHost sh;
  if (!decode) {
    stage_.reset();
    sh = StepHost::read(be_, batch, V, "deepseek_v4");
  }
  rope_.grow(be_, config_, batch.max_seq_len);
  // Embedding, copied into every stream: row t * hc + k of the streams is token t's.
  if (stream_rows_.tensor().numel() < T * hc) {
    std::vector<int32_t> ids(static_cast<size_t>(std::max(T * hc, 2 * stream_rows_.tensor().numel())));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) / hc);
    stream_rows_ = v4_family::upload_i32(be_, ids);
  }
  DeviceBuffer streams = alloc(DType::F32, {T, hc, H}), next = alloc(DType::F32, {T, hc, H});
  {
    ArenaScope scope(arena_);
    DeviceBuffer emb = alloc(DType::F32, {T, H});
    be_.embedding(batch.token_ids, w_.embed, emb.tensor());
    Tensor s2 = streams.tensor().view({T * hc, H});
    be_.embedding(stream_rows_.tensor().slice_rows(0, T * hc), emb.tensor(), s2);
  }
  DecodeRows dr;
  if (decode) dr = decode_rows(batch, kv);
  for (int l = 0; l < c.num_layers(); ++l)
    block(w_.layers[static_cast<size_t>(l)], l, batch, sh, decode ? &dr : nullptr, kv,
          kv[layout_.window][static_cast<size_t>(l)], layout_.window, streams, next);
  if (hidden_out != nullptr) be_.copy(streams.tensor().view({T, hc * H}), *hidden_out);
  head_logits(batch, streams.tensor(), w_.hc_head, w_.norm, logits, !decode);
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
  block(B.block, -1, batch, sh, nullptr, none, kv_cache, 0, streams, next);
  be_.copy(streams.tensor().view({T * hc, H}), hidden_out);
  head_logits(batch, streams.tensor(), B.hc_head, B.norm, logits);
}

}  // namespace deepinfer
