// Grouped GEMMs with quantized weights on tensor cores (MoE experts in prefill and larger decode
// steps): C rows = A rows (BF16, gathered) · dequant(W_g)^T for the expert g of each row tile,
// with the weight tiles read as stored and converted to BF16 in the kernel:
//  - FP4 (kWeightFP4): e2m1 packed two per byte (element k even = low nibble of byte k/2),
//    one E8M0 scale byte (2^(s - 127)) per 32 along K. e2m1 x a power of two is exact in BF16,
//    so the scale is folded into the converted tile and there is one accumulator;
//  - FP8 (kWeightFP8): e4m3 (exact in BF16) with F32 scales per 128x128 block: each 128-wide
//    K block's partial sums are scaled in F32 before they join the accumulator (the promotion
//    of tc_gemm_kernel in gemm.cu, the same W8A16 numbers up to the order of the sums).
// Block tile BM (64 or 128) x 128 columns x 64 K, 8 warps (2 x 4, warp tile BM/2 x 32),
// mma.sync m16n8k16 BF16 with F32 accumulation. Per K step: A (BF16) and the raw weight bytes go
// global -> shared by cp.async in a 3-stage pipeline; all threads convert the raw tile into one
// BF16 tile in shared memory; the warps read both through ldmatrix. Rows past the expert's rows,
// columns past N and K past the end are zero-filled (cp.async src-size 0).
//
//  - FP8 with small blocks (kWeightFP8Fold, dense only: V4.1's 32x32 E8M0 blocks): each 16-value
//    chunk's block scale is folded into its BF16 conversion (gemm_problem.h), one accumulator.
// Row tiles come from moe.cu's device list (expert, first row) built for BM rows per tile, so
// there is no host sync and the launch is graph-capturable. Dense form (tiles null, one weight
// p.w / p.s): block x takes rows [x * BM, x * BM + BM) of p.M (CudaBackend::gemm's prefill path
// for kWeightFP8Fold weights). Grid (max_tiles, N / 128, halves):
// half 1 (gate | up in one launch) reads w2_ptrs / s2_ptrs and writes columns n_half + n.
// Not batch-invariant by construction of the callers (moe.cu keeps the own kernels in that mode).
#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemm_problem.h"
#include "backend/cuda/stream_mma.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kBN = 128, kBK = 64, kStages = 3, kThreads = 256;
constexpr int kLds = kBK + 8;  // BF16 row stride of the A and converted B tiles (ldmatrix conflict-free)

using acp::cp_async16;
using acp::cp_async_commit;
using acp::cp_async_wait;
using acp::ldmatrix_x4;
using acp::smem_addr;

// One packed byte (two e2m1 codes) -> a BF16 pair of code x 2^-126 (bit placement: the 3 code
// bits become the low two exponent bits and the top mantissa bit; code 1 = 0.5 is subnormal).
__device__ __forceinline__ uint32_t e2m1x2_bits(uint32_t b) {
  return ((b & 0x7u) << 6) | ((b & 0x8u) << 12) | ((b & 0x70u) << 18) | ((b & 0x80u) << 24);
}
__device__ __forceinline__ __nv_bfloat162 bf16x2_pow2(int e) {  // 2^e, -126 <= e <= 127
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 7;
  const uint32_t w = bits | (bits << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&w);
}

// 16 packed bytes (32 codes) with E8M0 scale byte s -> 16 words of BF16 pairs, exact:
// code x 2^-126 x 2^126 x 2^(s - 127) in two power-of-two steps (each product is a BF16 value).
__device__ __forceinline__ void fp4x32_to_bf16(const uint4& v, uint32_t s, uint32_t (&out)[16]) {
  const __nv_bfloat162 up = bf16x2_pow2(126);
  const int e = static_cast<int>(s) - 127;
  const __nv_bfloat162 sc = bf16x2_pow2(e < -126 ? -126 : e);
  const __nv_bfloat162 sc2 = bf16x2_pow2(e < -126 ? e + 126 : 0);  // s == 0: 2^-127 as 2^-126 x 2^-1 below
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t bits = e2m1x2_bits((w[i] >> (8 * j)) & 0xffu);
      __nv_bfloat162 x = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), up);
      x = __hmul2(x, sc);
      if (e < -126) x = __hmul2(x, sc2);
      out[4 * i + j] = *reinterpret_cast<const uint32_t*>(&x);
    }
}

template <int WK>
constexpr int raw_bytes_per_row() {  // FP8 kinds: kBK
  return WK == kWeightFP4 ? kBK / 2 : kBK;
}
template <int WK, int BM>
constexpr size_t smem_bytes() {
  return size_t{kStages} * BM * kLds * 2 + size_t{kStages} * kBN * raw_bytes_per_row<WK>() + size_t{kBN} * kLds * 2;
}

template <int WK, int BM>
__global__ void __launch_bounds__(kThreads, WK == kWeightFP4 ? 2 : 1) qgemm_kernel(GemmProblem p) {
  constexpr int RB = raw_bytes_per_row<WK>();
  constexpr int MI = BM / 32;  // m16 tiles per warp (warp tile BM/2 x 32)
  extern __shared__ __align__(128) uint8_t smem[];
  bf16* As = reinterpret_cast<bf16*>(smem);
  uint8_t* Braw = smem + size_t{kStages} * BM * kLds * 2;
  bf16* Bs = reinterpret_cast<bf16*>(Braw + kStages * kBN * RB);
  __shared__ int64_t arow[BM];

  const bool dense = p.tiles == nullptr;
  if (!dense && static_cast<int>(blockIdx.x) >= *p.num_tiles) return;
  const int2 tile = dense ? make_int2(0, static_cast<int>(blockIdx.x) * BM) : p.tiles[blockIdx.x];
  const int g = tile.x, row0 = tile.y, row_end = dense ? p.M : p.group_offsets[g + 1];
  const int half = blockIdx.z, n0 = blockIdx.y * kBN;
  const uint8_t* w = static_cast<const uint8_t*>(dense ? p.w : half ? p.w2_ptrs[g] : p.w_ptrs[g]);
  const void* sv = dense  ? static_cast<const void*>(p.s)
                   : half ? static_cast<const void*>(p.s2_ptrs[g])
                          : static_cast<const void*>(p.s_ptrs[g]);
  const int K = p.K, N = p.N, KT = (K + kBK - 1) / kBK;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3;
  const bf16* a = static_cast<const bf16*>(p.a);
  for (int i = tid; i < BM; i += kThreads) {
    const int r = row0 + i;
    arow[i] = r < row_end ? static_cast<int64_t>(p.a_rows ? p.a_rows[r] : r) * p.lda : -1;
  }
  __syncthreads();

  auto load_stage = [&](int stage, int kt) {
    bf16* as = As + stage * BM * kLds;
#pragma unroll
    for (int c = tid; c < BM * (kBK / 8); c += kThreads) {
      const int r = c / (kBK / 8), kc = (c % (kBK / 8)) * 8, k = kt + kc;
      const int64_t off = arow[r];
      const bool ok = off >= 0 && k < K;
      cp_async16(smem_addr(as + r * kLds + kc), ok ? a + off + k : a, ok);
    }
    uint8_t* bs = Braw + stage * kBN * RB;
#pragma unroll
    for (int c = tid; c < kBN * (RB / 16); c += kThreads) {
      const int r = c / (RB / 16), bc = (c % (RB / 16)) * 16, n = n0 + r;
      const int k = kt + (WK == kWeightFP4 ? bc * 2 : bc);
      const bool ok = n < N && k < K;
      const int64_t row_bytes = WK == kWeightFP4 ? K / 2 : K;
      cp_async16(smem_addr(bs + r * RB + bc), ok ? w + n * row_bytes + (WK == kWeightFP4 ? k / 2 : k) : w, ok);
    }
  };

  float acc[MI][4][4];
  float part[WK == kWeightFP8 ? MI : 1][4][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[i][j][e] = 0.0f;
        if constexpr (WK == kWeightFP8) part[i][j][e] = 0.0f;
      }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s * kBK);
    cp_async_commit();
  }
  for (int it = 0; it < KT; ++it) {
    const int kt = it * kBK, stage = it % kStages;
    // FP4: this thread converts row tid / 2, 32 K values (tid % 2); its scale byte (global, small).
    uint32_t sbyte = 0;
    if constexpr (WK == kWeightFP4) {
      const int r = tid >> 1, k = kt + (tid & 1) * 32, n = n0 + r;
      if (n < N && k < K) sbyte = static_cast<const uint8_t*>(sv)[static_cast<int64_t>(n) * (K / 32) + k / 32];
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (it + kStages - 1 < KT) load_stage((it + kStages - 1) % kStages, kt + (kStages - 1) * kBK);
    cp_async_commit();
    // Raw weight tile -> BF16 tile.
    const uint8_t* bs = Braw + stage * kBN * RB;
    if constexpr (WK == kWeightFP4) {
      const int r = tid >> 1, c = tid & 1;
      const uint4 v = *reinterpret_cast<const uint4*>(bs + r * RB + c * 16);
      uint32_t out[16];
      fp4x32_to_bf16(v, sbyte, out);
      uint4* dst = reinterpret_cast<uint4*>(Bs + r * kLds + c * 32);
#pragma unroll
      for (int q = 0; q < 4; ++q) dst[q] = make_uint4(out[4 * q], out[4 * q + 1], out[4 * q + 2], out[4 * q + 3]);
    } else {
#pragma unroll
      for (int c = tid; c < kBN * (RB / 16); c += kThreads) {
        const int r = c / (RB / 16), bc = (c % (RB / 16)) * 16;
        uint32_t out[8];
        if constexpr (WK == kWeightFP8Fold) {
          const int n = n0 + r, k = kt + bc;
          const float sc = n < N && k < K ? __ldg(static_cast<const float*>(sv) +
                                                 static_cast<int64_t>(n / p.block_n) * p.scale_cols + k / p.block_k)
                                          : 0.0f;
          smma::fp8x16_scaled_to_bf16x16(*reinterpret_cast<const uint4*>(bs + r * RB + bc), sc, out);
        } else {
          smma::fp8x16_to_bf16x16(*reinterpret_cast<const uint4*>(bs + r * RB + bc), out);
        }
        uint4* dst = reinterpret_cast<uint4*>(Bs + r * kLds + bc);
        dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
      }
    }
    __syncthreads();
    const bf16* as = As + stage * BM * kLds;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[MI][4], bfr[2][4];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        ldmatrix_x4(af[i], smem_addr(as + (wm * (BM / 2) + i * 16 + (lane & 15)) * kLds + kk + (lane >> 4) * 8));
#pragma unroll
      for (int j = 0; j < 2; ++j)
        ldmatrix_x4(bfr[j], smem_addr(Bs + (wn * 32 + j * 16 + (lane & 7) + (lane >> 4) * 8) * kLds + kk +
                                 ((lane >> 3) & 1) * 8));
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float(&c)[4] = WK == kWeightFP8 ? part[WK == kWeightFP8 ? i : 0][j] : acc[i][j];
          smma::mma_bf16(c, af[i][0], af[i][1], af[i][2], af[i][3], bfr[j >> 1][(j & 1) * 2],
                         bfr[j >> 1][(j & 1) * 2 + 1]);
        }
    }
    if constexpr (WK == kWeightFP8) {
      // End of a 128-wide K block (or of K): promote the block's partial sums with its scale.
      if ((kt + kBK) % 128 == 0 || it + 1 == KT) {
        const float s = static_cast<const float*>(sv)[(n0 / 128) * p.scale_cols + kt / 128];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              acc[i][j][e] += s * part[i][j][e];
              part[i][j][e] = 0.0f;
            }
      }
    }
  }
  // Epilogue: c0, c1 at (row g, columns 2q, 2q + 1), c2, c3 at row g + 8.
  const int gq = lane >> 2, q = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + wm * (BM / 2) + i * 16 + gq + h * 8;
      if (r >= row_end) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + wn * 32 + j * 8 + 2 * q;
        if (n >= N) continue;
        const int64_t o = static_cast<int64_t>(r) * p.ldc + half * p.n_half + n;
        const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if (p.c_bf16)
          *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.c) + o) = __floats2bfloat162_rn(v0, v1);
        else
          *reinterpret_cast<float2*>(static_cast<float*>(p.c) + o) = make_float2(v0, v1);
      }
    }
}

template <int WK, int BM>
void launch(const GemmProblem& p, int halves, CudaBackend& be, cudaStream_t stream) {
  const auto kernel = qgemm_kernel<WK, BM>;
  constexpr size_t smem = smem_bytes<WK, BM>();
  be.set_smem_limit(reinterpret_cast<const void*>(kernel), smem, "moe_experts (quantized grouped GEMM)");
  const unsigned tiles = p.tiles ? static_cast<unsigned>(p.max_tiles) : ceil_div(p.M, BM);
  const dim3 grid(tiles, ceil_div(p.N, kBN), static_cast<unsigned>(halves));
  kernel<<<grid, kThreads, smem, stream>>>(p);
}

}  // namespace

bool qgemm_supported(int w_kind, int64_t N, int64_t K, int64_t lda) {
  // 16-byte A chunks (8 BF16) and whole 16-byte weight chunks; even N for the paired stores;
  // FP8: the 128x128 scale blocks line up with the 128-column tiles.
  if (N % 2 != 0 || lda % 8 != 0) return false;
  if (w_kind == kWeightFP4) return K % 32 == 0;
  if (w_kind == kWeightFP8 || w_kind == kWeightFP8Fold) return K % 16 == 0;
  return false;
}

void CudaBackend::launch_qgemm(const GemmProblem& p, int halves, const char* op, const std::string& shapes) {
  const bool dense = p.tiles == nullptr;
  DI_CHECK((p.tile_rows == 64 || p.tile_rows == 128) && (p.tiles || (p.w && p.s && halves == 1)) &&
               qgemm_supported(p.w_kind, p.N, p.K, p.lda) && (halves == 1 || (p.w2_ptrs && p.s2_ptrs)) &&
               (dense == (p.w_kind == kWeightFP8Fold)) &&
               (p.w_kind != kWeightFP8Fold || (p.block_k % 16 == 0 && p.block_n > 0)),
           op, ": quantized GEMM does not take ", shapes, " (tile rows ", p.tile_rows, ")");
  if (dense ? p.M == 0 : p.max_tiles == 0) return;
  if (p.w_kind == kWeightFP8Fold) {
    if (p.tile_rows == 128)
      launch<kWeightFP8Fold, 128>(p, halves, *this, stream_);
    else
      launch<kWeightFP8Fold, 64>(p, halves, *this, stream_);
  } else if (p.w_kind == kWeightFP4) {
    if (p.tile_rows == 128)
      launch<kWeightFP4, 128>(p, halves, *this, stream_);
    else
      launch<kWeightFP4, 64>(p, halves, *this, stream_);
  } else {
    if (p.tile_rows == 128)
      launch<kWeightFP8, 128>(p, halves, *this, stream_);
    else
      launch<kWeightFP8, 64>(p, halves, *this, stream_);
  }
  check_launch(op, "qgemm " + shapes);
}

}  // namespace deepinfer::cuda

namespace deepinfer::cuda {

float* CudaBackend::moe_experts_qgemm(const void* a, int64_t lda, int P, int E, int64_t H, int64_t I, int w_kind,
                                      const void* const* ptrs, const int32_t* row_token, const int32_t* offsets,
                                      const int2* tiles, const int32_t* num_tiles, int tile_rows, int max_tiles,
                                      float limit, const std::string& shapes) {
  bf16* hidden = static_cast<bf16*>(scratch(kSlotMoeHidden, size_t{2} * P * 2 * I, "moe_experts"));
  bf16* act = static_cast<bf16*>(scratch(kSlotMoeAct, size_t{2} * P * I, "moe_experts"));
  float* y = static_cast<float*>(scratch(kSlotMoeOut, size_t{4} * P * H, "moe_experts"));
  const auto table = [&](int j) { return ptrs + static_cast<size_t>(j) * E; };
  GemmProblem p;
  p.a = a;
  p.lda = lda;
  p.a_rows = row_token;
  p.group_offsets = offsets;
  p.num_groups = E;
  p.max_rows = P;
  p.M = P;
  p.w_kind = w_kind;
  p.tiles = tiles;
  p.num_tiles = num_tiles;
  p.tile_rows = tile_rows;
  p.max_tiles = max_tiles;
  // gate | up: half 0 (gate) -> hidden[:, :I], half 1 (up) -> hidden[:, I:], rows gathered by row_token.
  p.w_ptrs = table(0);
  p.s_ptrs = reinterpret_cast<const float* const*>(table(3));
  p.w2_ptrs = table(1);
  p.s2_ptrs = reinterpret_cast<const float* const*>(table(4));
  p.N = static_cast<int>(I);
  p.n_half = static_cast<int>(I);
  p.K = static_cast<int>(H);
  p.scale_cols = static_cast<int>((H + 127) / 128);
  p.c = hidden;
  p.ldc = 2 * I;
  p.c_bf16 = 1;
  launch_qgemm(p, 2, "moe_experts (quantized gate|up)", shapes);
  Tensor hid(hidden, DType::BF16, {P, 2 * I}, Device::CUDA);
  Tensor actt(act, DType::BF16, {P, I}, Device::CUDA);
  if (std::isinf(limit))
    silu_mul(hid, actt);
  else
    silu_mul_clamped(hid, limit, actt);
  // down: act [P, I] -> y [P, H] (F32 for the combine).
  p.a = act;
  p.lda = I;
  p.a_rows = nullptr;
  p.w_ptrs = table(2);
  p.s_ptrs = reinterpret_cast<const float* const*>(table(5));
  p.w2_ptrs = nullptr;
  p.s2_ptrs = nullptr;
  p.N = static_cast<int>(H);
  p.n_half = 0;
  p.K = static_cast<int>(I);
  p.scale_cols = static_cast<int>((I + 127) / 128);
  p.c = y;
  p.ldc = H;
  p.c_bf16 = 0;
  launch_qgemm(p, 1, "moe_experts (quantized down)", shapes);
  return y;
}

}  // namespace deepinfer::cuda
