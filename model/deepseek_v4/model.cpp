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

// One sequence's rows in one layer's cache of one group: row r sits in block
// block_tables[seq][r / block_size] at offset r % block_size (kv/kv_groups.h).
class SeqRows {
 public:
  SeqRows(const Tensor& cache, const KvGroupTables& tables, int64_t seq, const std::string& group)
      : cache_(cache.ptr<float>()),
        num_blocks_(cache.size(0)),
        block_size_(cache.size(1)),
        dim_(cache.size(2)),
        width_(tables.block_tables.size(1)),
        table_(tables.block_tables.ptr<const int32_t>() + seq * width_),
        group_(group) {}
  // Whether row r's block is still held (a window group frees blocks as the window moves).
  bool held(int64_t r) const {
    const int64_t i = r / block_size_;
    return i < width_ && table_[i] >= 0 && table_[i] < num_blocks_;
  }
  float* row(int64_t r) const {
    const int64_t i = r / block_size_;
    const int32_t b = i < width_ ? table_[i] : -2;
    DI_CHECK(b >= 0 && b < num_blocks_, "deepseek_v4: row ", r, " of KV group '", group_, "' has no block (table ",
             "entry ", i, " is ", b, ": freed, or a table too short)");
    return cache_ + (b * block_size_ + r % block_size_) * dim_;
  }

 private:
  float* cache_;
  int64_t num_blocks_, block_size_, dim_, width_;
  const int32_t* table_;
  const std::string& group_;
};

// Pools the compression groups that one sequence's tokens [p0, end) complete (groups
// [p0 / ratio, end / ratio)) from its pending rows (columns [kv_col, + width) and
// [gate_col, + width); this step's rows already stored), norms them, rotates group k at its
// first token's position k * ratio and writes it to row k of `entries`. overlap (CSA): each
// window also reads the previous group's first halves (gate + ape), the one before the
// step's first group from the pending rows too.
void compress_groups(Backend& be, const V4Compressor& cp, int ratio, bool overlap, int64_t d, int64_t rope_dim,
                     const Tensor& table, float eps, const SeqRows& pending, int64_t kv_col, int64_t gate_col,
                     const SeqRows& entries, int64_t p0, int64_t end) {
  const int64_t k0 = p0 / ratio, k1 = end / ratio, n = k1 - k0, width = overlap ? 2 * d : d;
  if (n <= 0) return;
  const int64_t used = n * ratio;
  HostBuffer kv = buf({used, width}), gate = buf({used, width});
  for (int64_t i = 0; i < used; ++i) {
    const float* row = pending.row(k0 * ratio + i);
    std::copy_n(row + kv_col, width, kv.ptr<float>() + i * width);
    std::copy_n(row + gate_col, width, gate.ptr<float>() + i * width);
  }
  HostBuffer prior_kv, prior_gate;  // undefined: the first group has no predecessor
  if (overlap && k0 > 0) {
    prior_kv = buf({ratio, d});
    prior_gate = buf({ratio, d});
    for (int64_t j = 0; j < ratio; ++j) {
      const float* row = pending.row((k0 - 1) * ratio + j);
      for (int64_t c = 0; c < d; ++c) {
        prior_kv.ptr<float>()[j * d + c] = row[kv_col + c];
        prior_gate.ptr<float>()[j * d + c] = row[gate_col + c] + cp.ape.ptr<const float>()[j * width + c];
      }
    }
  }
  HostBuffer pooled = buf({n, d}), normed = buf({n, d});
  be.compressor_pool(kv.tensor(), gate.tensor(), cp.ape, ratio, overlap, prior_kv.tensor(), prior_gate.tensor(),
                     pooled.tensor());
  be.rms_norm(pooled.tensor(), cp.norm, eps, normed.tensor());
  HostBuffer pos(DType::I32, {n});
  for (int64_t w = 0; w < n; ++w) pos.ptr<int32_t>()[w] = static_cast<int32_t>((k0 + w) * ratio);
  be.rope(normed.tensor(), pos.tensor(), table, static_cast<int>(d - rope_dim), static_cast<int>(rope_dim), true);
  for (int64_t w = 0; w < n; ++w) std::copy_n(normed.ptr<float>() + w * d, d, entries.row(k0 + w));
}

// rows [T, row_dim] -> their slots of `cache` in group `tables` (slot -1: none).
void store_rows(Backend& be, const Tensor& rows, const Tensor& cache, const KvGroupTables& tables) {
  PagedKV kv;
  kv.cache = cache;
  kv.slot_mapping = tables.slot_mapping;
  be.kv_store(rows, kv);
}

}  // namespace

DeepseekV4Model::DeepseekV4Model(DeepseekV4Config config, V4Weights weights, Backend& backend)
    : config_(std::move(config)), w_(std::move(weights)), be_(backend), layout_(v4_kv_layout(config_)) {
  DI_CHECK(be_.device() == Device::CPU && be_.activation_dtype() == DType::F32,
           config_.base.source, ": deepseek_v4 runs on the CPU backend only so far (its ops have no CUDA kernels yet)");
}

void DeepseekV4Model::check_step(const StepBatch& batch, const KvCaches& kv) const {
  const std::vector<KvGroupSpec>& groups = layout_.groups;
  DI_CHECK(kv.size() == groups.size() && batch.kv_groups.size() == groups.size(), "forward: deepseek_v4 needs its ",
           groups.size(), " KV groups (", config_.base.source, "), got ", kv.size(), " caches and ",
           batch.kv_groups.size(), " block tables");
  for (size_t g = 0; g < groups.size(); ++g) {
    DI_CHECK(static_cast<int>(kv[g].size()) >= groups[g].num_layers, "forward: deepseek_v4 KV group '",
             groups[g].name, "' needs ", groups[g].num_layers, " layers, got ", kv[g].size());
    for (int l = 0; l < groups[g].num_layers; ++l) {
      const Tensor& c = kv[g][static_cast<size_t>(l)];
      DI_CHECK(c.device == Device::CPU && c.dtype == DType::F32 && c.ndim == 3 && c.is_contiguous() &&
                   c.size(2) == groups[g].row_dim,
               "forward: deepseek_v4 KV group '", groups[g].name, "' layer ", l, ": ", c.describe(),
               " must be host F32 [blocks, block_size, ", groups[g].row_dim, "]");
    }
  }
  check_positions(batch);
}

void DeepseekV4Model::check_positions(const StepBatch& batch) const {
  const int64_t S = batch.num_seqs;
  DI_CHECK(batch.num_tokens > 0 && static_cast<int64_t>(batch.host_query_start.size()) == S + 1 &&
               static_cast<int64_t>(batch.host_seq_lens.size()) == S && batch.host_query_start[0] == 0 &&
               batch.host_query_start[S] == batch.num_tokens,
           "forward: deepseek_v4 step of ", batch.num_tokens, " tokens with inconsistent query starts / seq_lens for ",
           S, " sequences");
  const int32_t* pos = batch.positions.ptr<const int32_t>();
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1], end = batch.host_seq_lens[s];
    DI_CHECK(t0 <= t1 && end >= t1 - t0 && end <= config_.base.max_position_embeddings,
             "forward: deepseek_v4 sequence ", s, ": ", t1 - t0, " new tokens ending at ", end, " (max_position_embeddings ",
             config_.base.max_position_embeddings, ")");
    for (int64_t t = t0; t < t1; ++t)
      DI_CHECK(pos[t] == end - (t1 - t), "forward: deepseek_v4 sequence ", s, ": token ", t, " at position ", pos[t],
               ", expected ", end - (t1 - t));
  }
}

void DeepseekV4Model::grow_rope_tables(int64_t num_positions) {
  if (rope_.rows >= num_positions) return;
  const int64_t rows = std::min<int64_t>(std::max<int64_t>({num_positions, 2 * rope_.rows, 256}),
                                         std::max<int64_t>(config_.base.max_position_embeddings, num_positions));
  rope_.main = rope_cos_sin_table(config_.main_rope_dims(), rows);
  rope_.compress = rope_cos_sin_table(config_.compress_rope_dims(), rows);
  rope_.main_inv = inverse_table(rope_.main);
  rope_.compress_inv = inverse_table(rope_.compress);
  rope_.rows = rows;
}

void DeepseekV4Model::attention(const V4Layer& L, int l, const StepBatch& batch, KvCaches& kv,
                                const Tensor& window_cache, const KvGroupTables& window_tables, const Tensor& x,
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
  HostBuffer kv_raw = buf({T, D}), kvn = buf({T, D});
  be_.gemm(x, L.wkv, kv_raw.tensor());
  be_.rms_norm(kv_raw.tensor(), L.kv_norm, eps, kvn.tensor());
  be_.rope(kvn.tensor(), positions, table, static_cast<int>(D - rd), static_cast<int>(rd), true);
  store_rows(be_, kvn.tensor(), window_cache, window_tables);

  // Compressor inputs of this step's tokens -> the pending cache; CSA: the indexer's
  // queries and head weights.
  const int pending = csa ? lay.csa_pending : lay.hca_pending, entries = csa ? lay.csa_entries : lay.hca_entries;
  HostBuffer iq, iw;
  if (csa || hca) {
    const int64_t width = csa ? 2 * D : D, row_dim = csa ? lay.csa_row : lay.hca_row;
    HostBuffer rows = buf({T, row_dim});
    auto put = [&](const Weight& w, int64_t cols, int64_t col) {
      HostBuffer p = buf({T, cols});
      be_.gemm(x, w, p.tensor());
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(p.ptr<float>() + t * cols, cols, rows.ptr<float>() + t * row_dim + col);
    };
    put(L.compressor.wkv, width, csa ? lay.csa_kv : lay.hca_kv);
    put(L.compressor.wgate, width, csa ? lay.csa_gate : lay.hca_gate);
    if (csa) {
      put(L.index_compressor.wkv, 2 * di, lay.csa_index_kv);
      put(L.index_compressor.wgate, 2 * di, lay.csa_index_gate);
      iq = buf({T, nh, di});
      iw = buf({T, nh});
      Tensor iq2 = iq.tensor().view({T, nh * di});
      be_.gemm(qr, L.index_wq_b, iq2);
      be_.rope(iq.tensor(), positions, table, static_cast<int>(di - rd), static_cast<int>(rd), true);
      be_.gemm(x, L.index_weights_proj, iw.tensor());
    }
    store_rows(be_, rows.tensor(), kv[pending][gl], batch.kv_groups[pending]);
  }

  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1], nq = t1 - t0;
    if (nq == 0) continue;
    const int64_t end = batch.host_seq_lens[s], p0 = end - nq;
    const SeqRows window(window_cache, window_tables, s, groups[lay.window].name);
    // The groups this step completes, pooled into the entry caches.
    int64_t nc = 0;  // entries visible to the sequence's last token
    if (csa || hca) {
      const SeqRows pend(kv[pending][gl], batch.kv_groups[pending], s, groups[pending].name);
      const SeqRows ent(kv[entries][gl], batch.kv_groups[entries], s, groups[entries].name);
      compress_groups(be_, L.compressor, ratio, csa, D, rd, table, eps, pend, csa ? lay.csa_kv : lay.hca_kv,
                      csa ? lay.csa_gate : lay.hca_gate, ent, p0, end);
      if (csa) {
        const SeqRows keys(kv[lay.indexer_keys][gl], batch.kv_groups[lay.indexer_keys], s,
                           groups[lay.indexer_keys].name);
        compress_groups(be_, L.index_compressor, ratio, true, di, rd, table, eps, pend, lay.csa_index_kv,
                        lay.csa_index_gate, keys, p0, end);
      }
      nc = end / ratio;
    }
    // Rows read: the window rows of tokens [w0, end), then entries [0, nc).
    int64_t w0 = std::max<int64_t>(0, p0 - W + 1);
    // The MTP block (l < 0) runs after the target step freed the window blocks its next
    // query no longer reads: a pass's rows before its last read only the rows still held.
    // Only their K=V rows (which attention does not change) and the last row's output are
    // used, and the last row's window is held (the runner keeps one row more, runner.cpp).
    if (l < 0)
      while (w0 < p0 && !window.held(w0)) ++w0;
    const int64_t nw = end - w0;
    HostBuffer rows = buf({nw + nc, D});
    for (int64_t r = 0; r < nw; ++r) std::copy_n(window.row(w0 + r), D, rows.ptr<float>() + r * D);
    if (nc > 0) {
      const SeqRows ent(kv[entries][gl], batch.kv_groups[entries], s, groups[entries].name);
      for (int64_t i = 0; i < nc; ++i) std::copy_n(ent.row(i), D, rows.ptr<float>() + (nw + i) * D);
    }
    // CSA: the indexer's top entries among those each query sees.
    std::vector<int32_t> chosen;
    int64_t topk = 0;
    if (csa && nc > 0) {
      const SeqRows keys(kv[lay.indexer_keys][gl], batch.kv_groups[lay.indexer_keys], s, groups[lay.indexer_keys].name);
      HostBuffer key_rows = buf({nc, di});
      for (int64_t i = 0; i < nc; ++i) std::copy_n(keys.row(i), di, key_rows.ptr<float>() + i * di);
      topk = std::min<int64_t>(c.index_topk, nc);
      HostBuffer sel(DType::I32, {nq, topk});
      be_.indexer_topk(iq.tensor().slice_rows(t0, t1), key_rows.tensor(), iw.tensor().slice_rows(t0, t1),
                       positions.slice_rows(t0, t1), ratio, 1.0f / std::sqrt(static_cast<float>(di)),
                       1.0f / std::sqrt(static_cast<float>(nh)), sel.tensor());
      chosen.assign(sel.ptr<int32_t>(), sel.ptr<int32_t>() + nq * topk);
    }
    // Each query's rows: its window, then the visible (HCA) or chosen (CSA) entries.
    const int64_t slots = std::max<int64_t>(std::min(W, nw) + (csa ? topk : nc), 1);
    HostBuffer idx(DType::I32, {nq, slots});
    std::fill(idx.ptr<int32_t>(), idx.ptr<int32_t>() + nq * slots, -1);
    for (int64_t t = 0; t < nq; ++t) {
      const int64_t p = p0 + t;
      int32_t* r = idx.ptr<int32_t>() + t * slots;
      int64_t n = 0;
      for (int64_t a = std::max<int64_t>(w0, p - W + 1); a <= p; ++a) r[n++] = static_cast<int32_t>(a - w0);
      if (hca) {
        for (int64_t i = 0; i < std::min<int64_t>(nc, (p + 1) / ratio); ++i) r[n++] = static_cast<int32_t>(nw + i);
      } else if (csa) {
        for (int64_t j = 0; j < topk; ++j)
          if (chosen[t * topk + j] >= 0) r[n++] = static_cast<int32_t>(nw + chosen[t * topk + j]);
      }
    }
    Tensor out_s = out.slice_rows(t0, t1);
    be_.sink_attention(q.slice_rows(t0, t1), rows.tensor(), idx.tensor(), L.sinks,
                       1.0f / std::sqrt(static_cast<float>(D)), out_s);
  }
}

void DeepseekV4Model::block(const V4Layer& L, int l, const StepBatch& batch, KvCaches& kv, const Tensor& window_cache,
                            const KvGroupTables& window_tables, HostBuffer& streams, HostBuffer& next) {
  const DeepseekV4Config& c = config_;
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, rd = c.rope_dim;
  const int64_t ql = c.base.q_lora_rank, G = c.o_groups, gin = heads * D / G, ol = c.o_lora_rank;
  const int64_t E = c.base.n_routed_experts, K = c.base.num_experts_per_tok;
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  const int32_t* ids = batch.token_ids.ptr<const int32_t>();
  Backend::HyperConnectionParams hp{c.hc_mult, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), eps};
  HostBuffer ones = buf({D});
  std::fill(ones.ptr<float>(), ones.ptr<float>() + D, 1.0f);
  HostBuffer collapsed = buf({T, H}), post = buf({T, hc}), comb = buf({T, hc, hc}), x = buf({T, H});
  {
    const bool compressed = L.kind != V4AttentionKind::Window;
    const Tensor& table = compressed ? rope_.compress.tensor() : rope_.main.tensor();
    const Tensor& inv = compressed ? rope_.compress_inv.tensor() : rope_.main_inv.tensor();
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
    be_.rope(qn.tensor(), batch.positions, table, static_cast<int>(D - rd), static_cast<int>(rd), true);
    HostBuffer attn = buf({T, heads, D});
    attention(L, l, batch, kv, window_cache, window_tables, x.tensor(), qr.tensor(), qn.tensor(), attn.tensor());
    be_.rope(attn.tensor(), batch.positions, inv, static_cast<int>(D - rd), static_cast<int>(rd), true);
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
}

// Logits of batch.logits_indices' rows of `streams` [T, hc, H]: hc_head, norm and head are per row.
void DeepseekV4Model::head_logits(const StepBatch& batch, const HostBuffer& streams, const V4HyperConnection& hc_head,
                                  const Tensor& norm, Tensor& logits) {
  const DeepseekV4Config& c = config_;
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult, V = c.base.vocab_size;
  const int64_t R = batch.logits_indices.numel();
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  DI_CHECK(logits.dims() == std::vector<int64_t>({R, V}), "deepseek_v4: logits must be [", R, ", ", V, "], got ",
           logits.describe());
  if (R == 0) return;
  Backend::HyperConnectionParams hp{c.hc_mult, c.hc_sinkhorn_iters, static_cast<float>(c.hc_eps), eps};
  HostBuffer picked = buf({R, hc, H}), h = buf({R, H}), hn = buf({R, H});
  for (int64_t i = 0; i < R; ++i) {
    const int32_t r = batch.logits_indices.ptr<const int32_t>()[i];
    DI_CHECK(r >= 0 && r < T, "deepseek_v4: logits index ", r, " outside the step's ", T, " tokens");
    std::copy_n(streams.ptr<float>() + r * hc * H, hc * H, picked.ptr<float>() + i * hc * H);
  }
  be_.hc_head(picked.tensor(), hc_head.fn, hc_head.base, hc_head.scale, hp, h.tensor());
  be_.rms_norm(h.tensor(), norm, eps, hn.tensor());
  be_.gemm(hn.tensor(), w_.head, logits);
}

void DeepseekV4Model::check_tokens(const StepBatch& batch) const {
  const int64_t V = config_.base.vocab_size;
  const int32_t* ids = batch.token_ids.ptr<const int32_t>();
  for (int64_t t = 0; t < batch.num_tokens; ++t)
    DI_CHECK(ids[t] >= 0 && ids[t] < V, "deepseek_v4: token id ", ids[t], " outside the vocabulary of ", V);
}

void DeepseekV4Model::forward(const StepBatch& batch, KvCaches& kv, Tensor& logits, Tensor* hidden_out) {
  check_step(batch, kv);
  check_tokens(batch);
  const DeepseekV4Config& c = config_;
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult;
  if (hidden_out != nullptr)
    DI_CHECK(hidden_out->device == Device::CPU && hidden_out->dtype == DType::F32 && hidden_out->is_contiguous() &&
                 hidden_out->dims() == std::vector<int64_t>({T, hc * H}),
             "deepseek_v4: hidden_out must be host F32 [", T, ", ", hc * H,
             "] (the hyper-connection streams after the last layer), got ", hidden_out->describe());
  grow_rope_tables(batch.max_seq_len);
  // Embedding, copied into every stream.
  HostBuffer emb = buf({T, H});
  be_.embedding(batch.token_ids, w_.embed, emb.tensor());
  HostBuffer streams = buf({T, hc, H}), next = buf({T, hc, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k) std::copy_n(emb.ptr<float>() + t * H, H, streams.ptr<float>() + (t * hc + k) * H);
  for (int l = 0; l < c.num_layers(); ++l)
    block(w_.layers[static_cast<size_t>(l)], l, batch, kv, kv[layout_.window][static_cast<size_t>(l)],
          batch.kv_groups[layout_.window], streams, next);
  if (hidden_out != nullptr) std::copy_n(streams.ptr<float>(), T * hc * H, hidden_out->ptr<float>());
  head_logits(batch, streams, w_.hc_head, w_.norm, logits);
}

void DeepseekV4Model::mtp_forward(const StepBatch& batch, Tensor& kv_cache, const Tensor& hidden_in,
                                  Tensor& hidden_out, Tensor& logits) {
  const DeepseekV4Config& c = config_;
  DI_CHECK(!w_.mtp.empty(), c.base.source, ": deepseek_v4 mtp_forward without an MTP block loaded");
  const V4MtpBlock& B = w_.mtp.front();
  const int64_t T = batch.num_tokens, H = c.base.hidden_size, hc = c.hc_mult;
  const KvGroupSpec& wg = layout_.groups[static_cast<size_t>(layout_.window)];
  DI_CHECK(!batch.kv_groups.empty(), "mtp_forward: deepseek_v4 needs the block tables of KV group '", wg.name, "'");
  DI_CHECK(kv_cache.device == Device::CPU && kv_cache.dtype == DType::F32 && kv_cache.ndim == 3 &&
               kv_cache.is_contiguous() && kv_cache.size(2) == wg.row_dim,
           "mtp_forward: deepseek_v4 MTP cache ", kv_cache.describe(), " must be host F32 [blocks, block_size, ",
           wg.row_dim, "] (a layer of KV group '", wg.name, "')");
  for (const Tensor* t : {&hidden_in, static_cast<const Tensor*>(&hidden_out)})
    DI_CHECK(t->device == Device::CPU && t->dtype == DType::F32 && t->is_contiguous() &&
                 t->dims() == std::vector<int64_t>({T, hc * H}),
             "mtp_forward: deepseek_v4 hidden rows must be host F32 [", T, ", ", hc * H,
             "] (hyper-connection streams), got ", t->describe());
  check_positions(batch);
  check_tokens(batch);
  grow_rope_tables(batch.max_seq_len);
  const float eps = static_cast<float>(c.base.rms_norm_eps);
  // Block input: stream k of row t = e_proj(enorm(embed(t_{i+1}))) + h_proj(hnorm(h_i stream k)).
  HostBuffer emb = buf({T, H}), en = buf({T, H}), ep = buf({T, H});
  be_.embedding(batch.token_ids, w_.embed, emb.tensor());
  be_.rms_norm(emb.tensor(), B.enorm, eps, en.tensor());
  be_.gemm(en.tensor(), B.e_proj, ep.tensor());
  HostBuffer hn = buf({T * hc, H}), streams = buf({T, hc, H}), next = buf({T, hc, H});
  be_.rms_norm(hidden_in.view({T * hc, H}), B.hnorm, eps, hn.tensor());
  Tensor s2 = streams.tensor().view({T * hc, H});
  be_.gemm(hn.tensor(), B.h_proj, s2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k) {
      float* row = streams.ptr<float>() + (t * hc + k) * H;
      const float* e = ep.ptr<float>() + t * H;
      for (int64_t i = 0; i < H; ++i) row[i] = e[i] + row[i];
    }
  KvCaches none;  // a window-only block reads no other group
  block(B.block, -1, batch, none, kv_cache, batch.kv_groups.front(), streams, next);
  std::copy_n(streams.ptr<float>(), T * hc * H, hidden_out.ptr<float>());
  head_logits(batch, streams, B.hc_head, B.norm, logits);
}

}  // namespace deepinfer
