// GemmProblem: one launch of out = A · W^T, dense or grouped (MoE experts), read by the
// kernels in gemm.cu. Plain data so it can be passed to a kernel by value.
//
// Rows live in a "problem row space" p in [0, M) (dense) or [0, group_offsets[G]) (grouped:
// group g owns rows [group_offsets[g], group_offsets[g+1]) ). Row p reads A row a_rows[p]
// (or p when a_rows is null) and writes C row p.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace deepinfer::cuda {

// kWeightFP4: e2m1 packed two per byte with E8M0 scale bytes per 32 along K (moe_qgemm.cu only).
// kWeightFP8Fold: e4m3 with F32 scales per block_n x block_k block (block_k % 16 == 0; V4.1's
// 32x32 E8M0 blocks), each value converted to BF16(e4m3 x scale) before the MMA: exact for
// power-of-two scales, else the one rounding DeviceUploader's BF16 dequantization made
// (dense gemm only: gemm_stream.cu and moe_qgemm.cu's dense form).
enum WeightKind : int { kWeightBF16 = 0, kWeightFP8 = 1, kWeightFP4 = 2, kWeightFP8Fold = 3 };

struct GemmProblem {
  const void* a = nullptr;  // BF16 rows, K contiguous, row stride lda (elements)
  int64_t lda = 0;
  const int* a_rows = nullptr;  // optional gather [rows]
  int M = 0;                    // dense row count
  // Grouped: device arrays; group_offsets [G + 1], w_ptrs / s_ptrs [G].
  const int* group_offsets = nullptr;
  int num_groups = 1;
  int max_rows = 0;  // upper bound of the total rows (host-known: T * top_k)
  const void* const* w_ptrs = nullptr;
  const float* const* s_ptrs = nullptr;
  // Dense weight (when w_ptrs is null).
  const void* w = nullptr;  // [N, K] row-major (BF16 or FP8 e4m3)
  const float* s = nullptr;  // FP8 scale_inv [ceil(N/128), ceil(K/128)]
  int w_kind = kWeightBF16;
  int N = 0, K = 0;
  int scale_cols = 0;  // ceil(K / 128); kWeightFP8Fold: ceil(K / block_k)
  int block_n = 128, block_k = 128;  // kWeightFP8Fold's scale blocks
  void* c = nullptr;   // out rows, row stride ldc; F32 or BF16
  int64_t ldc = 0;
  int c_bf16 = 1;
  // Grouped tile schedule for the tensor-core kernel (device): tiles[i] = (group, row0),
  // num_tiles[0] = count. Built by moe.cu for the chosen rows-per-tile.
  // Null tiles (moe_qgemm.cu's dense form): block x takes rows [x * tile_rows, +tile_rows) of M.
  const int2* tiles = nullptr;
  const int* num_tiles = nullptr;
  int tile_rows = 0;  // rows per tile that `tiles` was built for
  int max_tiles = 0;  // grid size bound for `tiles`
  // Per-head batched form (gemm_heads; stream kernel only): head h reads A at
  // a + h * a_head_stride, W at w + h * w_head_stride and writes C at c + h * c_head_stride
  // (all in elements). 0 = not batched.
  int heads = 0;
  int64_t a_head_stride = 0, w_head_stride = 0, c_head_stride = 0;
  // Paired grouped form (MoE gate | up in one launch; stream kernel only): output columns
  // [0, n_half) use w_ptrs / s_ptrs, [n_half, N) use w2_ptrs / s2_ptrs (weight row n - n_half).
  const void* const* w2_ptrs = nullptr;
  const float* const* s2_ptrs = nullptr;
  int n_half = 0;
  // Paired dense form (gemm_pair; stream kernel only): columns [n_half, N) read w2 / s2
  // (weight row n - n_half) and, when c2 is set, go to c2 (column n - n_half, row stride ldc2).
  const void* w2 = nullptr;
  const float* s2 = nullptr;
  void* c2 = nullptr;
  int64_t ldc2 = 0;
  // Optional (grouped, stream kernel): the groups that have rows, in order, and their count
  // (device); the grid then spans min(num_groups, max_rows) groups instead of all.
  const int* active_groups = nullptr;
  const int* num_active_groups = nullptr;
  // Grouped gate | up pair (w_ptrs | w2_ptrs, N = 2 n_half) with SwiGLU in the epilogue
  // (pipeline kernel only, moe18): an item's first half of n8 tiles holds columns of the gate
  // weight and its second half the same columns of the up weight; c [rows, n_half] (ldc, BF16)
  // receives silu_mul's value of the two sums rounded to BF16, the bits that the pair's BF16
  // rows followed by silu_mul give.
  int swiglu = 0;
  // Grouped form on the pipeline kernel (moe18): the tile list (tiles, num_tiles) was written by
  // a kernel at least two launches back (pdl_launch.cuh's rule), so the kernel is launched as a
  // programmatic dependent that reads it and streams its first chunks of weights before its
  // wait (0: a plain launch that waits first).
  int tiles_early = 0;
};

// Weight-streaming tensor-core GEMM (gemm_stream.cu): mma.sync m16n8k16 with 16-byte weight
// and activation loads, fixed K split per (K) and no atomics, so a row's result does not
// depend on M, on the row's position or on the grouping (batch-invariant). Returns false
// (launching nothing) when the problem does not fit it (K % 64, alignment). pdl: launched as a
// programmatic dependent of the previous kernel (dense problems ask L2 for their first weight
// chunks before waiting for it).
bool stream_gemm_supported(const GemmProblem& p);
void launch_stream_gemm(const GemmProblem& p, cudaStream_t stream, bool pdl = false);
// The stream kernel's few-row form with each warp's whole weight share held in registers
// (gemm_stream.cu, gemm18; gemm_heads at decode): dense or per-head BF16 problems (no groups, no
// row gather, no pair) of at most 16 rows whose warps own at most 4 chunks of K (stream_kpw(K)
// <= 256: K = 64..256 or 256 x k_split(K)). As a programmatic dependent it loads every weight
// value before pdl_wait, then all of a row's activations at once: one memory round trip after the
// wait. Same bits as the stream kernel.
bool stream_resident_supported(const GemmProblem& p);
// Launches it when p fits and its grid fits one wave on num_sms SMs; false (nothing launched)
// otherwise.
bool launch_stream_resident(const GemmProblem& p, int num_sms, cudaStream_t stream, bool pdl);

// The same GEMM with the weights staged through shared memory by cp.async in a D-stage
// pipeline per warp, over a grid of about (SMs x resident blocks) blocks that walk the
// (row entry, 16-column tile) items (gemm_pipe.cu). Same bits as the stream kernel. Grouped
// problems with `tiles` built for tile_rows 16 (entries of at most 16 rows), or dense ones
// (no group_offsets, w_ptrs, tiles, a_rows; gemm_pair's w | w2 too): entries of 16 rows of M.
struct PipePlan {
  const void* kernel = nullptr;
  int stages = 2;    // 2, 3, 4 or 8 chunk copies in flight per warp
  int threads = 0;   // ks warps
  int kpw = 0;       // K values per warp
  size_t smem_bytes = 0;  // dynamic shared memory (the caller raises the kernel's limit)
  int64_t max_items = 0;  // grid bound: max_tiles x column tiles
};
bool pipe_gemm_supported(const GemmProblem& p);
// FP8 items are 32 columns wide (the same bits as 16: each column's products, order and split-K
// sum are unchanged; the activation loads and per-item bookkeeping shared by both halves).
PipePlan plan_pipe_gemm(const GemmProblem& p, int stages);
// As many blocks per SM as fit (fewer lost: bench/NOTES.md "MoE expert GEMM staged through shared memory").
// pdl: launched as a programmatic dependent of the previous kernel in the stream (the dense form
// streams its first weight chunks before waiting for it).
void launch_pipe_gemm(const GemmProblem& p, const PipePlan& plan, int num_sms, bool pdl, cudaStream_t stream);

// Grouped GEMM with FP4 / FP8 weights converted in the kernel (moe_qgemm.cu): the shapes it
// takes (N output columns, K, A row stride lda in elements).
bool qgemm_supported(int w_kind, int64_t N, int64_t K, int64_t lda);

// Rows per tile of the tensor-core kernel for a problem with about rows_per_group rows.
inline int tc_tile_rows(int64_t rows_per_group) { return rows_per_group > 48 ? 128 : 32; }

}  // namespace deepinfer::cuda
