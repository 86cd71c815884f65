#include "model/layers/mla.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "model/layers/common.h"

namespace deepinfer {
namespace {

// transformers builds q_a_layernorm and kv_a_layernorm with DeepseekV3RMSNorm's default
// eps (1e-6), not config.rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

// Real value of row r of a host weight (F32, BF16 or block-scaled FP8) into dst[in].
void host_weight_row(const Weight& w, int64_t r, float* dst) {
  const int64_t K = w.in_features();
  const char* row = static_cast<const char*>(w.w.data) +
                    r * w.w.stride[0] * static_cast<int64_t>(dtype_size(w.w.dtype));
  for (int64_t k = 0; k < K; ++k) {
    switch (w.w.dtype) {
      case DType::F32: std::memcpy(dst + k, row + 4 * k, 4); break;
      case DType::BF16: {
        uint16_t b;
        std::memcpy(&b, row + 2 * k, 2);
        dst[k] = bf16_to_float(b);
        break;
      }
      case DType::F8_E4M3: {
        const float s = w.scale_inv.ptr<float>()[(r / w.block_n) * w.scale_inv.stride[0] +
                                                 k / w.block_k];
        dst[k] = fp8_e4m3_to_float(static_cast<uint8_t>(row[k])) * s;
        break;
      }
      default: fail("kv_b_proj: unsupported dtype ", w.w.describe());
    }
  }
}

}  // namespace

MlaAbsorbedWeights make_mla_absorbed_weights(const MlaDims& dims,
                                             const AttentionWeights& host, Backend& backend) {
  const Weight& kvb = host.kv_b_proj;  // [heads * (nope + v), kv_lora]
  DI_CHECK(kvb.w.device == Device::CPU, "kv_b_proj must be host-readable to derive MLA weights");
  const int64_t heads = dims.heads, nope = dims.qk_nope_head_dim;
  const int64_t vdim = dims.v_head_dim, L = dims.kv_lora_rank;
  DI_CHECK(kvb.w.ndim == 2 && kvb.out_features() == heads * (nope + vdim) &&
               kvb.in_features() == L,
           "kv_b_proj ", kvb.w.describe(), " must be [", heads * (nope + vdim), ", ", L, "]");
  // BF16 sources stay exact in BF16. FP8 / F32 sources: F32 (exact) where activations are F32
  // (the CPU reference), BF16 where they are BF16 (CUDA: gemm_heads takes BF16 weights only;
  // the dequantized FP8 x scale values round to BF16 at 2^-9 relative, the activations' own
  // precision).
  const DType dtype = kvb.w.dtype == DType::BF16 || backend.activation_dtype() == DType::BF16
                          ? DType::BF16
                          : DType::F32;
  HostBuffer uk_t(dtype, {heads, L, nope});   // W_UK[h]^T
  HostBuffer uv(dtype, {heads, vdim, L});     // W_UV[h]
  std::vector<float> row(static_cast<size_t>(L));
  auto put = [&](HostBuffer& b, int64_t index, float v) {
    if (dtype == DType::F32) {
      b.ptr<float>()[index] = v;
    } else {
      b.ptr<uint16_t>()[index] = float_to_bf16(v);  // RNE; exact when v came from BF16
    }
  };
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < nope + vdim; ++i) {
      host_weight_row(kvb, h * (nope + vdim) + i, row.data());  // [L]
      for (int64_t l = 0; l < L; ++l) {
        if (i < nope) {
          put(uk_t, (h * L + l) * nope + i, row[l]);
        } else {
          put(uv, (h * vdim + (i - nope)) * L + l, row[l]);
        }
      }
    }
  }
  MlaAbsorbedWeights out;
  for (HostBuffer* src : {&uk_t, &uv}) {
    DeviceBuffer d = backend.alloc(dtype, src->tensor().dims());
    backend.copy(src->tensor(), d.tensor());
    out.owners.push_back(std::move(d));
  }
  const Tensor& uk_dev = out.owners[0].tensor();
  const Tensor& uv_dev = out.owners[1].tensor();
  for (int64_t h = 0; h < heads; ++h) {
    Weight a, b;
    a.w = uk_dev.row(h);  // [L, nope]
    b.w = uv_dev.row(h);  // [v, L]
    out.uk_t.push_back(a);
    out.uv.push_back(b);
  }
  return out;
}

MlaWorkspace make_mla_workspace(const MlaDims& c, Backend& backend, int64_t capacity) {
  MlaWorkspace ws;
  ws.capacity = capacity;
  const DType dt = backend.activation_dtype();
  const int64_t heads = c.heads;
  auto make = [&](int64_t cols) {
    ws.buffers.push_back(backend.alloc(dt, {capacity, std::max<int64_t>(cols, 1)}));
    return ws.buffers.back().tensor();
  };
  ws.q_a = make(c.q_lora_rank);
  ws.q = make(heads * c.qk_head_dim());
  ws.kv_a = make(c.kv_row_dim());
  ws.kv_b = make(heads * (c.qk_nope_head_dim + c.v_head_dim));
  ws.k = make(heads * c.qk_head_dim());
  ws.q_abs = make(heads * c.kv_row_dim());
  ws.latent = make(heads * c.kv_lora_rank);
  ws.attn = make(heads * c.v_head_dim);
  return ws;
}

MlaStep make_mla_step(const StepBatch& batch, const Tensor& cos_sin, bool batch_invariant) {
  bool direct = !batch_invariant;
  for (int s = 0; s < batch.num_seqs && direct; ++s)
    direct = batch.host_seq_lens[s] == batch.host_query_start[s + 1] - batch.host_query_start[s];
  MlaStep step;
  step.positions = &batch.positions;
  step.cos_sin = &cos_sin;
  step.query_start = &batch.query_start;
  step.direct = direct;
  step.batch_invariant = batch_invariant;
  step.host_query_start = &batch.host_query_start;
  step.host_seq_lens = &batch.host_seq_lens;
  step.kv.block_tables = batch.block_tables;
  step.kv.seq_lens = batch.seq_lens;
  step.kv.query_start = batch.query_start;
  step.kv.slot_mapping = batch.slot_mapping;
  step.kv.num_seqs = batch.num_seqs;
  step.kv.max_query_len = batch.max_query_len;
  step.kv.max_seq_len = batch.max_seq_len;
  return step;
}

bool mla_context_direct_pays(const MlaDims& c, const std::vector<int32_t>& query_start,
                             const std::vector<int32_t>& seq_lens) {
  const double heads = static_cast<double>(c.heads), L = static_cast<double>(c.kv_lora_rank);
  const double expand = 2.0 * heads * L * static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);  // per row
  double rows = 0, queries = 0, pairs = 0;
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const double q = query_start[s + 1] - query_start[s], ctx = seq_lens[s];
    rows += ctx;
    queries += q;
    pairs += q * (ctx - q) + q * (q + 1) / 2;  // query i sees ctx - q + i + 1 positions
  }
  const double direct = rows * expand + pairs * 2.0 * heads * static_cast<double>(c.qk_head_dim() + c.v_head_dim);
  const double absorbed = queries * expand + pairs * 2.0 * heads * static_cast<double>(2 * c.kv_lora_rank + c.qk_rope_head_dim);
  return direct < absorbed;
}

namespace {

// Step rows' worth of the direct form's context buffers, or false when they would pass
// kMlaContextBytes (the absorbed form runs then).
bool reserve_context(Backend& backend, const MlaDims& c, MlaWorkspace& ws, int64_t rows) {
  if (rows <= ws.ctx_capacity) return true;
  const int64_t heads = c.heads;
  const int64_t row_bytes = static_cast<int64_t>(dtype_size(backend.activation_dtype())) *
                            (c.kv_row_dim() + heads * (c.qk_nope_head_dim + c.v_head_dim) + heads * c.qk_head_dim());
  const int64_t most = kMlaContextBytes / row_bytes;
  if (rows > most) return false;
  const int64_t cap = std::min(most, std::max(rows, 2 * ws.capacity));  // room for the next chunks
  ws.ctx_buffers.clear();
  const DType dt = backend.activation_dtype();
  for (auto [t, cols] : {std::pair{&ws.ctx_rows, c.kv_row_dim()}, std::pair{&ws.ctx_kv_b, heads * (c.qk_nope_head_dim + c.v_head_dim)},
                         std::pair{&ws.ctx_k, heads * c.qk_head_dim()}}) {
    ws.ctx_buffers.push_back(backend.alloc(dt, {cap, cols}));
    *t = ws.ctx_buffers.back().tensor();
  }
  ws.ctx_capacity = cap;
  return true;
}

// k = [k_nope | k_rope (shared by all heads)] per head for n rows: k_nope from kv_b's
// [nope | v] rows, k_rope from the rows' rope part (columns kv_lora .. of `rope_rows`).
void assemble_k(Backend& backend, const MlaDims& c, const Tensor& kv_b, const Tensor& rope_rows, int64_t n, Tensor& k) {
  const int64_t heads = c.heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
  Tensor k3 = heads_view(k, n, heads, qk, nope);  // k[:, :, :nope]
  backend.copy(heads_view(kv_b, n, heads, nope + c.v_head_dim, nope), k3);
  Tensor k_rope = heads_view(rope_rows, n, 1, c.kv_row_dim(), rope, c.kv_lora_rank);  // [n, 1, rope]
  k_rope.shape[1] = heads;  // broadcast over heads
  k_rope.stride[1] = 0;
  Tensor k3_rope = heads_view(k, n, heads, qk, rope, nope);
  backend.copy(k_rope, k3_rope);
}

}  // namespace

void mla_project(Backend& backend, const MlaDims& c, const AttentionWeights& w, MlaStep& step,
                 const Tensor& x, MlaWorkspace& ws, bool rope_on_side) {
  const int64_t T = x.size(0);
  DI_CHECK(T <= ws.capacity, "mla_forward: ", T, " tokens exceed the workspace (", ws.capacity, ")");
  const int64_t heads = c.heads, nope = c.qk_nope_head_dim;
  const int64_t rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
  const int64_t L = c.kv_lora_rank, row = c.kv_row_dim();

  // Query: [T, heads * qk] with per-head [nope | rope].
  // Latent: [T, kv_lora | rope]; normalize c_kv in place below.
  Tensor q = cols_view(ws.q, T, heads * qk);
  Tensor kv_a = cols_view(ws.kv_a, T, row);
  Tensor c_kv = cols_view(ws.kv_a, T, L);  // [T, kv_lora] (row stride kv_lora + rope)
  if (c.has_q_lora()) {
    Tensor q_a = cols_view(ws.q_a, T, c.q_lora_rank);  // [T, q_lora]
    backend.gemm_pair(x, w.q_a_proj, w.kv_a_proj_with_mqa, q_a, kv_a);  // both read x
    backend.rms_norm_pair(q_a, w.q_a_layernorm, q_a, c_kv, w.kv_a_layernorm, c_kv, kLatentNormEps);
    backend.gemm(q_a, w.q_b_proj, q);
  } else {
    backend.gemm(x, w.q_proj, q);
    backend.gemm(x, w.kv_a_proj_with_mqa, kv_a);
    backend.rms_norm(c_kv, w.kv_a_layernorm, kLatentNormEps, c_kv);
  }

  // rope(q), rope(k_rope), cache rows [c_kv | rope(k_rope)] and, absorbed, the query's
  // rope part into q_abs[:, h, kv_lora:] in one op.
  Tensor q3 = heads_view(ws.q, T, heads, qk, qk);  // [T, heads, qk]
  Tensor q_abs_rope = step.direct ? Tensor{} : heads_view(ws.q_abs, T, heads, row, rope, L);
  if (rope_on_side) backend.side_begin();
  backend.mla_rope_store(q3, kv_a, *step.positions, *step.cos_sin, static_cast<int>(nope),
                         static_cast<int>(L), static_cast<int>(rope), c.rope_interleave, step.kv,
                         q_abs_rope);
  if (rope_on_side) backend.side_end();
}

void mla_attend(Backend& backend, const MlaDims& c, const AttentionWeights& w,
                const MlaAbsorbedWeights& absorbed, MlaStep& step, int64_t T, MlaWorkspace& ws,
                Tensor& out, const Tensor* indices) {
  const int64_t heads = c.heads, nope = c.qk_nope_head_dim;
  const int64_t qk = c.qk_head_dim(), vdim = c.v_head_dim;
  const int64_t L = c.kv_lora_rank, row = c.kv_row_dim();
  const float scale = static_cast<float>(c.softmax_scale);
  Tensor q3 = heads_view(ws.q, T, heads, qk, qk);  // [T, heads, qk]
  Tensor c_kv = cols_view(ws.kv_a, T, L);           // [T, kv_lora] (normed)
  Tensor attn3 = heads_view(ws.attn, T, heads, vdim, vdim);  // [T, heads, v]
  // Cached context, dense, long chunks: the direct form over the whole context when it costs
  // fewer FLOPs and its buffers fit kMlaContextBytes.
  int64_t ctx_rows = 0;
  bool context_direct = false;
  if (!step.direct && !step.batch_invariant && indices == nullptr && step.host_seq_lens != nullptr &&
      mla_context_direct_pays(c, *step.host_query_start, *step.host_seq_lens)) {
    for (int32_t len : *step.host_seq_lens) ctx_rows += len;
    context_direct = reserve_context(backend, c, ws, ctx_rows);
  }
  // mla_project's side line (rope_on_side), if any, is joined before the first op that reads
  // the cache or the query's rope part (side_join: nothing when no side line is pending).
  if (step.direct || context_direct) backend.side_join();
  if (step.direct) {
    // kv_b: [T, heads, nope + v] -> k = [k_nope | k_rope (shared by all heads)], v.
    Tensor kv_b = cols_view(ws.kv_b, T, heads * (nope + vdim));  // [T, heads * (nope + v)]
    backend.gemm(c_kv, w.kv_b_proj, kv_b);
    assemble_k(backend, c, ws.kv_b, ws.kv_a, T, ws.k);
    const Tensor v3 = heads_view(ws.kv_b, T, heads, nope + vdim, vdim, nope);  // [T, heads, v]
    if (indices != nullptr) {
      backend.mla_attention_prefill_sparse(q3, heads_view(ws.k, T, heads, qk, qk), v3,
                                           *step.query_start, step.kv.num_seqs, *indices, scale,
                                           attn3);
    } else {
      backend.mla_attention_prefill(q3, heads_view(ws.k, T, heads, qk, qk), v3, *step.query_start,
                                    step.kv.num_seqs, scale, attn3);
    }
  } else if (context_direct) {
    // The context's cached rows (this step's too) -> kv_b -> k, v of every position.
    Tensor rows = cols_view(ws.ctx_rows, ctx_rows, row);
    backend.kv_gather(step.kv, rows);
    Tensor kv_b = cols_view(ws.ctx_kv_b, ctx_rows, heads * (nope + vdim));
    backend.gemm(cols_view(ws.ctx_rows, ctx_rows, L), w.kv_b_proj, kv_b);
    assemble_k(backend, c, ws.ctx_kv_b, ws.ctx_rows, ctx_rows, ws.ctx_k);
    backend.mla_attention_prefill_context(q3, heads_view(ws.ctx_k, ctx_rows, heads, qk, qk),
                                          heads_view(ws.ctx_kv_b, ctx_rows, heads, nope + vdim, vdim, nope),
                                          step.kv, scale, attn3);
  } else {
    // q_abs[:, h] = [q_nope[:, h] · W_UK[h] | q_rope[:, h]]   [T, heads, kv_lora + rope]
    // (the rope part was written by mla_rope_store). All heads in one op (owners[0] = W_UK^T stacked [heads, kv_lora, nope]).
    Tensor q_abs_nope = heads_view(ws.q_abs, T, heads, row, L);
    backend.gemm_heads(heads_view(ws.q, T, heads, qk, nope), absorbed.owners[0].tensor(),
                       q_abs_nope);
    backend.side_join();
    Tensor latent3 = heads_view(ws.latent, T, heads, L, L);  // [T, heads, kv_lora]
    if (indices != nullptr) {
      backend.mla_attention_paged_sparse(heads_view(ws.q_abs, T, heads, row, row), step.kv,
                                         *indices, scale, static_cast<int>(L), latent3);
    } else {
      backend.mla_attention_paged(heads_view(ws.q_abs, T, heads, row, row), step.kv, scale,
                                  static_cast<int>(L), latent3);
    }
    // attn[:, h] = latent[:, h] · W_UV[h]^T  [T, heads, v] (owners[1] = W_UV [heads, v, kv_lora])
    backend.gemm_heads(latent3, absorbed.owners[1].tensor(), attn3);
  }
  backend.gemm(cols_view(ws.attn, T, heads * vdim), w.o_proj, out);
}

void mla_forward(Backend& backend, const MlaDims& c, const AttentionWeights& w,
                 const MlaAbsorbedWeights& absorbed, MlaStep& step, const Tensor& x,
                 MlaWorkspace& ws, Tensor& out) {
  // RoPE + store beside W_UK when the absorbed form follows at decode sizes (mla.h).
  mla_project(backend, c, w, step, x, ws, !step.direct && x.size(0) <= kMlaRopeSideMaxTokens);
  mla_attend(backend, c, w, absorbed, step, x.size(0), ws, out, nullptr);
}

}  // namespace deepinfer
