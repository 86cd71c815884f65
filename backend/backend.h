// Backend: the op table. backend/cpu (the reference) and backend/cuda implement
// the same table, one source file per op family with the same names on both
// sides. Models call only these ops; tests/ops checks every CUDA op against the
// CPU reference. Tensors passed to an op live on that backend's device.
//
// Conventions
//  - Activations are F32 on the CPU backend and BF16 (or F32) on CUDA; every op
//    accumulates in fp32.
//  - A linear weight is [out, in] (HF layout): y = x · W^T.
//  - Determinism: every reduction has a batch-invariant order selected by
//    BackendOptions::batch_invariant (DEEPINFER_BATCH_INVARIANT=1); it must not
//    depend on how many tokens share a step, on chunking, or on split choice.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

class ThreadPool;

// A linear weight, possibly block-quantized (FP8 e4m3 with 128x128 scales).
struct Weight {
  Tensor w;          // [N, K]: F32, BF16 or F8_E4M3
  Tensor scale_inv;  // F32 [ceil(N/block_n), ceil(K/block_k)] when w is F8; else undefined
  int block_n = 128;
  int block_k = 128;
  int64_t out_features() const { return w.size(0); }
  int64_t in_features() const { return w.size(1); }
};

// One routed (or shared) SwiGLU expert: down(silu(gate(x)) * up(x)).
struct ExpertWeights {
  Weight gate;  // [I, H]
  Weight up;    // [I, H]
  Weight down;  // [H, I]
};

// Routing rule of a MoE layer (MODELS.md; V3: sigmoid + bias + groups, V2: softmax).
struct MoeRouting {
  enum class Scoring { Sigmoid, Softmax } scoring = Scoring::Sigmoid;
  int num_experts = 0;
  int top_k = 0;
  int num_groups = 1;        // n_group
  int top_k_groups = 1;      // topk_group
  bool use_bias = false;     // e_score_correction_bias chooses experts (noaux_tc)
  // Restrict to top_k_groups groups. Group score = sum of the top-2 biased scores of the
  // group when use_bias (V3 noaux_tc), else the group's max score (V2 group_limited_greedy).
  bool group_limited = false;
  bool normalize = true;     // norm_topk_prob
  float scaling = 1.0f;      // routed_scaling_factor
};

// Paged latent KV cache of one layer plus the step's addressing. A token's slot is
// block_id * block_size + offset. Query token i of sequence s sits at position
// seq_lens[s] - q_len(s) + i and attends cache positions <= its own (causal).
struct PagedKV {
  Tensor cache;         // [num_blocks, block_size, row_dim] row_dim = kv_lora_rank + qk_rope_dim
  Tensor block_tables;  // I32 [num_seqs, max_blocks_per_seq]
  Tensor seq_lens;      // I32 [num_seqs] context length including this step's tokens
  Tensor query_start;   // I32 [num_seqs + 1] offsets of each sequence's tokens in the step
  Tensor slot_mapping;  // I32 [num_tokens]; -1 means do not store
  int num_seqs = 0;
  int max_query_len = 0;
  int max_seq_len = 0;
};

// Per-row parameters of Backend::sample (plain data: uploaded as I32 words, read by kernels).
struct SampleRowParams {
  float temperature = 1.0f;  // 0: greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  int32_t top_k = 0;         // <= 0: off
  uint64_t seed = 0;         // Philox key
  uint64_t stream = 0;       // seq_seed + sample index
  uint64_t position = 0;     // index in its sequence of the token being sampled
};
inline constexpr int kSampleRowWords = static_cast<int>(sizeof(SampleRowParams) / 4);
static_assert(sizeof(SampleRowParams) == 40, "SampleRowParams is uploaded as 10 I32 words");

// Backend::spec_shift's step (views into the step's input arrays; I32).
struct SpecShift {
  Tensor accepted;      // [S]
  int assumed = 0;      // drafts the layout assumed accepted
  Tensor query_start;   // [>= S + 1]: the tokens of sequence s
  Tensor positions;     // [T]: += delta
  Tensor slots;         // [T]: entries >= 0 recomputed at the new position (-1 past the table row)
  Tensor seq_lens;      // [>= S]: += delta
  Tensor block_tables;  // [>= S, width]
  int block_size = 0;
  // Optional (defined or not): the sequence's input tokens only the device knows. Token 0 of
  // sequence s = first_tokens[s] ([S]); token 1 + j = drafts[j * drafts_stride + s] for j <
  // num_drafts (drafts: [num_drafts, >= S] row-major, one row per draft position).
  Tensor tokens;        // [T]
  Tensor first_tokens;
  Tensor drafts;
  int num_drafts = 0;
  int64_t drafts_stride = 0;
  // Optional: SampleRowParams rows [S * rows_per_seq, kSampleRowWords] whose position += delta.
  Tensor sample_params;
  int rows_per_seq = 0;
};

// Owning device allocation; the view is valid while the buffer lives.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Tensor view, std::shared_ptr<void> owner) : view_(view), owner_(std::move(owner)) {}
  Tensor& tensor() { return view_; }
  const Tensor& tensor() const { return view_; }

 private:
  Tensor view_;
  std::shared_ptr<void> owner_;
};

// CUDA backend options; the defaults are the measured winners (bench/NOTES.md, "Kernel
// switches against their A/Bs"). Only sync_each_op has a setting (DEEPINFER_CUDA_SYNC, via
// cuda_options(env_settings())); the other fields select variants that lost their A/Bs, kept
// for the parity tests and benches that set them in code.
struct CudaOptions {
  bool sync_each_op = false;      // DEEPINFER_CUDA_SYNC
  bool stream_gemm = true;        // false: no weight-streaming kernel anywhere (lost 38-43%)
  int64_t stream_max_rows = 0;    // dense BF16 GEMMs of at most this many rows on the stream kernel (0: cuBLASLt)
  int pipe_stages = 2;            // MoE expert pipeline stages (0: the stream kernel)
  bool pipe_fp8 = true;           // FP8 experts on the pipeline too
  int64_t pipe_max_tokens = 64;   // most tokens of a step for the pipeline (16 lost 30-44% at 32-64)
  // Dense GEMMs of at most this many rows on the pipeline kernel's dense form, launched as
  // programmatic dependents (pdl); 0: FP8 on the stream kernel, BF16 on cuBLASLt. H200 (bench/
  // NOTES.md dec18): FP8 -10% / -5.5% / -5% per step at batch 1 / 8 / 32, +1.2% at 64; BF16 -8% /
  // -3.5% at batch 1 / 8, +2% / +10% at 32 / 64 against cuBLASLt.
  int64_t pipe_dense_fp8_rows = 32;
  int64_t pipe_dense_bf16_rows = 8;
  // The dense pipeline GEMMs (dec18) and the decode step's other own kernels (pdl17: norms, rope
  // + store, stream GEMMs, paged attention, routing, MoE index / combine, silu_mul, add, argmax,
  // embedding; backend/cuda/pdl_launch.cuh) as programmatic dependent launches (false: plain).
  bool pdl = true;
  int attn_chunk = 0;             // paged attention chunk: 32, 64 or 0 (by shape)
  int64_t fp8_act_min_rows = 129; // fewest rows for FP8 activations on FP8 weights
  bool moe_cutlass = true;        // routed BF16 prefill experts on CUTLASS (false: the own tiles)
  int moe_cutlass_tile = 0;       // CUTLASS tile 64 (64x128) / 256 (128x256; FP8: 128x128); 0: by load
  // Routed FP8 experts in prefill (> 16 rows per expert) with FP8 activations on CUTLASS's
  // blockwise-scaled grouped GEMM (false: moe_qgemm.cu, W8A16). H200 (bench/NOTES.md
  // "fp8grp"): bench model FP8 prefill 512 / 4096 1.6x / 1.66x the previous paths.
  bool moe_cutlass_fp8 = true;
  // Routed experts with quantized weights on the tensor-core grouped GEMM (moe_qgemm.cu) from
  // moe_qgemm_min_tokens tokens, never batch-invariant: FP4 (false: the CUDA-core kernel of
  // moe_fp4.cu always) and FP8 in prefill where FP8 activations do not take the step (false: the
  // own tiles there). H200 (bench/NOTES.md "mixq"): FP4 prefill 512 8x, FP8 prefill 512 1.56x.
  bool moe_qgemm_fp4 = true;
  bool moe_qgemm_fp8 = true;
  int64_t moe_qgemm_min_tokens = 2;
};

struct BackendOptions {
  bool batch_invariant = false;  // DEEPINFER_BATCH_INVARIANT
  int num_threads = 0;           // CPU: 0 = all cores
  int device_index = 0;          // CUDA
  CudaOptions cuda;
};

class Settings;  // core/settings.h
// The CUDA switches from `settings` (the DEEPINFER_CUDA_* entries); throws Error
// naming the variable for an out-of-range value.
CudaOptions cuda_options(const Settings& settings);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // Activation dtype this backend computes in (CPU: F32, CUDA: BF16).
  virtual DType activation_dtype() const = 0;
  // True when BackendOptions::batch_invariant was set. Models read it to keep one
  // code path for every batch shape (e.g. always the absorbed MLA form).
  virtual bool batch_invariant() const { return false; }
  // The stream ops are issued on, for a communicator that issues its collectives there
  // (dist/: NCCL takes the cudaStream_t); nullptr on backends without one (CPU).
  virtual void* native_stream() { return nullptr; }

  // --- memory -------------------------------------------------------------
  virtual DeviceBuffer alloc(DType dtype, const std::vector<int64_t>& dims) = 0;
  // Copies between any two tensors of equal dtype and numel (host<->device too).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void synchronize() = 0;
  // Device memory in bytes (engine/: KV cache sizing); -1 where not tracked (CPU).
  struct MemoryInfo {
    int64_t free_bytes = -1;
    int64_t total_bytes = -1;
  };
  virtual MemoryInfo memory_info() const { return {}; }

  // --- embedding.{cpp,cu} ---------------------------------------------------
  // out[T, H] = table[ids[t], :]; table F32/BF16; ids I32 [T].
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out) = 0;

  // --- norm ---------------------------------------------------------------
  // out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight. x may be a strided row view.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // Fused: residual += x; out = rms_norm(residual).
  virtual void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                            Tensor& out) = 0;

  // --- gemm ---------------------------------------------------------------
  // out[M, N] = x[M, K] · W[N, K]^T (fp32 accumulation; FP8 weights use block scales).
  virtual void gemm(const Tensor& x, const Weight& w, Tensor& out) = 0;
  // Per-head GEMM (MLA's absorbed W_UK / W_UV): out[t, h, :] = x[t, h, :] · w[h]^T.
  // x [T, heads, K] and out [T, heads, N] are 3-D views (last dim contiguous, any row and
  // head strides); w [heads, N, K] contiguous, unquantized. The default (backend/cpu/
  // gemm_heads.cpp) runs one gemm per head; the CPU backend all heads' column tiles in one
  // threaded loop (same bits); CUDA does all heads in one launch.
  virtual void gemm_heads(const Tensor& x, const Tensor& w, Tensor& out);

  // --- fused GEMMs (defaults in backend/cpu/fused_gemm.cpp compose the ops above) -------
  // out1 = x · w1^T and out2 = x · w2^T: two weights that read the same activations (MLA's
  // q_a | kv_a, an MLP's gate | up). CUDA runs both in one launch for few rows.
  virtual void gemm_pair(const Tensor& x, const Weight& w1, const Weight& w2, Tensor& out1,
                         Tensor& out2);
  // SwiGLU down projection: y = silu_mul(gate_up) · w^T with gate_up [T, 2I], w [N, I];
  // out = y, or out += y when accumulate (y rounded to out's dtype first, as silu_mul +
  // gemm + add would give). CUDA applies the gate in the GEMM's activation load.
  virtual void gemm_swiglu(const Tensor& gate_up, const Weight& w, Tensor& out, bool accumulate);

  // --- fp8 activations (CPU reference defaults in backend/cpu/fp8.cpp; CUDA fp8_gemm.cu) ---
  // DeepSeek-V3's 1x128 activation quantization: for row m and 128-column block b of x [M, K]
  // (F32/BF16, any row stride), amax = max |x[m, 128b : 128b + 128]|, scale = amax / 448 (1 when
  // amax == 0), q[m, k] = e4m3(x[m, k] / scale) (RNE, saturating). q F8_E4M3 [M, K] contiguous;
  // scales F32 [ceil(K/128), M] contiguous (block-major: the layout cuBLASLt's VEC128 reads).
  virtual void quantize_fp8_1x128(const Tensor& x, Tensor& q, Tensor& scales);
  // out[M, N] (F32/BF16) = sum_k (q[m, k] scales[k/128, m]) (W[n, k] W.scale_inv[n/128, k/128])
  // with fp32 accumulation: the FP8 x FP8 GEMM on q and scales from quantize_fp8_1x128 and a
  // 128x128 block-scaled F8_E4M3 weight. gemm() on an FP8 weight may take this path for many
  // rows on a backend where it is faster (CUDA: prefill); the CPU gemm stays W8A32.
  virtual void gemm_fp8_1x128(const Tensor& q, const Tensor& scales, const Weight& w, Tensor& out);

  // --- rope ---------------------------------------------------------------
  // Rotates x[t, h, rope_offset : rope_offset + rope_dim] in place at positions[t].
  // cos_sin: F32 [max_positions, rope_dim] = [cos(f_0..f_{d/2-1}) | sin(...)] (YaRN folded in).
  // interleave: pairs (2i, 2i+1) rotate together (DeepSeek rope_interleave); else halves.
  virtual void rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset,
                    int rope_dim, bool interleave) = 0;

  // --- fused MLA steps (defaults in backend/cpu/fused_mla.cpp compose the ops) -------------
  // rms_norm(x1, w1) -> out1 and rms_norm(x2, w2) -> out2 (MLA's q_a and c_kv norms; CUDA:
  // one launch). Same eps; each pair as rms_norm would take it.
  virtual void rms_norm_pair(const Tensor& x1, const Tensor& w1, Tensor& out1, const Tensor& x2,
                             const Tensor& w2, Tensor& out2, float eps);
  // MLA position step: rope(q, q_rope_offset), rope(kv_rows, kv_rope_offset) (same rope_dim,
  // positions, cos_sin, interleave), kv_store(kv_rows, kv), and when q_rope_out is defined
  // ([T, heads, rope_dim]) copy(q[:, :, q_rope_offset : + rope_dim], q_rope_out) after the
  // rotation (the absorbed query's rope part). q [T, heads, dim], kv_rows [T, row_dim].
  // CUDA: one launch.
  virtual void mla_rope_store(Tensor& q, Tensor& kv_rows, const Tensor& positions,
                              const Tensor& cos_sin, int q_rope_offset, int kv_rope_offset,
                              int rope_dim, bool interleave, PagedKV& kv, Tensor& q_rope_out);

  // --- activation ---------------------------------------------------------
  // out[T, I] = silu(gate_up[T, :I]) * gate_up[T, I:]
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;
  // x += y (same shape).
  virtual void add(Tensor& x, const Tensor& y) = 0;

  // --- kv_copy ------------------------------------------------------------
  // kv.cache[slot_mapping[t]] = rows[t] for rows [T, row_dim].
  virtual void kv_store(const Tensor& rows, PagedKV& kv) = 0;

  // --- mla_attention --------------------------------------------------------
  // Absorbed MLA over the paged latent cache (decode; also steps with cached context whose
  // chunks are short: model/layers/mla.h):
  // q [T, heads, row_dim] (q_nope·W_UK | q_rope), K = cache rows (row_dim), V = first
  // v_dim (= kv_lora_rank) of each row. out [T, heads, v_dim].
  virtual void mla_attention_paged(const Tensor& q, const PagedKV& kv, float softmax_scale,
                                   int v_dim, Tensor& out) = 0;
  // Direct MLA for prefill with no cached context: per sequence (query_start), causal.
  // q [T, heads, qk_dim], k [T, heads, qk_dim], v [T, heads, v_dim] -> out [T, heads, v_dim].
  virtual void mla_attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& query_start, int num_seqs, float softmax_scale,
                                     Tensor& out) = 0;
  // Direct MLA over each sequence's whole context (a prefill chunk after cached positions):
  // k [N, heads, qk_dim] and v [N, heads, v_dim] hold every position of every sequence, sequence
  // s at rows c_s .. c_s + kv.seq_lens[s] - 1 (c_s = the sum of the earlier seq_lens; position p
  // at row c_s + p); its q rows kv.query_start[s] .. are its last q_len(s) positions, each
  // attending the positions up to its own. Reads kv.query_start, kv.seq_lens, kv.num_seqs. With
  // seq_lens equal to the query lengths this is mla_attention_prefill.
  virtual void mla_attention_prefill_context(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const PagedKV& kv, float softmax_scale, Tensor& out);
  // rows [N, row_dim] = kv.cache's rows of every position of every sequence, in the layout above
  // (kv.block_tables, kv.seq_lens, kv.num_seqs; N = the sum of seq_lens).
  virtual void kv_gather(const PagedKV& kv, Tensor& rows);

  // --- DeepSeek sparse attention (V3.2; backend/cpu/{norm,indexer,mla_attention}.cpp) --------
  // The defaults (backend/backend.cpp) throw "not implemented on <backend>"; the CPU backend is
  // the reference. Positions are per sequence (0 = the sequence's first token); query token i
  // of sequence s sits at position seq_lens[s] - q_len(s) + i and sees positions <= its own.
  // out[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * weight + bias (biased variance, fp32;
  // torch.nn.LayerNorm). weight/bias F32/BF16 [cols].
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                          Tensor& out);
  // Lightning-indexer scores. q [T, heads, D] (rotated), weights F32 [T, heads], keys: kv.cache
  // [blocks, block_size, D] (one key per cached token, paged like the latent cache):
  //   scores[t, j] = sum_h weights[t, h] * scale * ReLU(q[t, h] . key_j)   for j < ctx(t),
  //   scores[t, j] = -inf                                                for ctx(t) <= j < N,
  // scores F32 [T, N] with N >= every ctx(t). Heads are summed in ascending order.
  virtual void indexer_scores(const Tensor& q, const Tensor& weights, const PagedKV& kv,
                              float scale, Tensor& scores);
  // The k = indices.size(1) best positions of each row of scores [T, N] among its ctx(t) causal
  // ones (kv: query_start, seq_lens, num_seqs only): a higher score wins, an equal score goes
  // to the lower position; the kept positions are written in ASCENDING position order, then -1
  // padding when ctx(t) < k (every causal position kept, as DeepSeek's reference does with
  // min(index_topk, end_pos)). indices I32 [T, k].
  virtual void indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices);
  // mla_attention_paged / mla_attention_prefill restricted to the positions in indices I32
  // [T, k] (-1 entries skipped; every other entry must be a causal position of its token).
  // Attending over every causal position in ascending order gives the dense op's result.
  virtual void mla_attention_paged_sparse(const Tensor& q, const PagedKV& kv,
                                          const Tensor& indices, float softmax_scale, int v_dim,
                                          Tensor& out);
  virtual void mla_attention_prefill_sparse(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& query_start, int num_seqs,
                                            const Tensor& indices, float softmax_scale,
                                            Tensor& out);

  // --- moe_routing ----------------------------------------------------------
  // logits [T, E] F32, bias [E] F32 (may be undefined) -> topk_ids I32 [T, k], topk_weights F32 [T, k].
  // Choice scores = scores (+ bias); experts are chosen by choice score (ties: lowest index),
  // slots ordered by descending choice score; weights = unbiased scores, divided by
  // (their sum + 1e-20) when normalize, times scaling.
  virtual void moe_routing(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                           Tensor& topk_ids, Tensor& topk_weights) = 0;
  // --- moe (permute, grouped_gemm, combine) ---------------------------------
  // out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]). out is overwritten.
  // A slot whose id is -1 is skipped (contributes nothing).
  virtual void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                           const std::vector<ExpertWeights>& experts, Tensor& out) = 0;
  // The combine of moe_experts on its own (expert parallelism's dispatch: model/expert_parallel.h):
  // out[t] = sum over slots j in ascending order of topk_weights[t, j] * y[pos[t, j]], summed in
  // F32 from 0 with moe_experts' own arithmetic (so a token's bits equal moe_experts' when y holds
  // its experts' outputs); a slot whose pos is -1 is skipped. y F32 [P, H], pos I32 [T, k],
  // topk_weights F32 [T, k], out [T, H] (the activation dtype). Default: fails (no kernel).
  virtual void moe_combine(const Tensor& y, const Tensor& pos, const Tensor& topk_weights, Tensor& out);

  // --- DeepSeek-V4 (issue 16; MODELS.md V4-Flash). Defaults in backend/cpu/{hyper_connection,
  // v4_routing, sink_attention, compressor}.cpp compute on host memory (CPU tensors, F32
  // activations) and fail on other devices; CUDA has its kernels in backend/cuda/ (same file
  // names; streams, queries, rows and outputs F32 or BF16 there). -----------------------
  // Manifold-constrained hyper-connections (mHC) over hc residual streams. streams [T, hc, H];
  // fn [(2 + hc) * hc, hc * H], base [(2 + hc) * hc], scale [3] (F32). Per token, with
  // flat = streams[t] flattened and scaled by rsqrt(mean(flat^2) + norm_eps) (no weight) and
  // mix = fn · flat split as [pre hc | post hc | comb hc*hc]:
  //   pre = sigmoid(mix_pre * scale[0] + base_pre) + hc_eps, post = 2 sigmoid(mix_post * scale[1]
  //   + base_post), comb = softmax_row(mix_comb * scale[2] + base_comb) + hc_eps, then comb /=
  //   (column sums + hc_eps), then sinkhorn_iters - 1 rounds of (rows, then columns) likewise.
  // collapsed [T, H] = sum_j pre_j streams[t, j]; post [T, hc]; comb [T, hc, hc] (row j, col k).
  struct HyperConnectionParams {
    int hc_mult = 4;
    int sinkhorn_iters = 20;
    float hc_eps = 1e-6f;
    float norm_eps = 1e-6f;
  };
  virtual void hc_pre(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const HyperConnectionParams& params, Tensor& collapsed, Tensor& post,
                      Tensor& comb);
  // out[t, k, :] = post[t, k] * f[t, :] + sum_j comb[t, j, k] * streams[t, j, :]. out [T, hc, H]
  // must not alias streams.
  virtual void hc_post(const Tensor& streams, const Tensor& f, const Tensor& post, const Tensor& comb,
                       Tensor& out);
  // Final collapse (hc_head): fn [hc, hc * H], base [hc], scale [1]; pre = sigmoid(fn · flat *
  // scale[0] + base) + hc_eps (flat as in hc_pre); out [T, H] = sum_k pre_k streams[t, k].
  virtual void hc_head(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                       const HyperConnectionParams& params, Tensor& out);
  // V4 routing: scores = sqrt(softplus(logits)) (fp32). Experts = hash_ids[t] (I32 [T, k], the
  // tid2eid rows of the step's tokens) when defined, else the top-k of scores + bias (bias F32
  // [E], may be undefined; ties: lowest index; slots by descending choice score). Weights =
  // scores of the chosen experts / (their sum + 1e-20) * scaling. topk_ids I32 [T, k],
  // topk_weights F32 [T, k].
  virtual void moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias,
                                         const Tensor& hash_ids, int top_k, float scaling,
                                         Tensor& topk_ids, Tensor& topk_weights);
  // Clamped SwiGLU: out[T, I] = silu(min(g, limit)) * clamp(u, -limit, limit) with g = gate_up[:, :I],
  // u = gate_up[:, I:].
  virtual void silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out);
  // moe_experts with each expert's SwiGLU clamped as silu_mul_clamped (V4 routed experts).
  // Experts may also be packed FP4 e2m1 (w U8/I8 [N, K/2], scale_inv E8M0 bytes [N, K/32];
  // core/quant.h): the reference dequantizes them, CUDA reads them packed (moe_fp4.cu).
  virtual void moe_experts_clamped(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                   const std::vector<ExpertWeights>& experts, float limit, Tensor& out);
  // Attention over chosen rows with a per-head sink: q [T, heads, D], kv [S, D] (K = V, one head
  // shared by all), indices I32 [T, N] (row of kv per slot; -1 = empty), sinks F32 [heads].
  // out[t, h] = sum_n p_n kv[indices[t, n]] with p_n = exp(l_n - m) / (sum_n exp(l_n - m) +
  // exp(sink_h - m)), l_n = scale * q[t, h] · kv[indices[t, n]], m = max(l, sink_h). A query
  // with no row gets 0.
  virtual void sink_attention(const Tensor& q, const Tensor& kv, const Tensor& indices,
                              const Tensor& sinks, float scale, Tensor& out);
  // KV compressor pooling (CSA / HCA / the indexer's). ratio r; n = T / r windows (the tail
  // waits). Without overlap: kv, gate [T, D], ape [r, D]; out[w, c] = sum_j softmax_j(gate[w r + j,
  // c] + ape[j, c]) kv[w r + j, c]. With overlap: kv, gate [T, 2D], ape [r, 2D]; the softmax runs
  // over 2r slots: window w-1's first halves (kv[., :D], gate + ape [., :D]) then window w's
  // second halves ([., D:]); window 0's first slots come from prior_kv / prior_gate [r, D]
  // (gate + ape already added) when defined, else are empty. out [n, D]. kv and gate may be
  // row-strided views (columns of wider rows). RMS norm and RoPE of the entries are separate ops.
  virtual void compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio,
                               bool overlap, const Tensor& prior_kv, const Tensor& prior_gate,
                               Tensor& out);
  // Lightning indexer (V4 CSA): score(t, s) = sum_h weights[t, h] * weights_scale *
  // relu(q[t, h] · keys[s]) * softmax_scale for keys s < (positions[t] + 1) / ratio; out I32 [T,
  // top_k] = the top_k visible s by score (ties: lowest s), -1 where fewer are visible.
  // q [T, heads, d], keys [S, d] (or [T, S, d]: each query its own keys, a decode step's
  // sequences), weights [T, heads] (F32), positions I32 [T].
  virtual void indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights,
                            const Tensor& positions, int ratio, float softmax_scale,
                            float weights_scale, Tensor& out);

  // compressor_pool over listed rows of a table: kv, gate [R, C] (row-strided views, e.g.
  // columns of a paged cache's rows), row_ids I32 [n, slots] with slots = 2 ratio (overlap) or
  // ratio. Slot s of window w reads row row_ids[w, s] (-1: an empty slot, skipped): with
  // overlap slots s < ratio are a previous group's first halves (columns [0, D), ape[s, :D]) and
  // slots s >= ratio this group's second halves (columns [D, 2D), ape[s - ratio, D:]); without,
  // slot s is columns [0, D) with ape[s]. out [n, D] (a window without a slot: zeros). The same
  // values, order and rounding as compressor_pool over those rows laid out consecutively
  // (window 0's first slots empty).
  virtual void compressor_pool_rows(const Tensor& kv, const Tensor& gate, const Tensor& ape, const Tensor& row_ids,
                                    int ratio, bool overlap, Tensor& out);
  // V4 decode addressing built on the device (backend/cpu/v4_rows.cpp, cuda/v4_rows.cu): a
  // decode step of S sequences, one new token each, sequence s with context e = keys[s] after
  // the step. Row j (j < n = slots.size(1)) of sequence s by rule.kind:
  //   Window:    row e - window + j (none when < 0): the window the new token reads;
  //   Visible:   row j when j < e / ratio (the entries or indexer keys it sees);
  //   Group:     when e % ratio == 0 (the step completes group k = e / ratio - 1), row
  //              (k - 1) * ratio + j with overlap (none when < 0), k * ratio + j without; else none;
  //   Completed: (n = 1) row k when the step completes group k, else none;
  //   Listed:    row rows_in[s, j] (I32 [S, n]; none when < 0).
  // slots[s, j] = the row's slot in table [S, width] (its group's block tables: table[s][row /
  // block_size] * block_size + row % block_size; none when that entry is outside [0,
  // num_blocks)), or rule.fill where there is none. index (optional, I32 [S, n], may be a
  // row-strided view): index_base + s * n + j where a slot exists, else -1.
  //   GroupStart: slots[s, 0] = k * ratio (the completed group's first position), else 0.
  //   TableRows:  slots[s, j] = table[keys[s], j] (keys: token ids; table I32 [V, n]: tid2eid).
  struct V4RowRule {
    enum class Kind { Window, Visible, Group, Completed, Listed, GroupStart, TableRows } kind = Kind::Window;
    int ratio = 1, window = 0;
    bool overlap = false;
    int32_t fill = -1;
    int64_t block_size = 1, num_blocks = 0, index_base = 0;
  };
  virtual void v4_decode_rows(const Tensor& keys, const Tensor& rows_in, const Tensor& table, const V4RowRule& rule,
                              Tensor& slots, Tensor& index);

  // --- DeepSeek-V4.1 (model/deepseek_v41/): host references in backend/cpu/{fake_quant,
  // hyper_connection, compressor, engram}.cpp (F32 host tensors; fail on other devices); CUDA in
  // backend/cuda/{fake_quant, hyper_connection, engram, indexer}.cu, where rows, streams and the
  // collapse's output may also be BF16 (the formats' values are exact in BF16). ---
  // The cache formats' fake quantization, in place on rows x [R, C] (F32), per block of `block`
  // channels (C % block == 0): amax = max |x| of the block;
  //   Fp8Ue8m0x32: scale = 2^ceil(log2(max(amax, 1e-4) / 448)); x = e4m3(clamp(x / scale, +-448)) * scale
  //                (the window KV);
  //   Fp4Ue8m0x32: scale = 2^ceil(log2(max(amax, 6 * 2^-126) / 6)); x = e2m1(clamp(x / scale, +-6)) * scale
  //                (indexer queries and keys);
  //   Fp4E4m3x16:  scale = e4m3(max(amax, 6 * 2^-9) / 6); x = e2m1(clamp(x / scale, +-6)) * scale
  //                (the compressed KV);
  // e4m3 and e2m1 round to nearest even.
  enum class FakeQuant { Fp8Ue8m0x32, Fp4Ue8m0x32, Fp4E4m3x16 };
  virtual void fake_quant(Tensor& x, FakeQuant kind);
  // The same formats packed into byte rows of a paged cache (packed_row_bytes(kind, C) bytes: the C
  // values, FP8 one byte each or FP4 two per byte low nibble first, then one scale byte per block,
  // E8M0 (2^(b - 127)) or e4m3): rows x F32 [R, C] -> their slots of kv.cache U8 [blocks,
  // block_size, bytes] (kv.slot_mapping I32 [R], -1: none); and back: out F32 [N, C] = rows ids
  // (I32 [N]) of cache U8 [rows, bytes], equal to fake_quant of what was stored.
  virtual void store_packed_rows(const Tensor& x, FakeQuant kind, const PagedKV& kv);
  virtual void gather_packed_rows(const Tensor& ids, const Tensor& cache, FakeQuant kind, Tensor& out);
  // hc_pre's pre [T, hc], post and comb without the collapse (V4.1's single-pass hyper-connections
  // collapse a site's streams with the previous site's pre).
  virtual void hc_mix(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const HyperConnectionParams& params, Tensor& pre, Tensor& post, Tensor& comb);
  // out [T, H] = sum_k pre[t, k] streams[t, k, :]; streams [T, hc, H], pre [T, hc] (F32).
  virtual void hc_collapse(const Tensor& streams, const Tensor& pre, Tensor& out);
  // V4.1 Engram's gated write into the streams: kv [T, (hc + 1) * H] (F32) holds the hc keys then the
  // value; weight F32 [hc, H] (q_weight * k_weight). Per token t and stream k, with h = streams[t, k]:
  //   dot  = sum(h * weight[k] * key[k]) * rsqrt(mean(h^2) + eps) * rsqrt(mean(key[k]^2) + eps) / sqrt(H)
  //   gate = sigmoid(sign(dot) * sqrt(max(|dot|, 1e-6)))  (sign(+-0) = +)
  //   out[t, k] = h + gate * value.   streams, out F32 [T, hc, H] (out may be streams).
  virtual void engram_gate(const Tensor& streams, const Tensor& kv, const Tensor& weight, float eps, Tensor& out);
  // A row gather from an FP8 table with a scale per 32 channels (V4.1's Engram tables as released):
  // out F32 [N, C] = e4m3(table[ids[n], c]) * scale(ids[n], c / 32); table F8_E4M3 [R, C] (C % 32 == 0),
  // scales [R, C / 32] E8M0 bytes (F8_E8M0 or U8: 2^(b - 127)) or F32; ids I32 [N] in [0, R).
  virtual void embedding_fp8_rows(const Tensor& ids, const Tensor& table, const Tensor& scales, Tensor& out);
  // The lightning indexer's scores as indexer_topk computes them, all kept: scores F32 [T, S],
  // -inf for the keys s >= (positions[t] + 1) / ratio a query does not see.
  virtual void indexer_scores_visible(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                      const Tensor& positions, int ratio, float softmax_scale,
                                      float weights_scale, Tensor& scores);
  // Two-level top-k, level one (V4.1's candidate source): per query, the entries in blocks of
  // `block_size` are scored by their block's max score; the block holding the query's newest
  // visible entry ((positions[t] + 1) / ratio - 1) is always kept; the top `topk_blocks` blocks
  // with a finite score are kept (ties: lowest block). bias F32 [T, S]: 0 kept, -inf dropped.
  virtual void candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio, int64_t topk_blocks,
                                int64_t block_size, Tensor& bias);
  // out I32 [T, k] = the k entries of highest finite score per row of scores F32 [T, S] (ties:
  // lowest index), -1 where fewer are finite.
  virtual void topk_finite(const Tensor& scores, Tensor& out);
  // --- V4.1's DSpark drafter (model/deepseek_v41/dspark.h): its Markov and confidence heads. ---
  // One step of the Markov head's sequential drafts: for block n, the sums s[v] = logits[n, step, v]
  // + bias[n, v] (bias undefined: no Markov head, s = logits) over ids v in [0, vocab); drafts[n, step]
  // = the id of the largest sum (lowest id on ties, NaN sums skipped; -1 when every sum is NaN) and
  // next[n] = max(drafts[n, step], 0) (the next step's previous token). logits F32 [N, B, V] (the
  // backbone's rows, block-major), bias F32 [N, V], drafts I32 [N, B] (only column `step` written),
  // next I32 [N]; 0 <= step < B, 1 <= vocab <= V.
  virtual void markov_argmax(const Tensor& logits, int64_t step, const Tensor& bias, int64_t vocab, Tensor& drafts,
                             Tensor& next);
  // The confidence head, P(draft accepted | the drafts before it were):
  //   out[t] = sigmoid(sum_j w[j] h[t, j] + sum_k w[H + k] e[t, k]);
  // h [T, H] and e [T, R] F32 or BF16 (e undefined: R = 0), w F32 [H + R], out F32 [T].
  virtual void dspark_confidence(const Tensor& h, const Tensor& e, const Tensor& w, Tensor& out);

  // --- sampling -------------------------------------------------------------
  // ids I32 [R] = argmax over logits [R, V] (lowest index wins ties).
  virtual void argmax(const Tensor& logits, Tensor& ids) = 0;
  // ids I32 [R]: row r sampled from logits [R, V] (F32) with row_params [R] (SampleRowParams
  // viewed as I32 [R, kSampleRowWords], on this backend's device) by the rule in
  // backend/sample_rule.h (temperature, min-p, top-k, top-p, Philox draw keyed by (seed,
  // stream, position); greedy rows are argmax). Every backend gives the same token bit for
  // bit; a row's token does not depend on the other rows. The default (backend/cpu/
  // sampling_rows.cpp) copies both to the host and runs the reference there.
  virtual void sample(const Tensor& logits, const Tensor& row_params, Tensor& ids);

  // --- speculative decoding with drafts in flight (backend/spec_rule.h; cpu/spec_fixup.cpp,
  // cuda/spec_fixup.cu; the defaults in backend.cpp throw): a verify step issued before the previous one's accepted counts are
  // read is fixed up on the device from them. All tensors I32, on this backend's device.
  // A verify step of S = accepted.numel() sequences with q tokens each (uniform, sequence s at
  // rows s * q ..): ids [>= S * q] its chosen tokens, tokens [>= S * q] its input tokens.
  // accepted[s] = spec_rule::accepted_count, last[s] = ids[s * q + accepted[s]].
  virtual void spec_accept(const Tensor& ids, const Tensor& tokens, int q, Tensor& accepted, Tensor& last);
  // MTP row selection: row = s * q + accepted[s]; out_ids[s] = ids[row], out_rows[s] = row,
  // for s < S = accepted.numel().
  virtual void spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, Tensor& out_ids,
                                Tensor& out_rows);
  // Moves a step laid out as if `assumed` drafts of the previous verify step were accepted by
  // delta_s = accepted[s] - assumed (SpecShift says what changes); sequences >= S (padding)
  // are untouched.
  virtual void spec_shift(const SpecShift& shift);

  // --- random (backend/random.h; CPU default in cpu/random.cpp, CUDA in cuda/) --------
  // Fills t (contiguous F32, BF16 or F8_E4M3) with element i = scale * random_uniform(seed, i),
  // u in [-1, 1), rounded to t's dtype (RNE, FP8 saturating). Every backend produces the
  // same bits, so random weights made on the device equal the host's. The default
  // implementation generates on the host in chunks and copies.
  virtual void fill_random(Tensor& t, uint64_t seed, float scale);

  // --- graphs (optional; CUDA) ------------------------------------------------
  // Ops issued between graph_capture_begin and graph_capture_end are recorded, not run;
  // graph_replay(id) runs them again on the same buffers. Run one step uncaptured first
  // (workspaces grow only outside a capture); no host<->device copy inside a capture.
  virtual bool supports_graphs() const { return false; }
  // Whether ops are being recorded into a graph now (no allocation, copy or wait may run).
  virtual bool capturing() const { return false; }
  virtual void graph_capture_begin() { fail(name(), " backend: graphs are not supported"); }
  virtual int graph_capture_end() { fail(name(), " backend: graphs are not supported"); }
  virtual void graph_replay(int graph_id) { fail(name(), " backend: graphs are not supported"); }
  virtual void graph_release(int graph_id) {}
  // Changes whenever the backend reallocates a scratch workspace: graphs captured before
  // then hold stale pointers and must be released (runner/).
  virtual uint64_t workspace_epoch() const { return 0; }

  // --- a second line of ops (optional; CUDA: a second stream, joined in graphs too) ------
  // Ops issued between side_begin() and side_end() start after everything issued before
  // side_begin() and may overlap the ops issued after side_end(), until side_join(): from
  // then on everything waits for them. The caller keeps the two lines independent (neither
  // touches a buffer the other writes; the backend's own scratch is per line, any op may run
  // on either). One side line at a time; each op's results are
  // the same as in issue order. Defaults: nothing to do (ops run in issue order).
  virtual void side_begin() {}
  virtual void side_end() {}
  virtual void side_join() {}

  // --- asynchronous steps (runner/; the defaults are synchronous, as the CPU is) -------
  // Host memory that copy_async may read or fill while the host goes on (CUDA: page-locked).
  // The tensor's device is CPU. Default: plain host memory (backend/backend.cpp).
  virtual DeviceBuffer alloc_host(DType dtype, const std::vector<int64_t>& dims);
  // copy() that may return before the transfer is done: host memory must come from
  // alloc_host and stay untouched until a fence recorded after the copy has been waited for.
  virtual void copy_async(const Tensor& src, Tensor& dst) { copy(src, dst); }
  // Marks the work issued so far; wait_fence(fence) returns once all of it has finished.
  virtual int64_t record_fence() { return 0; }
  virtual void wait_fence(int64_t fence) { (void)fence; }
};

// Bytes of one row of `channels` values packed in `kind`'s cache format (Backend::store_packed_rows).
int64_t packed_row_bytes(Backend::FakeQuant kind, int64_t channels);

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options = {});
// Throws unless x [T, heads, K], w [heads, N, K] and out [T, heads, N] fit gemm_heads
// (backend/cpu/gemm_heads.cpp; shared by the default and the CPU backend's own).
void check_gemm_heads(const Tensor& x, const Tensor& w, const Tensor& out);
// Returns nullptr when deepinfer was built without CUDA; throws when no device is usable.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options = {});

}  // namespace deepinfer
