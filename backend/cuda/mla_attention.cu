// mla_attention: absorbed MLA over the paged latent cache (decode and any step with cached
// context) and direct causal MLA for prefill, on tensor cores (WMMA bf16, fp32 accumulate).
//
// Paged (absorbed): all heads share one cached row per token (K = the row, V = its first
// v_dim values), so a block takes one query token, 16 heads and one fixed chunk of its
// context (32 or 64 positions; see paged_chunk below): the chunk's rows are read once
// into shared memory, S = Q·K^T, P = exp(S - max) and O = P·V are written as a partial with
// (max, sum); a combine kernel merges the chunks of each (token, head) in chunk order. In
// batch-invariant mode the chunk size is fixed for the process (it never depends on the
// batch or on the split count); the default mode picks it per launch. Smaller chunks give
// more blocks at batch 1 (ctx 576: 9 of 64, 18 of 32) but re-read the query and write more
// partials: H200 2026-11-30, graphs: chunk 32 for launches of <= 4 items: bs1 +1.6% over 64
// (bench/NOTES.md; a chunk of 16 lost 1.5-3.5% at bs8-64 and was removed). A block's rows
// go to shared memory by cp.async, all in flight at once, the rows of earlier steps before
// pdl_wait (attn18: see mla_paged_kernel).
//
// Prefill (direct, per head): the model's head dims (192 / 128) on wgmma, FlashAttention-3
// style (mla_prefill_wgmma.cu); the other dims FlashAttention-2 style on mma.sync
// (fa::prefill_kernel below): a block takes 128 queries of one sequence and one head and
// walks the causal key tiles of 64 through cp.async double buffers with an online softmax in
// registers.
#include <mma.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/mla_prefill.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/stream_mma.cuh"

namespace deepinfer::cuda {
namespace {

using namespace nvcuda;

constexpr int kDefaultChunk = 64;  // context positions per split (fixed: batch-invariant)
constexpr int kHeadsPerBlock = 16;
constexpr float kNegInf = -INFINITY;

__device__ __forceinline__ int round16(int x) { return (x + 15) / 16 * 16; }

// Loads n elements (n % 8 == 0, 16-byte aligned source) of a bf16/f32 row as bf16 into dst.
__device__ __forceinline__ void load_row_bf16(bf16* dst, const void* src, int kind, int n, int lane,
                                              int lanes) {
  if (kind == 1) {
    for (int c = lane * 8; c < n; c += lanes * 8)
      *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(src) + c);
  } else {
    for (int c = lane; c < n; c += lanes) dst[c] = __float2bfloat16_rn(static_cast<const float*>(src)[c]);
  }
}

// One warp: dst[0, n_pad) = row `offset` of base (n values, bf16/f32 by kind) zero-padded, or
// all zeros when !valid (heads past H, positions past the token's own).
__device__ __forceinline__ void load_padded_row(bf16* dst, const void* base, int kind, int64_t offset,
                                                bool valid, int n, int n_pad, int lane) {
  if (valid) {
    const void* src = kind ? static_cast<const void*>(static_cast<const bf16*>(base) + offset)
                           : static_cast<const void*>(static_cast<const float*>(base) + offset);
    load_row_bf16(dst, src, kind, n, lane, 32);
  }
  for (int c = (valid ? n : 0) + lane; c < n_pad; c += 32) dst[c] = __float2bfloat16_rn(0.0f);
}

struct PagedArgs {
  const void* q;
  int q_kind;
  int64_t q_s0, q_s1;
  const void* cache;
  int cache_kind;
  const int32_t* block_tables;
  int max_blocks;
  int block_size;
  const int32_t* seq_lens;
  const int32_t* query_start;
  int num_seqs;
  int T, H, D, V;  // tokens, heads, row dim, value dim
  int token0;      // first token of this launch
  int max_splits;
  int h_pad, v_pad;
  float scale;
  float* part_o;  // [tokens_in_launch, max_splits, h_pad, v_pad]
  float* part_ml;  // [tokens_in_launch, max_splits, h_pad, 2]
  // Sparse (V3.2): token t attends the positions indices[t, 0 .. topk) (-1: none) instead of
  // 0 .. pos; chunk c covers entries [c * chunk, (c + 1) * chunk) of that list. nullptr: dense.
  const int32_t* indices;
  int topk;
};

// Position attended by entry e of token t's list (dense: position e itself), or -1. A sparse
// entry outside 0 .. pos (the token's causal range) counts as none, so a bad index never
// reads past the sequence (the CPU reference rejects it; backend.h).
__device__ __forceinline__ int attended(const PagedArgs& a, int t, int pos, int e) {
  if (a.indices == nullptr) return e <= pos ? e : -1;
  if (e >= a.topk) return -1;
  const int p = a.indices[int64_t{t} * a.topk + e];
  return p >= 0 && p <= pos ? p : -1;
}

// One warp: dst[0, Dk) = a row of D bf16 values at src, zero-padded to Dk, or all zeros when
// !valid (src is not read then, but must be a mapped address), as 16-byte cp.async pieces:
// every piece of the row in flight at once (a plain load -> shared store loop waits for each
// load before the next one issues).
__device__ __forceinline__ void cp_padded_row(bf16* dst, const bf16* src, bool valid, int D, int Dk,
                                              int lane) {
  const uint32_t d = acp::smem_addr(dst);
  const int have = valid ? D / 8 : 0;
  for (int c = lane; c < Dk / 8; c += 32) acp::cp_async16(d + c * 16, c < have ? src + c * 8 : src, c < have);
}

// grid (max_splits, tokens_in_launch, ceil(H / 16)), 256 threads; kChunk 32 or 64.
// The 8 warps split S = Q·K^T into kChunk / 16 column tiles x kSplitK parts of K's dims.
// BF16 q and cache (the model's) are staged by cp.async: every row of the block in flight at
// once. Before pdl_wait a block reads only what no kernel of the step writes: the step's
// addressing (query_start, seq_lens, block_tables: the host's, uploaded before the step's
// first kernel; spec_shift's device fix-up of seq_lens is a plain launch before the step) and,
// in the dense form, the cache rows of positions before the first one this launch's tokens of
// the sequence store (seq_len - q_len: rows of earlier steps; mla_rope_store, a kernel of this
// step, writes the others), plus the zero rows past pos. q, the step's own rows and the sparse
// indices (the indexer's) are read after it. H200 2026-12-04 (bench/NOTES.md attn18), graph
// decode against every load after pdl_wait, row by row: bf16 -3.7% / -2.5% / -4.1% per step at
// batch 1 / 8 / 64, fp8 -3.6% / -3.2% / -4.4%.
template <int kChunk>
__global__ void __launch_bounds__(256) mla_paged_kernel(PagedArgs a) {
  static_assert(kChunk == 32 || kChunk == 64, "a lane takes kChunk / 32 positions of the softmax");
  constexpr int kColTiles = kChunk / 16, kSplitK = 8 / kColTiles;
  constexpr int kRowsPerWarp = kChunk / 8;  // K rows j = warp + 8 i
  extern __shared__ __align__(128) unsigned char smem[];
  const int Dk = round16(a.D), Dp = Dk + 8;  // padded row (elements)
  bf16* Qs = reinterpret_cast<bf16*>(smem);              // [16][Dp]
  bf16* Ks = Qs + kHeadsPerBlock * Dp;                    // [kChunk][Dp]
  float* S = reinterpret_cast<float*>(Ks + kChunk * Dp);  // [kSplitK][16][kChunk]
  bf16* P = reinterpret_cast<bf16*>(S + kSplitK * 16 * kChunk);  // [16][kChunk + 8]
  constexpr int LDP = kChunk + 8;
  const int split = blockIdx.x, lt = blockIdx.y, t = a.token0 + lt, hg = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  int seq, pos;
  locate(a.query_start, a.seq_lens, a.num_seqs, t, &seq, &pos);
  const int c0 = split * kChunk;
  const bool async = a.q_kind == 1 && a.cache_kind == 1;
  const bf16* cache = static_cast<const bf16*>(a.cache);
  // The dense form's K rows: position, cache block (looked up once, before pdl_wait).
  int kp[kRowsPerWarp] = {}, kblock[kRowsPerWarp] = {};
  int fresh = 0;  // first position stored by this step for seq (dense)
  if (async && a.indices == nullptr && c0 <= pos) {
    fresh = pos - (t - a.query_start[seq]);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int p = c0 + warp + 8 * i;
      kp[i] = p <= pos ? p : -1;
      kblock[i] = kp[i] >= 0 ? a.block_tables[int64_t{seq} * a.max_blocks + p / a.block_size] : 0;
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
      if (kp[i] < fresh)  // a row of an earlier step, or a zero row (-1)
        cp_padded_row(Ks + (warp + 8 * i) * Dp,
                      cache + (int64_t{kblock[i]} * a.block_size + (kp[i] >= 0 ? kp[i] % a.block_size : 0)) * a.D,
                      kp[i] >= 0, a.D, Dk, lane);
  }
  pdl_wait();  // a programmatic dependent (pdl_launch.cuh): q and the cache rows just stored
  pdl_trigger();
  if (a.indices == nullptr && c0 > pos) return;  // this token has fewer chunks
  if (a.indices != nullptr) {
    // A sparse chunk with no position (the -1 padding of a context shorter than topk) only
    // marks its partial empty (max -inf); the combine skips it.
    int any = 0;
    for (int j = tid; j < kChunk; j += 256) any |= attended(a, t, pos, c0 + j) >= 0;
    if (!__syncthreads_or(any)) {
      const int h = hg * kHeadsPerBlock + tid;
      if (tid < kHeadsPerBlock && h < a.H) {
        float* ml = a.part_ml + ((int64_t{lt} * a.max_splits + split) * a.h_pad + h) * 2;
        ml[0] = kNegInf;
        ml[1] = 0.0f;
      }
      return;
    }
  }

  if (async) {
    // Q rows (16 heads), zero for heads >= H and columns >= D.
    for (int r = warp; r < kHeadsPerBlock; r += 8) {
      const int h = hg * kHeadsPerBlock + r;
      cp_padded_row(Qs + r * Dp, static_cast<const bf16*>(a.q) + (h < a.H ? int64_t{t} * a.q_s0 + int64_t{h} * a.q_s1 : 0),
                    h < a.H, a.D, Dk, lane);
    }
    if (a.indices == nullptr) {
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i)
        if (kp[i] >= fresh)  // this step's rows
          cp_padded_row(Ks + (warp + 8 * i) * Dp,
                        cache + (int64_t{kblock[i]} * a.block_size + kp[i] % a.block_size) * a.D, true, a.D,
                        Dk, lane);
    } else {
      // Sparse: the entries, then their blocks, then the rows (each lookup's loads together).
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) kp[i] = attended(a, t, pos, c0 + warp + 8 * i);
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i)
        kblock[i] = kp[i] >= 0 ? a.block_tables[int64_t{seq} * a.max_blocks + kp[i] / a.block_size] : 0;
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i)
        cp_padded_row(Ks + (warp + 8 * i) * Dp,
                      cache + (int64_t{kblock[i]} * a.block_size + (kp[i] >= 0 ? kp[i] % a.block_size : 0)) * a.D,
                      kp[i] >= 0, a.D, Dk, lane);
    }
    acp::cp_async_commit();
    acp::cp_async_wait<0>();
  } else {
    // FP32 q or cache (tests): plain loads.
    for (int r = warp; r < kHeadsPerBlock; r += 8) {
      const int h = hg * kHeadsPerBlock + r;
      load_padded_row(Qs + r * Dp, a.q, a.q_kind, int64_t{t} * a.q_s0 + int64_t{h} * a.q_s1, h < a.H,
                      a.D, Dk, lane);
    }
    // K rows of this chunk; rows past the token's position are zero (and masked below).
    for (int j = warp; j < kChunk; j += 8) {
      const int p = attended(a, t, pos, c0 + j);
      const int block = p >= 0 ? a.block_tables[int64_t{seq} * a.max_blocks + p / a.block_size] : 0;
      const int offset = p >= 0 ? p % a.block_size : 0;
      load_padded_row(Ks + j * Dp, a.cache, a.cache_kind, (int64_t{block} * a.block_size + offset) * a.D,
                      p >= 0, a.D, Dk, lane);
    }
  }
  __syncthreads();

  // S[16][kChunk] = Q · K^T: warp w takes column tile (w % kColTiles) over part
  // (w / kColTiles) of K's dims; the parts are summed in part order below.
  {
    const int nf = warp % kColTiles, part = warp / kColTiles, steps = Dk / 16;
    const int s_begin = part * steps / kSplitK, s_end = (part + 1) * steps / kSplitK;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int s = s_begin; s < s_end; ++s) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, Qs + s * 16, Dp);
      wmma::load_matrix_sync(fb, Ks + nf * 16 * Dp + s * 16, Dp);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(S + part * 16 * kChunk + nf * 16, acc, kChunk, wmma::mem_row_major);
  }
  __syncthreads();

  // Softmax over the chunk: warp w takes head rows 2w and 2w + 1.
  constexpr int kPerLane = kChunk / 32;
  for (int r = warp * 2; r < warp * 2 + 2; ++r) {
    float s[kPerLane];
    float mx = kNegInf;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int j = lane + 32 * i;
      float v = S[r * kChunk + j];
#pragma unroll
      for (int k = 1; k < kSplitK; ++k) v += S[(k * 16 + r) * kChunk + j];
      s[i] = attended(a, t, pos, c0 + j) >= 0 ? v * a.scale : kNegInf;
      mx = fmaxf(mx, s[i]);
    }
    // Finite: a dense chunk always has position c0, a sparse one some position (above); a
    // head row whose positions all underflow is impossible (s is finite where valid).
    const float m = warp_max(mx);
    float l = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int j = lane + 32 * i;
      const bf16 p = __float2bfloat16_rn(s[i] == kNegInf ? 0.0f : __expf(s[i] - m));
      P[r * LDP + j] = p;
      l += __bfloat162float(p);
    }
    l = warp_sum(l);
    const int h = hg * kHeadsPerBlock + r;
    if (lane == 0 && h < a.H) {
      float* ml = a.part_ml + ((int64_t{lt} * a.max_splits + split) * a.h_pad + h) * 2;
      ml[0] = m;
      ml[1] = l;
    }
  }
  __syncthreads();

  // O[16][v_pad] = P[16][64] · V[64][v_pad]; warp w takes column tiles w, w + 8, ...
  float* out = a.part_o + ((int64_t{lt} * a.max_splits + split) * a.h_pad + hg * kHeadsPerBlock) * a.v_pad;
  for (int nf = warp; nf < a.v_pad / 16; nf += 8) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int s = 0; s < kChunk / 16; ++s) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, P + s * 16, LDP);
      wmma::load_matrix_sync(fb, Ks + s * 16 * Dp + nf * 16, Dp);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + nf * 16, acc, a.v_pad, wmma::mem_row_major);
  }
}

// Splits whose weights one pass of mla_combine_kernel stages in shared memory, and the
// partial rows each thread has in flight.
constexpr int kCombineTile = 256, kCombineDepth = 24;

// grid (tokens_in_launch, H), 128 threads; thread i owns the 4 value columns 4i .. 4i + 3
// (v_dim <= 512). Merges a token's chunks in chunk order: the same per-element arithmetic
// as a serial loop over the chunks (max, then denom += e_s l_s, then acc += e_s o_s, in
// chunk order, e_s = exp(m_s - m)), with the chunk weights computed once per block into
// shared memory and kCombineDepth partial rows loaded before they are added (dec17: the
// serial form waited for one load per chunk and column, ~34 us per call cold on the H200).
// The token's place (locate: the step's addressing, no kernel's output) is read before
// pdl_wait; after it, the first kCombineDepth partial rows and the chunk maxima and sums are
// all loaded before the first use (attn18; 8 rows at a time after the max before it).
__global__ void __launch_bounds__(128)
    mla_combine_kernel(PagedArgs a, int chunk, void* out, int out_kind, int64_t o_s0, int64_t o_s1) {
  __shared__ float e_tile[kCombineTile];  // exp(m_s - m), or -inf for an empty chunk
  __shared__ float l_tile[kCombineTile];
  __shared__ float red[4];
  __shared__ float inv_sh;
  const int lt = blockIdx.x, t = a.token0 + lt, h = blockIdx.y, tid = threadIdx.x;
  int seq, pos;
  locate(a.query_start, a.seq_lens, a.num_seqs, t, &seq, &pos);
  // Sparse: every chunk of the list ran; empty ones (max -inf) are skipped, and a token
  // with no position at all gets 0 (as the CPU reference).
  const int splits = a.indices != nullptr ? a.max_splits : pos / chunk + 1;
  const float* ml = a.part_ml + (int64_t{lt} * a.max_splits * a.h_pad + h) * 2;
  const int64_t ml_step = int64_t{a.h_pad} * 2;
  const int d0 = 4 * tid;
  const bool mine = d0 < a.V;
  const float* po = a.part_o + (int64_t{lt} * a.max_splits * a.h_pad + h) * a.v_pad + d0;
  const int64_t po_step = int64_t{a.h_pad} * a.v_pad;
  pdl_wait();  // a programmatic dependent (pdl_launch.cuh): the chunks' partials
  pdl_trigger();
  float4 v[kCombineDepth];
  float m0 = kNegInf, l0 = 0.0f;  // chunk tid's max and sum (tid < splits)
  if (mine) {
#pragma unroll
    for (int u = 0; u < kCombineDepth; ++u)
      if (u < splits) v[u] = *reinterpret_cast<const float4*>(po + u * po_step);
  }
  if (tid < splits) {
    m0 = ml[tid * ml_step];
    l0 = ml[tid * ml_step + 1];
  }
  float m = m0;
  for (int s = tid + blockDim.x; s < splits; s += blockDim.x) m = fmaxf(m, ml[s * ml_step]);
  m = warp_max(m);
  if ((tid & 31) == 0) red[tid >> 5] = m;
  __syncthreads();
  m = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));  // max: order-free
  float denom = 0.0f;  // thread 0's, in chunk order
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s0 = 0; s0 < splits; s0 += kCombineTile) {
    const int n = min(kCombineTile, splits - s0);
    __syncthreads();  // the previous tile's readers are done
    for (int i = tid; i < n; i += blockDim.x) {
      const bool have = s0 == 0 && i == tid;  // loaded above
      const float ms = have ? m0 : ml[(s0 + i) * ml_step];
      e_tile[i] = ms != kNegInf ? __expf(ms - m) : kNegInf;
      l_tile[i] = have ? l0 : ml[(s0 + i) * ml_step + 1];
    }
    __syncthreads();
    if (tid == 0)
      for (int i = 0; i < n; ++i)
        if (e_tile[i] != kNegInf) denom += e_tile[i] * l_tile[i];
    if (!mine) continue;
    for (int i0 = 0; i0 < n; i0 += kCombineDepth) {
      if (s0 + i0 > 0) {  // the first kCombineDepth rows were loaded above
#pragma unroll
        for (int u = 0; u < kCombineDepth; ++u)
          if (i0 + u < n) v[u] = *reinterpret_cast<const float4*>(po + (s0 + i0 + u) * po_step);
      }
#pragma unroll
      for (int u = 0; u < kCombineDepth; ++u) {
        if (i0 + u >= n) break;
        const float e = e_tile[i0 + u];
        if (e == kNegInf) continue;
        acc[0] += e * v[u].x;
        acc[1] += e * v[u].y;
        acc[2] += e * v[u].z;
        acc[3] += e * v[u].w;
      }
    }
  }
  if (tid == 0) inv_sh = denom > 0.0f ? 1.0f / denom : 0.0f;
  __syncthreads();
  const float inv = inv_sh;
  for (int j = 0; j < 4; ++j)
    if (d0 + j < a.V)
      st(out, int64_t{t} * o_s0 + int64_t{h} * o_s1 + d0 + j, out_kind, acc[j] * inv);
}

// ------------------------------------------------------------------------------------

// Direct causal prefill, FlashAttention-2 style on mma.sync m16n8k16 (bf16 in, fp32 accumulate).
// A block takes kBr = 128 queries of one sequence and one head; its 8 warps own 16 query rows
// each. Q is staged once through shared memory into registers (ldmatrix); K and V walk the
// causal key tiles of kBc = 64 through two shared-memory stages (cp.async: tile kt + 1 is in
// flight while tile kt is computed). Per tile, a warp computes S = Q·K^T (16 x 64, fp32),
// masks it (causal, sequence end) only on the tiles that need it, updates the running row max
// and sum (base-2 exponent, fp32), rounds P to bf16 in registers and adds P·V into its 16 x Dv
// fp32 accumulator. Key tiles wholly past a warp's last row are skipped by that warp. Rows and
// columns past the sequence or the head dims are zero-filled (cp.async src-size 0), so
// padding never carries NaN. One tiling for every shape: a (sequence, row) result depends
// only on its own sequence, never on the other sequences of the launch (batch-invariant).
// With cached context (a.seq_lens) query i of a sequence sits at position ctx - q_len + i and
// the key tiles run over the whole context (the same tiles from position 0).
namespace fa {

constexpr int kBr = 128, kBc = 64, kWarps = 8, kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

using acp::cp_async16;
using acp::cp_async_commit;
using acp::cp_async_wait;
using acp::ldmatrix_x4;
using acp::ldmatrix_x4_trans;
using acp::smem_addr;

// Rows first .. first + kRows - 1 of one head (row i of the sequence at tensor row s0 + i), kCols
// (padded) columns, into dst (row stride ld elements); rows >= len or past the tensor's `rows`
// and columns >= dim read 0.
template <int kRows, int kCols>
__device__ __forceinline__ void load_rows(bf16* dst, int ld, const bf16* base, int64_t st0, int64_t st1,
                                          int h, int s0, int first, int len, int rows, int dim) {
  constexpr int kChunks = kCols / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8, row = first + r;
    const bool ok = row < len && s0 + row < rows && c < dim;
    const bf16* src = ok ? base + int64_t{s0 + row} * st0 + int64_t{h} * st1 + c : base;
    cp_async16(smem_addr(dst + r * ld + c), src, ok);
  }
}

// Dynamic shared memory of prefill_kernel<kDq, kDv>: Q [kBr][kDq + 8], K [2][kBc][kDq + 8],
// V [2][kBc][kDv + 8] (bf16; the 16-byte row pad keeps ldmatrix free of bank conflicts).
constexpr size_t smem_bytes(int dq, int dv) {
  return size_t{2} * (size_t{kBr} * (dq + 8) + 2 * size_t{kBc} * (dq + 8) + 2 * size_t{kBc} * (dv + 8));
}

// grid (H, ceil(T / kBr) + num_seqs), kThreads threads. blockIdx.y enumerates the (sequence,
// query tile) pairs, each sequence's last (longest) tile first; surplus blocks exit.
// kDq / kDv: the head dims padded to multiples of 16 (a.Dq <= kDq, a.Dv <= kDv).
template <int kDq, int kDv>
__global__ void __launch_bounds__(kThreads, 1) prefill_kernel(PrefillArgs a) {
  static_assert(kDq % 16 == 0 && kDv % 16 == 0, "head dims are padded to multiples of 16");
  constexpr int LDQ = kDq + 8, LDV = kDv + 8;
  constexpr int kKSteps = kDq / 16, kSTiles = kBc / 8, kOTiles = kDv / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kBr * LDQ;       // [2][kBc][LDQ]
  bf16* Vs = Ks + 2 * kBc * LDQ;   // [2][kBc][LDV]

  PrefillTile pt;
  if (!prefill_tile<kBr>(a, pt)) return;
  const int h = blockIdx.x, s0 = pt.s0, len = pt.len, q0 = pt.q0, ctx = pt.ctx, off = pt.off, c0 = pt.c0;
  const int num_kt = max(0, off + min(q0 + kBr, len) + kBc - 1) / kBc;  // key tiles with a causal key
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;  // this thread's two query rows
  // Positions of the warp's first and last rows and of this thread's rows.
  const int warp_first = off + q0 + warp * 16, warp_last = warp_first + 15;
  const int pos0 = off + row0, pos1 = off + row1;
  const float scale = a.scale * kLog2e;

  load_rows<kBr, kDq>(Qs, LDQ, a.q, a.q_s0, a.q_s1, h, s0, q0, len, a.T, a.Dq);
  load_rows<kBc, kDq>(Ks, LDQ, a.k, a.k_s0, a.k_s1, h, c0, 0, ctx, a.N, a.Dq);
  load_rows<kBc, kDv>(Vs, LDV, a.v, a.v_s0, a.v_s1, h, c0, 0, ctx, a.N, a.Dv);
  cp_async_commit();

  uint32_t qf[kKSteps][4];
  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // running max (scaled), sum

  for (int kt = 0; kt < num_kt; ++kt) {
    if (kt + 1 < num_kt) {
      const int st = (kt + 1) & 1;
      load_rows<kBc, kDq>(Ks + st * kBc * LDQ, LDQ, a.k, a.k_s0, a.k_s1, h, c0, (kt + 1) * kBc, ctx, a.N, a.Dq);
      load_rows<kBc, kDv>(Vs + st * kBc * LDV, LDV, a.v, a.v_s0, a.v_s1, h, c0, (kt + 1) * kBc, ctx, a.N, a.Dv);
    }
    cp_async_commit();  // an empty group on the last tile keeps wait_group<1> uniform
    cp_async_wait<1>();
    __syncthreads();
    if (kt == 0) {
      // A fragments of Q: matrix j = lane / 8 holds rows (j & 1) * 8 .. + 7, columns (j >> 1) * 8.
      const bf16* qa = Qs + (warp * 16 + (lane >> 3 & 1) * 8 + (lane & 7)) * LDQ + (lane >> 4) * 8;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) ldmatrix_x4(qf[ks], smem_addr(qa + ks * 16));
    }
    const int k0 = kt * kBc;
    if (k0 <= warp_last) {  // warp-uniform: some key of this tile is causal for the warp's rows
      const bf16* kb = Ks + (kt & 1) * kBc * LDQ;
      const bf16* vb = Vs + (kt & 1) * kBc * LDV;
      float s[kSTiles][4];
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      // S = Q·K^T. B fragments: matrix j holds keys (j >> 1) * 8 .. + 7, dims (j & 1) * 8 .. + 7.
      const bf16* kaddr = kb + ((lane >> 4) * 8 + (lane & 7)) * LDQ + (lane >> 3 & 1) * 8;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
        for (int np = 0; np < kSTiles / 2; ++np) {
          uint32_t kf[4];
          ldmatrix_x4(kf, smem_addr(kaddr + np * 16 * LDQ + ks * 16));
          smma::mma_bf16(s[2 * np], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], kf[0], kf[1]);
          smma::mma_bf16(s[2 * np + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], kf[2], kf[3]);
        }
      }
      // Scale into base 2; mask keys past a row (causal) or past the sequence.
      const bool masked = k0 + kBc - 1 > warp_first || k0 + kBc > ctx;
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[n][e] * scale;
          if (masked) {
            const int col = k0 + n * 8 + 2 * t4 + (e & 1), pos = e < 2 ? pos0 : pos1;
            if (col > pos || col >= ctx) v = -INFINITY;
          }
          s[n][e] = v;
        }
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
      }
      // The 4 lanes of a row (same g) hold its 64 columns.
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      // A row with no causal key yet keeps max -inf: subtract 0 then (exp2(-inf) = 0).
      const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
      const float al0 = exp2_approx(m0 - b0), al1 = exp2_approx(m1 - b1);
      m0 = mn0;
      m1 = mn1;
      float ps0 = 0.0f, ps1 = 0.0f;  // this lane's part of the tile's row sums
      uint32_t pf[kBc / 16][4];      // P as A fragments of P·V (k-step j: keys 16j .. 16j + 15)
#pragma unroll
      for (int j = 0; j < kBc / 16; ++j) {
        pf[j][0] = pack_bf16(exp2_approx(s[2 * j][0] - b0), exp2_approx(s[2 * j][1] - b0), ps0);
        pf[j][1] = pack_bf16(exp2_approx(s[2 * j][2] - b1), exp2_approx(s[2 * j][3] - b1), ps1);
        pf[j][2] = pack_bf16(exp2_approx(s[2 * j + 1][0] - b0), exp2_approx(s[2 * j + 1][1] - b0), ps0);
        pf[j][3] = pack_bf16(exp2_approx(s[2 * j + 1][2] - b1), exp2_approx(s[2 * j + 1][3] - b1), ps1);
      }
      l0 = l0 * al0 + ps0;
      l1 = l1 * al1 + ps1;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        o[n][0] *= al0;
        o[n][1] *= al0;
        o[n][2] *= al1;
        o[n][3] *= al1;
      }
      // O += P·V. B fragments (transposed): matrix j holds keys (j & 1) * 8 .. + 7, value
      // dims (j >> 1) * 8 .. + 7.
      const bf16* vaddr = vb + ((lane >> 3 & 1) * 8 + (lane & 7)) * LDV + (lane >> 4) * 8;
#pragma unroll
      for (int j = 0; j < kBc / 16; ++j) {
#pragma unroll
        for (int np = 0; np < kOTiles / 2; ++np) {
          uint32_t vf[4];
          ldmatrix_x4_trans(vf, smem_addr(vaddr + j * 16 * LDV + np * 16));
          smma::mma_bf16(o[2 * np], pf[j][0], pf[j][1], pf[j][2], pf[j][3], vf[0], vf[1]);
          smma::mma_bf16(o[2 * np + 1], pf[j][0], pf[j][1], pf[j][2], pf[j][3], vf[2], vf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next load refills it
  }

  store_rows<kOTiles>(a, &o[0][0], l0, l1, s0, len, row0, h, t4);
}

// The kernel for a's head dims (one per padded pair: 64 / 64, 128 / 128, 256 / 256; dims that
// pad to 192 / 128 take the wgmma kernel, fa3::fits), its shared memory and grid.
struct Launch {
  void (*kernel)(PrefillArgs);
  size_t smem;
  dim3 grid;
};
inline Launch launch_for(const PrefillArgs& a) {
  Launch l{prefill_kernel<256, 256>, smem_bytes(256, 256), dim3(a.H, (a.T + kBr - 1) / kBr + a.num_seqs)};
  if (a.Dq <= 64 && a.Dv <= 64) {
    l.kernel = prefill_kernel<64, 64>;
    l.smem = smem_bytes(64, 64);
  } else if (a.Dq <= 128 && a.Dv <= 128) {
    l.kernel = prefill_kernel<128, 128>;
    l.smem = smem_bytes(128, 128);
  }
  return l;
}

}  // namespace fa

// Sparse direct prefill (V3.2): grid (T, H), 128 threads. The block of (token t, head h)
// scores the k listed positions of t's sequence (entry e: position indices[t, e], -1 or one
// outside 0 .. t's own: none), one warp per entry (fp32 dot of the bf16 rows), then a softmax
// over the list and P·V in fp32, the threads taking value dims. Dynamic shared memory: q row
// [Dq] and the list's scores [k] (F32) and positions [k] (I32). The gathered K/V rows differ
// per token, so no tile is shared between queries (unlike fa::prefill_kernel).
__global__ void __launch_bounds__(128) mla_prefill_sparse_kernel(PrefillArgs a, const int32_t* indices,
                                                                 int topk) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float red[32];
  float* qf = reinterpret_cast<float*>(smem);  // [Dq]
  float* sc = qf + a.Dq;                        // [topk]
  int* rows = reinterpret_cast<int*>(sc + topk);  // [topk] token index of each entry's row, -1
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {  // last sequence with query_start <= t
    const int mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int first = a.query_start[lo], own = t - first;  // t's position in its sequence
  for (int d = tid; d < a.Dq; d += blockDim.x) qf[d] = __bfloat162float(a.q[int64_t{t} * a.q_s0 + int64_t{h} * a.q_s1 + d]);
  for (int e = tid; e < topk; e += blockDim.x) {
    const int p = indices[int64_t{t} * topk + e];
    rows[e] = p >= 0 && p <= own ? first + p : -1;
  }
  __syncthreads();
  const int num_warps = blockDim.x >> 5;
  for (int e = warp; e < topk; e += num_warps) {
    const int r = rows[e];
    float dot = 0.0f;
    if (r >= 0) {
      const bf16* k = a.k + int64_t{r} * a.k_s0 + int64_t{h} * a.k_s1;
      for (int d = lane; d < a.Dq; d += 32) dot += qf[d] * __bfloat162float(k[d]);
    }
    dot = warp_sum(dot);
    if (lane == 0) sc[e] = r >= 0 ? dot * a.scale : kNegInf;
  }
  __syncthreads();
  float mx = kNegInf;
  for (int e = tid; e < topk; e += blockDim.x) mx = fmaxf(mx, sc[e]);
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  float m = kNegInf;
  for (int w = 0; w < num_warps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();  // red is reused by block_sum
  float l = 0.0f;
  for (int e = tid; e < topk; e += blockDim.x) {
    const float p = sc[e] == kNegInf ? 0.0f : __expf(sc[e] - m);
    sc[e] = p;
    l += p;
  }
  const float sum = block_sum(l, red);  // syncs: every p is in sc
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // no position: 0, as the CPU reference
  for (int d = tid; d < a.Dv; d += blockDim.x) {
    float acc = 0.0f;
    for (int e = 0; e < topk; ++e) {
      const int r = rows[e];
      if (r >= 0) acc += sc[e] * __bfloat162float(a.v[int64_t{r} * a.v_s0 + int64_t{h} * a.v_s1 + d]);
    }
    st(a.out, int64_t{t} * a.o_s0 + int64_t{h} * a.o_s1 + d, a.out_kind, acc * inv);
  }
}

// S holds kSplitK x 16 x chunk = 8 x 256 floats for every chunk size.
size_t paged_smem_bytes(int D, int chunk) {
  const int Dp = (D + 15) / 16 * 16 + 8;
  return size_t{2} * (kHeadsPerBlock + chunk) * Dp + 4 * 8 * 256 + 2 * 16 * (chunk + 8);
}

// CudaOptions::attn_chunk (32 or 64; tests) fixes the chunk for the process; otherwise the
// batch-invariant mode keeps kDefaultChunk for every launch (one chunk size whatever the
// batch), and the default mode takes kSmallChunk for few (token, 16-head block) work items
// (the grid is max_splits x items blocks on a 132-SM chip), how few by the launch's context
// bound (max_seq_len; sparse launches: the width of their top-k lists, which their chunks walk as
// the dense chunks walk the context, so that a sparse launch listing every position takes the dense
// launch's chunk and bits: SparseAttention.PagedSparseOverEveryPositionIsTheDenseOp),
// and kDefaultChunk otherwise.
// The choice depends on the launch's shape only (the runner captures a graph per batch bucket
// and context bucket), so a replayed graph runs the kernel it was captured with.
constexpr int kSmallChunk = 32;
// H200, bf16 graph decode, chunk 32 against 64 per step (bench/NOTES.md session 16, calls B, D, E,
// F): bound 576: -87 / -42 / -19 / -23 / -15 us at batch 1 / 8 / 16 / 32 / 64; bound 1,024: -11 us at
// batch 8, +36 / +64 us at 32 / 64; bound 4,096: -30 us at batch 1, +17 / +50 / +76 / +126 us at
// 2 / 3 / 4 / 8 (the runner's context buckets are powers of two from 256). A bound of 576 is in
// the 1,024 class (below), so there batch 16-64 give up the 15-23 us chunk 32 won.
// The bound counts by its power-of-two class (the next power of two at or above it): a graph's
// padded bound lies between the step's real bound and the runner's context bucket (powers of two
// from 256, runner/decode_graphs.cpp), so both fall in the same class and an eager step takes the
// chunk its graph took (the same bits; AttentionMoe.MlaPagedVerifyRunsMatchCpuAndDecodeBits found
// the rule of session 16, thresholds 768 / 1024 on the raw bound, changing bits between a bound
// of 640 and its padding to 1,024 at 16 items). The item thresholds (8, 1) are batch buckets too.
int small_chunk_max_items(int context_bound) {
  int64_t cls = 1;
  while (cls < context_bound) cls *= 2;
  if (cls <= 512) return 1 << 30;  // every launch
  if (cls <= 1024) return 8;
  return 1;
}

int paged_chunk(int num_work_items, int context_bound, bool batch_invariant, int forced_chunk) {
  if (forced_chunk != 0) return forced_chunk;  // 32 or 64 (checked by the backend's constructor)
  if (batch_invariant) return kDefaultChunk;
  return num_work_items <= small_chunk_max_items(context_bound) ? kSmallChunk : kDefaultChunk;
}

void check_heads_view(const Tensor& t, const char* what) {
  check_float(t, what);
  DI_CHECK(t.ndim == 3 && t.stride[2] == 1, what, ": expected [T, heads, dim] with contiguous dim, got ",
           t.describe());
}

}  // namespace

void CudaBackend::paged_attention(const Tensor& q, const PagedKV& kv, const Tensor* indices,
                                  float softmax_scale, int v_dim, Tensor& out, const char* op) {
  const std::string name = op;
  check_heads_view(q, (name + " q").c_str());
  check_heads_view(out, (name + " out").c_str());
  check_float(kv.cache, (name + " cache").c_str());
  check_dtype(kv.block_tables, DType::I32, (name + " block_tables").c_str());
  check_dtype(kv.seq_lens, DType::I32, (name + " seq_lens").c_str());
  check_dtype(kv.query_start, DType::I32, (name + " query_start").c_str());
  const int T = static_cast<int>(q.shape[0]), H = static_cast<int>(q.shape[1]);
  const int D = static_cast<int>(q.shape[2]);
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() && kv.cache.shape[2] == D,
           op, ": cache ", kv.cache.describe(), " must be [blocks, block_size, ", D, "]");
  DI_CHECK(out.shape[0] == T && out.shape[1] == H && out.shape[2] == v_dim && v_dim <= D,
           op, ": out ", out.describe(), " must be [", T, ", ", H, ", ", v_dim, "]");
  DI_CHECK(D % 8 == 0 && v_dim % 8 == 0 && D <= 1024 && v_dim <= 512,
           op, ": CUDA needs row_dim and v_dim multiples of 8 (<= 1024 / 512), got ", D,
           " / ", v_dim);
  DI_CHECK(q.dtype == DType::F32 || (q.stride[1] % 8 == 0 && q.stride[0] % 8 == 0),
           op, ": BF16 q rows must be 16-byte aligned, got ", q.describe());
  DI_CHECK(kv.num_seqs >= 1 && kv.query_start.numel() == kv.num_seqs + 1 &&
               kv.seq_lens.numel() == kv.num_seqs && kv.block_tables.ndim == 2 &&
               kv.block_tables.shape[0] >= kv.num_seqs && kv.max_seq_len > 0,
           op, ": addressing (num_seqs ", kv.num_seqs, ", query_start ",
           kv.query_start.describe(), ", seq_lens ", kv.seq_lens.describe(), ", block_tables ",
           kv.block_tables.describe(), ", max_seq_len ", kv.max_seq_len, ") is inconsistent");
  int topk = 0;
  if (indices != nullptr) {
    check_dtype(*indices, DType::I32, (name + " indices").c_str());
    DI_CHECK(indices->ndim == 2 && indices->shape[0] == T && indices->is_contiguous() &&
                 indices->shape[1] > 0,
             op, ": indices ", indices->describe(), " must be contiguous I32 [", T, ", k > 0]");
    topk = static_cast<int>(indices->shape[1]);
  }
  if (T == 0) return;
  PagedArgs a{};
  a.indices = indices != nullptr ? indices->ptr<int32_t>() : nullptr;
  a.topk = topk;
  a.q = q.data;
  a.q_kind = float_kind(q.dtype);
  a.q_s0 = q.stride[0];
  a.q_s1 = q.stride[1];
  a.cache = kv.cache.data;
  a.cache_kind = float_kind(kv.cache.dtype);
  a.block_tables = kv.block_tables.ptr<int32_t>();
  a.max_blocks = static_cast<int>(kv.block_tables.shape[1]);
  a.block_size = static_cast<int>(kv.cache.shape[1]);
  a.seq_lens = kv.seq_lens.ptr<int32_t>();
  a.query_start = kv.query_start.ptr<int32_t>();
  a.num_seqs = kv.num_seqs;
  a.T = T;
  a.H = H;
  a.D = D;
  a.V = v_dim;
  const int chunk = paged_chunk(T * ((H + 15) / 16), indices != nullptr ? topk : kv.max_seq_len,
                                options_.batch_invariant, options_.cuda.attn_chunk);
  // Dense: chunks of the context (max_seq_len bounds every token's); sparse: of the topk list
  // (a fixed count: graph-stable whatever the contexts).
  a.max_splits = ((indices != nullptr ? topk : kv.max_seq_len) + chunk - 1) / chunk;
  a.h_pad = (H + 15) / 16 * 16;
  a.v_pad = (v_dim + 15) / 16 * 16;
  a.scale = softmax_scale;
  // Partials for a slice of tokens at a time so the workspace stays bounded (<= 512 MiB).
  const size_t per_token = size_t{4} * a.max_splits * a.h_pad * (a.v_pad + 2);
  const int tokens_per_launch = static_cast<int>(std::max<size_t>(1, std::min<size_t>(T, (size_t{512} << 20) / per_token)));
  a.part_o = static_cast<float*>(scratch(kSlotAttn, per_token * tokens_per_launch, op));
  a.part_ml = a.part_o + size_t{1} * tokens_per_launch * a.max_splits * a.h_pad * a.v_pad;
  const size_t smem = paged_smem_bytes(D, chunk);
  auto kernel = chunk == 32 ? mla_paged_kernel<32> : mla_paged_kernel<64>;
  set_smem_limit(reinterpret_cast<const void*>(kernel), smem, op);
  const std::string shapes = q.describe() + " cache " + kv.cache.describe();
  for (int t0 = 0; t0 < T; t0 += tokens_per_launch) {
    const int nt = std::min(tokens_per_launch, T - t0);
    a.token0 = t0;
    dim3 grid(a.max_splits, nt, (H + 15) / 16);
    launch_pdl(pdl_, grid, 256, smem, stream_, kernel, a);
    check_launch(op, shapes);
    launch_pdl(pdl_, dim3(nt, H), 128, 0, stream_, mla_combine_kernel, a, chunk, out.data, float_kind(out.dtype),
               out.stride[0], out.stride[1]);
    check_launch((name + " (combine)").c_str(), shapes);
  }
}

void CudaBackend::mla_attention_paged(const Tensor& q, const PagedKV& kv, float softmax_scale,
                                      int v_dim, Tensor& out) {
  paged_attention(q, kv, nullptr, softmax_scale, v_dim, out, "mla_attention_paged");
}

void CudaBackend::mla_attention_paged_sparse(const Tensor& q, const PagedKV& kv,
                                             const Tensor& indices, float softmax_scale, int v_dim,
                                             Tensor& out) {
  paged_attention(q, kv, &indices, softmax_scale, v_dim, out, "mla_attention_paged_sparse");
}

namespace {

// The checked arguments of a direct prefill op (`op` names it in errors).
// context: k and v hold every sequence's whole context (any row count, the same for both);
// otherwise the q rows.
PrefillArgs prefill_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_start,
                         int num_seqs, float softmax_scale, Tensor& out, const char* op, bool context = false) {
  const std::string name = op;
  check_heads_view(q, (name + " q").c_str());
  check_heads_view(k, (name + " k").c_str());
  check_heads_view(v, (name + " v").c_str());
  check_heads_view(out, (name + " out").c_str());
  check_dtype(query_start, DType::I32, (name + " query_start").c_str());
  DI_CHECK(q.dtype == DType::BF16 && k.dtype == DType::BF16 && v.dtype == DType::BF16, op,
           ": CUDA needs BF16 q, k, v, got ", q.describe(), ", ", k.describe(), ", ", v.describe());
  const int T = static_cast<int>(q.shape[0]), H = static_cast<int>(q.shape[1]);
  const int Dq = static_cast<int>(q.shape[2]), Dv = static_cast<int>(v.shape[2]);
  const int64_t N = context ? k.shape[0] : T;
  DI_CHECK(k.shape[0] == N && k.shape[1] == H && k.shape[2] == Dq && v.shape[0] == N &&
               v.shape[1] == H && out.shape[0] == T && out.shape[1] == H && out.shape[2] == Dv,
           op, ": q ", q.describe(), ", k ", k.describe(), ", v ", v.describe(), ", out ",
           out.describe(), " do not match");
  DI_CHECK(Dq % 8 == 0 && Dv % 8 == 0 && Dq <= 256 && Dv <= 256 && q.stride[0] % 8 == 0 &&
               q.stride[1] % 8 == 0 && k.stride[0] % 8 == 0 && k.stride[1] % 8 == 0 &&
               v.stride[0] % 8 == 0 && v.stride[1] % 8 == 0,
           op, ": CUDA needs head dims multiples of 8 (<= 256) and 16-byte aligned rows, got q ",
           q.describe(), ", v ", v.describe());
  DI_CHECK(num_seqs >= 1 && query_start.numel() == num_seqs + 1, op, ": query_start ",
           query_start.describe(), " for ", num_seqs, " sequences");
  PrefillArgs a{};
  a.q = static_cast<const bf16*>(q.data);
  a.k = static_cast<const bf16*>(k.data);
  a.v = static_cast<const bf16*>(v.data);
  a.q_s0 = q.stride[0];
  a.q_s1 = q.stride[1];
  a.k_s0 = k.stride[0];
  a.k_s1 = k.stride[1];
  a.v_s0 = v.stride[0];
  a.v_s1 = v.stride[1];
  a.query_start = query_start.ptr<int32_t>();
  a.num_seqs = num_seqs;
  a.T = T;
  a.N = static_cast<int>(N);
  a.H = H;
  a.Dq = Dq;
  a.Dv = Dv;
  a.scale = softmax_scale;
  a.out = out.data;
  a.out_kind = float_kind(out.dtype);
  a.o_s0 = out.stride[0];
  a.o_s1 = out.stride[1];
  return a;
}

// The direct prefill kernel for a's head dims: the wgmma one for the model's 192 / 128
// (mla_prefill_wgmma.cu), the mma.sync one (fa::prefill_kernel) for the others.
void launch_prefill(CudaBackend& be, const PrefillArgs& a, cudaStream_t stream, const char* op) {
  if (fa3::fits(a)) {
    be.set_smem_limit(fa3::kernel(), fa3::smem_bytes(), op);
    fa3::launch(a, stream);
    return;
  }
  const fa::Launch l = fa::launch_for(a);
  be.set_smem_limit(reinterpret_cast<const void*>(l.kernel), l.smem, op);
  l.kernel<<<l.grid, fa::kThreads, l.smem, stream>>>(a);
}

}  // namespace

void CudaBackend::mla_attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& query_start, int num_seqs, float softmax_scale,
                                        Tensor& out) {
  const PrefillArgs a =
      prefill_args(q, k, v, query_start, num_seqs, softmax_scale, out, "mla_attention_prefill");
  if (a.T == 0) return;
  launch_prefill(*this, a, stream_, "mla_attention_prefill");
  check_launch("mla_attention_prefill", q.describe() + " " + v.describe());
}

void CudaBackend::mla_attention_prefill_context(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const PagedKV& kv, float softmax_scale, Tensor& out) {
  const char* op = "mla_attention_prefill_context";
  check_dtype(kv.seq_lens, DType::I32, "mla_attention_prefill_context seq_lens");
  DI_CHECK(kv.seq_lens.numel() == kv.num_seqs, op, ": seq_lens ", kv.seq_lens.describe(), " for ",
           kv.num_seqs, " sequences");
  PrefillArgs a = prefill_args(q, k, v, kv.query_start, kv.num_seqs, softmax_scale, out, op, true);
  a.seq_lens = kv.seq_lens.ptr<int32_t>();
  if (a.T == 0) return;
  launch_prefill(*this, a, stream_, op);
  check_launch(op, q.describe() + " " + k.describe() + " " + v.describe());
}

void CudaBackend::mla_attention_prefill_sparse(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& query_start, int num_seqs,
                                               const Tensor& indices, float softmax_scale,
                                               Tensor& out) {
  const char* op = "mla_attention_prefill_sparse";
  const PrefillArgs a = prefill_args(q, k, v, query_start, num_seqs, softmax_scale, out, op);
  const int T = static_cast<int>(q.shape[0]);
  check_dtype(indices, DType::I32, "mla_attention_prefill_sparse indices");
  DI_CHECK(indices.ndim == 2 && indices.shape[0] == T && indices.is_contiguous() && indices.shape[1] > 0,
           op, ": indices ", indices.describe(), " must be contiguous I32 [", T, ", k > 0]");
  if (T == 0) return;
  const int topk = static_cast<int>(indices.shape[1]);
  const size_t smem = size_t{4} * (a.Dq + 2 * size_t{static_cast<unsigned>(topk)});
  set_smem_limit(reinterpret_cast<const void*>(mla_prefill_sparse_kernel), smem, op);
  mla_prefill_sparse_kernel<<<dim3(T, a.H), 128, smem, stream_>>>(a, indices.ptr<int32_t>(), topk);
  check_launch(op, q.describe() + " " + v.describe() + " indices " + indices.describe());
}

}  // namespace deepinfer::cuda
