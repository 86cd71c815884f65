// Multi-head latent attention (MLA) of one DeepSeek layer, built from backend ops.
//
//  q      = q_b_proj(q_a_layernorm(q_a_proj(x)))  or  q_proj(x)      [T, heads, nope + rope]
//  kv_a   = kv_a_proj_with_mqa(x) = [c_kv | k_rope]                    [T, kv_lora + rope]
//  c_kv   = kv_a_layernorm(c_kv); rope on q's and kv_a's rope parts; kv_a rows -> paged cache
//  direct (no cached context): kv_b_proj(c_kv) -> k_nope, v per head; softmax(q·k) v
//  direct over cached context (long prefill chunks): the context's cached rows gathered,
//            kv_b_proj over them, the same direct attention (mla_context_direct_pays)
//  absorbed: q_abs = [q_nope · W_UK | q_rope] (kv_lora + rope per head) over the cached rows,
//            out = latent · W_UV^T per head
//  out    = o_proj(attn)                                               [T, hidden]
// The two forms agree up to fp32 rounding (tests/golden checks chunked vs whole prefill).
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/layers/dims.h"
#include "model/step_batch.h"
#include "model/weights.h"

namespace deepinfer {

// Per-head absorbed-form weights derived from kv_b_proj [heads * (nope + v), kv_lora]:
// uk_t[h] = W_UK[h]^T [kv_lora, nope] (so gemm gives q_nope · W_UK), uv[h] = W_UV[h]
// [v, kv_lora]. BF16 for BF16 sources (exact); for F32/FP8 sources (FP8 dequantized) F32
// (exact) on backends with F32 activations, BF16 (rounded) on BF16-activation backends.
struct MlaAbsorbedWeights {
  std::vector<Weight> uk_t;
  std::vector<Weight> uv;
  std::vector<DeviceBuffer> owners;
};

// Builds them on the host from `host` (host-readable weights) and uploads to `backend`.
MlaAbsorbedWeights make_mla_absorbed_weights(const MlaDims& dims,
                                             const AttentionWeights& host, Backend& backend);

// Scratch for one layer's attention, sized for `capacity` tokens (reused by every layer).
struct MlaWorkspace {
  std::vector<DeviceBuffer> buffers;
  Tensor q_a;     // [cap, q_lora_rank]
  Tensor q;       // [cap, heads * qk_head_dim]
  Tensor kv_a;    // [cap, kv_lora + rope]
  Tensor kv_b;    // [cap, heads * (nope + v)]             direct form
  Tensor k;       // [cap, heads * qk_head_dim]            direct form
  Tensor q_abs;   // [cap, heads * (kv_lora + rope)]       absorbed form
  Tensor latent;  // [cap, heads * kv_lora]                absorbed form
  Tensor attn;    // [cap, heads * v]
  int64_t capacity = 0;
  // Direct form over cached context, grown on first use up to kMlaContextBytes:
  std::vector<DeviceBuffer> ctx_buffers;
  Tensor ctx_rows;  // [ctx_cap, kv_lora + rope]  the context's cached rows
  Tensor ctx_kv_b;  // [ctx_cap, heads * (nope + v)]
  Tensor ctx_k;     // [ctx_cap, heads * qk_head_dim]
  int64_t ctx_capacity = 0;
};
MlaWorkspace make_mla_workspace(const MlaDims& dims, Backend& backend, int64_t capacity);

// What one step's attention needs besides the weights.
struct MlaStep {
  const Tensor* positions = nullptr;     // I32 [T]
  const Tensor* cos_sin = nullptr;       // F32 [max_positions, rope]
  const Tensor* query_start = nullptr;   // I32 [S + 1]
  PagedKV kv;                            // this layer's cache and the step's addressing
  bool direct = false;                   // no sequence has cached context
  bool batch_invariant = false;          // absorbed form whenever there is cached context
  const std::vector<int32_t>* host_query_start = nullptr;  // [S + 1]
  const std::vector<int32_t>* host_seq_lens = nullptr;     // [S]
};

// Most bytes of the direct form's context buffers (rows, kv_b output, k) per workspace.
constexpr int64_t kMlaContextBytes = int64_t{512} << 20;

// True when a step with cached context costs fewer FLOPs in the direct form (kv_b over every
// context row, then 2 x heads x (qk + v) per query-key pair) than in the absorbed one (W_UK and
// W_UV per query, then 2 x heads x (2 kv_lora + rope) per pair): long prefill chunks, never
// decode. query_start [S + 1] and seq_lens [S] as in StepBatch.
bool mla_context_direct_pays(const MlaDims& dims, const std::vector<int32_t>& query_start,
                             const std::vector<int32_t>& seq_lens);

// A step's attention inputs from its StepBatch (cos_sin: the RoPE table; the layer's cache
// goes into .kv.cache). .direct when every sequence starts fresh (seq_len == its new tokens)
// and the backend is not batch-invariant; otherwise mla_attend picks the direct form over the
// gathered context when mla_context_direct_pays (dense, not batch-invariant), else absorbed.
MlaStep make_mla_step(const StepBatch& batch, const Tensor& cos_sin, bool batch_invariant);

// The two halves of mla_forward, for layers that act in between (V3.2's indexer reads the
// q_lora output ws.q_a [T, q_lora_rank] after mla_project):
//  mla_project: q_a, q, kv_a (normed), RoPE, latent rows -> step.kv.cache (and, absorbed, the
//               query's rope part);
//  mla_attend:  attention (direct or absorbed, per step.direct) over every causal position,
//               or over the positions of `indices` I32 [T, k] when given (sparse; -1 = none),
//               then o_proj -> out [T, hidden].
// rope_on_side: the RoPE + cache store goes on the backend's side line (Backend::side_begin),
// which mla_attend joins before anything reads the cache or the query's rope part (absorbed:
// after gemm_heads W_UK, which reads only the query's nope part, so the two overlap). Only when
// nothing between the two halves reads what RoPE writes (mla_forward; not V3.2's indexer).
// mla_forward puts it there for absorbed steps of at most kMlaRopeSideMaxTokens tokens: graph
// decode on the H200 (bench/NOTES.md, session 16), bf16 -15 / -46 / -25 us per step at batch 1 / 8
// / 16, but +40 / +60 us at 32 / 64 (the side stream's join costs more than the overlap gives).
inline constexpr int64_t kMlaRopeSideMaxTokens = 16;
void mla_project(Backend& backend, const MlaDims& dims, const AttentionWeights& w,
                 MlaStep& step, const Tensor& x, MlaWorkspace& ws, bool rope_on_side = false);
void mla_attend(Backend& backend, const MlaDims& dims, const AttentionWeights& w,
                const MlaAbsorbedWeights& absorbed, MlaStep& step, int64_t num_tokens,
                MlaWorkspace& ws, Tensor& out, const Tensor* indices);

// out [T, hidden] = MLA(x) for x [T, hidden] (already input_layernorm-ed).
void mla_forward(Backend& backend, const MlaDims& dims, const AttentionWeights& w,
                 const MlaAbsorbedWeights& absorbed, MlaStep& step, const Tensor& x,
                 MlaWorkspace& ws, Tensor& out);

}  // namespace deepinfer
