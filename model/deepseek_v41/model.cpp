#include "model/deepseek_v41/model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deepinfer {

using v4_family::cache_rows;
using v4_family::columns;
using v4_family::store_rows;

namespace {

constexpr const char* kModel = "deepseek_v41";

}  // namespace

void DeepseekV41Model::store_packed(const Tensor& rows, Backend::FakeQuant format,
                                    const Tensor& cache, const Tensor& slot_mapping) {
  PagedKV kv;
  kv.cache = cache;
  kv.slot_mapping = slot_mapping;
  be_.store_packed_rows(rows, format, kv);
}

DeepseekV41Model::DeepseekV41Model(DeepseekV41Config config, V41Weights weights, Backend& backend,
                                   V41PrefillTruncation truncation)
    : config_(std::move(config)),
      w_(std::move(weights)),
      be_(backend),
      act_(backend.activation_dtype()),
      layout_(v41_kv_layout(config_, w_.dspark.loaded())), arena_(backend), trunc_(truncation) {
  // (On a host backend act_ is F32, the CPU backend's, except under the golden tests' BF16
  // emulation, tests/golden/bf16_emulation.h, which converts its BF16 arguments per op.)
  // The drafter reads its confidence head's row from the host weights, before the upload.
  if (w_.dspark.loaded()) drafter_ = std::make_unique<DsparkDrafter>(config_, w_, be_);
  if (be_.device() != Device::CPU) upload_weights();
  engram_index_.assign(static_cast<size_t>(config_.num_layers()), -1);
  if (!config_.engram_layers.empty()) {
    DI_CHECK(static_cast<int64_t>(w_.engram_token_map.size()) == config_.base.vocab_size,
             config_.base.source, ": Engram layers need the compressed token map (weights.h)");
    hashing_ = make_engram_hashing(
        config_, w_.engram_token_map[static_cast<size_t>(config_.engram_pad_id)]);
    // The token map as an F32 [vocab, 1] table on the device (ids < 2^24: exact), gathered by
    // the step's device token ids into the "engram_tokens" cache.
    const int64_t V = config_.base.vocab_size;
    HostBuffer map(DType::F32, {V, 1});
    for (int64_t i = 0; i < V; ++i)
      map.ptr<float>()[i] = static_cast<float>(w_.engram_token_map[static_cast<size_t>(i)]);
    token_map_ = be_.alloc(DType::F32, {V, 1});
    be_.copy(map.tensor(), token_map_.tensor());
    for (size_t e = 0; e < config_.engram_layers.size(); ++e)
      engram_index_[static_cast<size_t>(config_.engram_layers[e])] = static_cast<int>(e);
  }
  tap_index_.assign(static_cast<size_t>(config_.num_layers()), -1);
  if (w_.dspark.loaded()) {
    for (size_t k = 0; k < config_.dspark_target_layers.size(); ++k)
      tap_index_[static_cast<size_t>(config_.dspark_target_layers[k])] = static_cast<int>(k);
  }
  // With prefill truncation the drafter's context rows are written for the kept rows only: a block
  // reads the rows of its last sliding_window positions, and the truncation floor keeps at least
  // those (v41_prefill_truncation refuses a keep below window + backtracking).
  int max_ratio = 1;
  for (const V41KvLayout::Ratio& r : layout_.ratios) max_ratio = std::max(max_ratio, r.ratio);
  HostBuffer zeros(DType::F32, {max_ratio, config_.head_dim});
  std::fill(zeros.ptr<float>(), zeros.ptr<float>() + zeros.tensor().numel(), 0.0f);
  zero_ape_ = be_.alloc(DType::F32, {max_ratio, config_.head_dim});
  be_.copy(zeros.tensor(), zero_ape_.tensor());
}

void DeepseekV41Model::upload_weights() {
  v4_family::DeviceUploader up(be_, w_.owners, kModel);
  up.tensor(w_.embed);
  up.tensor(w_.norm);
  up.linear(w_.head);
  // The drafter's stages carry the same kinds of weights as the text model's layers.
  std::vector<V41Layer*> blocks;
  for (std::vector<V41Layer>* v : {&w_.layers, &w_.dspark.stages})
    for (V41Layer& L : *v) blocks.push_back(&L);
  for (V41Layer* block : blocks) {
    V41Layer& L = *block;
    for (Tensor* t : {&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.kv_norm, &L.sinks, &L.comp_norm, &L.index_k_norm,
                      &L.gate_bias, &L.gate_bias_vl, &L.engram_table, &L.engram_scale, &L.engram_weight})
      up.tensor(*t);
    up.hc(L.hc_attn);
    up.hc(L.hc_ffn);
    for (Weight* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.comp_wkv, &L.comp_wgate, &L.index_wq_b,
                      &L.index_weights_proj, &L.index_wk, &L.gate, &L.shared.gate, &L.shared.up, &L.shared.down,
                      &L.engram_wkv})
      up.linear(*w);
    for (ExpertWeights& e : L.experts)
      for (Weight* w : {&e.gate, &e.up, &e.down}) up.linear(*w);
  }
  DsparkWeights& d = w_.dspark;  // the drafter's own (its confidence row: DsparkDrafter's copy)
  for (Tensor* t : {&d.main_norm, &d.norm, &d.markov_w1}) up.tensor(*t);
  up.hc(d.hc_head);
  for (Weight* w : {&d.main_proj, &d.markov_w2}) up.linear(*w);
  be_.synchronize();
}

Tensor DeepseekV41Model::constant_pre(bool mean, int64_t T) {
  const int64_t hc = config_.hc_mult;
  if (T > const_rows_) {  // grown on the host once in a while; a step only copies on the device
    const_rows_ = std::max<int64_t>({T, 2 * const_rows_, 64});
    HostBuffer one(DType::F32, {const_rows_, hc}), avg(DType::F32, {const_rows_, hc});
    for (int64_t i = 0; i < const_rows_ * hc; ++i) {
      one.ptr<float>()[i] = i % hc == 0 ? 1.0f : 0.0f;
      avg.ptr<float>()[i] = 1.0f / static_cast<float>(hc);
    }
    one_hot_ = be_.alloc(DType::F32, {const_rows_, hc});
    mean_pre_ = be_.alloc(DType::F32, {const_rows_, hc});
    be_.copy(one.tensor(), one_hot_.tensor());
    be_.copy(avg.tensor(), mean_pre_.tensor());
  }
  return (mean ? mean_pre_ : one_hot_).tensor().slice_rows(0, T);
}

PrefillTruncation DeepseekV41Model::prefill_truncation() const {
  if (!trunc_.active()) return {};
  return {trunc_.keep, trunc_.exact_lag};
}

void DeepseekV41Model::compress(int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv,
                                const Tensor& x, int64_t s) {
  const DeepseekV41Config& c = config_;
  const V41Layer& L = w_.layers[static_cast<size_t>(l)];
  const V41KvLayout::Ratio& G =
      layout_.ratios[static_cast<size_t>(layout_.ratio_of_layer[static_cast<size_t>(l)])];
  const int slot = layout_.source_slot[static_cast<size_t>(l)];
  const int64_t D = c.head_dim, rd = c.rope_dim, di = c.index_head_dim, r = G.ratio;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1];
  const int64_t end = batch.host_seq_lens[s], p0 = end - (t1 - t0), k0 = p0 / r, n = end / r - k0;
  if (n <= 0) return;
  const Tensor& table = rope_.compress.tensor();
  // The entries' latents (normed, before RoPE).
  DeviceBuffer latent = alloc(act_, {n, D});
  if (r > 1) {
    const Tensor& pend_cache = kv[static_cast<size_t>(G.pending)][static_cast<size_t>(slot)];
    const StepHost::Rows pend =
        sh.rows(G.pending, s, pend_cache, layout_.groups[static_cast<size_t>(G.pending)].name);
    std::vector<int32_t> ids(static_cast<size_t>(n * r));
    for (int64_t i = 0; i < n * r; ++i) ids[static_cast<size_t>(i)] = pend.slot(k0 * r + i);
    DeviceBuffer idb = v4_family::upload_i32(be_, ids), rows = alloc(act_, {n * r, 2 * D}),
                 pooled = alloc(act_, {n, D});
    be_.embedding(idb.tensor(), cache_rows(pend_cache), rows.tensor());
    be_.compressor_pool(columns(rows.tensor(), 0, D), columns(rows.tensor(), D, D),
                        zero_ape_.tensor().slice_rows(0, r), static_cast<int>(r), false, Tensor(),
                        Tensor(), pooled.tensor());
    be_.rms_norm(pooled.tensor(), L.comp_norm, eps, latent.tensor());
  } else {  // ratio 1: every token is an entry, norm(wkv(x))
    DeviceBuffer raw = alloc(act_, {n, D});
    be_.gemm(x.slice_rows(t0, t1), L.comp_wkv, raw.tensor());
    be_.rms_norm(raw.tensor(), L.comp_norm, eps, latent.tensor());
  }
  // Entry k sits at its group's first position k * ratio, in row k of the source's groups.
  std::vector<int32_t> pos(static_cast<size_t>(n)), key_slots(static_cast<size_t>(n)),
      ent_slots(static_cast<size_t>(n));
  const Tensor& key_cache = kv[static_cast<size_t>(G.indexer_keys)][static_cast<size_t>(slot)];
  const Tensor& ent_cache = kv[static_cast<size_t>(G.compressed)][static_cast<size_t>(slot)];
  const StepHost::Rows keys = sh.rows(G.indexer_keys, s, key_cache,
                                      layout_.groups[static_cast<size_t>(G.indexer_keys)].name);
  const StepHost::Rows ents =
      sh.rows(G.compressed, s, ent_cache, layout_.groups[static_cast<size_t>(G.compressed)].name);
  for (int64_t i = 0; i < n; ++i) {
    pos[static_cast<size_t>(i)] = static_cast<int32_t>((k0 + i) * r);
    key_slots[static_cast<size_t>(i)] = keys.slot(k0 + i);
    ent_slots[static_cast<size_t>(i)] = ents.slot(k0 + i);
  }
  DeviceBuffer posb = v4_family::upload_i32(be_, pos),
               kslot = v4_family::upload_i32(be_, key_slots);
  DeviceBuffer eslot = v4_family::upload_i32(be_, ent_slots);
  // Indexer keys from the unrotated latent: FP4(RoPE(k_norm(wk(latent)))).
  DeviceBuffer kr = alloc(act_, {n, di}), kn = alloc(act_, {n, di});
  be_.gemm(latent.tensor(), L.index_wk, kr.tensor());
  be_.rms_norm(kr.tensor(), L.index_k_norm, eps, kn.tensor());
  be_.rope(kn.tensor(), posb.tensor(), table, static_cast<int>(di - rd), static_cast<int>(rd),
           true);
  store_packed(kn.tensor(), V41KvLayout::kKeyFormat, key_cache, kslot.tensor());
  // Entries: FP4(RoPE(latent)) with e4m3 scales per 16.
  be_.rope(latent.tensor(), posb.tensor(), table, static_cast<int>(D - rd), static_cast<int>(rd),
           true);
  store_packed(latent.tensor(), V41KvLayout::kEntryFormat, ent_cache, eslot.tensor());
}

void DeepseekV41Model::attention(int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv,
                                 const Tensor& x, const Tensor& qr, const Tensor& q,
                                 std::vector<SeqChoice>& choice, Tensor& out) {
  const DeepseekV41Config& c = config_;
  const V41Layer& L = w_.layers[static_cast<size_t>(l)];
  const int64_t T = x.size(0), D = c.head_dim, rd = c.rope_dim, W = c.sliding_window;
  const int64_t nh = c.index_n_heads, di = c.index_head_dim;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  const int ratio = c.ratio(l);
  const Tensor& table = ratio > 0 ? rope_.compress.tensor() : rope_.main.tensor();
  const Tensor& positions = batch.positions;
  const std::vector<KvGroupSpec>& groups = layout_.groups;
  const Tensor& window_cache = kv[static_cast<size_t>(layout_.window)][static_cast<size_t>(l)];

  // This step's K=V rows (FP8-rounded) -> the window cache.
  DeviceBuffer kv_raw = alloc(act_, {T, D}), kvn = alloc(act_, {T, D});
  be_.gemm(x, L.wkv, kv_raw.tensor());
  be_.rms_norm(kv_raw.tensor(), L.kv_norm, eps, kvn.tensor());
  be_.rope(kvn.tensor(), positions, table, static_cast<int>(D - rd), static_cast<int>(rd), true);
  store_packed(kvn.tensor(), V41KvLayout::kWindowFormat, window_cache,
               batch.kv_groups[static_cast<size_t>(layout_.window)].slot_mapping);

  const bool source = ratio > 0 && c.is_kv_source(l), index = ratio > 0 && c.is_index_source(l);
  const V41KvLayout::Ratio* G =
      ratio > 0
          ? &layout_.ratios[static_cast<size_t>(layout_.ratio_of_layer[static_cast<size_t>(l)])]
          : nullptr;
  const int slot = ratio > 0 ? layout_.source_slot[static_cast<size_t>(l)] : -1;
  if (source && ratio > 1) {  // compressor inputs [kv | gate] -> the pending cache
    DeviceBuffer rows = alloc(act_, {T, 2 * D});
    Tensor kvc = columns(rows.tensor(), 0, D), gc = columns(rows.tensor(), D, D);
    be_.gemm(x, L.comp_wkv, kvc);
    be_.gemm(x, L.comp_wgate, gc);
    store_rows(be_, rows.tensor(), kv[static_cast<size_t>(G->pending)][static_cast<size_t>(slot)],
               batch.kv_groups[static_cast<size_t>(G->pending)].slot_mapping);
  }
  DeviceBuffer iq, iw;
  if (index) {  // the indexer's FP4-rounded rotated queries and its head weights
    iq = alloc(act_, {T, nh, di});
    iw = alloc(DType::F32, {T, nh});
    Tensor iq2 = iq.tensor().view({T, nh * di});
    be_.gemm(qr, L.index_wq_b, iq2);
    be_.rope(iq.tensor(), positions, table, static_cast<int>(di - rd), static_cast<int>(rd), true);
    Tensor iqr = iq.tensor().view({T * nh, di});
    be_.fake_quant(iqr, Backend::FakeQuant::Fp4Ue8m0x32);
    be_.gemm(x, L.index_weights_proj, iw.tensor());
  }

  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1], nq = t1 - t0;
    if (nq == 0) continue;
    const int64_t end = batch.host_seq_lens[s], p0 = end - nq;
    SeqChoice& ch = choice[static_cast<size_t>(s)];
    int64_t nc = 0;  // entries visible to the sequence's last token
    if (ratio > 0) {
      if (source) compress(l, batch, sh, kv, x, s);
      nc = end / ratio;
    }
    const Tensor* ent_cache =
        ratio > 0 ? &kv[static_cast<size_t>(G->compressed)][static_cast<size_t>(slot)] : nullptr;
    // What later layers reuse (the chosen entries, the candidate bias) lives to the step's end;
    // the rest of this sequence's temporaries (its gathered keys and rows, scores, lists: they
    // grow with its context) go back when its attention is issued, so a step's peak is one
    // sequence's, not the batch's sum (V4.1-Flash at batch 64 x 128k asked for 36 GiB).
    const bool candidates = l == c.candidate_source_layer;
    if (index) {
      ch.k = 0;
      if (nc > 0) {
        if (candidates) ch.candidates = alloc(DType::F32, {nq, nc});
        ch.k = std::min<int64_t>(c.index_topk, nc);
        ch.chosen = alloc(DType::I32, {nq, ch.k});
      }
    }
    ArenaScope scope(arena_);
    if (index) {
      if (nc > 0) {
        const Tensor& key_cache =
            kv[static_cast<size_t>(G->indexer_keys)][static_cast<size_t>(slot)];
        const StepHost::Rows keys = sh.rows(G->indexer_keys, s, key_cache,
                                            groups[static_cast<size_t>(G->indexer_keys)].name);
        std::vector<int32_t> ids(static_cast<size_t>(nc));
        for (int64_t i = 0; i < nc; ++i) ids[static_cast<size_t>(i)] = keys.slot(i);
        DeviceBuffer idb = v4_family::upload_i32(be_, ids), key_rows = alloc(act_, {nc, di});
        DeviceBuffer scores = alloc(DType::F32, {nq, nc});
        be_.gather_packed_rows(idb.tensor(), cache_rows(key_cache), V41KvLayout::kKeyFormat,
                               key_rows.tensor());
        be_.indexer_scores_visible(iq.tensor().slice_rows(t0, t1), key_rows.tensor(),
                                   iw.tensor().slice_rows(t0, t1), positions.slice_rows(t0, t1),
                                   ratio, 1.0f / std::sqrt(static_cast<float>(di)),
                                   1.0f / std::sqrt(static_cast<float>(nh)), scores.tensor());
        if (candidates) {
          be_.candidate_blocks(scores.tensor(), positions.slice_rows(t0, t1), ratio,
                               c.candidate_topk_blocks, c.candidate_block_size,
                               ch.candidates.tensor());
        } else if (c.candidate_source_layer >= 0 && c.candidate_source_layer < l &&
                   ch.candidates.tensor().defined()) {
          be_.add(scores.tensor(), ch.candidates.tensor());
        }
        be_.topk_finite(scores.tensor(), ch.chosen.tensor());
      }
    }
    const int64_t k = ratio > 0 && nc > 0 ? ch.k : 0;
    // Rows read: entries [0, nc) when any is chosen, then the window rows of tokens [w0, end).
    // (The truncated layers read no window row below the sequence's replay floor.)
    const int64_t floor = window_floor_.empty() ? 0 : window_floor_[static_cast<size_t>(s)];
    const int64_t ne = k > 0 ? nc : 0, w0 = std::max<int64_t>({0, p0 - W + 1, floor}),
                  nw = end - w0;
    const StepHost::Rows window =
        sh.rows(layout_.window, s, window_cache, groups[static_cast<size_t>(layout_.window)].name);
    std::vector<int32_t> row_ids;
    DeviceBuffer rows = alloc(act_, {ne + nw, D});
    if (ne > 0) {
      const StepHost::Rows ent =
          sh.rows(G->compressed, s, *ent_cache, groups[static_cast<size_t>(G->compressed)].name);
      for (int64_t i = 0; i < ne; ++i) row_ids.push_back(ent.slot(i));
      DeviceBuffer ids = v4_family::upload_i32(be_, row_ids);
      Tensor dst = rows.tensor().slice_rows(0, ne);
      be_.gather_packed_rows(ids.tensor(), cache_rows(*ent_cache), V41KvLayout::kEntryFormat, dst);
    }
    {
      row_ids.clear();
      for (int64_t r = 0; r < nw; ++r) row_ids.push_back(window.slot(w0 + r));
      DeviceBuffer ids = v4_family::upload_i32(be_, row_ids);
      Tensor dst = rows.tensor().slice_rows(ne, ne + nw);
      be_.gather_packed_rows(ids.tensor(), cache_rows(window_cache), V41KvLayout::kWindowFormat,
                             dst);
    }
    // Each query's rows: its window, then the chosen entries (entry e is row e; -1: empty).
    const int64_t nwin = std::min(W, nw), slots = nwin + k;
    std::vector<int32_t> idx(static_cast<size_t>(nq * slots), -1);
    for (int64_t t = 0; t < nq; ++t) {
      const int64_t p = p0 + t;
      int32_t* r = idx.data() + t * slots;
      int64_t n = 0;
      for (int64_t a = std::max<int64_t>(w0, p - W + 1); a <= p; ++a)
        r[n++] = static_cast<int32_t>(ne + a - w0);
    }
    DeviceBuffer idxb = v4_family::upload_i32(be_, idx);
    Tensor idx2 = idxb.tensor().view({nq, slots});
    if (k > 0) {
      Tensor chosen = columns(idx2, nwin, k);
      be_.copy(ch.chosen.tensor(), chosen);
    }
    Tensor out_s = out.slice_rows(t0, t1);
    be_.sink_attention(q.slice_rows(t0, t1), rows.tensor(), idx2, L.sinks,
                       1.0f / std::sqrt(static_cast<float>(D)), out_s);
  }
}

DeviceBuffer DeepseekV41Model::engram_rows(const StepBatch& batch, const StepHost& sh,
                                          KvCaches& kv) {
  const int64_t T = batch.num_tokens, nE = static_cast<int64_t>(config_.engram_layers.size());
  const int n = hashing_.max_ngram, cols = hashing_.cols();
  const Tensor& cache = kv[static_cast<size_t>(layout_.engram)][0];
  const std::string& name = layout_.groups[static_cast<size_t>(layout_.engram)].name;
  // The step's compressed ids: on the host for the hashes, on the device for the cache.
  std::vector<int64_t> cid(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    cid[static_cast<size_t>(t)] =
        w_.engram_token_map[static_cast<size_t>(sh.token_ids[static_cast<size_t>(t)])];
  // The look-back before each sequence's first new token: up to N - 1 cached ids.
  std::vector<int32_t> slots;
  std::vector<int64_t> first(static_cast<size_t>(batch.num_seqs) + 1, 0);
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t nq = batch.host_query_start[s + 1] - batch.host_query_start[s];
    const int64_t p0 = batch.host_seq_lens[s] - nq,
                  back = nq == 0 ? 0 : std::min<int64_t>(p0, n - 1);
    const StepHost::Rows rows = sh.rows(layout_.engram, s, cache, name);
    for (int64_t p = p0 - back; p < p0; ++p) slots.push_back(rows.slot(p));
    first[static_cast<size_t>(s) + 1] = static_cast<int64_t>(slots.size());
  }
  std::vector<float> prior(slots.size());
  if (!slots.empty()) {
    DeviceBuffer ids = v4_family::upload_i32(be_, slots);
    DeviceBuffer got = alloc(DType::F32, {static_cast<int64_t>(slots.size()), 1});
    be_.embedding(ids.tensor(), cache_rows(cache), got.tensor());
    Tensor host(prior.data(), DType::F32, {static_cast<int64_t>(prior.size()), 1});
    be_.copy(got.tensor(), host);
  }
  DeviceBuffer step_ids = alloc(DType::F32, {T, 1});
  be_.embedding(batch.token_ids, token_map_.tensor(), step_ids.tensor());
  v4_family::store_rows(be_, step_ids.tensor(), cache,
                        batch.kv_groups[static_cast<size_t>(layout_.engram)].slot_mapping);
  std::vector<int32_t> out(static_cast<size_t>(nE * T * cols));
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1];
    const int64_t p0 = batch.host_seq_lens[s] - (t1 - t0);
    const int64_t f0 = first[static_cast<size_t>(s)], nb = first[static_cast<size_t>(s) + 1] - f0;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = p0 + (t - t0);
      int have = 0;
      for (; have < n && p - have >= 0; ++have) {
        const int64_t q = p - have;  // the position `have` tokens back
        ids[static_cast<size_t>(have)] =
            q >= p0 ? cid[static_cast<size_t>(t0 + q - p0)]
                    : static_cast<int64_t>(prior[static_cast<size_t>(f0 + nb - (p0 - q))]);
      }
      for (int64_t e = 0; e < nE; ++e)
        hashing_.hash(static_cast<int>(e), ids.data(), have,
                      out.data() + (e * T + t) * cols);
    }
  }
  return v4_family::upload_i32(be_, out);
}

void DeepseekV41Model::block(int l, const StepBatch& batch, const StepHost& sh, KvCaches& kv,
                             std::vector<SeqChoice>& choice, DeviceBuffer& streams,
                             DeviceBuffer& next, DeviceBuffer& pre) {
  const DeepseekV41Config& c = config_;
  const V41Layer& L = w_.layers[static_cast<size_t>(l)];
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, rd = c.rope_dim,
                ql = c.base.q_lora_rank;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  Backend::HyperConnectionParams hp{c.hc_mult, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps),
                                    eps};
  DeviceBuffer collapsed = alloc(DType::F32, {T, H}), post = alloc(DType::F32, {T, hc});
  DeviceBuffer comb = alloc(DType::F32, {T, hc, hc}), x = alloc(act_, {T, H});
  DeviceBuffer attn_pre = alloc(DType::F32, {T, hc}), ffn_pre = alloc(DType::F32, {T, hc});
  const bool compressed = c.ratio(l) > 0;
  const Tensor& table = compressed ? rope_.compress.tensor() : rope_.main.tensor();
  const Tensor& inv = compressed ? rope_.compress_inv.tensor() : rope_.main_inv.tensor();
  if (const int e = engram_index_[static_cast<size_t>(l)]; e >= 0) {
    // --- Engram: the n-gram rows -> hc keys + one value -> gated into every stream.
    const int64_t cols = hashing_.cols(), hd = c.engram_head_dim;
    Tensor ids = engram_ids_.tensor().slice_rows(e * T * cols, (e + 1) * T * cols);
    DeviceBuffer rows = alloc(act_, {T * cols, hd}), kvb = alloc(DType::F32, {T, (hc + 1) * H});
    if (L.engram_scale.defined())
      be_.embedding_fp8_rows(ids, L.engram_table, L.engram_scale, rows.tensor());
    else
      be_.embedding(ids, L.engram_table, rows.tensor());
    be_.gemm(rows.tensor().view({T, cols * hd}), L.engram_wkv, kvb.tensor());
    be_.engram_gate(streams.tensor(), kvb.tensor(), L.engram_weight, eps, streams.tensor());
  }
  // --- attention site: this site's mixes; the streams collapse with the previous site's pre.
  be_.hc_mix(streams.tensor(), L.hc_attn.fn, L.hc_attn.base, L.hc_attn.scale, hp, attn_pre.tensor(),
             post.tensor(), comb.tensor());
  be_.hc_collapse(streams.tensor(), pre.tensor(), collapsed.tensor());
  be_.rms_norm(collapsed.tensor(), L.attn_norm, eps, x.tensor());
  DeviceBuffer qa = alloc(act_, {T, ql}), qr = alloc(act_, {T, ql}), q = alloc(act_, {T, heads, D});
  be_.gemm(x.tensor(), L.wq_a, qa.tensor());
  be_.rms_norm(qa.tensor(), L.q_norm, eps, qr.tensor());
  {
    Tensor q2 = q.tensor().view({T, heads * D});
    be_.gemm(qr.tensor(), L.wq_b, q2);
  }
  be_.rope(q.tensor(), batch.positions, table, static_cast<int>(D - rd), static_cast<int>(rd),
           true);
  DeviceBuffer attn = alloc(act_, {T, heads, D});
  attention(l, batch, sh, kv, x.tensor(), qr.tensor(), q.tensor(), choice, attn.tensor());
  be_.rope(attn.tensor(), batch.positions, inv, static_cast<int>(D - rd), static_cast<int>(rd),
           true);
  DeviceBuffer o = alloc(act_, {T, H});
  v4_family::grouped_output(be_, arena_, act_, c, attn.tensor().view({T, heads * D}), L.wo_a, L.wo_b,
                            o.tensor());
  be_.hc_post(streams.tensor(), o.tensor(), post.tensor(), comb.tensor(), next.tensor());
  std::swap(streams, next);
  // --- MoE site: collapses with the attention site's pre.
  be_.hc_mix(streams.tensor(), L.hc_ffn.fn, L.hc_ffn.base, L.hc_ffn.scale, hp, ffn_pre.tensor(),
             post.tensor(), comb.tensor());
  be_.hc_collapse(streams.tensor(), attn_pre.tensor(), collapsed.tensor());
  be_.rms_norm(collapsed.tensor(), L.ffn_norm, eps, x.tensor());
  DeviceBuffer y = alloc(act_, {T, H});
  v4_family::moe_site(be_, arena_, act_, c, x.tensor(), L.gate, L.gate_bias, Tensor(), L.experts, L.shared,
                      y.tensor());
  be_.hc_post(streams.tensor(), y.tensor(), post.tensor(), comb.tensor(), next.tensor());
  std::swap(streams, next);
  std::swap(pre, ffn_pre);
}

void DeepseekV41Model::forward(const StepBatch& batch, KvCaches& kv, Tensor& logits,
                               Tensor* hidden_out) {
  const DeepseekV41Config& c = config_;
  v4_family::check_step(be_, layout_.groups, act_, batch, kv, c.base.max_position_embeddings,
                        kModel);
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult, V = c.base.vocab_size;
  const int64_t R = batch.logits_indices.numel();
  DI_CHECK(logits.dims() == std::vector<int64_t>({R, V}), "deepseek_v41: logits must be [", R, ", ",
           V, "], got ", logits.describe());
  if (hidden_out != nullptr)
    DI_CHECK(hidden_out->device == be_.device() && hidden_out->dtype == DType::F32 &&
                 hidden_out->is_contiguous() &&
                 hidden_out->dims() == std::vector<int64_t>({T, hc * H}),
             "deepseek_v41: hidden_out must be F32 [", T, ", ", hc * H,
             "] on the backend's device (the hyper-connection streams after the last layer), got ",
             hidden_out->describe());
  arena_.reset();
  window_floor_.clear();
  const StepHost sh = StepHost::read(be_, batch, V, kModel);
  rope_.grow(be_, c, batch.max_seq_len);
  // Embedding, copied into every stream; the first site collapses stream 0.
  std::vector<int32_t> rep(static_cast<size_t>(T * hc));
  for (int64_t i = 0; i < T * hc; ++i)
    rep[static_cast<size_t>(i)] = sh.token_ids[static_cast<size_t>(i / hc)];
  DeviceBuffer rep_ids = v4_family::upload_i32(be_, rep);
  DeviceBuffer streams = alloc(DType::F32, {T, hc, H}), next = alloc(DType::F32, {T, hc, H});
  Tensor s2 = streams.tensor().view({T * hc, H});
  be_.embedding(rep_ids.tensor(), w_.embed, s2);
  DeviceBuffer pre = alloc(DType::F32, {T, hc});
  if (T > 0) be_.copy(constant_pre(false, T), pre.tensor());
  if (!c.engram_layers.empty()) engram_ids_ = engram_rows(batch, sh, kv);
  std::vector<SeqChoice> choice(static_cast<size_t>(batch.num_seqs));
  // The drafter's tap features (activation dtype): per tap layer, the mean over the hc streams of its
  // output.
  const int64_t taps = drafter_ ? drafter_->num_taps() : 0;
  // (hc_collapse with pre = 1 / hc: the mean, bit-equal to sum / hc when hc is a power of two.)
  DeviceBuffer features;
  if (taps > 0) features = alloc(act_, {T, taps * H});
  auto run_layer = [&](int l) {
    block(l, batch, sh, kv, choice, streams, next, pre);
    tap(l, streams.tensor(), features.tensor());
  };
  const int first = trunc_.active() ? trunc_.first_layer : c.num_layers();
  for (int l = 0; l < first; ++l) run_layer(l);
  const bool floored =
      std::any_of(batch.host_replay_floor.begin(), batch.host_replay_floor.end(),
                  [](int32_t f) { return f > 0; });
  if (first < c.num_layers() && floored) {
    DI_CHECK(static_cast<int64_t>(batch.host_replay_floor.size()) == batch.num_seqs,
             "deepseek_v41: host_replay_floor has ", batch.host_replay_floor.size(),
             " entries for ", batch.num_seqs, " sequences");
    truncated_layers(batch, sh, kv, choice, streams, next, pre, features.tensor(), logits, hidden_out);
    window_floor_.clear();
    return;
  }
  for (int l = first; l < c.num_layers(); ++l) run_layer(l);
  // Every token's context rows (a verify step's drafts too: see model.h).
  store_drafter_rows(features.tensor(), batch.positions, batch, kv);
  if (hidden_out != nullptr) be_.copy(streams.tensor().view({T, hc * H}), *hidden_out);
  if (R == 0) return;
  for (int32_t r : v4_family::host_i32(be_, batch.logits_indices))
    DI_CHECK(r >= 0 && r < T, "deepseek_v41: logits index ", r, " outside the step's ", T,
             " tokens");
  head(streams.tensor(), pre.tensor(), batch.logits_indices, logits);
}

void DeepseekV41Model::tap(int l, const Tensor& streams, const Tensor& features) {
  const int k = tap_index_[static_cast<size_t>(l)];
  const int64_t T = streams.ndim > 0 ? streams.size(0) : 0, H = config_.base.hidden_size;
  if (k < 0 || T == 0) return;
  DeviceBuffer mean = alloc(act_, {T, H});
  be_.hc_collapse(streams, constant_pre(true, T), mean.tensor());
  Tensor dst = columns(features, k * H, H);
  be_.copy(mean.tensor(), dst);
}

void DeepseekV41Model::store_drafter_rows(const Tensor& features, const Tensor& positions,
                                          const StepBatch& batch, KvCaches& kv) {
  if (!drafter_ || !features.defined() || features.size(0) == 0) return;
  std::vector<DeviceBuffer> rows;
  drafter_->context_rows(features, positions, rows);
  const KvCaches::value_type& caches = kv[static_cast<size_t>(layout_.dspark)];
  for (size_t st = 0; st < rows.size(); ++st)
    store_rows(be_, rows[st].tensor(), caches[st],
               batch.kv_groups[static_cast<size_t>(layout_.dspark)].slot_mapping);
}

void DeepseekV41Model::head(const Tensor& streams, const Tensor& pre, const Tensor& rows,
                            Tensor& logits) {
  const DeepseekV41Config& c = config_;
  const int64_t T = streams.size(0), H = c.base.hidden_size, hc = c.hc_mult, R = rows.numel();
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  // Logits rows: the last site's pre collapses the streams, then the norm and the head.
  DeviceBuffer picked = alloc(DType::F32, {R, hc, H}), picked_pre = alloc(DType::F32, {R, hc});
  DeviceBuffer h = alloc(act_, {R, H}), hn = alloc(act_, {R, H});
  Tensor picked2 = picked.tensor().view({R, hc * H});
  be_.embedding(rows, streams.view({T, hc * H}), picked2);
  be_.embedding(rows, pre, picked_pre.tensor());
  be_.hc_collapse(picked.tensor(), picked_pre.tensor(), h.tensor());
  be_.rms_norm(h.tensor(), w_.norm, eps, hn.tensor());
  be_.gemm(hn.tensor(), w_.head, logits);
}

void DeepseekV41Model::propose_blocks(std::span<const BlockSeq> seqs, KvCaches& kv, int64_t vocab,
                                      std::vector<DsparkDrafter::Output>& out, HostBuffer* base_logits) {
  DI_CHECK(drafter_ != nullptr, config_.base.source, ": propose_blocks without a DSpark drafter loaded");
  const int g = layout_.dspark;
  const KvCaches::value_type& caches = kv[static_cast<size_t>(g)];
  const int64_t D = config_.head_dim, W = config_.sliding_window;
  std::vector<DeviceBuffer> keep;
  std::vector<DsparkDrafter::Block> blocks(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const BlockSeq& q = seqs[i];
    DsparkDrafter::Block& b = blocks[i];
    b.anchor = q.anchor;
    b.anchor_pos = q.anchor_pos;
    // The rows the block reads: positions [anchor_pos - (W - 1), anchor_pos).
    const int64_t first = std::max<int64_t>(0, q.anchor_pos - std::max<int64_t>(W - 1, 0));
    std::vector<int32_t> slots;
    for (int64_t p = first; p < q.anchor_pos; ++p) {
      const int64_t bs = caches[0].size(1), blk = p / bs;
      DI_CHECK(blk < static_cast<int64_t>(q.block_ids.size()) && q.block_ids[static_cast<size_t>(blk)] >= 0 &&
                   q.block_ids[static_cast<size_t>(blk)] < caches[0].size(0),
               "deepseek_v41 propose_blocks: position ", p, " has no block in KV group 'dspark_context'");
      slots.push_back(static_cast<int32_t>(q.block_ids[static_cast<size_t>(blk)] * bs + p % bs));
    }
    for (const Tensor& cache : caches) {
      if (slots.empty()) {
        b.context.emplace_back();
        continue;
      }
      DeviceBuffer ids = v4_family::upload_i32(be_, slots);
      DeviceBuffer rows = be_.alloc(act_, {static_cast<int64_t>(slots.size()), D});
      be_.embedding(ids.tensor(), cache_rows(cache), rows.tensor());
      b.context.push_back(rows.tensor());
      keep.push_back(std::move(rows));
    }
  }
  drafter_->propose(blocks, vocab, out, base_logits);
}

void DeepseekV41Model::truncated_layers(const StepBatch& batch, const StepHost& sh, KvCaches& kv,
                                        std::vector<SeqChoice>& choice, DeviceBuffer& streams,
                                        DeviceBuffer& next, DeviceBuffer& pre,
                                        const Tensor& features, Tensor& logits,
                                        Tensor* hidden_out) {
  const DeepseekV41Config& c = config_;
  const int64_t T = batch.num_tokens, S = batch.num_seqs, hc = c.hc_mult, H = c.base.hidden_size;
  // The kept rows: each sequence's rows at or after its floor (a suffix of its rows).
  std::vector<int32_t> kept, query_start = {0}, positions, row_of(static_cast<size_t>(T), -1);
  window_floor_.assign(static_cast<size_t>(S), 0);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1];
    const int64_t end = batch.host_seq_lens[s], p0 = end - (t1 - t0);
    const int64_t floor = batch.host_replay_floor[static_cast<size_t>(s)];
    DI_CHECK(floor >= 0, "deepseek_v41: sequence ", s, " has replay floor ", floor);
    window_floor_[static_cast<size_t>(s)] = floor;
    for (int64_t t = t0 + std::clamp<int64_t>(floor - p0, 0, t1 - t0); t < t1; ++t) {
      row_of[static_cast<size_t>(t)] = static_cast<int32_t>(kept.size());
      kept.push_back(static_cast<int32_t>(t));
      positions.push_back(static_cast<int32_t>(p0 + (t - t0)));
    }
    query_start.push_back(static_cast<int32_t>(kept.size()));
    // The index sources' choices of the kept rows (the last rows of the sequence's).
    SeqChoice& ch = choice[static_cast<size_t>(s)];
    const int64_t nq = t1 - t0, nk = query_start.back() - query_start[static_cast<size_t>(s)];
    auto keep_rows = [&](DeviceBuffer& b) {
      if (!b.tensor().defined() || nk == nq) return;
      const Tensor& src = b.tensor();
      DeviceBuffer out = alloc(src.dtype, {nk, src.size(1)});
      if (nk > 0) be_.copy(src.slice_rows(nq - nk, nq), out.tensor());
      b = std::move(out);
    };
    keep_rows(ch.chosen);
    keep_rows(ch.candidates);
  }
  const int64_t K = static_cast<int64_t>(kept.size());
  if (K == T) {  // nothing skipped (decode, or a chunk past the floor): only the window floor
    for (int l = trunc_.first_layer; l < c.num_layers(); ++l) {
      block(l, batch, sh, kv, choice, streams, next, pre);
      tap(l, streams.tensor(), features);
    }
    store_drafter_rows(features, batch.positions, batch, kv);
    if (hidden_out != nullptr) be_.copy(streams.tensor().view({T, hc * H}), *hidden_out);
    if (batch.logits_indices.numel() > 0)
      head(streams.tensor(), pre.tensor(), batch.logits_indices, logits);
    return;
  }
  DI_CHECK(hidden_out == nullptr, "deepseek_v41: hidden_out of a step whose rows below a "
           "sequence's replay floor skip layers ", trunc_.first_layer, " on (prefill truncation)");
  // The compacted step: the same sequences and tables, their kept rows.
  StepBatch sub;
  sub.num_tokens = static_cast<int>(K);
  sub.num_seqs = batch.num_seqs;
  sub.max_seq_len = batch.max_seq_len;
  for (int64_t s = 0; s < S; ++s)
    sub.max_query_len = std::max<int>(sub.max_query_len, query_start[static_cast<size_t>(s) + 1] -
                                                             query_start[static_cast<size_t>(s)]);
  std::vector<DeviceBuffer> held;
  auto upload = [&](const std::vector<int32_t>& v) {
    held.push_back(v4_family::upload_i32(be_, v));
    return held.back().tensor();
  };
  auto gather = [&](const Tensor& t) {
    const std::vector<int32_t> all = v4_family::host_i32(be_, t);
    std::vector<int32_t> out;
    for (int32_t r : kept) out.push_back(all[static_cast<size_t>(r)]);
    return upload(out);
  };
  sub.token_ids = gather(batch.token_ids);
  sub.positions = upload(positions);
  sub.query_start = upload(query_start);
  sub.seq_lens = batch.seq_lens;
  sub.host_query_start = query_start;
  sub.host_seq_lens = batch.host_seq_lens;
  sub.host_replay_floor = batch.host_replay_floor;
  for (const KvGroupTables& g : batch.kv_groups)
    sub.kv_groups.push_back({g.block_tables, gather(g.slot_mapping)});
  sub.block_tables = sub.kv_groups[0].block_tables;
  sub.slot_mapping = sub.kv_groups[0].slot_mapping;
  std::vector<int32_t> rows;
  for (int32_t r : v4_family::host_i32(be_, batch.logits_indices)) {
    DI_CHECK(r >= 0 && r < T, "deepseek_v41: logits index ", r, " outside the step's ", T,
             " tokens");
    DI_CHECK(row_of[static_cast<size_t>(r)] >= 0, "deepseek_v41: logits row ", r,
             " lies below its sequence's replay floor: prefill truncation computes no logits "
             "there (a request asking for prompt logprobs runs untruncated)");
    rows.push_back(row_of[static_cast<size_t>(r)]);
  }
  sub.logits_indices = upload(rows);
  // The kept rows' streams and pre, then the truncated layers over them.
  const Tensor kept_ids = upload(kept);
  DeviceBuffer ks = alloc(DType::F32, {K, hc, H}), kn = alloc(DType::F32, {K, hc, H}),
               kp = alloc(DType::F32, {K, hc});
  if (K > 0) {
    Tensor ks2 = ks.tensor().view({K, hc * H});
    be_.embedding(kept_ids, streams.tensor().view({T, hc * H}), ks2);
    be_.embedding(kept_ids, pre.tensor(), kp.tensor());
    // The drafter's taps of the kept rows: the lower layers' from the whole step's, the truncated
    // layers' as they run; their context rows go to the kept rows' slots only.
    DeviceBuffer kf;
    if (features.defined()) {
      kf = alloc(features.dtype, {K, features.size(1)});
      be_.embedding(kept_ids, features, kf.tensor());
    }
    for (int l = trunc_.first_layer; l < c.num_layers(); ++l) {
      block(l, sub, sh, kv, choice, ks, kn, kp);
      tap(l, ks.tensor(), kf.tensor());
    }
    store_drafter_rows(kf.tensor(), sub.positions, sub, kv);
  }
  if (!rows.empty()) head(ks.tensor(), kp.tensor(), sub.logits_indices, logits);
}

}  // namespace deepinfer
