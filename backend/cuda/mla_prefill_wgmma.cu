// Direct causal MLA prefill on Hopper's warpgroup MMA (wgmma), FlashAttention-3 style, for
// head dims that pad to 192 (q/k: the model's 128 nope + 64 rope) / 128 (v). It replaced the
// mma.sync kernel (fa::prefill_kernel, mla_attention.cu) for those dims (H200 A/B in
// bench/NOTES.md, "fa3"); the other dims (the tiny golden models') keep that one.
//
// A block takes kBr = 128 queries of one sequence and one head: two warpgroups of 64 query
// rows each. Q, K and V live in shared memory in the 128-byte-swizzled layouts wgmma reads
// through matrix descriptors: Q and K K-major ([rows][64 dims] blocks, 128-byte rows, 16-byte
// chunk c of row r at c ^ (r % 8)), V MN-major (the same blocks over [keys][64 value dims],
// read transposed). Key tiles of kBc = 128 go through two cp.async stages per operand (rows
// past the sequence or the tensor and columns past the head dim are zero-filled, so padding
// never carries NaN). Per tile a warpgroup computes S = Q·K^T (64 x 128 fp32 in registers,
// wgmma m64n128k16 from shared memory, 12 k-steps), masks it only on the diagonal /
// sequence-end tiles, runs the online softmax in fp32 (base 2) and rounds P to bf16 in
// registers (the accumulator layout is the A-fragment layout: no shuffles); P·V (wgmma
// m64n128k16, P from registers, 8 k-steps) of a tile is issued with the next tile's Q·K^T and
// runs during that tile's softmax. Same tiling for every shape, so a (sequence, row) result
// depends only on its own sequence (batch-invariant); with cached context (a.seq_lens) query i
// sits at position ctx - q_len + i with the key tiles from position 0, as in the mma.sync
// kernel.
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/mla_prefill.cuh"

namespace deepinfer::cuda::fa3 {
namespace {

constexpr int kBr = 128, kBc = 128, kDq = 192, kDv = 128, kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
// Shared memory (bytes, from a 1024-aligned base: the swizzle atoms are 8 rows x 128 bytes):
// Q: 3 blocks of [kBr][128 B]; K stage: 3 blocks of [kBc][128 B]; V stage: 2 of [kBc][128 B].
constexpr int kQBytes = kBr * kDq * 2, kKBytes = kBc * kDq * 2, kVBytes = kBc * kDv * 2;
constexpr int kSmem = kQBytes + 2 * (kKBytes + kVBytes) + 1024;

using acp::cp_async16;
using acp::cp_async_commit;
using acp::cp_async_wait;
using acp::smem_addr;

// Matrix descriptor of a 128-byte-swizzled operand at shared address addr: lbo / sbo in
// bytes (K-major: sbo = 1024 between 8-row groups, lbo unused; MN-major: lbo between the
// 64-wide blocks along M/N, sbo = 1024 between 8-row groups along K).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t{(addr & 0x3FFFFu) >> 4} | uint64_t{lbo >> 4} << 16 | uint64_t{sbo >> 4} << 32 | uint64_t{1} << 62;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared-memory writes of the generic proxy (cp.async, stores) visible to wgmma's async proxy.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define FA3_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                  "+f"(d[i + 6]), "+f"(d[i + 7])
#define FA3_D64 FA3_D8(0), FA3_D8(8), FA3_D8(16), FA3_D8(24), FA3_D8(32), FA3_D8(40), FA3_D8(48), FA3_D8(56)

// d (64 x 128 fp32, accumulator layout) = A·B (+ d when accumulate); A and B K-major in shared memory.
__device__ __forceinline__ void mma_ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : FA3_D64
      : "l"(a), "l"(b), "r"(accumulate));
}
// d += A·B; A (64 x 16 bf16) in registers (the mma.sync m16n8k16 A-fragment per warp), B
// MN-major in shared memory (read transposed).
__device__ __forceinline__ void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : FA3_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
#undef FA3_D64
#undef FA3_D8

// Rows first .. first + kRows - 1 of one head (row i of the sequence at tensor row s0 + i),
// kCols columns, into the swizzled blocks at dst (block b: columns 64b .. 64b + 63, kRows x
// 128 bytes); rows >= len or past the tensor's `rows` and columns >= dim read 0.
template <int kRows, int kCols>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16* base, int64_t st0, int64_t st1, int h, int s0,
                                          int first, int len, int rows, int dim) {
  constexpr int kChunks = kCols / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks, row = first + r;
    const bool ok = row < len && s0 + row < rows && c * 8 < dim;
    const bf16* src = ok ? base + int64_t{s0 + row} * st0 + int64_t{h} * st1 + c * 8 : base;
    cp_async16(dst + (c >> 3) * (kRows * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4), src, ok);
  }
}

// Keeps the compiler from moving other uses of these registers across the asynchronous wgmma
// that reads or writes them (the wait_group before it is what orders them).
__device__ __forceinline__ void fence_regs(float (&r)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void fence_regs(uint32_t (&r)[kBc / 16][4]) {
#pragma unroll
  for (int j = 0; j < kBc / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[j][e])::"memory");
}

// S = Q·K^T of warpgroup wg (its 64 query rows) against the key tile at kb, issued, not waited.
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t Qs, uint32_t kb, int wg) {
#pragma unroll
  for (int ks = 0; ks < kDq / 16; ++ks) {
    // k-step ks: block ks / 4, bytes 32 (ks % 4) into its 128-byte rows.
    const uint32_t koff = (ks & 3) * 32;
    mma_ss(s, desc_sw128(Qs + (ks >> 2) * (kBr * 128) + wg * 64 * 128 + koff, 16, 1024),
           desc_sw128(kb + (ks >> 2) * (kBc * 128) + koff, 16, 1024), ks > 0);
  }
}
// O += P·V over the value tile at vb (keys 16j ..: 2 groups of 8 rows, 1024 bytes each), issued.
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pf)[kBc / 16][4], uint32_t vb) {
#pragma unroll
  for (int j = 0; j < kBc / 16; ++j) mma_rs(o, pf[j], desc_sw128(vb + j * 2048, kBc * 128, 1024));
}

// The online softmax of one thread's two rows (row0, row1 = row0 + 8 of its warp's 16).
struct Rows {
  float m0, m1, l0, l1;  // running max (scaled, base 2) and sum
  int pos0, pos1;        // positions of the two rows
};
// Scales S (accumulator element 4n + e: row g + 8 (e >> 1), column k0 + 8n + 2 t4 + (e & 1))
// into base 2, masks it when `masked` (keys past a row or past ctx), updates max and sum and
// writes P as bf16 A fragments (k-step j: keys 16j .. 16j + 15); al: the factors for O.
__device__ __forceinline__ void softmax_tile(float (&s)[64], uint32_t (&pf)[kBc / 16][4], Rows& r, float& al0,
                                             float& al1, bool masked, int k0, int ctx, int t4, float scale) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < kBc / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = k0 + n * 8 + 2 * t4 + (e & 1), pos = e < 2 ? r.pos0 : r.pos1;
      const bool drop = masked & ((col > pos) | (col >= ctx));
      s[4 * n + e] = drop ? -INFINITY : s[4 * n + e] * scale;
    }
    mx0 = fmaxf(mx0, fmaxf(s[4 * n], s[4 * n + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
  }
  // The 4 lanes of a row (same g) hold its columns.
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float mn0 = fmaxf(r.m0, mx0), mn1 = fmaxf(r.m1, mx1);
  // A row with no causal key yet keeps max -inf: subtract 0 then (exp2(-inf) = 0).
  const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
  al0 = exp2_approx(r.m0 - b0);
  al1 = exp2_approx(r.m1 - b1);
  r.m0 = mn0;
  r.m1 = mn1;
  float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
  for (int j = 0; j < kBc / 16; ++j) {
    const float* x = s + 8 * j;
    pf[j][0] = pack_bf16(exp2_approx(x[0] - b0), exp2_approx(x[1] - b0), ps0);
    pf[j][1] = pack_bf16(exp2_approx(x[2] - b1), exp2_approx(x[3] - b1), ps1);
    pf[j][2] = pack_bf16(exp2_approx(x[4] - b0), exp2_approx(x[5] - b0), ps0);
    pf[j][3] = pack_bf16(exp2_approx(x[6] - b1), exp2_approx(x[7] - b1), ps1);
  }
  r.l0 = r.l0 * al0 + ps0;
  r.l1 = r.l1 * al1 + ps1;
}
__device__ __forceinline__ void rescale(float (&o)[64], float al0, float al1) {
#pragma unroll
  for (int n = 0; n < kDv / 8; ++n) {
    o[4 * n] *= al0;
    o[4 * n + 1] *= al0;
    o[4 * n + 2] *= al1;
    o[4 * n + 3] *= al1;
  }
}

// grid (H, ceil(T / kBr) + num_seqs), kThreads threads; blockIdx.y enumerates the (sequence,
// query tile) pairs, each sequence's last (longest) tile first; surplus blocks exit.
// Tile j's softmax runs while P(j-1)·V(j-1) is in flight (FlashAttention-3's intra-warpgroup
// overlap).
__global__ void __launch_bounds__(kThreads, 1) prefill_kernel(PrefillArgs a) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t Qs = base, Ks = Qs + kQBytes, Vs = Ks + 2 * kKBytes;  // stage st: Ks + st * kKBytes

  PrefillTile pt;
  if (!prefill_tile<kBr>(a, pt)) return;
  const int h = blockIdx.x, s0 = pt.s0, len = pt.len, q0 = pt.q0, ctx = pt.ctx, off = pt.off, c0 = pt.c0;
  // Key tiles with a causal key (at least the peeled tile 0, whatever seq_lens says).
  const int num_kt = max(1, (off + min(q0 + kBr, len) + kBc - 1) / kBc);
  const int wg = threadIdx.x >> 7, warp = threadIdx.x >> 5 & 3, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int row0 = q0 + wg * 64 + warp * 16 + g, row1 = row0 + 8;  // this thread's two query rows
  const int wg_first = off + q0 + wg * 64;
  const float scale = a.scale * kLog2e;
  Rows r{-INFINITY, -INFINITY, 0.0f, 0.0f, off + row0, off + row1};
  // Tile kt needs masking for this warpgroup (warpgroup-uniform).
  auto masked = [&](int k0) { return k0 + kBc - 1 > wg_first || k0 + kBc > ctx; };
  auto load_k = [&](int kt) {
    load_tile<kBc, kDq>(Ks + (kt & 1) * kKBytes, a.k, a.k_s0, a.k_s1, h, c0, kt * kBc, ctx, a.N, a.Dq);
  };
  auto load_v = [&](int kt) {
    load_tile<kBc, kDv>(Vs + (kt & 1) * kVBytes, a.v, a.v_s0, a.v_s1, h, c0, kt * kBc, ctx, a.N, a.Dv);
  };

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  uint32_t pf[kBc / 16][4];
  float al0, al1;
  load_tile<kBr, kDq>(Qs, a.q, a.q_s0, a.q_s1, h, s0, q0, len, a.T, a.Dq);
  load_k(0);
  // Tile j >= 1: K(j + 1) and V(j) load while S(j) = Q·K(j)^T and P(j-1)·V(j-1) run; the one
  // barrier per tile orders the stages (K(j + 1) overwrites K(j - 1), whose product was
  // waited in tile j - 1; V(j) overwrites V(j - 2), whose product was waited there too).
  // Tile 0 is peeled: no branch may sit between an issued P·V and its wait (a merge of
  // two paths could move the accumulators while the product still writes them).
  cp_async_commit();
  cp_async_wait<0>();
  fence_async_smem();
  __syncthreads();
  if (num_kt > 1) load_k(1);
  load_v(0);
  cp_async_commit();
  {
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.0f;
    wgmma_fence();
    issue_qk(s, Qs, Ks, wg);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    softmax_tile(s, pf, r, al0, al1, masked(0), 0, ctx, t4, scale);  // o is 0: no rescale
  }
  for (int kt = 1; kt < num_kt; ++kt) {
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    if (kt + 1 < num_kt) load_k(kt + 1);
    load_v(kt);
    cp_async_commit();
    const int k0 = kt * kBc;
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.0f;
    wgmma_fence();
    issue_qk(s, Qs, Ks + (kt & 1) * kKBytes, wg);
    wgmma_commit();
    issue_pv(o, pf, Vs + ((kt - 1) & 1) * kVBytes);
    wgmma_commit();
    wgmma_wait<1>();
    fence_regs(s);
    uint32_t pn[kBc / 16][4];
    softmax_tile(s, pn, r, al0, al1, masked(k0), k0, ctx, t4, scale);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pf);
    rescale(o, al0, al1);
#pragma unroll
    for (int j = 0; j < kBc / 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) pf[j][e] = pn[j][e];
  }
  cp_async_wait<0>();
  fence_async_smem();
  __syncthreads();
  wgmma_fence();
  issue_pv(o, pf, Vs + ((num_kt - 1) & 1) * kVBytes);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(o);

  store_rows<kDv / 8>(a, o, r.l0, r.l1, s0, len, row0, h, t4);
}

}  // namespace

bool fits(const PrefillArgs& a) { return a.Dq > 128 && a.Dq <= kDq && a.Dv <= kDv; }
const void* kernel() { return reinterpret_cast<const void*>(prefill_kernel); }
size_t smem_bytes() { return kSmem; }
void launch(const PrefillArgs& a, cudaStream_t stream) {
  prefill_kernel<<<dim3(a.H, (a.T + kBr - 1) / kBr + a.num_seqs), kThreads, kSmem, stream>>>(a);
}

}  // namespace deepinfer::cuda::fa3
