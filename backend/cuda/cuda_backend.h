// CudaBackend: the op table on one NVIDIA GPU (Hopper first, sm_90a). Activations BF16
// (F32 accepted where noted), fp32 accumulation everywhere. One op family per .cu file,
// named as on the CPU side: elementwise.cu (embedding, norm, rope, activation, kv_copy,
// sampling), fused_mla.cu (rms_norm_pair, mla_rope_store), gemm.cu, mla_attention.cu, indexer.cu, moe.cu; this file's .cu has memory, copies,
// workspaces, random fill and graphs.
//
// Every kernel launch is checked; errors name the op and tensor shapes. Set
// DEEPINFER_CUDA_SYNC=1 to synchronize after each op so an asynchronous fault is
// reported by the op that caused it.
//
// Batch invariance (BackendOptions::batch_invariant): GEMMs (dense and grouped) always
// run the tensor-core tile kernel whose per-element K order is fixed (no cuBLASLt, no
// split-K); attention splits the KV length in fixed 64-token chunks combined in chunk
// order in every mode; norms and argmax use fixed-order block reductions in every mode.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"

namespace deepinfer::cuda {

struct GemmProblem;  // gemm_kernels.h

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;
  Device device() const override { return Device::CUDA; }
  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::BF16; }
  bool batch_invariant() const override { return options_.batch_invariant; }

  DeviceBuffer alloc(DType dtype, const std::vector<int64_t>& dims) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void synchronize() override;
  MemoryInfo memory_info() const override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                    Tensor& out) override;
  void gemm(const Tensor& x, const Weight& w, Tensor& out) override;
  void gemm_heads(const Tensor& x, const Tensor& w, Tensor& out) override;
  void gemm_pair(const Tensor& x, const Weight& w1, const Weight& w2, Tensor& out1,
                 Tensor& out2) override;
  void gemm_swiglu(const Tensor& gate_up, const Weight& w, Tensor& out, bool accumulate) override;
  void quantize_fp8_1x128(const Tensor& x, Tensor& q, Tensor& scales) override;
  void gemm_fp8_1x128(const Tensor& q, const Tensor& scales, const Weight& w, Tensor& out) override;
  void rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset,
            int rope_dim, bool interleave) override;
  void rms_norm_pair(const Tensor& x1, const Tensor& w1, Tensor& out1, const Tensor& x2,
                     const Tensor& w2, Tensor& out2, float eps) override;
  void mla_rope_store(Tensor& q, Tensor& kv_rows, const Tensor& positions, const Tensor& cos_sin,
                      int q_rope_offset, int kv_rope_offset, int rope_dim, bool interleave,
                      PagedKV& kv, Tensor& q_rope_out) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void kv_store(const Tensor& rows, PagedKV& kv) override;
  void mla_attention_paged(const Tensor& q, const PagedKV& kv, float softmax_scale, int v_dim,
                           Tensor& out) override;
  void mla_attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& query_start, int num_seqs, float softmax_scale,
                             Tensor& out) override;
  // DeepSeek sparse attention (V3.2): layer_norm in elementwise.cu, the indexer in indexer.cu,
  // the sparse MLA forms in mla_attention.cu.
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  Tensor& out) override;
  void indexer_scores(const Tensor& q, const Tensor& weights, const PagedKV& kv, float scale,
                      Tensor& scores) override;
  void indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) override;
  // V4's CSA form (indexer.cu): scores of the visible compressed keys, then the top-k.
  void indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                    int ratio, float softmax_scale, float weights_scale, Tensor& out) override;
  void mla_attention_prefill_context(const Tensor& q, const Tensor& k, const Tensor& v, const PagedKV& kv,
                                     float softmax_scale, Tensor& out) override;
  void kv_gather(const PagedKV& kv, Tensor& rows) override;
  void mla_attention_paged_sparse(const Tensor& q, const PagedKV& kv, const Tensor& indices,
                                  float softmax_scale, int v_dim, Tensor& out) override;
  void mla_attention_prefill_sparse(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& query_start, int num_seqs, const Tensor& indices,
                                    float softmax_scale, Tensor& out) override;
  void moe_routing(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                   Tensor& topk_ids, Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                   const std::vector<ExpertWeights>& experts, Tensor& out) override;
  // DeepSeek-V4 (issue 16): hyper_connection.cu, v4_routing.cu (routing, clamped SwiGLU; the
  // clamped experts run moe_experts' path in moe.cu), sink_attention.cu, compressor.cu.
  void hc_pre(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
              const HyperConnectionParams& params, Tensor& collapsed, Tensor& post, Tensor& comb) override;
  void hc_post(const Tensor& streams, const Tensor& f, const Tensor& post, const Tensor& comb,
               Tensor& out) override;
  void hc_head(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
               const HyperConnectionParams& params, Tensor& out) override;
  void moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias, const Tensor& hash_ids, int top_k,
                                 float scaling, Tensor& topk_ids, Tensor& topk_weights) override;
  void silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) override;
  void moe_experts_clamped(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                           const std::vector<ExpertWeights>& experts, float limit, Tensor& out) override;
  void sink_attention(const Tensor& q, const Tensor& kv, const Tensor& indices, const Tensor& sinks,
                      float scale, Tensor& out) override;
  void compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                       const Tensor& prior_kv, const Tensor& prior_gate, Tensor& out) override;
  void compressor_pool_rows(const Tensor& kv, const Tensor& gate, const Tensor& ape, const Tensor& row_ids,
                            int ratio, bool overlap, Tensor& out) override;
  void v4_decode_rows(const Tensor& keys, const Tensor& rows_in, const Tensor& table, const V4RowRule& rule,
                      Tensor& slots, Tensor& index) override;  // v4_rows.cu
  // DeepSeek-V4.1: fake_quant.cu (the cache formats), hyper_connection.cu (hc_mix, hc_collapse),
  // engram.cu (engram_gate, embedding_fp8_rows), indexer.cu (scores, candidate blocks, top-k).
  void fake_quant(Tensor& x, FakeQuant kind) override;
  void store_packed_rows(const Tensor& x, FakeQuant kind, const PagedKV& kv) override;
  void gather_packed_rows(const Tensor& ids, const Tensor& cache, FakeQuant kind, Tensor& out) override;
  void hc_mix(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
              const HyperConnectionParams& params, Tensor& pre, Tensor& post, Tensor& comb) override;
  void hc_collapse(const Tensor& streams, const Tensor& pre, Tensor& out) override;
  void engram_gate(const Tensor& streams, const Tensor& kv, const Tensor& weight, float eps, Tensor& out) override;
  void embedding_fp8_rows(const Tensor& ids, const Tensor& table, const Tensor& scales, Tensor& out) override;
  void indexer_scores_visible(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                              int ratio, float softmax_scale, float weights_scale, Tensor& scores) override;
  void candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio, int64_t topk_blocks,
                        int64_t block_size, Tensor& bias) override;
  void topk_finite(const Tensor& scores, Tensor& out) override;
  // dspark.cu: the DSpark drafter's Markov argmax and confidence head.
  void markov_argmax(const Tensor& logits, int64_t step, const Tensor& bias, int64_t vocab, Tensor& drafts,
                     Tensor& next) override;
  void dspark_confidence(const Tensor& h, const Tensor& e, const Tensor& w, Tensor& out) override;
  void moe_combine(const Tensor& y, const Tensor& pos, const Tensor& topk_weights, Tensor& out) override;
  void argmax(const Tensor& logits, Tensor& ids) override;
  void sample(const Tensor& logits, const Tensor& row_params, Tensor& ids) override;  // sampling.cu
  void fill_random(Tensor& t, uint64_t seed, float scale) override;
  // Speculative decoding's fix-ups (spec_fixup.cu).
  void spec_accept(const Tensor& ids, const Tensor& tokens, int q, Tensor& accepted, Tensor& last) override;
  void spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, Tensor& out_ids, Tensor& out_rows) override;
  void spec_shift(const SpecShift& shift) override;

  void side_begin() override;
  void side_end() override;
  void side_join() override;

  bool supports_graphs() const override { return true; }
  void graph_capture_begin() override;
  int graph_capture_end() override;
  void graph_replay(int graph_id) override;
  void graph_release(int graph_id) override;
  uint64_t workspace_epoch() const override { return workspace_epoch_; }
  bool capturing() const override;
  DeviceBuffer alloc_host(DType dtype, const std::vector<int64_t>& dims) override;
  void copy_async(const Tensor& src, Tensor& dst) override;
  int64_t record_fence() override;
  void wait_fence(int64_t fence) override;

  // --- for the op files -------------------------------------------------------
  cudaStream_t stream() const { return stream_; }
  void* native_stream() override { return stream_; }
  int num_sms() const { return num_sms_; }
  // Checks the launch just issued (and, with DEEPINFER_CUDA_SYNC=1, its completion).
  void check_launch(const char* op, const std::string& shapes);
  // Scratch device memory of at least num_bytes for `slot` (grows outside captures only;
  // contents are not kept across growth). Slots let one op hold several buffers; the side line
  // has its own set.
  enum Slot { kSlotGemmA, kSlotGemmW, kSlotAttn, kSlotAttnStats, kSlotMoeIndex, kSlotMoeHidden,
              kSlotMoeAct, kSlotMoeOut, kSlotMoeGather, kSlotSwigluAct, kSlotSwigluOut, kSlotSample, kSlotV4Scores,
              kSlotV41, kSlotCount };
  void* scratch(Slot slot, size_t num_bytes, const char* op);
  // Launches the grouped/dense GEMM described by p (gemm.cu); `op` names it in errors.
  void launch_gemm(const GemmProblem& p, const char* op, bool prefer_gemv);
  // Launches p on the shared-memory pipeline kernel (gemm_pipe.cu: grouped experts or the dense
  // form) with the stages of its weight kind; false (nothing launched) when it does not take p.
  bool launch_pipe(const GemmProblem& p, const char* op, const std::string& shapes);
  // Device table of expert weight pointers (built once per experts vector, cached).
  struct ExpertTable {
    DeviceBuffer ptrs;  // 6 * E pointers: gate w, up w, down w, gate s, up s, down s
    int num_experts = 0;
  };
  const ExpertTable& expert_table(const std::vector<ExpertWeights>& experts);
  // Raises a kernel's dynamic shared-memory limit once (not again inside graph captures).
  void set_smem_limit(const void* kernel, size_t num_bytes, const char* op);

 private:
  // out rows (ldo) = x rows (ldx, BF16) · W^T (BF16) through cuBLASLt; false when no
  // algorithm fits (alignment), so the caller falls back to the own kernels.
  bool cublaslt_gemm(const void* x, int64_t ldx, int64_t M, const Weight& w, void* out,
                     int64_t ldo, DType out_dtype);
  // moe_experts and moe_experts_clamped (moe.cu): limit = +inf is the plain SwiGLU.
  void routed_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                      const std::vector<ExpertWeights>& experts, float limit, Tensor& out, const char* op);
  // routed_experts for packed FP4 e2m1 experts with E8M0 scales per 32 along K (moe_fp4.cu).
  void moe_experts_fp4(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                       const std::vector<ExpertWeights>& experts, float limit, Tensor& out, const char* op);
  // The packed FP4 expert weights' shapes and dtypes (moe_fp4.cu); clear errors otherwise.
  static void check_fp4_experts(const std::vector<ExpertWeights>& experts, int64_t H, int64_t I, const char* op);
  // Routed experts with FP4 or FP8 weights on the tensor-core grouped GEMM of moe_qgemm.cu, called by
  // routed_experts after the permutation (row_token, offsets, tiles of tile_rows 64 or 128 rows,
  // all on the device): gate | up, SiLU-mul (clamped at a finite limit), down. x BF16 rows (lda).
  // Returns the down outputs F32 [P, H] in permuted order for the combine.
  float* moe_experts_qgemm(const void* x, int64_t lda, int P, int E, int64_t H, int64_t I, int w_kind,
                           const void* const* ptrs, const int32_t* row_token, const int32_t* offsets,
                           const int2* tiles, const int32_t* num_tiles, int tile_rows, int max_tiles, float limit,
                           const std::string& shapes);
  void launch_qgemm(const GemmProblem& p, int halves, const char* op, const std::string& shapes);
  // gemm() on FP8 weights with blocks other than 128x128 (kWeightFP8Fold): a BF16 [M, K] rows
  // (stride lda) into ov.
  void gemm_fp8_fold(const void* a, int64_t lda, int64_t M, const Weight& w, const RowView& ov);
  // mla_attention_paged (indices == nullptr) and mla_attention_paged_sparse (mla_attention.cu).
  void paged_attention(const Tensor& q, const PagedKV& kv, const Tensor* indices,
                       float softmax_scale, int v_dim, Tensor& out, const char* op);
  // Device-to-device copy of equal-shaped tensors with any strides (elementwise.cu).
  void copy_strided(const Tensor& src, Tensor& dst);
  // True when a dense GEMM of M rows with this weight would run on the stream kernel (the
  // choice gemm() makes), so a fused form on that kernel gives the same bits per row.
  bool dense_rows_on_stream(int64_t M, const Weight& w) const;
  // True when a dense GEMM of M rows with this weight goes to the pipeline kernel's dense form
  // (pipe_dense_fp8_ / pipe_dense_bf16_, at most pipe_max_tokens_ rows, not batch-invariant).
  bool dense_rows_on_pipe(int64_t M, const Weight& w) const;
  // FP8 weight with the 128x128 block scales the kernels read (else false).
  static bool fp8_scales_fit(const Weight& w);
  // FP8 activations (fp8_gemm.cu): out = x · W^T for an FP8 weight as 1x128 quantization of x
  // + cuBLASLt's block-scaled FP8 x FP8 GEMM, when enabled for M rows and cuBLASLt takes the
  // shape; false otherwise (the caller keeps W8A16). x BF16 rows (ldx), out rows of ov.
  bool gemm_fp8_act(const void* x, int64_t ldx, int64_t M, const Weight& w, const RowView& ov);
  // cuBLASLt FP8 GEMM on quantized rows (q [M, K], act_scales [ceil(K/128), M]); false when
  // no algorithm fits. q == nullptr: only finds (and caches) the plan. When ceil(K/128) % 4 != 0
  // the weight scales are copied with rows padded to a multiple of 4 into w_scale_space
  // (ceil(N/128) x that many floats).
  bool cublaslt_fp8(const void* q, const float* act_scales, int64_t M, const Weight& w, void* out,
                    int64_t ldo, DType out_dtype, float* w_scale_space);
  // Routed experts in prefill on CUTLASS's Hopper grouped GEMMs (moe_cutlass.cu), called by
  // moe_experts after the permutation (row_token [P], offsets [E + 1] on the device) for BF16
  // experts: gathers x's rows (BF16, ldx a multiple of 8, 16-byte aligned) per expert, runs
  // gate | up, SiLU-mul and down; returns the down outputs F32 [P, H] in permuted order (row
  // entry_pos[i] for pair i) for the combine. cutlass_moe_fits: shapes it takes.
  static bool cutlass_moe_fits(int64_t H, int64_t I);
  float* moe_experts_cutlass(const void* x, int64_t ldx, int P, int E, int64_t H, int64_t I,
                             const void* const* w_ptrs, const int32_t* row_token, const int32_t* offsets,
                             const std::string& shapes);
  struct CutlassMoe;  // moe_cutlass.cu: group arrays, workspaces, initialized GEMMs per E
  CutlassMoe& cutlass_moe(int E);
  std::map<int, std::shared_ptr<CutlassMoe>> cutlass_moe_;
  // The same for FP8 experts (cutlass_fp8.cu): x's rows gathered and quantized 1x128 per
  // expert, CUTLASS's blockwise-scaled FP8 grouped GEMMs (the weights' 128x128 scales), the
  // SwiGLU quantized 1x128 again; F32 [P, H] in permuted order for the combine.
  // cutlass_moe_fp8_fits: shapes and scales it takes (H, I multiples of 16, 128x128 scales).
  static bool cutlass_moe_fp8_fits(const std::vector<ExpertWeights>& experts);
  float* moe_experts_cutlass_fp8(const void* x, int64_t ldx, int P, int E, int64_t H, int64_t I,
                                 const void* const* ptrs, const int32_t* row_token, const int32_t* offsets,
                                 const std::string& shapes);
  struct CutlassMoeFp8;  // cutlass_fp8.cu: group arrays, workspaces, initialized GEMMs per E
  CutlassMoeFp8& cutlass_moe_fp8(int E);
  std::map<int, std::shared_ptr<CutlassMoeFp8>> cutlass_moe_fp8_;
  struct Fp8State;  // fp8_gemm.cu: settings and cuBLASLt plans
  Fp8State& fp8_state();
  std::shared_ptr<Fp8State> fp8_;

  BackendOptions options_;
  int device_ = 0;
  int num_sms_ = 0;
  bool sync_each_op_ = false;
  // CudaOptions::stream_gemm false: no weight-streaming MMA kernel (few-row GEMMs on the
  // gemv, as in v1); stream_max_rows: dense BF16 GEMMs with at most this many rows use it
  // instead of cuBLASLt (default 0: cuBLASLt won 1.8-2.2% at bs1 / bs8, bench/NOTES.md v32c).
  bool stream_gemm_ = true;
  int64_t stream_max_rows_ = 16;
  // CudaOptions::pipe_stages: chunk copies in flight per warp in the shared-memory-staged MoE
  // expert GEMM (gemm_pipe.cu: 2, 3, 4 or 8; 0 = the register-staged stream kernel). Default
  // 2 (H200, bench/NOTES session 3: bs1 +4.4%, bs8 +20.7% over the stream kernel; 4 and 8
  // stages gave fewer resident warps and less). FP8 experts too (pipe_fp8_; H200 2026-12-03:
  // bs1 +5.4%, bs8 +26% over the stream kernel, bench/NOTES.md v32c);
  // pipe_max_tokens: moe_experts calls of at most this many tokens use it (as many
  // resident blocks per SM as fit: a cap of 1 lost 10%, bench/NOTES.md). Default 64 (H200
  // 2026-12-03, dec17: 16 tokens, the stream kernel above, was 1.34x / 1.44x slower at
  // batch 32 / 64 bf16, 1.35x / 1.43x FP8).
  int pipe_stages_ = 2;
  bool pipe_fp8_ = false;
  int64_t pipe_max_tokens_ = 64;
  // Dense few-row GEMMs (gemm, gemm_pair; not batch-invariant) of at most these many rows on the
  // pipeline kernel's dense form: FP8 (instead of the stream kernel), BF16 (instead of cuBLASLt).
  // Same bits as the stream kernel. CudaOptions::pdl: those launched as programmatic dependents
  // of the previous kernel, which triggers early (device_utils.cuh pdl_trigger / pdl_wait): they
  // stream their first weight chunks under it. (The grouped MoE gate|up launch stays plain: both
  // grouped pipes with PDL, waiting first, lost 2.4% in BF16 at batch 64, dec18; the down GEMM
  // is a dependent that streams before its wait, its tile list being older, moe18.) FP8 experts keep pipe_stages_ (4 stages for FP8 lost
  // 0.6-1.4% at batch 32 / 64 and were equal at 1 / 8, dec18).
  int64_t pipe_dense_fp8_rows_ = 32;
  int64_t pipe_dense_bf16_rows_ = 8;
  bool pdl_ = true;
  // CudaOptions::moe_cutlass: routed BF16 experts in prefill (more than 16 rows per expert on
  // average, not batch-invariant) on CUTLASS's grouped GEMMs (the default) or the own
  // tensor-core tiles (false); moe_cutlass_tile 64 / 256 pins its tiles to 64x128 / 128x256
  // (0: 64x128 while the experts average fewer than 128 rows, else 128x256). H200 (bench/NOTES.md, cutlass): prefill 512 / 4096 2.10x / 1.64x the own tiles.
  bool moe_cutlass_ = true;
  int moe_cutlass_tile_ = 0;
  // CudaOptions::moe_cutlass_fp8: routed FP8 experts in prefill (more than 16 rows per expert on
  // average, not batch-invariant, not clamped) on cutlass_fp8.cu (tiles by moe_cutlass_tile:
  // 64 pins 64x128, 256 the 128x128 ones; 0: 64x128 below 128 rows per expert).
  bool moe_cutlass_fp8_ = true;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  size_t lt_workspace_bytes_ = 0;
  // The side line (Backend::side_begin): while it is open, stream_ and lt_workspace_ are the
  // side stream and its own cuBLASLt workspace (swapped with these), so every op launches
  // there unchanged. side_fork_ / side_done_: the events that start and join it.
  cudaStream_t side_stream_ = nullptr;
  void* side_lt_workspace_ = nullptr;
  cudaEvent_t side_fork_ = nullptr, side_done_ = nullptr;
  bool on_side_ = false, side_pending_ = false;
  void side_swap();
  struct Scratch {
    void* ptr = nullptr;
    size_t num_bytes = 0;
  };
  Scratch scratch_[kSlotCount];
  // The side line's own slots (side_swap exchanges them with scratch_): an op on the side line
  // never shares scratch with one running at the same time on the main line (a FP8 prefill once
  // crashed when both lines used kSlotGemmW).
  Scratch side_scratch_[kSlotCount];
  // cuBLASLt algorithm per (M, N, K, ldx, ldo, out dtype); nullopt-like flag when none fits.
  struct LtPlan {
    bool ok = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int>, LtPlan> lt_plans_;
  std::map<std::vector<const void*>, ExpertTable> expert_tables_;  // by the 6E pointers
  std::vector<cudaGraphExec_t> graphs_;
  uint64_t workspace_epoch_ = 0;  // bumped by each scratch reallocation
  // Fences are events recorded on stream_ in a ring: fence f uses events_[f % size]. Waiting
  // on a fence whose event was recorded again waits for later work, never less.
  std::vector<cudaEvent_t> fence_events_;
  int64_t next_fence_ = 0;
  std::map<const void*, size_t> smem_limits_;
};

}  // namespace deepinfer::cuda
