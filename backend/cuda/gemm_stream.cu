// Weight-streaming tensor-core GEMM for few rows per weight (decode, MoE decode experts,
// MLA's per-head absorbed GEMMs) and for every GEMM in batch-invariant mode.
//
// out[r, n] = sum_k A[r, k] W[n, k]. One block = KS warps on one 8 * NT column tile; warp w
// owns K range [w * kpw, (w + 1) * kpw) (kpw a multiple of 64 fixed by K alone) and reads
// its weight rows once per 16 * MT rows with 16-byte loads, two 64-wide K chunks in flight.
// The warps' partial sums are added in warp order through shared memory (no atomics).
//
// mma.sync m16n8k16 (bf16 in, fp32 accumulate). Lane l (group g = l / 4, q = l % 4) loads
// 16 consecutive K values k0 + 16 q + j (j < 16) of weight row n0 + g and of activation
// rows g and g + 8; MMA step s (of 4) takes j = 4s..4s+3 as the K slots {2q, 2q+1, 2q+8,
// 2q+9} of both operands. Every K value meets its partner in exactly one slot, so the
// product is the plain dot product, summed in a fixed order that does not depend on M.
// FP8 weights (e4m3, exact in bf16) are converted in registers; each 64-wide chunk's
// product is scaled by its 128x128 block scale in fp32 before joining the accumulator.
// kWeightFP8Fold (smaller blocks, V4.1's 32x32): each lane's 16 values lie in one block, whose
// scale is folded into their BF16 conversion (gemm_problem.h); the MMA then runs as for BF16.
//
// Batch invariance: a row's value depends only on its own A row, W and K (the MMA computes
// each output element from its own row; KS and the chunk order depend on K only), so the
// same bits come out for M = 1 or M = 4096, alone or grouped, whatever MT is.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemm_problem.h"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/stream_mma.cuh"

namespace deepinfer::cuda {
namespace {

using namespace smma;  // NOLINT: the shared fragment helpers (stream_mma.cuh)

// Weight chunks per warp a dense stream GEMM asks L2 for before its programmatic wait.
constexpr int kStreamPrefetch = 4;

__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
}

// grid (ceil(N / (8 NT)), groups or heads or 1); block KS warps; dynamic smem for the split-K sum.
template <int WK, int MT, int NT>
__global__ void __launch_bounds__(256) stream_gemm_kernel(GemmProblem p, int kpw, int rows_per_z) {
  extern __shared__ float red[];  // [KS][MT * NT * 4][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = blockDim.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  // A programmatic dependent (pdl_launch.cuh). Dense and per-head problems (gemm_heads: weights
  // and their addresses from the arguments alone) ask L2 for the first kStreamPrefetch chunks of
  // the warp's weights before waiting for the kernel before them; grouped ones (rows, groups and
  // weight tables from the index kernel) wait first.
  if (p.group_offsets == nullptr && p.active_groups == nullptr && p.w_ptrs == nullptr) {
    const WeightSource ws = weight_source<WK>(p, blockIdx.y, blockIdx.x * 8 * NT);
    const int kb = warp * kpw, ke = min(p.K, kb + min(kpw, kStreamPrefetch * kChunk));
    for (int k = kb; k < ke; k += kChunk)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int r = min(ws.wrow0 + j * 8 + g, ws.wrows - 1);
        prefetch_l2(static_cast<const char*>(ws.base) + (static_cast<int64_t>(r) * p.K + k + 16 * q) *
                                                            (one_byte<WK>() ? 1 : 2));
      }
  }
  pdl_wait();
  pdl_trigger();  // a following pipeline GEMM (o after uv) may start streaming its weights (dec18)
  int grp = blockIdx.y;
  if (p.active_groups) {  // grid.y covers at most the groups with rows, listed in order
    if (grp >= *p.num_active_groups) return;
    grp = p.active_groups[grp];
  }
  int r0 = 0, r1 = p.M;
  if (p.group_offsets) {
    r0 = p.group_offsets[grp];
    r1 = p.group_offsets[grp + 1];
  }
  r0 += blockIdx.z * rows_per_z;  // row slice of this block (grid.z)
  r1 = min(r1, r0 + rows_per_z);
  if (r0 >= r1) return;
  const int n0 = blockIdx.x * 8 * NT;  // first output column of the tile
  const WeightSource ws = weight_source<WK>(p, grp, n0);
  const void* wbase = ws.base;
  const float* sbase = ws.s;
  const int wrow0 = ws.wrow0, wrows = ws.wrows;
  const bf16* a = static_cast<const bf16*>(p.a) + static_cast<int64_t>(grp) * p.a_head_stride;
  const int K = p.K;
  const int kb = warp * kpw, ke = min(K, kb + kpw);
  const int esz = one_byte<WK>() ? 1 : 2;
  const char* wr[NT];
  int lrow[NT];  // the lane's weight row per n tile (kWeightFP8Fold's scale row)
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int r = min(wrow0 + j * 8 + g, wrows - 1);  // clamp: columns past N are not stored
    wr[j] = static_cast<const char*>(wbase) + static_cast<int64_t>(r) * K * esz;
    lrow[j] = r;
  }

  for (int rb = r0; rb < r1; rb += 16 * MT) {
    const bf16* ar[MT][2];
    bool av[MT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rb + i * 16 + h * 8 + g;
        av[i][h] = r < r1;
        const int rr = av[i][h] ? r : r0;
        ar[i][h] = a + static_cast<int64_t>(p.a_rows ? p.a_rows[rr] : rr) * p.lda;
      }
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    WRaw<WK> cur[NT], nxt[NT];
    float scur[NT], snxt[NT];  // FP8: the chunk's block scale per n tile, loaded with the weights
    float fcur[NT], fnxt[NT];  // kWeightFP8Fold: the lane's scale per n tile
    if (kb < ke) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        cur[j] = load_w<WK>(wr[j], kb + 16 * q);
        scur[j] = chunk_scale<WK>(sbase, p.scale_cols, min(wrow0 + j * 8, wrows - 1), kb);
        fcur[j] = fold_scale<WK>(sbase, p, lrow[j], kb + 16 * q);
      }
    }
    for (int k = kb; k < ke; k += kChunk) {
      const bool more = k + kChunk < ke;
      if (more) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          nxt[j] = load_w<WK>(wr[j], k + kChunk + 16 * q);
          snxt[j] = chunk_scale<WK>(sbase, p.scale_cols, min(wrow0 + j * 8, wrows - 1), k + kChunk);
          fnxt[j] = fold_scale<WK>(sbase, p, lrow[j], k + kChunk + 16 * q);
        }
      }
      // Activations: rows g and g + 8 of each m tile, 16 values each.
      Chunk16 av16[MT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (av[i][h]) {
            av16[i][h] = load16_bf16(ar[i][h] + k + 16 * q);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) av16[i][h].w[e] = 0u;
          }
        }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t w[8];
        w_words<WK>(cur[j], w, fcur[j]);
        float part[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[i][e] = 0.0f;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            if constexpr (WK == kWeightFP8) {
              mma_bf16(part[i], av16[i][0].w[2 * s], av16[i][1].w[2 * s], av16[i][0].w[2 * s + 1],
                       av16[i][1].w[2 * s + 1], w[2 * s], w[2 * s + 1]);
            } else {
              mma_bf16(acc[i][j], av16[i][0].w[2 * s], av16[i][1].w[2 * s], av16[i][0].w[2 * s + 1],
                       av16[i][1].w[2 * s + 1], w[2 * s], w[2 * s + 1]);
            }
          }
        }
        if constexpr (WK == kWeightFP8) {
          const float sc = scur[j];
#pragma unroll
          for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] += sc * part[i][e];
        }
      }
      if (more) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          cur[j] = nxt[j];
          scur[j] = snxt[j];
          fcur[j] = fnxt[j];
        }
      }
    }
    // Split-K sum in warp order.
    constexpr int V = MT * NT * 4;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(warp * V + (i * NT + j) * 4 + e) * 32 + lane] = acc[i][j][e];
    __syncthreads();
    // Warp w stores the m tiles i with i % ks == w (all when ks == 1).
    for (int i = warp; i < MT; i += ks) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int v = (i * NT + j) * 4 + e;
          float sum = red[v * 32 + lane];
          for (int w = 1; w < ks; ++w) sum += red[(w * V + v) * 32 + lane];
          const int r = rb + i * 16 + g + (e >= 2 ? 8 : 0);
          const int n = n0 + j * 8 + 2 * q + (e & 1);
          if (r < r1 && n < p.N) store_out(p, grp, r, n, sum);
        }
    }
    __syncthreads();
  }
}

// Few rows, the weights in registers (gemm18; gemm_heads at decode). grid (ceil(N / 16), heads
// or 1); block ks warps. Each lane loads all NCH chunks of its two weight rows (32 bytes per chunk
// and n8 tile) before pdl_wait: the weights are constants, so every weight byte of the GEMM is on
// its way under the previous kernel (the stream kernel only asks L2 for the first chunks there,
// then loads them two at a time after the wait, one activation load per chunk in between). After
// the wait: all NCH chunks of the lane's two activation rows at once, the MMAs, the split-K sum.
// The fragments, the chunk and MMA order and the warp-order sum are the stream kernel's (MT 1),
// so are the bits; with one warp (K <= 256) the warp's sums go straight to the output. At most
// 128 registers (NCH 4: 2 blocks of 8 warps per SM).
// gemm18x: a block holds tpb = blockDim / (32 ks) column tiles side by side (ks warps each; the
// same work and sums per tile as one tile per block), so the grid has tpb times fewer CTAs.
template <int NCH>
__global__ void __launch_bounds__(256, 2) stream_resident_kernel(GemmProblem p, int kpw, int ks) {
  constexpr int V = kNT * 4;  // accumulator values per lane
  extern __shared__ float red_all[];  // [tpb][ks][V][32] (none with one warp per tile)
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % ks, slot = (threadIdx.x >> 5) / ks;
  const int tpb = (blockDim.x >> 5) / ks;
  float* red = red_all + slot * ks * V * 32;
  const int g = lane >> 2, q = lane & 3;
  const int grp = blockIdx.y, n0 = (blockIdx.x * tpb + slot) * 8 * kNT;
  const WeightSource ws = weight_source<kWeightBF16>(p, grp, n0);
  const int K = p.K, kb = warp * kpw;
  const int nch = kb < K && n0 < p.N ? min(NCH, (min(K, kb + kpw) - kb) / kChunk) : 0;
  WRaw<kWeightBF16> w[NCH][kNT];
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const int r = min(ws.wrow0 + j * 8 + g, ws.wrows - 1);  // clamp: columns past N are not stored
    const bf16* wr = static_cast<const bf16*>(ws.base) + static_cast<int64_t>(r) * K;
#pragma unroll
    for (int c = 0; c < NCH; ++c)
      if (c < nch) w[c][j] = load_w<kWeightBF16>(wr, kb + c * kChunk + 16 * q);
  }
  pdl_wait();
  pdl_trigger();
  const bf16* a = static_cast<const bf16*>(p.a) + static_cast<int64_t>(grp) * p.a_head_stride;
  for (int rb = 0; rb < p.M; rb += 16) {
    Chunk16 av[NCH][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rb + h * 8 + g;
      const bf16* ar = a + static_cast<int64_t>(r < p.M ? r : 0) * p.lda + kb + 16 * q;
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        if (r < p.M && c < nch) {
          av[c][h] = load16_bf16(ar + c * kChunk);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) av[c][h].w[e] = 0u;
        }
      }
    }
    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      if (c >= nch) continue;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        uint32_t wv[8];
        w_words<kWeightBF16>(w[c][j], wv);
#pragma unroll
        for (int s = 0; s < 4; ++s)
          mma_bf16(acc[j], av[c][0].w[2 * s], av[c][1].w[2 * s], av[c][0].w[2 * s + 1], av[c][1].w[2 * s + 1],
                   wv[2 * s], wv[2 * s + 1]);
      }
    }
    if (ks == 1) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int r = rb + g + ((v & 3) >= 2 ? 8 : 0);
        const int n = n0 + (v >> 2) * 8 + 2 * q + (v & 1);
        if (r < p.M && n < p.N) store_out(p, grp, r, n, acc[v >> 2][v & 3]);
      }
      continue;
    }
    // Split-K sum in warp order; value v by warp v % ks.
#pragma unroll
    for (int v = 0; v < V; ++v) red[(warp * V + v) * 32 + lane] = acc[v >> 2][v & 3];
    __syncthreads();
    for (int v = warp; v < V; v += ks) {
      float sum = red[v * 32 + lane];
      for (int u = 1; u < ks; ++u) sum += red[(u * V + v) * 32 + lane];
      const int r = rb + g + ((v & 3) >= 2 ? 8 : 0);
      const int n = n0 + (v >> 2) * 8 + 2 * q + (v & 1);
      if (r < p.M && n < p.N) store_out(p, grp, r, n, sum);
    }
    if (rb + 16 < p.M) __syncthreads();
  }
}

const void* resident_kernel(int nch) {
  switch (nch) {
    case 1: return reinterpret_cast<const void*>(stream_resident_kernel<1>);
    case 2: return reinterpret_cast<const void*>(stream_resident_kernel<2>);
    case 3: return reinterpret_cast<const void*>(stream_resident_kernel<3>);
    default: return reinterpret_cast<const void*>(stream_resident_kernel<4>);
  }
}

template <int WK, int MT>
void launch(const GemmProblem& p, bool pdl, cudaStream_t stream) {
  const int ks = k_split(p.K);
  const int kpw = stream_kpw(p.K);
  int groups = p.group_offsets ? p.num_groups : (p.heads > 0 ? p.heads : 1);
  if (p.group_offsets && p.active_groups) groups = std::min(p.num_groups, std::max(1, p.max_rows));
  // Row slices of 4 passes (grid.z) so that large M (batch-invariant prefill) fills the chip;
  // grouped problems bound a group's rows by max_rows.
  const int rows_per_z = 16 * MT * 4;
  const int max_group_rows = p.group_offsets ? p.max_rows : p.M;
  dim3 grid(ceil_div(p.N, 8 * kNT), groups, std::max(1u, ceil_div(max_group_rows, rows_per_z)));
  const size_t smem = size_t{4} * ks * MT * kNT * 4 * 32;
  launch_pdl(pdl, grid, ks * 32, smem, stream, stream_gemm_kernel<WK, MT, kNT>, p, kpw, rows_per_z);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

}  // namespace

bool stream_gemm_supported(const GemmProblem& p) {
  if (p.K % kChunk != 0 || p.lda % 8 != 0 || !aligned16(p.a)) return false;
  if (p.heads > 0 && (p.w_kind == kWeightFP8 || p.a_head_stride % 8 != 0 || p.group_offsets)) return false;
  if (p.w_kind == kWeightFP8Fold && (p.heads > 0 || p.group_offsets || p.w2 || p.block_k % 16 != 0)) return false;
  if (p.w_ptrs == nullptr && !aligned16(p.w)) return false;
  if ((p.w2_ptrs || p.w2) && (p.n_half % (8 * kNT) != 0 || p.n_half <= 0 || p.n_half >= p.N)) return false;
  if (p.w2 && (p.heads > 0 || p.w_ptrs || !aligned16(p.w2))) return false;
  // The smem split-K buffer stays under the 48 KB default: ks * MT * 2 * 4 * 32 * 4 <= 32 KB.
  return true;
}

bool stream_resident_supported(const GemmProblem& p) {
  return stream_gemm_supported(p) && p.w_kind == kWeightBF16 && p.M > 0 && p.M <= 16 &&
         p.group_offsets == nullptr && p.w_ptrs == nullptr && p.a_rows == nullptr && p.tiles == nullptr &&
         p.active_groups == nullptr && p.w2 == nullptr && stream_kpw(p.K) <= 4 * kChunk;
}

bool launch_stream_resident(const GemmProblem& p, int num_sms, cudaStream_t stream, bool pdl) {
  if (!stream_resident_supported(p)) return false;
  const int nch = stream_kpw(p.K) / kChunk;
  const void* kernel = resident_kernel(nch);
  const int ks = k_split(p.K), n_tiles = ceil_div(p.N, 8 * kNT);
  const int tpb = std::max(1, std::min(8 / ks, n_tiles)), threads = tpb * ks * 32;
  const size_t smem = ks > 1 ? size_t{4} * tpb * ks * kNT * 4 * 32 : 0;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) per_sm = 0;
  const dim3 grid(ceil_div(n_tiles, tpb), p.heads > 0 ? p.heads : 1);
  // One wave: every block loads its weights under the previous kernel (later waves would start
  // only after the wait).
  if (static_cast<int64_t>(grid.x) * grid.y > static_cast<int64_t>(per_sm) * num_sms) return false;
  const int kpw = stream_kpw(p.K);
  int ks_arg = ks;
  void* args[] = {const_cast<GemmProblem*>(&p), const_cast<int*>(&kpw), &ks_arg};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = pdl_config(pdl, grid, dim3(threads), smem, stream, &attr);
  (void)cudaLaunchKernelExC(&config, kernel, args);  // the caller's check_launch reports a failure
  return true;
}

void launch_stream_gemm(const GemmProblem& p, cudaStream_t stream, bool pdl) {
  // Rows per warp pass: 16 for few rows (decode, MoE experts), 64 otherwise. Either gives
  // the same bits per row (see the file comment).
  const int rows = p.group_offsets ? p.max_rows / std::max(1, p.num_groups) : p.M;
  const bool wide = rows > 24;
  if (p.w_kind == kWeightFP8) {
    if (wide)
      launch<kWeightFP8, 4>(p, pdl, stream);
    else
      launch<kWeightFP8, 1>(p, pdl, stream);
  } else if (p.w_kind == kWeightFP8Fold) {
    if (wide)
      launch<kWeightFP8Fold, 4>(p, pdl, stream);
    else
      launch<kWeightFP8Fold, 1>(p, pdl, stream);
  } else {
    if (wide)
      launch<kWeightBF16, 4>(p, pdl, stream);
    else
      launch<kWeightBF16, 1>(p, pdl, stream);
  }
}

}  // namespace deepinfer::cuda
