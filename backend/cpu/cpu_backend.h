// CpuBackend: the reference implementation of the op table (backend/backend.h).
// Each op family lives in its own file (embedding.cpp, norm.cpp, gemm.cpp, ...);
// this header is private to backend/cpu and the CPU op unit tests.
//
// Conventions of the CPU side: activations are F32; weights F32, BF16 or F8_E4M3
// (block-scaled); every reduction runs in fp32 in an order fixed by the problem
// shape of one row/token, never by how many rows share the call, so every op is
// batch-invariant by construction (batch_invariant() only reports the option).
#pragma once
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace deepinfer::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::F32; }
  bool batch_invariant() const override { return options_.batch_invariant; }

  DeviceBuffer alloc(DType dtype, const std::vector<int64_t>& dims) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void synchronize() override {}

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                    Tensor& out) override;
  void gemm(const Tensor& x, const Weight& w, Tensor& out) override;
  // All heads in one threaded loop (Backend's default runs one gemm, one loop, per head);
  // the same gemm_columns calls on the same column tiles, so the same bits.
  void gemm_heads(const Tensor& x, const Tensor& w, Tensor& out) override;
  // Both weights' column tiles in one threaded loop (the default runs two gemms, two loops);
  // the same gemm_columns calls on the same tiles, so the same bits.
  void gemm_pair(const Tensor& x, const Weight& w1, const Weight& w2, Tensor& out1,
                 Tensor& out2) override;
  void rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset,
            int rope_dim, bool interleave) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void kv_store(const Tensor& rows, PagedKV& kv) override;
  void mla_attention_paged(const Tensor& q, const PagedKV& kv, float softmax_scale, int v_dim,
                           Tensor& out) override;
  void mla_attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& query_start, int num_seqs, float softmax_scale,
                             Tensor& out) override;
  void moe_routing(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                   Tensor& topk_ids, Tensor& topk_weights) override;
  void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                   const std::vector<ExpertWeights>& experts, Tensor& out) override;
  void moe_combine(const Tensor& y, const Tensor& pos, const Tensor& topk_weights, Tensor& out) override;
  void argmax(const Tensor& logits, Tensor& ids) override;
  // Speculative decoding's fix-ups (spec_fixup.cpp).
  void spec_accept(const Tensor& ids, const Tensor& tokens, int q, Tensor& accepted, Tensor& last) override;
  void spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, Tensor& out_ids, Tensor& out_rows) override;
  void spec_shift(const SpecShift& shift) override;
  // DeepSeek sparse attention (norm.cpp, indexer.cpp, mla_attention.cpp).
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  Tensor& out) override;
  void indexer_scores(const Tensor& q, const Tensor& weights, const PagedKV& kv, float scale,
                      Tensor& scores) override;
  void indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) override;
  void mla_attention_prefill_context(const Tensor& q, const Tensor& k, const Tensor& v, const PagedKV& kv,
                                     float softmax_scale, Tensor& out) override;
  void kv_gather(const PagedKV& kv, Tensor& rows) override;
  void mla_attention_paged_sparse(const Tensor& q, const PagedKV& kv, const Tensor& indices,
                                  float softmax_scale, int v_dim, Tensor& out) override;
  void mla_attention_prefill_sparse(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& query_start, int num_seqs, const Tensor& indices,
                                    float softmax_scale, Tensor& out) override;

  ThreadPool& pool() { return *pool_; }

 private:
  BackendOptions options_;
  std::unique_ptr<ThreadPool> owned_pool_;  // when options.num_threads > 0
  ThreadPool* pool_ = nullptr;
};

// --- helpers shared by the op files -------------------------------------------

// A 2-D row view [rows, cols] with unit column stride and any row stride (elements).
struct Rows {
  char* base = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0, row_stride = 0;
  float* f32(int64_t r) const { return reinterpret_cast<float*>(base) + r * row_stride; }
  const char* bytes(int64_t r) const {
    return base + r * row_stride * static_cast<int64_t>(dtype_size(dtype));
  }
};
// Views `t` as rows of its last dimension: t must be 2-D with unit column stride, or
// have contiguous trailing dimensions after the first. `what` names the op argument.
Rows as_rows(const Tensor& t, const char* what);

// Throws unless t is on the CPU with the given dtype; `what` names the op argument.
void check_cpu(const Tensor& t, DType dtype, const char* what);
void check_cpu(const Tensor& t, const char* what);

// Converts n elements of a row of dtype F32/BF16/F8_E4M3 (unscaled) to float.
void row_to_float(const void* src, DType dtype, int64_t n, float* dst);
// dst[i] = fp8_e4m3(src[i]) * scale (branch-free decode; exact, as fp8_e4m3_to_float).
void fp8_row_to_float(const uint8_t* src, int64_t n, float scale, float* dst);

// Eight fp32 lanes (AVX2 with -march=x86-64-v3; emulated without it). Used inside inline
// functions only, never passed by value across a call, so the psabi note does not apply.
// (A function compiled for another ISA, e.g. gemm.cpp's AVX-512 paths, must not call these
// helpers with a v8f_lanes argument either: where the base build has no AVX (Debug), an
// out-of-line copy takes it in memory while the AVX-512 caller passes it in %ymm0, and the
// callee reads garbage. That is why those paths sum through hsum8_floats.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8f_lanes __attribute__((vector_size(32)));

inline v8f_lanes load8_lanes(const float* p) {
  v8f_lanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// The fixed horizontal sum of eight lanes: ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
inline float hsum8_floats(const float* v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
inline float hsum8_lanes(v8f_lanes v) {
  float f[8];
  std::memcpy(f, &v, sizeof(f));
  return hsum8_floats(f);
}
// acc + a * b in every lane, rounded once (fused), in every build: the AVX-512 paths use FMA
// instructions, so every path that must give their bits fuses too, explicitly, never through
// the compiler's contraction of `acc += a * b` (GCC contracts only when optimizing for an FMA
// target, so a Debug build got mul + add there: other bits than the AVX-512 paths').
inline v8f_lanes fma8_lanes(v8f_lanes a, v8f_lanes b, v8f_lanes acc) {
#if defined(__FMA__)
  return __builtin_ia32_vfmaddps256(a, b, acc);
#else
  for (int i = 0; i < 8; ++i) acc[i] = std::fma(a[i], b[i], acc[i]);
  return acc;
#endif
}

// Dot product of a and b with eight fp32 lanes (lane i takes elements i, i+8, ...)
// summed in a fixed order: the result depends only on the two vectors. Inline: attention
// calls it once per (query, key) pair.
inline float dot8(const float* a, const float* b, int64_t n) {
  v8f_lanes acc = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) acc = fma8_lanes(load8_lanes(a + k), load8_lanes(b + k), acc);
  for (int64_t i = 0; k + i < n; ++i) acc[i] = std::fma(a[k + i], b[k + i], acc[i]);  // tail into lanes 0..
  return hsum8_lanes(acc);
}
// dot8(a, b_j, n) for four b rows at once (n a multiple of 8): the same four results.
inline void dot8x4_rows(const float* a, const float* b0, const float* b1, const float* b2,
                        const float* b3, int64_t n, float* out4) {
  v8f_lanes c0 = {}, c1 = {}, c2 = {}, c3 = {};
  for (int64_t k = 0; k < n; k += 8) {
    const v8f_lanes av = load8_lanes(a + k);
    c0 = fma8_lanes(av, load8_lanes(b0 + k), c0);
    c1 = fma8_lanes(av, load8_lanes(b1 + k), c1);
    c2 = fma8_lanes(av, load8_lanes(b2 + k), c2);
    c3 = fma8_lanes(av, load8_lanes(b3 + k), c3);
  }
  out4[0] = hsum8_lanes(c0);
  out4[1] = hsum8_lanes(c1);
  out4[2] = hsum8_lanes(c2);
  out4[3] = hsum8_lanes(c3);
}
// dot8x4_rows for three rows a[0..2] at once (12 accumulators; each b vector loaded once for
// three FMAs): out[r][j] = dot8(a[r], b[j], n), the same bits.
inline void dot8x4x3_rows(const float* const* a, const float* const* b, int64_t n, float* const* out) {
  v8f_lanes c[3][4] = {};
  for (int64_t k = 0; k < n; k += 8) {
    const v8f_lanes a0 = load8_lanes(a[0] + k), a1 = load8_lanes(a[1] + k), a2 = load8_lanes(a[2] + k);
    for (int j = 0; j < 4; ++j) {
      const v8f_lanes v = load8_lanes(b[j] + k);
      c[0][j] = fma8_lanes(a0, v, c[0][j]);
      c[1][j] = fma8_lanes(a1, v, c[1][j]);
      c[2][j] = fma8_lanes(a2, v, c[2][j]);
    }
  }
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 4; ++j) out[r][j] = hsum8_lanes(c[r][j]);
}
#pragma GCC diagnostic pop

// y[0..n) += alpha * x[0..n)  (elementwise, fused: y[i] = fma(alpha, x[i], y[i])).
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(alpha, x[i], y[i]);
}
// axpy with a0, x0 then a1, x1, ... a3, x3, each element updated in that order: the bits of
// four axpy calls, with y loaded and stored once.
inline void axpy4(const float* alpha, const float* x0, const float* x1, const float* x2,
                  const float* x3, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = y[i];
    v = std::fma(alpha[0], x0[i], v);
    v = std::fma(alpha[1], x1[i], v);
    v = std::fma(alpha[2], x2[i], v);
    v = std::fma(alpha[3], x3[i], v);
    y[i] = v;
  }
}

// AVX-512 (F, BW, VL, DQ) at run time: where the CPU has it, the kernels below and gemm's
// one/two-row paths take 16-lane forms that keep every lane and every sum of the 8-lane forms
// (the same bits). simd_avx512.cpp.
bool cpu_has_avx512();
// dot8x4x3_rows with two b rows per 16-lane register: the same twelve results, bit for bit.
void dot8x4x3_rows_avx512(const float* const* a, const float* const* b, int64_t n, float* const* out);
// axpy4 in 16 lanes (elementwise, the same fused steps per element): the same bits.
void axpy4_avx512(const float* alpha, const float* x0, const float* x1, const float* x2,
                  const float* x3, float* y, int64_t n);
// out[r][i] = dot8(q_r, keys[i], n) for six queries r and four keys, the queries given
// pair-interleaved per 8-float chunk in `qpairs` ([3][n / 8][16]: q_2p's chunk, then q_2p+1's);
// n a multiple of 8. The bits of dot8x4_rows per query.
void dot8x4_qpairs_avx512(const float* qpairs, const float* const* keys, int64_t n, float* const* out);
// axpy4_avx512 on up to three y rows (rows <= 3) sharing x0..x3, alpha[r] for y[r]: the bits of
// one axpy4_avx512 per row.
void axpy4_rows_avx512(const float* const* alpha, int rows, const float* x0, const float* x1,
                       const float* x2, const float* x3, float* const* y, int64_t n);

// Single-threaded blocked GEMM over output columns [n_begin, n_end):
// out[m, n] = sum_k x[m, k] * W[n, k]. Used by gemm() and by the MoE experts.
// Up to 2 x rows run the direct path (weights converted in registers), more the buffered one
// (each weight block converted once into a buffer and reused by every row); both give the
// same bits, so a row's result does not depend on how many rows share the call.
void gemm_columns(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                  int64_t n_end);
// The buffered path alone, for any number of rows (tests compare the two paths bitwise): on
// CPUs with AVX-512 its 16-lane form (two weight rows per register, up to eight x rows per
// weight load), elsewhere the 8-lane form below; the same bits.
void gemm_columns_buffered(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                           int64_t n_end);
void gemm_columns_buffered_8lane(const Rows& x, const Weight& w, const Rows& out, int64_t n_begin,
                                 int64_t n_end);
// Checks a Weight's dtype, scales and shape; `what` names it in the message.
void check_weight(const Weight& w, int64_t in_features, const char* what);
// Threaded GEMM on `pool`: splits the output columns into fixed tiles.
void gemm_threaded(ThreadPool& pool, const Rows& x, const Weight& w, const Rows& out);
// Several GEMMs in one threaded loop over all their column tiles (the tiles gemm_threaded
// cuts, so the same bits as one gemm_threaded per job): fewer fork/joins for small GEMMs.
struct GemmJob {
  Rows x;
  const Weight* w = nullptr;
  Rows out;
};
void gemm_threaded_many(ThreadPool& pool, const std::vector<GemmJob>& jobs);

// --- paged attention addressing (mla_attention.cpp; also the indexer's key cache) ---------

// A [T, H, D] F32 view with a contiguous last dimension and any other strides.
struct Heads3 {
  float* base = nullptr;
  int64_t T = 0, H = 0, D = 0, st = 0, sh = 0;
  float* at(int64_t t, int64_t h) const { return base + t * st + h * sh; }
};
Heads3 heads3(const Tensor& x, const char* what);

// Checks query_start [num_seqs + 1] (monotone, from 0 to num_tokens) and returns the
// sequence of every token.
std::vector<int32_t> token_seqs(const Tensor& query_start, int num_seqs, int64_t num_tokens,
                                const char* op);

// A checked PagedKV (cache contiguous F32/BF16 [blocks, block_size, row_dim], one block table
// row and seq_len per sequence, every block id in range) over `num_tokens` query tokens.
struct PagedView {
  std::vector<int32_t> seq_of;  // [T] sequence of each token
  const int32_t* qs = nullptr;
  const int32_t* lens = nullptr;
  const int32_t* tables = nullptr;
  int64_t max_blocks = 0, block_size = 0, row_dim = 0;
  // Context of token t: positions [0, ctx(t)) (causal).
  int64_t ctx(int64_t t) const {
    const int s = seq_of[t];
    return lens[s] - (qs[s + 1] - qs[s]) + (t - qs[s]) + 1;
  }
  int64_t slot(int64_t t, int64_t pos) const {
    return tables[seq_of[t] * max_blocks + pos / block_size] * block_size + pos % block_size;
  }
};
PagedView check_paged(const PagedKV& kv, int64_t num_tokens, const char* op);

// Per-thread scratch vector of at least n floats (reused across calls).
float* scratch_floats(int slot, size_t n);

}  // namespace deepinfer::cpu
