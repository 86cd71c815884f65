// DeepSeek-V3.2's lightning indexer on CUDA (the reference: backend/cpu/indexer.cpp).
//  - indexer_scores: a block takes one query token and kScoreChunk context positions. The
//    chunk's keys (gathered from the paged key cache) and the token's q (every head) go to
//    shared memory, S[h, j] = q_h . k_j on tensor cores (WMMA bf16, fp32 accumulate, one fixed
//    K order per element), then score_j = sum_h (w_h * scale) * ReLU(S[h, j]) in ascending head
//    order, as the CPU sums. Positions at or past the token's context get -inf. A score depends
//    only on its token's q and weights and on the key: batch-invariant by construction.
//  - indexer_topk: one block per row (few long rows: first one block per slice of a row, each
//    keeping its slice's k best, then one per row over those candidates; topk_split). A radix select (4 passes of 8 bits over an order-keyed
//    copy of the score bits) finds the k-th best score; one pass in position order then writes
//    every position above it and the lowest-position ties at it, ascending: the CPU's total order
//    (higher score first, then lower position; NaN ranks as -inf, -0 equals +0). A context of at
//    most k positions keeps them all (-1 padded). The grid depends on the shapes only, so both
//    ops replay in CUDA graphs.
//  - V4.1: indexer_scores_visible is V4's score kernel alone (every visible score kept, -inf
//    past); topk_finite the radix select over a row for min(k, entries above -inf), written best
//    first; candidate_blocks a block-max kernel, topk_finite over the block scores and a bias fill.
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

using namespace nvcuda;

constexpr int kScoreChunk = 64;  // context positions per block
constexpr int kTopkThreadsHost = 512;  // = kTopkThreads (declared below with the top-k kernels)
constexpr int kScoreThreads = 256;

struct ScoreArgs {
  const bf16* q;  // [T, H, D] (row strides q_s0, q_s1)
  int64_t q_s0, q_s1;
  const float* w;  // [T, H] F32 (row stride w_s0)
  int64_t w_s0;
  const bf16* cache;  // [blocks, block_size, D]
  const int32_t* block_tables;
  int max_blocks, block_size;
  const int32_t* seq_lens;
  const int32_t* query_start;
  int num_seqs;
  int H, D;
  float scale;
  float* scores;  // [T, N] (row stride s_s0)
  int64_t s_s0;
  int N;
};

// How indexer_topk spreads few long rows over blocks (indexer_topk_slices_kernel): slices of
// slice_len positions (a multiple of the block's threads, >= 2k, about sqrt(N k), which balances
// the slice pass against the final pass over slices * k candidates) when the rows are fewer than
// a third of the SMs' worth and a row has more than 4k columns; else one block per row
// (slices 1). Depends on the shapes only (graph-stable); either way the same positions.
struct TopkSplit {
  int slices = 1;
  int slice_len = 0;
};
TopkSplit topk_split(int64_t rows, int64_t cols, int64_t k) {
  TopkSplit s;
  if (rows > 44 || cols <= 4 * k) return s;
  const int64_t want = std::max<int64_t>(2 * k, static_cast<int64_t>(std::sqrt(static_cast<double>(cols) * k)));
  s.slice_len = static_cast<int>((want + kTopkThreadsHost - 1) / kTopkThreadsHost * kTopkThreadsHost);
  s.slices = static_cast<int>((cols + s.slice_len - 1) / s.slice_len);
  return s;
}

__device__ __forceinline__ int pad16(int x) { return (x + 15) / 16 * 16; }

// grid (ceil(N / kScoreChunk), T). Shared memory: Q [Hp][Dp] bf16, K [kScoreChunk][Dp] bf16,
// S [Hp][kScoreChunk + 4] F32, w*scale [Hp] F32 (Hp, Dp: heads and dims padded to 16, rows + 8).
__global__ void __launch_bounds__(kScoreThreads) indexer_scores_kernel(ScoreArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDS = kScoreChunk + 4;
  const int Hp = pad16(a.H), Dk = pad16(a.D), Dp = Dk + 8;
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + Hp * Dp;
  float* S = reinterpret_cast<float*>(Ks + kScoreChunk * Dp);
  float* ws = S + Hp * LDS;
  const int t = blockIdx.y, c0 = blockIdx.x * kScoreChunk;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  int seq, pos;
  locate(a.query_start, a.seq_lens, a.num_seqs, t, &seq, &pos);
  const int ctx = pos + 1;
  float* out = a.scores + int64_t{t} * a.s_s0;
  if (c0 >= ctx) {  // the whole chunk lies past this token's context
    for (int j = tid; j < kScoreChunk && c0 + j < a.N; j += kScoreThreads) out[c0 + j] = -INFINITY;
    return;
  }
  // Rows of 8 bf16 (16 bytes) per lane; D % 8 == 0 and 16-byte aligned rows (host checks).
  auto load_row = [&](bf16* dst, const bf16* src, bool valid) {
    for (int c = lane * 8; c < Dk; c += 32 * 8) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (valid && c < a.D) v = *reinterpret_cast<const uint4*>(src + c);
      *reinterpret_cast<uint4*>(dst + c) = v;
    }
  };
  for (int h = warp; h < Hp; h += kScoreThreads / 32)
    load_row(Qs + h * Dp, a.q + int64_t{t} * a.q_s0 + int64_t{h < a.H ? h : 0} * a.q_s1, h < a.H);
  for (int j = warp; j < kScoreChunk; j += kScoreThreads / 32) {
    const int p = c0 + j;
    const bool valid = p < ctx;
    const int block = valid ? a.block_tables[int64_t{seq} * a.max_blocks + p / a.block_size] : 0;
    const int offset = valid ? p % a.block_size : 0;
    load_row(Ks + j * Dp, a.cache + (int64_t{block} * a.block_size + offset) * a.D, valid);
  }
  for (int h = tid; h < Hp; h += kScoreThreads) ws[h] = h < a.H ? a.w[int64_t{t} * a.w_s0 + h] * a.scale : 0.0f;
  __syncthreads();
  // S = Q · K^T: (Hp / 16) x (kScoreChunk / 16) fragments over the warps.
  constexpr int kColTiles = kScoreChunk / 16;
  const int num_frags = (Hp / 16) * kColTiles;
  for (int f = warp; f < num_frags; f += kScoreThreads / 32) {
    const int fm = f / kColTiles, fn = f % kColTiles;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int s = 0; s < Dk / 16; ++s) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, Qs + fm * 16 * Dp + s * 16, Dp);
      wmma::load_matrix_sync(fb, Ks + fn * 16 * Dp + s * 16, Dp);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(S + fm * 16 * LDS + fn * 16, acc, LDS, wmma::mem_row_major);
  }
  __syncthreads();
  for (int j = tid; j < kScoreChunk; j += kScoreThreads) {
    const int p = c0 + j;
    if (p >= a.N) continue;
    float s = -INFINITY;
    if (p < ctx) {
      s = 0.0f;
      for (int h = 0; h < a.H; ++h) {
        const float d = S[h * LDS + j];
        if (d > 0.0f) s += ws[h] * d;  // ReLU
      }
    }
    out[p] = s;
  }
}

// Order key of a score: larger key = better score; NaN ranks as -inf, -0 as +0 (the CPU's
// comparisons).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) v = -INFINITY;
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kTopkThreads = 512;

// Which positions of score row t a top-k ranks: V3.2's causal ones (the paged step's
// addressing), or V4's visible compressed entries min(S, (positions[t] + 1) / ratio).
struct TopkRows {
  const int32_t* query_start = nullptr;
  const int32_t* seq_lens = nullptr;
  int num_seqs = 0;
  const int32_t* positions = nullptr;  // V4
  int ratio = 1, S = 0;
};

// The k best of one list of a score row, by the total order of the header (higher score, then
// lower position), written to dst[0 .. k) in list order (= ascending position), -1 padded.
// List entry i (0 <= i < n) is position lo + i of `row`, or cand[i] when cand is given (a
// candidate list in ascending position order, -1 entries skipped). `all` (fewer than k valid
// entries, known by the caller): every valid one is kept. Called by every thread of a block of
// kTopkThreads; ends with the block synchronised.
struct TopkShared {
  int hist[257];  // bin 256: lanes outside the list or the current prefix
  uint32_t prefix;
  int need;
  int warp_gt[kTopkThreads / 32], warp_eq[kTopkThreads / 32];
};

__device__ void select_topk(const float* row, int lo, int n, const int32_t* cand, int k, bool all, int32_t* dst,
                            TopkShared& sh) {
  constexpr int kWarps = kTopkThreads / 32;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  auto position = [&](int i) { return i >= n ? -1 : cand != nullptr ? cand[i] : lo + i; };
  // Radix select of the k-th largest key: after each pass `prefix` holds its known high bits
  // and `need` how many keys with those bits still rank at or above it. `all`: prefix 0 (every
  // key is above or equal to it) with need k keeps every valid entry.
  uint32_t prefix = 0;
  int need = k;
  for (int shift = 24; shift >= 0 && !all; shift -= 8) {
    for (int i = tid; i < 257; i += kTopkThreads) sh.hist[i] = 0;
    __syncthreads();
    const uint32_t high = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);
    for (int i0 = 0; i0 < n; i0 += kTopkThreads) {
      const int j = position(i0 + tid);
      int bin = 256;
      if (j >= 0) {
        const uint32_t key = order_key(row[j]);
        if ((key & high) == prefix) bin = static_cast<int>((key >> shift) & 255u);
      }
      // One shared atomic per distinct bin of the warp (scores crowd into few bins).
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (lane == __ffs(peers) - 1 && bin < 256) atomicAdd(&sh.hist[bin], __popc(peers));
    }
    __syncthreads();
    if (tid == 0) {
      int above = 0, b = 255;
      for (; b > 0; --b) {
        if (above + sh.hist[b] >= need) break;
        above += sh.hist[b];
      }
      sh.prefix = prefix | (static_cast<uint32_t>(b) << shift);
      sh.need = need - above;
    }
    __syncthreads();
    prefix = sh.prefix;
    need = sh.need;
  }
  // prefix is the k-th key: the k - need keys above it are kept, and the `need` lowest
  // positions among the keys equal to it. In list order, the output slot of a kept entry is
  // (keys above before it) + min(ties before it, need).
  const uint32_t lanes_below = (1u << lane) - 1u;
  int gt_base = 0, eq_base = 0;
  for (int i0 = 0; i0 < n; i0 += kTopkThreads) {
    const int j = position(i0 + tid);
    const uint32_t key = j >= 0 ? order_key(row[j]) : 0u;
    const bool gt = j >= 0 && (all || key > prefix), eq = j >= 0 && !all && key == prefix;
    const unsigned gt_mask = __ballot_sync(0xffffffffu, gt), eq_mask = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) {
      sh.warp_gt[warp] = __popc(gt_mask);
      sh.warp_eq[warp] = __popc(eq_mask);
    }
    __syncthreads();
    int gt_before = gt_base + __popc(gt_mask & lanes_below), eq_before = eq_base + __popc(eq_mask & lanes_below);
    int gt_tile = 0, eq_tile = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) {
        gt_before += sh.warp_gt[w];
        eq_before += sh.warp_eq[w];
      }
      gt_tile += sh.warp_gt[w];
      eq_tile += sh.warp_eq[w];
    }
    if (gt || (eq && eq_before < need)) dst[gt_before + min(eq_before, need)] = j;
    gt_base += gt_tile;
    eq_base += eq_tile;
    __syncthreads();  // warp_gt / warp_eq are rewritten by the next tile
  }
  if (all)  // -1 after the kept entries
    for (int i = gt_base + tid; i < k; i += kTopkThreads) dst[i] = -1;
  __syncthreads();
}

// Causal context of score row t.
__device__ __forceinline__ int row_context(const TopkRows& rows, int t, bool by_score) {
  if (by_score) return min(rows.S, (rows.positions[t] + 1) / rows.ratio);
  int seq, pos;
  locate(rows.query_start, rows.seq_lens, rows.num_seqs, t, &seq, &pos);
  return pos + 1;
}

// The n_sel kept positions sel[0 .. n_sel) of a score row (any order) -> o[0 .. k) best first
// (higher score, then lower position), -1 padded. sel has room for k positions then k keys.
// Called by every thread of a block of kTopkThreads.
__device__ void write_best_first(const float* row, int32_t* sel, int n_sel, int k, int32_t* o) {
  const int tid = threadIdx.x;
  __syncthreads();
  uint32_t* keys = reinterpret_cast<uint32_t*>(sel + k);
  for (int i = tid; i < n_sel; i += kTopkThreads) keys[i] = order_key(row[sel[i]]);
  __syncthreads();
  for (int i = tid; i < k; i += kTopkThreads) {
    if (i >= n_sel) {
      o[i] = -1;
      continue;
    }
    const int p = sel[i];
    const uint32_t key = keys[i];
    int rank = 0;
    for (int j = 0; j < n_sel; ++j) rank += keys[j] > key || (keys[j] == key && sel[j] < p);
    o[rank] = p;
  }
}

// Top-k of few long rows over more blocks (V3.2 decode at batch 1: 128k positions would be one
// block's): grid (P, T), block (p, t) selects the k best of positions [p L, (p + 1) L) of row t
// (all of them when fewer) into cand[t, p, 0 .. k), ascending, -1 padded. The k best of a row are
// among its slices' k best, and the slices in order list them in ascending position: the final
// select (indexer_topk_kernel with cand) runs over P k candidates instead of the row.
__global__ void __launch_bounds__(kTopkThreads) indexer_topk_slices_kernel(const float* scores, int64_t ld,
                                                                          TopkRows rows, int k, int L,
                                                                          int32_t* cand) {
  __shared__ TopkShared sh;
  const int p = blockIdx.x, t = blockIdx.y, P = gridDim.x;
  const int ctx = row_context(rows, t, false);
  const int lo = p * L, n = max(0, min(ctx, lo + L) - lo);
  select_topk(scores + int64_t{t} * ld, lo, n, nullptr, k, n <= k, cand + (int64_t{t} * P + p) * k, sh);
}

// grid (T), kTopkThreads threads: row t of scores [T, ld] -> out[t, 0 .. k). kByScore (V4):
// the kept positions are written best first (higher score, then lower position), else in
// ascending position order; dynamic shared memory 8 k bytes when kByScore. cand (not kByScore):
// the row's candidates from indexer_topk_slices_kernel ([T, P k]), else null (the whole row).
template <bool kByScore>
__global__ void __launch_bounds__(kTopkThreads) indexer_topk_kernel(const float* scores, int64_t ld,
                                                                   TopkRows rows, int k, int32_t* out,
                                                                   const int32_t* cand = nullptr, int num_cand = 0) {
  extern __shared__ int32_t sel[];  // kByScore: [k] kept positions (ascending), then [k] their keys
  __shared__ TopkShared sh;
  const int t = blockIdx.x, tid = threadIdx.x;
  const int ctx = row_context(rows, t, kByScore);
  const float* row = scores + int64_t{t} * ld;
  int32_t* dst = kByScore ? sel : out + int64_t{t} * k;
  if (ctx <= k) {  // every causal position, then -1
    for (int j = tid; j < k; j += kTopkThreads) dst[j] = j < ctx ? j : -1;
    if (!kByScore) return;
  } else if (cand != nullptr) {  // more than k candidates: every slice of the row held some
    select_topk(row, 0, num_cand, cand + int64_t{t} * num_cand, k, false, dst, sh);
  } else {
    select_topk(row, 0, ctx, nullptr, k, false, dst, sh);
  }
  if (!kByScore) return;
  write_best_first(row, sel, min(ctx, k), k, out + int64_t{t} * k);
}

// V4.1's topk_finite: grid (T), kTopkThreads threads, dynamic shared memory 8 k bytes. Row t of
// scores [T, ld] (n columns): the min(k, finite) best of its entries above -inf (NaN ranks as
// -inf: the CPU's `score > -inf`), best first, -1 padded. The radix select of the n_sel-th best
// key over the whole row never reaches a -inf key while n_sel entries rank above it.
__global__ void __launch_bounds__(kTopkThreads) topk_finite_kernel(const float* scores, int64_t ld, int n, int k,
                                                                  int32_t* out) {
  extern __shared__ int32_t sel[];
  __shared__ TopkShared sh;
  __shared__ float red[32];
  const float* row = scores + int64_t{blockIdx.x} * ld;
  float count = 0.0f;
  for (int i = threadIdx.x; i < n; i += kTopkThreads) count += row[i] > -INFINITY ? 1.0f : 0.0f;
  count = block_sum(count, red);
  const int n_sel = min(k, static_cast<int>(count));
  if (n_sel > 0) select_topk(row, 0, n, nullptr, n_sel, false, sel, sh);
  write_best_first(row, sel, n_sel, k, out + int64_t{blockIdx.x} * k);
}

// candidate_blocks, step 1: grid (T), block scores [T, nb] = each block's max score (fmax: NaN
// skipped, as the CPU's std::fmax), +inf for the block of the query's newest visible entry.
__global__ void candidate_block_scores_kernel(const float* scores, int S, const int32_t* positions, int ratio,
                                              int block_size, int nb, float* blocks) {
  const int t = blockIdx.x;
  const float* row = scores + int64_t{t} * S;
  const int visible = (positions[t] + 1) / ratio;
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    float m = -INFINITY;
    for (int s = b * block_size; s < min(S, (b + 1) * block_size); ++s) m = fmaxf(m, row[s]);
    if (visible > 0 && (visible - 1) / block_size == b) m = INFINITY;
    blocks[int64_t{t} * nb + b] = m;
  }
}

// candidate_blocks, step 3: grid (T): bias row = -inf, then 0 over the chosen blocks' entries.
__global__ void candidate_bias_kernel(const int32_t* chosen, int kb, int S, int block_size, float* bias) {
  const int t = blockIdx.x;
  float* row = bias + int64_t{t} * S;
  for (int s = threadIdx.x; s < S; s += blockDim.x) row[s] = -INFINITY;
  __syncthreads();
  for (int j = 0; j < kb; ++j) {
    const int b = chosen[int64_t{t} * kb + j];
    if (b < 0) continue;
    for (int s = b * block_size + static_cast<int>(threadIdx.x); s < min(S, (b + 1) * block_size); s += blockDim.x)
      row[s] = 0.0f;
  }
}

// V4's indexer scores: grid (ceil(S / kV4Chunk), T), kV4Threads threads; warp w scores keys
// c0 + w, c0 + w + 8, ...: per head (ascending) the warp's q . key, ReLU, times softmax_scale
// and the head's weight * weights_scale, summed in head order. Keys past the token's visible
// count get -inf. Dynamic shared memory: the token's q as F32 [heads, d] and its head weights.
constexpr int kV4Chunk = 64;
constexpr int kV4Threads = 256;

struct V4ScoreArgs {
  const void* q;  // [T, heads, d]
  int q_kind;
  const void* keys;  // [S, d], or [T, S, d] (each query its own) when keys_per_query
  int k_kind;
  bool keys_per_query;
  const float* w;  // [T, heads]
  const int32_t* positions;
  int heads, d, S, ratio;
  float softmax_scale, weights_scale;
  float* scores;  // [T, S]
};

__global__ void __launch_bounds__(kV4Threads) v4_index_scores_kernel(V4ScoreArgs a) {
  extern __shared__ float qs[];
  float* ws = qs + a.heads * a.d;
  const int t = blockIdx.y, c0 = blockIdx.x * kV4Chunk, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int visible = min(a.S, (a.positions[t] + 1) / a.ratio);
  const int64_t k0 = a.keys_per_query ? int64_t{t} * a.S * a.d : 0;
  for (int i = tid; i < a.heads * a.d; i += kV4Threads) qs[i] = ld(a.q, int64_t{t} * a.heads * a.d + i, a.q_kind);
  for (int h = tid; h < a.heads; h += kV4Threads) ws[h] = a.w[int64_t{t} * a.heads + h] * a.weights_scale;
  __syncthreads();
  for (int j = warp; j < kV4Chunk; j += kV4Threads / 32) {
    const int s = c0 + j;
    if (s >= a.S) break;
    float total = -INFINITY;
    if (s < visible) {
      total = 0.0f;
      for (int h = 0; h < a.heads; ++h) {
        float dot = 0.0f;
        for (int i = lane; i < a.d; i += 32) dot += qs[h * a.d + i] * ld(a.keys, k0 + int64_t{s} * a.d + i, a.k_kind);
        dot = warp_sum(dot);
        total += fmaxf(dot, 0.0f) * a.softmax_scale * ws[h];
      }
    }
    if (lane == 0) a.scores[int64_t{t} * a.S + s] = total;
  }
}

}  // namespace

void CudaBackend::indexer_scores(const Tensor& q, const Tensor& weights, const PagedKV& kv,
                                 float scale, Tensor& scores) {
  const char* op = "indexer_scores";
  check_dtype(q, DType::BF16, "indexer_scores q");
  check_dtype(weights, DType::F32, "indexer_scores weights");
  check_dtype(kv.cache, DType::BF16, "indexer_scores key cache");
  check_dtype(scores, DType::F32, "indexer_scores scores");
  check_dtype(kv.block_tables, DType::I32, "indexer_scores block_tables");
  check_dtype(kv.seq_lens, DType::I32, "indexer_scores seq_lens");
  check_dtype(kv.query_start, DType::I32, "indexer_scores query_start");
  DI_CHECK(q.ndim == 3 && q.stride[2] == 1, op, ": q must be BF16 [T, heads, dim] with a contiguous "
           "last dimension, got ", q.describe());
  const int T = static_cast<int>(q.shape[0]), H = static_cast<int>(q.shape[1]);
  const int D = static_cast<int>(q.shape[2]);
  DI_CHECK(D % 8 == 0 && q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0 && D <= 512 && H <= 128, op,
           ": CUDA needs head_dim a multiple of 8 (<= 512), 16-byte aligned q rows and <= 128 heads, got ",
           q.describe());
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() && kv.cache.shape[2] == D, op,
           ": key cache ", kv.cache.describe(), " must be contiguous [blocks, block_size, ", D, "]");
  const RowView wv = rows_of(weights, "indexer_scores weights");
  const RowView sv = rows_of(scores, "indexer_scores scores");
  DI_CHECK(wv.rows == T && wv.cols == H, op, ": weights ", weights.describe(), " must be F32 [", T,
           ", ", H, "]");
  DI_CHECK(sv.rows == T && sv.cols >= kv.max_seq_len, op, ": scores ", scores.describe(),
           " must be F32 [", T, ", >= max_seq_len ", kv.max_seq_len, "]");
  DI_CHECK(kv.num_seqs >= 1 && kv.query_start.numel() == kv.num_seqs + 1 &&
               kv.seq_lens.numel() == kv.num_seqs && kv.block_tables.ndim == 2 &&
               kv.block_tables.shape[0] >= kv.num_seqs,
           op, ": addressing (num_seqs ", kv.num_seqs, ", query_start ", kv.query_start.describe(),
           ", seq_lens ", kv.seq_lens.describe(), ", block_tables ", kv.block_tables.describe(),
           ") is inconsistent");
  if (T == 0 || sv.cols == 0) return;
  ScoreArgs a{};
  a.q = static_cast<const bf16*>(q.data);
  a.q_s0 = q.stride[0];
  a.q_s1 = q.stride[1];
  a.w = static_cast<const float*>(wv.data);
  a.w_s0 = wv.row_stride;
  a.cache = static_cast<const bf16*>(kv.cache.data);
  a.block_tables = kv.block_tables.ptr<int32_t>();
  a.max_blocks = static_cast<int>(kv.block_tables.shape[1]);
  a.block_size = static_cast<int>(kv.cache.shape[1]);
  a.seq_lens = kv.seq_lens.ptr<int32_t>();
  a.query_start = kv.query_start.ptr<int32_t>();
  a.num_seqs = kv.num_seqs;
  a.H = H;
  a.D = D;
  a.scale = scale;
  a.scores = static_cast<float*>(sv.data);
  a.s_s0 = sv.row_stride;
  a.N = static_cast<int>(sv.cols);
  const int Hp = (H + 15) / 16 * 16, Dp = (D + 15) / 16 * 16 + 8;
  const size_t smem = size_t{2} * (Hp + kScoreChunk) * Dp + size_t{4} * Hp * (kScoreChunk + 4 + 1);
  set_smem_limit(reinterpret_cast<const void*>(indexer_scores_kernel), smem, op);
  indexer_scores_kernel<<<dim3(ceil_div(a.N, kScoreChunk), T), kScoreThreads, smem, stream_>>>(a);
  check_launch(op, q.describe() + " keys " + kv.cache.describe() + " scores " + scores.describe());
}

void CudaBackend::indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) {
  const char* op = "indexer_topk";
  check_dtype(scores, DType::F32, "indexer_topk scores");
  check_dtype(indices, DType::I32, "indexer_topk indices");
  check_dtype(kv.seq_lens, DType::I32, "indexer_topk seq_lens");
  check_dtype(kv.query_start, DType::I32, "indexer_topk query_start");
  const RowView sv = rows_of(scores, "indexer_topk scores");
  DI_CHECK(indices.ndim == 2 && indices.shape[0] == sv.rows && indices.is_contiguous() &&
               indices.shape[1] > 0,
           op, ": scores ", scores.describe(), " (F32 [T, N]) and indices ", indices.describe(),
           " (contiguous I32 [T, k], k > 0) do not fit");
  DI_CHECK(kv.num_seqs >= 1 && kv.query_start.numel() == kv.num_seqs + 1 &&
               kv.seq_lens.numel() == kv.num_seqs && kv.max_seq_len <= sv.cols,
           op, ": addressing (num_seqs ", kv.num_seqs, ", query_start ", kv.query_start.describe(),
           ", seq_lens ", kv.seq_lens.describe(), ", max_seq_len ", kv.max_seq_len,
           ") is inconsistent with scores ", scores.describe());
  if (sv.rows == 0) return;
  TopkRows rows;
  rows.query_start = kv.query_start.ptr<int32_t>();
  rows.seq_lens = kv.seq_lens.ptr<int32_t>();
  rows.num_seqs = kv.num_seqs;
  const int k = static_cast<int>(indices.shape[1]);
  const float* sp = static_cast<const float*>(sv.data);
  const TopkSplit split = topk_split(sv.rows, sv.cols, k);
  if (split.slices <= 1) {
    indexer_topk_kernel<false><<<static_cast<unsigned>(sv.rows), kTopkThreads, 0, stream_>>>(
        sp, sv.row_stride, rows, k, indices.ptr<int32_t>());
  } else {
    const int num_cand = split.slices * k;
    // The scratch slot of V4's select (an op of its own: never in use at the same time).
    int32_t* cand = static_cast<int32_t*>(
        scratch(kSlotV4Scores, static_cast<size_t>(sv.rows) * static_cast<size_t>(num_cand) * 4, op));
    indexer_topk_slices_kernel<<<dim3(split.slices, static_cast<unsigned>(sv.rows)), kTopkThreads, 0, stream_>>>(
        sp, sv.row_stride, rows, k, split.slice_len, cand);
    indexer_topk_kernel<false><<<static_cast<unsigned>(sv.rows), kTopkThreads, 0, stream_>>>(
        sp, sv.row_stride, rows, k, indices.ptr<int32_t>(), cand, num_cand);
  }
  check_launch(op, scores.describe() + " -> " + indices.describe());
}

void CudaBackend::indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                               int ratio, float softmax_scale, float weights_scale, Tensor& out) {
  const char* op = "indexer_topk (V4)";
  check_device(q, "indexer_topk q");
  check_device(keys, "indexer_topk keys");
  check_device(out, "indexer_topk out");
  DI_CHECK(q.ndim == 3 && (keys.ndim == 2 || keys.ndim == 3) && out.ndim == 2, op,
           ": q [T, heads, d], keys [S, d] or [T, S, d], out [T, top_k] expected, got ", q.describe(), ", ",
           keys.describe(), ", ", out.describe());
  const bool per_query = keys.ndim == 3;
  const int64_t T = q.size(0), heads = q.size(1), d = q.size(2), S = keys.size(keys.ndim - 2), k = out.size(1);
  DI_CHECK(ratio > 0, op, ": ratio must be > 0, got ", ratio);
  check_exact(q, {DType::F32, DType::BF16}, {T, heads, d}, "indexer_topk q");
  if (per_query)
    check_exact(keys, {DType::F32, DType::BF16}, {T, S, d}, "indexer_topk keys");
  else
    check_exact(keys, {DType::F32, DType::BF16}, {S, d}, "indexer_topk keys");
  check_exact(weights, {DType::F32}, {T, heads}, "indexer_topk weights");
  check_exact(positions, {DType::I32}, {T}, "indexer_topk positions");
  check_exact(out, {DType::I32}, {T, k}, "indexer_topk out");
  constexpr int64_t kMaxK = 8192, kMaxQ = 16384;  // shared memory: 8 k bytes; q as F32 [heads, d]
  DI_CHECK(k >= 1 && k <= kMaxK && heads * d <= kMaxQ, op, ": CUDA takes top_k in [1, ", kMaxK,
           "] and heads * d <= ", kMaxQ, ", got ", q.describe(), " -> ", out.describe());
  if (T == 0) return;
  float* scores = S > 0 ? static_cast<float*>(scratch(kSlotV4Scores, static_cast<size_t>(T * S) * 4, op)) : nullptr;
  const std::string shapes = q.describe() + " keys " + keys.describe() + " -> " + out.describe();
  if (S > 0) {
    V4ScoreArgs a{q.data, float_kind(q.dtype), keys.data, float_kind(keys.dtype), per_query, weights.ptr<float>(),
                  positions.ptr<int32_t>(), static_cast<int>(heads), static_cast<int>(d), static_cast<int>(S),
                  ratio, softmax_scale, weights_scale, scores};
    const size_t smem = static_cast<size_t>(heads * d + heads) * 4;
    set_smem_limit(reinterpret_cast<const void*>(v4_index_scores_kernel), smem, op);
    v4_index_scores_kernel<<<dim3(ceil_div(S, kV4Chunk), static_cast<unsigned>(T)), kV4Threads, smem, stream_>>>(a);
    check_launch("indexer_topk (V4 scores)", shapes);
  }
  TopkRows rows;
  rows.positions = positions.ptr<int32_t>();
  rows.ratio = ratio;
  rows.S = static_cast<int>(S);
  const size_t smem = static_cast<size_t>(k) * 8;
  set_smem_limit(reinterpret_cast<const void*>(indexer_topk_kernel<true>), smem, op);
  indexer_topk_kernel<true><<<static_cast<unsigned>(T), kTopkThreads, smem, stream_>>>(
      scores, S, rows, static_cast<int>(k), out.ptr<int32_t>());
  check_launch("indexer_topk (V4 select)", shapes);
}

// --- DeepSeek-V4.1 -------------------------------------------------------------------------

void CudaBackend::indexer_scores_visible(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                         const Tensor& positions, int ratio, float softmax_scale, float weights_scale,
                                         Tensor& scores) {
  const char* op = "indexer_scores_visible";
  check_device(q, "indexer_scores_visible q");
  DI_CHECK(q.ndim == 3 && (keys.ndim == 2 || keys.ndim == 3), op, ": q [T, heads, d], keys [S, d] or [T, S, d] expected, got ",
           q.describe(), ", ", keys.describe());
  const bool per_query = keys.ndim == 3;
  const int64_t T = q.size(0), heads = q.size(1), d = q.size(2), S = keys.size(keys.ndim - 2);
  DI_CHECK(ratio > 0, op, ": ratio must be > 0, got ", ratio);
  check_exact(q, {DType::F32, DType::BF16}, {T, heads, d}, "indexer_scores_visible q");
  if (per_query)
    check_exact(keys, {DType::F32, DType::BF16}, {T, S, d}, "indexer_scores_visible keys");
  else
    check_exact(keys, {DType::F32, DType::BF16}, {S, d}, "indexer_scores_visible keys");
  check_exact(weights, {DType::F32}, {T, heads}, "indexer_scores_visible weights");
  check_exact(positions, {DType::I32}, {T}, "indexer_scores_visible positions");
  check_exact(scores, {DType::F32}, {T, S}, "indexer_scores_visible scores");
  constexpr int64_t kMaxQ = 16384;  // q as F32 [heads, d] in shared memory
  DI_CHECK(heads * d <= kMaxQ, op, ": CUDA takes heads * d <= ", kMaxQ, ", got ", q.describe());
  if (T == 0 || S == 0) return;
  V4ScoreArgs a{q.data, float_kind(q.dtype), keys.data, float_kind(keys.dtype), per_query, weights.ptr<float>(),
                positions.ptr<int32_t>(), static_cast<int>(heads), static_cast<int>(d), static_cast<int>(S),
                ratio, softmax_scale, weights_scale, scores.ptr<float>()};
  const size_t smem = static_cast<size_t>(heads * d + heads) * 4;
  set_smem_limit(reinterpret_cast<const void*>(v4_index_scores_kernel), smem, op);
  v4_index_scores_kernel<<<dim3(ceil_div(S, kV4Chunk), static_cast<unsigned>(T)), kV4Threads, smem, stream_>>>(a);
  check_launch(op, q.describe() + " keys " + keys.describe());
}

namespace {

void launch_topk_finite(CudaBackend& be, const float* scores, int64_t ld, int64_t T, int64_t n, int64_t k,
                        int32_t* out, const char* op, const std::string& shapes) {
  constexpr int64_t kMaxK = 8192;  // shared memory: 8 k bytes
  DI_CHECK(k <= kMaxK, op, ": CUDA takes k <= ", kMaxK, ", got ", shapes);
  const size_t smem = static_cast<size_t>(k) * 8;
  be.set_smem_limit(reinterpret_cast<const void*>(topk_finite_kernel), smem, op);
  topk_finite_kernel<<<static_cast<unsigned>(T), kTopkThreads, smem, be.stream()>>>(
      scores, ld, static_cast<int>(n), static_cast<int>(k), out);
  be.check_launch(op, shapes);
}

}  // namespace

void CudaBackend::topk_finite(const Tensor& scores, Tensor& out) {
  DI_CHECK(scores.ndim == 2 && out.ndim == 2, "topk_finite: scores [T, S], out [T, k] expected, got ",
           scores.describe(), ", ", out.describe());
  const int64_t T = scores.size(0), S = scores.size(1), k = out.size(1);
  check_exact(scores, {DType::F32}, {T, S}, "topk_finite scores");
  check_exact(out, {DType::I32}, {T, k}, "topk_finite out");
  if (T == 0 || k == 0) return;
  launch_topk_finite(*this, scores.ptr<float>(), S, T, S, k, out.ptr<int32_t>(), "topk_finite",
                     scores.describe() + " -> " + out.describe());
}

void CudaBackend::candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio, int64_t topk_blocks,
                                   int64_t block_size, Tensor& bias) {
  const char* op = "candidate_blocks";
  DI_CHECK(scores.ndim == 2 && ratio > 0 && topk_blocks > 0 && block_size > 0,
           "candidate_blocks: scores [T, S], ratio, topk_blocks and block_size > 0 expected, got ", scores.describe(),
           ", ", ratio, ", ", topk_blocks, ", ", block_size);
  const int64_t T = scores.size(0), S = scores.size(1), nb = (S + block_size - 1) / block_size;
  check_exact(scores, {DType::F32}, {T, S}, "candidate_blocks scores");
  check_exact(positions, {DType::I32}, {T}, "candidate_blocks positions");
  check_exact(bias, {DType::F32}, {T, S}, "candidate_blocks bias");
  if (T == 0 || S == 0) return;
  const int64_t kb = std::min(topk_blocks, nb);
  // Scratch: block scores F32 [T, nb], then the chosen blocks I32 [T, kb].
  char* space = static_cast<char*>(scratch(kSlotV41, static_cast<size_t>(T * (nb + kb)) * 4, op));
  float* blocks = reinterpret_cast<float*>(space);
  int32_t* chosen = reinterpret_cast<int32_t*>(space + T * nb * 4);
  const std::string shapes = scores.describe() + " blocks of " + std::to_string(block_size);
  candidate_block_scores_kernel<<<static_cast<unsigned>(T), 256, 0, stream_>>>(
      scores.ptr<float>(), static_cast<int>(S), positions.ptr<int32_t>(), ratio, static_cast<int>(block_size),
      static_cast<int>(nb), blocks);
  check_launch("candidate_blocks (block scores)", shapes);
  launch_topk_finite(*this, blocks, nb, T, nb, kb, chosen, "candidate_blocks (top blocks)", shapes);
  candidate_bias_kernel<<<static_cast<unsigned>(T), 256, 0, stream_>>>(chosen, static_cast<int>(kb), static_cast<int>(S),
                                                                       static_cast<int>(block_size), bias.ptr<float>());
  check_launch("candidate_blocks (bias)", shapes);
}

}  // namespace deepinfer::cuda
