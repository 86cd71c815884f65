// Weight-streaming grouped GEMM with the weights staged through shared memory (cp.async),
// for MoE experts at decode: few rows per expert, every expert's weights read once.
//
// Why: the register-staged stream kernel (gemm_stream.cu) gives each block one 16-column
// tile (64 KB of weights at K 2048) and 2 chunks in flight per warp; a block's life is a
// chain of dependent loads (tile list, offsets, pointers) and 2-3 memory round trips, and
// holding more in flight in registers costs occupancy (bench/NOTES: -16..-36%). Here a
// grid of about (SMs x resident blocks) blocks walks the (row entry, column tile) items
// round-robin, and each warp keeps D chunk copies in flight in shared memory across item
// boundaries, so the stream never drains between tiles and the registers stay free.
//
// Same bits as the stream kernel (stream_mma.cuh): the same fragments, the same K split
// over ks warps (K alone fixes it), the same chunk order and MMA order, the warps' partial
// sums added in warp order. Rows come in entries of at most 16 rows (one m16 tile) listed
// by the caller (GemmProblem::tiles with tile_rows 16: (group, first row)), or, for a dense
// problem (no groups, no tile list: few-row dense GEMMs and gemm_pair in decode), entry e is
// rows [16 e, 16 e + 16) of the M rows, read from the dense weight (w, or w | w2).
//
// Shared memory per block: stages [ks][D] of 2 KB (BF16: 16 rows x 128-byte chunk, copied
// as whole row segments into XOR-swizzled 16-byte slots, bf16_slot; FP8: 16 rows x 64 bytes,
// each lane's own 16 bytes), the split-K sums [2][ks][8][32] floats (double-buffered by item
// parity: one block barrier per item), FP8 chunk scales [ks][D][2] floats. D = 2 measured
// best on the H200 (more resident blocks beat more bytes in flight per warp; bench/NOTES).
//
// MoE gate | up with the SwiGLU in the epilogue (GemmProblem::swiglu, moe18): an item's n8
// tiles are gate columns and the same up columns, so one item holds both sums of a (row,
// column) and writes silu_mul's BF16 value of them (no silu_mul launch, no hidden round trip).
// moe_experts' down GEMM reads its tile list (two launches old) and streams its first chunks
// before its programmatic wait (GemmProblem::tiles_early).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemm_problem.h"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/stream_mma.cuh"

namespace deepinfer::cuda {
namespace {

using namespace smma;  // NOLINT: the shared fragment helpers (stream_mma.cuh)

constexpr int kEntryRows = 16;      // rows per entry: one m16 MMA tile (MT = 1)
// n8 tiles per item (NTI): BF16 kNT (16 columns, the stream kernel's tile), FP8 kWideNT (32
// columns: two 16-column tiles of one entry in one item, sharing its activation loads and its
// per-item and per-chunk bookkeeping, so a warp's chunk is 2 KB as for BF16; H200, bench/NOTES.md
// fp8items17: FP8 decode -5.6 / -9.7 / -13.0 / -9.6% at batch 1 / 8 / 32 / 64 against main's 16 columns;
// BF16 with 32 columns was -1.3% at batch 1, +0.3% at 8, equal at 32 / 64). Every column's
// products, their order, the FP8 scales and the split-K sum are those of the 16-column item: the
// same bits as the stream kernel.
constexpr int kWideNT = 2 * kNT;
template <int WK>
constexpr int item_tiles() {
  return WK == kWeightFP8 ? kWideNT : kNT;
}
constexpr int values_per_lane(int nti) {  // accumulator values per lane (MT 1 x NTI x 4)
  return nti * 4;
}

// BF16 stage slot (16 bytes) of n8 tile j, row r (0..7), segment c (0..7) of the 128-byte
// chunk: rows of 8 slots, the segment XOR (r & 1) so that the 8 lanes of a quarter warp
// reading (rows g, g + 1; segments 2q + h) hit 8 different 16-byte bank groups.
__device__ __forceinline__ int bf16_slot(int j, int r, int c) { return j * 64 + r * 8 + (c ^ (r & 1)); }

constexpr int pieces_per_chunk(bool fp8, int nti) {  // 16-byte pieces per lane per 64-wide chunk
  return nti * (fp8 ? 1 : 2);
}

// 16 bytes global -> shared, not cached in L1 (every weight byte is read once). (The
// L2::256B prefetch hint measured 0.5-0.7% slower on the H200, bench/NOTES.)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The weight rows one lane copies for the NTI n8 tiles at column n0 of group grp (issue side):
// one row per copy instruction, i = j (FP8) or 2 j + half (BF16), and (FP8) the scale row of
// n8 tile `lane`'s 128-row block (lanes < NTI copy the scales). A 32-column item looks its
// weight up per 16-column half (gemm_pair / gate|up: the halves may read different weights).
// BF16: copy instruction (j, half) moves rows half * 4 + lane / 8 of n8 tile j, 16 bytes at
// 16 * (lane % 8): 4 whole 128-byte row segments per instruction (the fragment order, 32-byte
// stride per lane, would fetch each L2 sector twice). FP8: lane (g, q) copies row g, 16 bytes
// at 16 q: whole 64-byte segments already, read back by the same lane.
template <int WK, int NTI>
struct RowPtrs {
  static constexpr int kRows = WK == kWeightFP8 ? NTI : 2 * NTI;
  const char* w[kRows];
  const float* s;  // FP8, lanes < NTI: the scale row of n8 tile `lane`
};
template <int WK, int NTI>
__device__ __forceinline__ void row_ptrs(const GemmProblem& p, int grp, int n0, int copy_row, int lane,
                                         RowPtrs<WK, NTI>& rp) {
  constexpr int esz = WK == kWeightFP8 ? 1 : 2;
  constexpr int kHalfRows = RowPtrs<WK, NTI>::kRows / (NTI / kNT);  // copy rows per 16 columns
#pragma unroll
  for (int h = 0; h < NTI / kNT; ++h) {
    const WeightSource w = weight_source<WK>(p, grp, n0 + h * 8 * kNT);
#pragma unroll
    for (int i = 0; i < kHalfRows; ++i) {
      const int j = WK == kWeightFP8 ? i : i >> 1;  // n8 tile within the half
      const int row = WK == kWeightFP8 ? copy_row : (i & 1) * 4 + copy_row;
      const int r = min(w.wrow0 + j * 8 + row, w.wrows - 1);  // clamp: columns past N are not stored
      rp.w[h * kHalfRows + i] = static_cast<const char*>(w.base) + static_cast<int64_t>(r) * p.K * esz;
    }
    if constexpr (WK == kWeightFP8) {
      if ((lane >> 1) == h) rp.s = w.s + (min(w.wrow0 + (lane & 1) * 8, w.wrows - 1) / 128) * p.scale_cols;
    }
  }
}

// The same for a SwiGLU item (GemmProblem::swiglu): n8 tile j < NTI / 2 reads gate rows
// n0 + 8 j, tile NTI / 2 + j the same rows of the up weight (w2_ptrs); copy row i as above.
template <int WK, int NTI>
__device__ __forceinline__ void row_ptrs_swiglu(const GemmProblem& p, int grp, int n0, int copy_row, int lane,
                                                RowPtrs<WK, NTI>& rp) {
  constexpr int esz = WK == kWeightFP8 ? 1 : 2;
  constexpr int kTileRows = RowPtrs<WK, NTI>::kRows / NTI;  // copy rows per n8 tile: FP8 1, BF16 2
  const char* const gate = static_cast<const char*>(p.w_ptrs[grp]);
  const char* const up = static_cast<const char*>(p.w2_ptrs[grp]);
#pragma unroll
  for (int i = 0; i < RowPtrs<WK, NTI>::kRows; ++i) {
    const int j = i / kTileRows;
    const bool second = j >= NTI / 2;
    const int row = WK == kWeightFP8 ? copy_row : (i & 1) * 4 + copy_row;
    const int r = min(n0 + (second ? j - NTI / 2 : j) * 8 + row, p.n_half - 1);
    rp.w[i] = (second ? up : gate) + static_cast<int64_t>(r) * p.K * esz;
  }
  if constexpr (WK == kWeightFP8) {
    if (lane < NTI) {
      const bool second = lane >= NTI / 2;
      const int r = min(n0 + (second ? lane - NTI / 2 : lane) * 8, p.n_half - 1);
      rp.s = (second ? p.s2_ptrs : p.s_ptrs)[grp] + (r / 128) * p.scale_cols;
    }
  }
}

// Columns of the output one item covers: 8 NTI (SwiGLU: 4 NTI gate columns and the same up ones).
template <int NTI>
__device__ __forceinline__ int item_cols(const GemmProblem& p) {
  return p.swiglu ? 4 * NTI : 8 * NTI;
}

// Copies of the chunk at K offset k into stage st (and FP8: its scales into sc[NTI]).
template <int WK, int NTI>
__device__ __forceinline__ void copy_chunk(uint4* st, float* sc, const RowPtrs<WK, NTI>& rp, int k, int lane,
                                           int copy_row) {
  if constexpr (WK == kWeightFP8) {
#pragma unroll
    for (int j = 0; j < NTI; ++j) cp_async16(st + j * 32 + lane, rp.w[j] + k + 16 * (lane & 3));
    if (lane < NTI) cp_async4(sc + lane, rp.s + k / 128);
  } else {
    (void)sc;
    const int seg = lane & 7;  // 16-byte segment of the row's 128-byte chunk
#pragma unroll
    for (int i = 0; i < RowPtrs<WK, NTI>::kRows; ++i) {
      const int row = (i & 1) * 4 + copy_row;
      cp_async16(st + bf16_slot(i >> 1, row, seg), rp.w[i] + static_cast<int64_t>(k) * 2 + 16 * seg);
    }
  }
}

// The 16 x 64 activations of a lane's rows g and g + 8 at K offset k (zeros for rows past the
// entry's end).
__device__ __forceinline__ void load_a(Chunk16 (&a16)[2], const bf16* const (&ar)[2], const bool (&av)[2], int k,
                                       int q) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (av[h]) {
      a16[h] = load16_bf16(ar[h] + k + 16 * q);
    } else {
#pragma unroll
      for (int v = 0; v < 8; ++v) a16[h].w[v] = 0u;
    }
  }
}

// One chunk's MMAs from stage st (FP8: chunk scales sc[NTI]) into acc.
template <int WK, int NTI>
__device__ __forceinline__ void chunk_mma(float (&acc)[NTI][4], const Chunk16 (&a16)[2], const uint4* st,
                                          const float* sc, int lane, int g, int q) {
#pragma unroll
  for (int j = 0; j < NTI; ++j) {
    WRaw<WK> raw;
    if constexpr (WK == kWeightFP8) {
      raw.u[0] = st[j * 32 + lane];
    } else {
      (void)sc;
      (void)lane;
      raw.u[0] = st[bf16_slot(j, g, 2 * q)];
      raw.u[1] = st[bf16_slot(j, g, 2 * q + 1)];
    }
    uint32_t w[8];
    w_words<WK>(raw, w);
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      if constexpr (WK == kWeightFP8)
        mma_bf16(part, a16[0].w[2 * m], a16[1].w[2 * m], a16[0].w[2 * m + 1], a16[1].w[2 * m + 1], w[2 * m],
                 w[2 * m + 1]);
      else
        mma_bf16(acc[j], a16[0].w[2 * m], a16[1].w[2 * m], a16[0].w[2 * m + 1], a16[1].w[2 * m + 1], w[2 * m],
                 w[2 * m + 1]);
    }
    if constexpr (WK == kWeightFP8) {
      const float s = sc[j];
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[j][v] += s * part[v];
    }
  }
}

// Split-K sum in warp order through rb ([ks][NTI * 4][32] floats) and the stores of rows
// [r0, r1), columns [n0, n0 + 8 NTI) of group grp; value v (n8 tile v / 4, element v % 4) by
// warp v % ks. One block barrier: the caller alternates rb between two halves by item parity (the
// next item writes the other half; the one after it waits for these readers at its barrier).
template <int NTI>
__device__ __forceinline__ void sum_store(const GemmProblem& p, float* rb, const float (&acc)[NTI][4], int warp,
                                          int ks, int lane, int grp, int r0, int r1, int n0) {
  constexpr int kValues = values_per_lane(NTI);
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int j = 0; j < NTI; ++j)
#pragma unroll
    for (int v = 0; v < 4; ++v) rb[(warp * kValues + j * 4 + v) * 32 + lane] = acc[j][v];
  __syncthreads();
  if (p.swiglu) {
    // Value v < kValues / 2 is a gate sum, v + kValues / 2 the up sum of the same row and column;
    // both summed in warp order as below, rounded to BF16 as the pair's rows store them, then
    // silu_mul_kernel's expression (elementwise.cu) on those BF16 values.
    constexpr int kHalf = kValues / 2;
    for (int v = warp; v < kHalf; v += ks) {
      float sg = rb[v * 32 + lane], su = rb[(v + kHalf) * 32 + lane];
      for (int w = 1; w < ks; ++w) {
        sg += rb[(w * kValues + v) * 32 + lane];
        su += rb[(w * kValues + v + kHalf) * 32 + lane];
      }
      const int r = r0 + g + ((v & 3) >= 2 ? 8 : 0);
      const int col = n0 + (v >> 2) * 8 + 2 * q + (v & 1);
      if (r < r1 && col < p.n_half) {
        const float a = __bfloat162float(__float2bfloat16_rn(sg));
        const float b = __bfloat162float(__float2bfloat16_rn(su));
        static_cast<bf16*>(p.c)[static_cast<int64_t>(r) * p.ldc + col] =
            __float2bfloat16_rn(a / (1.0f + __expf(-a)) * b);
      }
    }
    return;
  }
  for (int v = warp; v < kValues; v += ks) {
    float sum = rb[v * 32 + lane];
    for (int w = 1; w < ks; ++w) sum += rb[(w * kValues + v) * 32 + lane];
    const int r = r0 + g + ((v & 3) >= 2 ? 8 : 0);
    const int col = n0 + (v >> 2) * 8 + 2 * q + (v & 1);
    if (r < r1 && col < p.N) store_out(p, grp, r, col, sum);
  }
}

// An item's rows on the consumer side: group, rows [r0, r1), first column n0, and a lane's two
// activation rows (g, g + 8) with their validity. The gathered row index is read at
// min(r, M - 1) whatever r1 is (the pointer of a row past r1 is never read), so the group end and
// the gather are two independent loads after the tile list's.
struct ItemRows {
  int grp, r0, r1, n0;
  const bf16* ar[2];
  bool av[2];
};
template <int NTI>
__device__ __forceinline__ ItemRows item_rows(const GemmProblem& p, int e, int t, int g) {
  ItemRows it;
  const int2 entry = p.tiles ? p.tiles[e] : make_int2(0, e * kEntryRows);
  it.grp = entry.x;
  it.r0 = entry.y;
  it.r1 = min(p.group_offsets ? p.group_offsets[it.grp + 1] : p.M, it.r0 + kEntryRows);
  it.n0 = t * item_cols<NTI>(p);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = it.r0 + h * 8 + g;
    it.av[h] = r < it.r1;
    const int rr = min(r, p.M - 1);
    it.ar[h] = static_cast<const bf16*>(p.a) + static_cast<int64_t>(p.a_rows ? p.a_rows[rr] : rr) * p.lda;
  }
  return it;
}

// grid: min(resident blocks, items); block: ks warps. Items i = entry * n_tiles + tile,
// block b takes b, b + gridDim.x, ...; entries = *p.num_tiles (device).
// The bookkeeping is kept off the MMA path (fp8dec17b, bench/NOTES.md; -3 to -8% per decode step
// against the kernel that looked it up per chunk, same bits):
// - the items are walked by (entry, tile) counters that add the grid stride with a carry (one
//   integer division per block instead of one per chunk and two per item);
// - the next item's rows (tile list, group end, gathered rows) are looked up at the start of the
//   current item, and the activations are loaded one chunk ahead in registers (the next item's
//   first chunk during the current item's last), so no MMA waits on its own activation loads;
// - at most 80 registers (3 blocks of 8 warps per SM; unbounded the look-ahead took 96-114).
template <int WK, int D, int NTI>
__device__ __forceinline__ void pipe_gemm(const GemmProblem& p, int kpw) {
  constexpr int PW = pieces_per_chunk(WK == kWeightFP8, NTI);
  constexpr int kValues = values_per_lane(NTI);
  extern __shared__ uint4 smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = blockDim.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  uint4* stages = smem + warp * D * PW * 32;  // this warp's [D][PW][32]
  float* red = reinterpret_cast<float*>(smem + ks * D * PW * 32);  // [2][ks][kValues][32]
  float* scales = red + 2 * ks * kValues * 32 + warp * D * NTI;  // this warp's [D][NTI] (FP8)

  // Launched as a programmatic dependent (CudaBackend::pdl_): the dense form streams its first
  // D chunks of weights (written by no kernel) before waiting for the previous kernel; the
  // grouped form too when its tile list was written two or more launches back
  // (GemmProblem::tiles_early: moe_experts' down GEMM), else it waits first (its tile list comes
  // from the kernel before: gate|up, a plain launch whose wait is a no-op).
  const bool early = p.tiles == nullptr || p.tiles_early;
  if (!early) pdl_wait();
  const int n_cols = item_cols<NTI>(p);
  const int n_tiles = ((p.swiglu ? p.n_half : p.N) + n_cols - 1) / n_cols;
  const int entries = p.tiles ? *p.num_tiles : (p.M + kEntryRows - 1) / kEntryRows;
  const int total = entries * n_tiles;
  const int first = blockIdx.x, stride = gridDim.x;
  if (first >= total) {  // uniform over the block
    if (early) pdl_wait();
    return;
  }
  const int num_items = (total - first + stride - 1) / stride;
  const int kb = warp * kpw, ke = min(p.K, kb + kpw);
  const int nch = ke > kb ? (ke - kb) / kChunk : 0;  // this warp's chunks per item
  const int steps = num_items * nch;
  // Item first + n * stride is (entry, tile) = (e, t); the next one adds (de, dt) with a carry.
  const int e_first = first / n_tiles, t_first = first - e_first * n_tiles;
  const int de = stride / n_tiles, dt = stride - de * n_tiles;
  auto advance = [&](int& e, int& t) {
    t += dt;
    e += de;
    if (t >= n_tiles) {
      t -= n_tiles;
      ++e;
    }
  };

  // Issue side: copies of step s (item s / nch, chunk s % nch) into stage s % D, steps in order.
  // The item's weight rows are looked up once per item.
  const int copy_row = WK == kWeightFP8 ? g : lane >> 3;
  RowPtrs<WK, NTI> rp = {};
  int ie = e_first, it = t_first, ic = 0;  // the item and chunk of the next copy
  auto issue = [&](int s) {
    const int c = ic;
    if (ic == 0) {
      if (p.swiglu)
        row_ptrs_swiglu<WK, NTI>(p, p.tiles[ie].x, it * n_cols, copy_row, lane, rp);
      else
        row_ptrs<WK, NTI>(p, p.tiles ? p.tiles[ie].x : 0, it * n_cols, copy_row, lane, rp);
    }
    if (++ic == nch) {
      ic = 0;
      advance(ie, it);
    }
    copy_chunk<WK, NTI>(stages + (s % D) * PW * 32, scales + (s % D) * NTI, rp, kb + c * kChunk, lane, copy_row);
  };
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (s < steps) issue(s);
    cp_async_commit();  // empty groups keep the count uniform for wait_group
  }
  if (early) pdl_wait();  // activations and outputs: after the previous kernel
  pdl_trigger();          // the next kernel (norm, silu_mul, combine) may launch (pdl17)

  ItemRows cur{}, nxt{};  // this item's rows, the next item's
  int ne = e_first, nt = t_first;  // the item after `cur`
  Chunk16 a16[2];  // the activations of the chunk the next MMAs take
  cur = item_rows<NTI>(p, ne, nt, g);
  advance(ne, nt);
  if (nch > 0) load_a(a16, cur.ar, cur.av, kb, q);
  int s = 0;
  for (int n = 0; n < num_items; ++n) {
    const bool more = n + 1 < num_items;
    if (more) {
      nxt = item_rows<NTI>(p, ne, nt, g);
      advance(ne, nt);
    }
    float acc[NTI][4];
#pragma unroll
    for (int j = 0; j < NTI; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[j][v] = 0.0f;

    for (int c = 0; c < nch; ++c, ++s) {
      Chunk16 an[2];  // the next chunk's (this item's, or the next item's first)
      if (c + 1 < nch) {
        load_a(an, cur.ar, cur.av, kb + (c + 1) * kChunk, q);
      } else {
        const bool av[2] = {more && nxt.av[0], more && nxt.av[1]};  // zeros after the last item
        load_a(an, nxt.ar, av, kb, q);
      }
      cp_async_wait<D - 1>();  // this lane's copies of step s have landed
      __syncwarp();  // and every lane's (BF16 rows and FP8 scales are read across lanes)
      chunk_mma<WK, NTI>(acc, a16, stages + (s % D) * PW * 32, scales + (s % D) * NTI, lane, g, q);
      __syncwarp();  // stage s % D is refilled only after every lane has read it
      if (s + D < steps) issue(s + D);
      cp_async_commit();
#pragma unroll
      for (int h = 0; h < 2; ++h) a16[h] = an[h];
    }
    sum_store<NTI>(p, red + (n & 1) * ks * kValues * 32, acc, warp, ks, lane, cur.grp, cur.r0, cur.r1, cur.n0);
    cur = nxt;
  }
}
// 16-column items (BF16): at most 80 registers (3 blocks of 8 warps per SM); 32-column items (FP8):
// 128 (2 blocks: their accumulators and the four tiles' copy rows do not fit 80 without spilling
// in the chunk loop; 3 stages for them lost 1.5% to 2 on the H200).
template <int WK, int D, int NTI>
__global__ void __launch_bounds__(256, NTI == kWideNT ? 2 : 3) pipe_gemm_kernel(GemmProblem p, int kpw) {
  pipe_gemm<WK, D, NTI>(p, kpw);
}

template <int WK>
const void* pick_stages(int stages) {
  constexpr int NTI = item_tiles<WK>();
  auto k = [](auto kernel) { return reinterpret_cast<const void*>(kernel); };
  switch (stages) {
    case 2: return k(pipe_gemm_kernel<WK, 2, NTI>);
    case 3: return k(pipe_gemm_kernel<WK, 3, NTI>);
    case 8: return k(pipe_gemm_kernel<WK, 8, NTI>);
    default: return k(pipe_gemm_kernel<WK, 4, NTI>);
  }
}

}  // namespace

bool pipe_gemm_supported(const GemmProblem& p) {
  if (!stream_gemm_supported(p) || p.heads != 0) return false;
  if (p.swiglu && (p.w2_ptrs == nullptr || p.tiles == nullptr || 2 * p.n_half != p.N || !p.c_bf16)) return false;
  if (p.group_offsets == nullptr && p.w_ptrs == nullptr && p.tiles == nullptr)  // dense
    return p.M > 0 && p.a_rows == nullptr;
  return p.group_offsets != nullptr && p.w_ptrs != nullptr && p.tiles != nullptr && p.num_tiles != nullptr &&
         p.tile_rows == kEntryRows && p.max_tiles > 0;
}

PipePlan plan_pipe_gemm(const GemmProblem& p, int stages) {
  PipePlan plan;
  plan.stages = stages >= 8 ? 8 : stages >= 4 ? 4 : std::max(2, stages);
  const bool fp8 = p.w_kind == kWeightFP8;
  const int nti = fp8 ? item_tiles<kWeightFP8>() : item_tiles<kWeightBF16>();
  plan.kernel = fp8 ? pick_stages<kWeightFP8>(plan.stages) : pick_stages<kWeightBF16>(plan.stages);
  const int ks = k_split(p.K);
  const int pw = pieces_per_chunk(fp8, nti);
  plan.threads = ks * 32;
  plan.kpw = stream_kpw(p.K);
  plan.smem_bytes = size_t{16} * ks * plan.stages * pw * 32 + size_t{4} * 2 * ks * values_per_lane(nti) * 32 +
                    size_t{4} * ks * plan.stages * nti;
  const int n_tiles = p.swiglu ? ceil_div(p.n_half, 4 * nti) : ceil_div(p.N, 8 * nti);
  const int64_t entries = p.tiles ? p.max_tiles : ceil_div(p.M, kEntryRows);
  plan.max_items = entries * n_tiles;
  return plan;
}

void launch_pipe_gemm(const GemmProblem& p, const PipePlan& plan, int num_sms, bool pdl, cudaStream_t stream) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, plan.kernel, plan.threads, plan.smem_bytes) !=
          cudaSuccess ||
      per_sm < 1)
    per_sm = 1;
  const int64_t blocks = std::min<int64_t>(static_cast<int64_t>(num_sms) * per_sm, plan.max_items);
  if (blocks <= 0) return;
  void* args[] = {const_cast<GemmProblem*>(&p), const_cast<int*>(&plan.kpw)};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config =
      pdl_config(pdl, dim3(static_cast<unsigned>(blocks)), dim3(plan.threads), plan.smem_bytes, stream, &attr);
  cudaLaunchKernelExC(&config, plan.kernel, args);
}

}  // namespace deepinfer::cuda
