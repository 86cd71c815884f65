// gemm: out[M, N] = x[M, K] · W[N, K]^T, fp32 accumulation, and the grouped form that
// moe.cu uses for the experts. Three engines:
//  - cuBLASLt for dense BF16 weights (fast mode);
//  - gemv_kernel for few rows (decode): memory-bound, one warp per output column reads
//    the weight row once with 16-byte loads and dots it with up to 8 rows at a time;
//  - tc_gemm_kernel: a tensor-core (WMMA bf16 m16n16k16) tile kernel for the rest.
// FP8 weights (e4m3, 128x128 block scales): e4m3 values are exact in bf16, so tiles are
// converted without scaling and each 128-wide K block's partial product is scaled in
// fp32 before it joins the accumulator (DeepGEMM's promotion). Activations stay BF16
// (W8A16) up to 128 rows; from fp8 min_rows rows (default 129) gemm() quantizes them to
// 1x128-scaled e4m3 and runs cuBLASLt's FP8 x FP8 block-scaled GEMM (fp8_gemm.cu).
//
// Batch invariance: tc_gemm_kernel accumulates every output element over K in the same
// order (16-wide MMA steps, 128-wide FP8 promotion blocks) whatever the tile shape or M,
// so in batch-invariant mode every GEMM uses it, never cuBLASLt, gemv or split-K.
#include <mma.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemm_problem.h"

namespace deepinfer::cuda {
namespace {

using namespace nvcuda;

__device__ __forceinline__ void bf16x8_to_f(const uint4& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ void fp8x16_to_f(const uint4& v, float* f) {
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(b[i] | (b[i + 1] << 8)), __NV_E4M3);
    const float2 t = __half22float2(__half2(h));
    f[i] = t.x;
    f[i + 1] = t.y;
  }
}

__device__ __forceinline__ void store_out(const GemmProblem& p, int64_t row, int n, float v) {
  if (p.c_bf16)
    static_cast<bf16*>(p.c)[row * p.ldc + n] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p.c)[row * p.ldc + n] = v;
}

// ---------------------------------------------------------------------------------------
// gemv: grid (ceil(N / 8), groups); 8 warps, warp w owns column n = blockIdx.x * 8 + w.
template <int WK>
__global__ void __launch_bounds__(256) gemv_kernel(GemmProblem p, bool vec) {
  constexpr int EPL = WK == kWeightFP8 ? 16 : 8;  // weight elements per 16-byte load
  constexpr int MT = 8;                           // rows per pass
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * 8 + (threadIdx.x >> 5);
  const int g = blockIdx.y;
  int r0 = 0, r1 = p.M;
  if (p.group_offsets) {
    r0 = p.group_offsets[g];
    r1 = p.group_offsets[g + 1];
  }
  if (n >= p.N || r0 >= r1) return;
  const void* wbase = p.w_ptrs ? p.w_ptrs[g] : p.w;
  const float* sbase = p.s_ptrs ? p.s_ptrs[g] : p.s;
  const int K = p.K;
  const bf16* a = static_cast<const bf16*>(p.a);
  for (int rb = r0; rb < r1; rb += MT) {
    const int nr = min(MT, r1 - rb);
    const bf16* xr[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int row = rb + (m < nr ? m : 0);
      xr[m] = a + static_cast<int64_t>(p.a_rows ? p.a_rows[row] : row) * p.lda;
    }
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
    for (int k0 = lane * EPL; k0 < K; k0 += 32 * EPL) {
      float wf[EPL];
      if (vec && k0 + EPL <= K) {
        if constexpr (WK == kWeightFP8) {
          const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(wbase) +
                                                            static_cast<int64_t>(n) * K + k0);
          fp8x16_to_f(raw, wf);
        } else {
          const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(wbase) +
                                                            static_cast<int64_t>(n) * K + k0);
          bf16x8_to_f(raw, wf);
        }
      } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          const int k = k0 + e;
          float v = 0.0f;
          if (k < K) {
            if constexpr (WK == kWeightFP8)
              v = fp8_to_f(static_cast<const uint8_t*>(wbase)[static_cast<int64_t>(n) * K + k]);
            else
              v = __bfloat162float(static_cast<const bf16*>(wbase)[static_cast<int64_t>(n) * K + k]);
          }
          wf[e] = v;
        }
      }
      float scale = 1.0f;
      if constexpr (WK == kWeightFP8) scale = sbase[(n / 128) * p.scale_cols + k0 / 128];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < nr) {
          float xf[EPL];
          if (vec && k0 + EPL <= K) {
#pragma unroll
            for (int j = 0; j < EPL; j += 8)
              bf16x8_to_f(*reinterpret_cast<const uint4*>(xr[m] + k0 + j), xf + j);
          } else {
#pragma unroll
            for (int e = 0; e < EPL; ++e)
              xf[e] = k0 + e < K ? __bfloat162float(xr[m][k0 + e]) : 0.0f;
          }
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < EPL; ++e) d += wf[e] * xf[e];
          acc[m] += WK == kWeightFP8 ? d * scale : d;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < nr) {
        const float v = warp_sum(acc[m]);
        if (lane == 0) store_out(p, rb + m, n, v);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Tensor-core tile kernel: block tile BM x BN, K step 32, warps WM x WN.
template <int WK, int BM, int BN, int WM, int WN>
__global__ void __launch_bounds__(WM* WN * 32) tc_gemm_kernel(GemmProblem p, bool vec) {
  constexpr int BK = 32, LDS = BK + 8;  // padded rows; fragment origins stay 32-byte aligned
  constexpr int NT = WM * WN * 32;
  constexpr int FM = BM / WM / 16, FN = BN / WN / 16;
  __shared__ __align__(128) bf16 As[BM * LDS];
  __shared__ __align__(128) bf16 Bs[BN * LDS];
  __shared__ __align__(128) float Cs[WM * WN][256];
  __shared__ int64_t arow[BM];

  int g = 0, row0, row_end;
  if (p.tiles) {
    if (static_cast<int>(blockIdx.x) >= *p.num_tiles) return;
    const int2 t = p.tiles[blockIdx.x];
    g = t.x;
    row0 = t.y;
    row_end = p.group_offsets[g + 1];
  } else {
    row0 = blockIdx.x * BM;
    row_end = p.M;
  }
  const int n0 = blockIdx.y * BN;
  const void* wbase = p.w_ptrs ? p.w_ptrs[g] : p.w;
  const float* sbase = p.s_ptrs ? p.s_ptrs[g] : p.s;
  const int K = p.K, N = p.N;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WN, wn = warp % WN;
  const bf16* a = static_cast<const bf16*>(p.a);
  for (int i = tid; i < BM; i += NT) {
    const int r = row0 + i;
    arow[i] = r < row_end ? static_cast<int64_t>(p.a_rows ? p.a_rows[r] : r) * p.lda : -1;
  }

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> part[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::fill_fragment(acc[i][j], 0.0f);
      wmma::fill_fragment(part[i][j], 0.0f);
    }
  __syncthreads();

  for (int kt = 0; kt < K; kt += BK) {
    // A tile: BM rows x 32 columns = 4 chunks of 8 per row.
    for (int c = tid; c < BM * 4; c += NT) {
      const int r = c >> 2, kc = (c & 3) * 8, k = kt + kc;
      uint4 v = make_uint4(0, 0, 0, 0);
      const int64_t off = arow[r];
      if (off >= 0) {
        if (vec && k + 8 <= K) {
          v = *reinterpret_cast<const uint4*>(a + off + k);
        } else {
          bf16 tmp[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) tmp[e] = k + e < K ? a[off + k + e] : __float2bfloat16_rn(0.0f);
          v = *reinterpret_cast<const uint4*>(tmp);
        }
      }
      *reinterpret_cast<uint4*>(As + r * LDS + kc) = v;
    }
    // B tile: BN weight rows x 32 columns, stored as bf16 (FP8 values exactly).
    if constexpr (WK == kWeightFP8) {
      const uint8_t* w8 = static_cast<const uint8_t*>(wbase);
      for (int c = tid; c < BN * 2; c += NT) {
        const int r = c >> 1, kc = (c & 1) * 16, k = kt + kc, n = n0 + r;
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (n < N) {
          if (vec && k + 16 <= K) {
            raw = *reinterpret_cast<const uint4*>(w8 + static_cast<int64_t>(n) * K + k);
          } else {
            uint8_t tmp[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) tmp[e] = k + e < K ? w8[static_cast<int64_t>(n) * K + k + e] : 0;
            raw = *reinterpret_cast<const uint4*>(tmp);
          }
        }
        float f[16];
        fp8x16_to_f(raw, f);
        __align__(16) bf16 h[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) h[e] = __float2bfloat16_rn(f[e]);
        *reinterpret_cast<uint4*>(Bs + r * LDS + kc) = *reinterpret_cast<const uint4*>(h);
        *reinterpret_cast<uint4*>(Bs + r * LDS + kc + 8) = *reinterpret_cast<const uint4*>(h + 8);
      }
    } else {
      const bf16* wb = static_cast<const bf16*>(wbase);
      for (int c = tid; c < BN * 4; c += NT) {
        const int r = c >> 2, kc = (c & 3) * 8, k = kt + kc, n = n0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (n < N) {
          if (vec && k + 8 <= K) {
            v = *reinterpret_cast<const uint4*>(wb + static_cast<int64_t>(n) * K + k);
          } else {
            bf16 tmp[8];
#pragma unroll
            for (int e = 0; e < 8; ++e)
              tmp[e] = k + e < K ? wb[static_cast<int64_t>(n) * K + k + e] : __float2bfloat16_rn(0.0f);
            v = *reinterpret_cast<const uint4*>(tmp);
          }
        }
        *reinterpret_cast<uint4*>(Bs + r * LDS + kc) = v;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i)
        wmma::load_matrix_sync(fa[i], As + (wm * FM * 16 + i * 16) * LDS + kk, LDS);
#pragma unroll
      for (int j = 0; j < FN; ++j)
        wmma::load_matrix_sync(fb[j], Bs + (wn * FN * 16 + j * 16) * LDS + kk, LDS);
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
          if constexpr (WK == kWeightFP8)
            wmma::mma_sync(part[i][j], fa[i], fb[j], part[i][j]);
          else
            wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    __syncthreads();
    if constexpr (WK == kWeightFP8) {
      // End of a 128-wide K block (or of K): promote the block's partial sums with its scale.
      if ((kt + BK) % 128 == 0 || kt + BK >= K) {
        const float s = sbase[(n0 / 128) * p.scale_cols + kt / 128];
#pragma unroll
        for (int i = 0; i < FM; ++i)
#pragma unroll
          for (int j = 0; j < FN; ++j) {
#pragma unroll
            for (int e = 0; e < acc[i][j].num_elements; ++e) acc[i][j].x[e] += s * part[i][j].x[e];
            wmma::fill_fragment(part[i][j], 0.0f);
          }
      }
    }
  }
  // Epilogue: each warp stages one 16x16 fragment at a time and writes the valid part.
  float* cs = Cs[warp];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(cs, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int r = row0 + wm * FM * 16 + i * 16 + (e >> 4);
        const int n = n0 + wn * FN * 16 + j * 16 + (e & 15);
        if (r < row_end && n < N) store_out(p, r, n, cs[e]);
      }
      __syncwarp();
    }
}

__global__ void f32_to_bf16_kernel(const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2bfloat16_rn(x[(i / cols) * ldx + i % cols]);
  }
}

template <int WK>
void launch_tc(const GemmProblem& p, bool vec, cudaStream_t stream, bool large) {
  const unsigned grid_x = p.tiles ? static_cast<unsigned>(p.max_tiles)
                                  : ceil_div(p.M, large ? 128 : 32);
  if (grid_x == 0) return;
  if (large) {
    dim3 grid(grid_x, ceil_div(p.N, 128));
    tc_gemm_kernel<WK, 128, 128, 2, 4><<<grid, 256, 0, stream>>>(p, vec);
  } else {
    dim3 grid(grid_x, ceil_div(p.N, 64));
    tc_gemm_kernel<WK, 32, 64, 1, 4><<<grid, 128, 0, stream>>>(p, vec);
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

}  // namespace

void CudaBackend::launch_gemm(const GemmProblem& p, const char* op, bool prefer_gemv) {
  // 16-byte vector loads need aligned bases and row strides (weights: K elements per row).
  const int wk_elems = p.w_kind == kWeightFP8 ? 16 : 8;
  bool vec = p.lda % 8 == 0 && p.K % wk_elems == 0 && aligned16(p.a) &&
             (p.w_ptrs != nullptr || aligned16(p.w));
  const auto shapes = [&] {
    return detail::concat("rows ", p.M, "/", p.max_rows, " N ", p.N, " K ", p.K, " groups ",
                          p.num_groups, p.w_kind == kWeightFP8 ? " fp8" : " bf16");
  };
  // Few rows (decode) and every batch-invariant GEMM: the weight-streaming MMA kernel
  // (gemm_stream.cu) when the shape fits it. The choice depends on the weight shape and
  // buffer alignment only, never on M, so batch-invariant results stay M-independent.
  if ((prefer_gemv || options_.batch_invariant) && stream_gemm_ && stream_gemm_supported(p)) {
    launch_stream_gemm(p, stream_, pdl_);
    check_launch(op, "stream " + shapes());
    return;
  }
  DI_CHECK(p.heads == 0 && p.w2_ptrs == nullptr && p.w2 == nullptr, op,
           ": batched/paired GEMM needs the stream kernel, ", shapes());
  if (prefer_gemv && !options_.batch_invariant) {
    dim3 grid(ceil_div(p.N, 8), p.group_offsets ? p.num_groups : 1);
    if (p.w_kind == kWeightFP8)
      gemv_kernel<kWeightFP8><<<grid, 256, 0, stream_>>>(p, vec);
    else
      gemv_kernel<kWeightBF16><<<grid, 256, 0, stream_>>>(p, vec);
    check_launch(op, "gemv " + shapes());
    return;
  }
  const bool large = p.tiles ? p.tile_rows == 128 : p.M > 48;
  if (p.w_kind == kWeightFP8)
    launch_tc<kWeightFP8>(p, vec, stream_, large);
  else
    launch_tc<kWeightBF16>(p, vec, stream_, large);
  check_launch(op, "tc " + shapes());
}

bool CudaBackend::launch_pipe(const GemmProblem& p, const char* op, const std::string& shapes) {
  if (pipe_stages_ <= 0 || !pipe_gemm_supported(p)) return false;
  const PipePlan plan = plan_pipe_gemm(p, pipe_stages_);
  set_smem_limit(plan.kernel, plan.smem_bytes, op);
  // A dense launch on the side line (the shared experts beside router .. moe_experts) gets a
  // third of the SMs' worth of blocks, leaving the main line's latency-bound kernels block slots.
  // Items do not depend on the block that takes them: same bits. H200 (bench/NOTES.md occ19x,
  // session 16): bf16 graph decode -19 / -16 us per step at batch 1 / 8, FP8 -6 / -16 / -20 us at
  // 1 / 8 / 32, equal at 64 (bf16 32 / 64 are on cuBLASLt); two thirds gained less (bf16 -7 / -12 us)
// and lost 3-6 us at FP8.
  const bool side_dense = on_side_ && p.tiles == nullptr && p.group_offsets == nullptr;
  const int sms = side_dense ? std::max(1, num_sms_ / 3) : num_sms_;
  launch_pipe_gemm(p, plan, sms, pdl_ && (p.tiles == nullptr || p.tiles_early), stream_);
  check_launch(op, shapes);
  return true;
}

bool CudaBackend::cublaslt_gemm(const void* x, int64_t ldx, int64_t M, const Weight& w, void* out,
                                int64_t ldo, DType out_dtype) {
  const int64_t N = w.w.shape[0], K = w.w.shape[1];
  if (!aligned16(x) || !aligned16(out) || !aligned16(w.w.data) || ldx % 8 || K % 8 ||
      ldo % (out_dtype == DType::F32 ? 4 : 8))
    return false;
  const auto key = std::make_tuple(M, N, K, ldx, ldo, static_cast<int>(out_dtype));
  auto it = lt_plans_.find(key);
  if (it == lt_plans_.end()) {
    LtPlan plan;
    const cudaDataType_t ctype = out_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
    bool ok = cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
              CUBLAS_STATUS_SUCCESS;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    // Column-major view: out^T [N, M] = W [K, N]^T · x^T [K, M].
    ok = ok && cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT,
                                              sizeof(opT)) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN,
                                              sizeof(opN)) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, K, N, K) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, K, M, ldx) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&plan.c, ctype, N, M, ldo) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref = nullptr;
    ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &lt_workspace_bytes_,
                                                    sizeof(lt_workspace_bytes_)) ==
                   CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    ok = ok && cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                                              1, &result, &found) == CUBLAS_STATUS_SUCCESS &&
         found > 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    plan.ok = ok;
    if (ok) plan.algo = result.algo;
    it = lt_plans_.emplace(key, plan).first;
  }
  const LtPlan& plan = it->second;
  if (!plan.ok) return false;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st =
      cublasLtMatmul(lt_, plan.desc, &alpha, w.w.data, plan.a, x, plan.b, &beta, out, plan.c, out,
                     plan.c, &plan.algo, lt_workspace_, lt_workspace_bytes_, stream_);
  DI_CHECK(st == CUBLAS_STATUS_SUCCESS, "gemm (cuBLASLt) failed with status ", static_cast<int>(st),
           ": x [", M, ", ", K, "] ld ", ldx, ", W ", w.w.describe(), ", out ld ", ldo);
  check_launch("gemm (cuBLASLt)", w.w.describe());
  return true;
}

void CudaBackend::gemm(const Tensor& x, const Weight& w, Tensor& out) {
  const RowView xv = rows_of(x, "gemm x");
  const RowView ov = rows_of(out, "gemm out");
  check_float(x, "gemm x");
  check_float(out, "gemm out");
  check_device(w.w, "gemm weight");
  DI_CHECK(w.w.ndim == 2 && w.w.is_contiguous(), "gemm: weight must be contiguous [N, K], got ",
           w.w.describe());
  DI_CHECK(w.w.dtype == DType::BF16 || w.w.dtype == DType::F8_E4M3,
           "gemm: CUDA weights must be BF16 or F8_E4M3 (upload F32 weights as BF16), got ",
           w.w.describe());
  const int64_t M = xv.rows, K = xv.cols, N = w.w.shape[0];
  DI_CHECK(w.w.shape[1] == K && ov.rows == M && ov.cols == N, "gemm: x ", x.describe(), " · W ",
           w.w.describe(), "^T does not fit out ", out.describe());
  const bool fp8 = w.w.dtype == DType::F8_E4M3;
  // FP8 with blocks other than 128x128 (V4.1's 32x32 E8M0): scales folded into the weight tiles.
  const bool fold = fp8 && !(w.block_n == 128 && w.block_k == 128);
  if (fp8) {
    check_dtype(w.scale_inv, DType::F32, "gemm weight scale_inv");
    const int64_t bn = w.block_n, bk = w.block_k;
    DI_CHECK(bn > 0 && bk > 0 && (!fold || bk % 16 == 0) && w.scale_inv.ndim == 2 && w.scale_inv.is_contiguous() &&
                 w.scale_inv.shape[0] == (N + bn - 1) / bn && w.scale_inv.shape[1] == (K + bk - 1) / bk,
             "gemm: FP8 weight ", w.w.describe(), " with ", bn, "x", bk, " blocks needs scale_inv F32 [",
             bn > 0 ? (N + bn - 1) / bn : 0, ", ", bk > 0 ? (K + bk - 1) / bk : 0,
             "] (blocks 128x128, or block_k a multiple of 16), got ", w.scale_inv.describe());
  }
  if (M == 0 || N == 0) return;
  const void* a = xv.data;
  int64_t lda = xv.row_stride;
  if (xv.dtype == DType::F32) {
    bf16* tmp = static_cast<bf16*>(scratch(kSlotGemmA, static_cast<size_t>(M * K) * 2, "gemm"));
    const int64_t n = M * K;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, num_sms_ * 16));
    f32_to_bf16_kernel<<<std::max(1u, blocks), 256, 0, stream_>>>(static_cast<const float*>(a), lda,
                                                                  M, K, tmp);
    check_launch("gemm (x to bf16)", x.describe());
    a = tmp;
    lda = K;
  }
  if (fold) {
    gemm_fp8_fold(a, lda, M, w, ov);
    return;
  }
  // FP8 weight, many rows (prefill): FP8 activations on CUTLASS (cutlass_fp8.cu) or cuBLASLt.
  if (fp8 && gemm_fp8_act(a, lda, M, w, ov)) return;
  // Dense BF16 on cuBLASLt, except few rows (<= stream_max_rows_, decode) which go to the
  // weight-streaming kernel, and batch-invariant mode.
  // FP8 dense has no cuBLASLt path here: up to 128 rows the stream kernel (one pass of 64
  // rows per block) beats the WMMA tile kernel's few blocks (N / 64) by far; the fewest rows
  // take the pipeline kernel's dense form (dense_rows_on_pipe).
  const bool small = M <= stream_max_rows_ || (fp8 && stream_gemm_ && M <= 128);
  const bool pipe = dense_rows_on_pipe(M, w);
  if (!fp8 && !options_.batch_invariant && !small && !pipe &&
      cublaslt_gemm(a, lda, M, w, ov.data, ov.row_stride, ov.dtype))
    return;
  GemmProblem p;
  p.a = a;
  p.lda = lda;
  p.M = static_cast<int>(M);
  p.max_rows = static_cast<int>(M);
  p.w = w.w.data;
  p.s = fp8 ? w.scale_inv.ptr<float>() : nullptr;
  p.w_kind = fp8 ? kWeightFP8 : kWeightBF16;
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.scale_cols = static_cast<int>((K + 127) / 128);
  p.c = ov.data;
  p.ldc = ov.row_stride;
  p.c_bf16 = ov.dtype == DType::BF16;
  if (pipe && launch_pipe(p, "gemm (pipe)", detail::concat("rows ", M, " N ", N, " K ", K, fp8 ? " fp8" : " bf16")))
    return;
  if (pipe && !fp8 && cublaslt_gemm(a, lda, M, w, ov.data, ov.row_stride, ov.dtype)) return;
  launch_gemm(p, "gemm", M <= 8 || M <= stream_max_rows_ || (small && stream_gemm_supported(p)));
}

void CudaBackend::gemm_fp8_fold(const void* a, int64_t lda, int64_t M, const Weight& w, const RowView& ov) {
  GemmProblem p;
  p.a = a;
  p.lda = lda;
  p.M = static_cast<int>(M);
  p.max_rows = p.M;
  p.w = w.w.data;
  p.s = w.scale_inv.ptr<float>();
  p.w_kind = kWeightFP8Fold;
  p.N = static_cast<int>(w.w.shape[0]);
  p.K = static_cast<int>(w.w.shape[1]);
  p.block_n = w.block_n;
  p.block_k = w.block_k;
  p.scale_cols = static_cast<int>(w.scale_inv.shape[1]);
  p.c = ov.data;
  p.ldc = ov.row_stride;
  p.c_bf16 = ov.dtype == DType::BF16;
  const std::string shapes = detail::concat("rows ", M, " N ", p.N, " K ", p.K, " fp8 blocks ", p.block_n, "x",
                                            p.block_k);
  // The stream kernel for few rows, the tile kernel for many; batch-invariant: one of the two
  // for every M (chosen by the weight shape and alignment only). Each row's sums run in a fixed
  // order in either kernel.
  const bool stream_ok = stream_gemm_supported(p);
  if (stream_ok && (options_.batch_invariant || M <= 128)) {
    launch_stream_gemm(p, stream_, pdl_);
    check_launch("gemm (fp8, folded scales)", "stream " + shapes);
    return;
  }
  p.tile_rows = !options_.batch_invariant && M >= 2048 ? 128 : 64;
  launch_qgemm(p, 1, "gemm (fp8, folded scales)", shapes);
}

void CudaBackend::gemm_heads(const Tensor& x, const Tensor& w, Tensor& out) {
  DI_CHECK(x.ndim == 3 && out.ndim == 3 && w.ndim == 3 && x.stride[2] == 1 && out.stride[2] == 1 &&
               w.is_contiguous() && x.shape[1] == w.shape[0] && out.shape[1] == w.shape[0] &&
               x.shape[0] == out.shape[0] && x.shape[2] == w.shape[2] && out.shape[2] == w.shape[1],
           "gemm_heads: x ", x.describe(), " (want [T, heads, K], last dim contiguous), w ",
           w.describe(), " (want contiguous [heads, N, K]) and out ", out.describe(),
           " (want [T, heads, N]) do not fit");
  check_device(w, "gemm_heads weight");
  const int64_t T = x.shape[0];
  if (T == 0 || w.shape[0] == 0) return;
  GemmProblem p;
  p.a = x.data;
  p.lda = x.stride[0];
  p.M = static_cast<int>(T);
  p.max_rows = p.M;
  p.w = w.data;
  p.w_kind = kWeightBF16;
  p.N = static_cast<int>(w.shape[1]);
  p.K = static_cast<int>(w.shape[2]);
  p.c = out.data;
  p.ldc = out.stride[0];
  p.c_bf16 = out.dtype == DType::BF16;
  p.heads = static_cast<int>(w.shape[0]);
  p.a_head_stride = x.stride[1];
  p.w_head_stride = w.shape[1] * w.shape[2];
  p.c_head_stride = out.stride[1];
  const bool fits = x.device == Device::CUDA && out.device == Device::CUDA && x.dtype == DType::BF16 &&
                    w.dtype == DType::BF16 && (out.dtype == DType::BF16 || out.dtype == DType::F32) &&
                    stream_gemm_ && stream_gemm_supported(p);
  if (!fits) {
    Backend::gemm_heads(x, w, out);  // one gemm per head (any dtype the gemm takes)
    return;
  }
  // Up to 16 rows (decode), not batch-invariant: the stream kernel's resident form (every weight
  // in registers before pdl_wait, one activation round trip after it; the same bits). H200
  // (bench/NOTES.md gemm18): bf16 batch 1 -14 us per step (-0.9%), batch 8 and FP8 equal.
  const bool resident = !options_.batch_invariant && launch_stream_resident(p, num_sms_, stream_, pdl_);
  if (!resident) launch_stream_gemm(p, stream_, pdl_);
  check_launch(resident ? "gemm_heads (resident)" : "gemm_heads",
               x.describe() + " · " + w.describe() + " -> " + out.describe());
}

}  // namespace deepinfer::cuda

namespace deepinfer::cuda {

bool CudaBackend::fp8_scales_fit(const Weight& w) {
  const int64_t N = w.w.shape[0], K = w.w.shape[1];
  return w.block_n == 128 && w.block_k == 128 && w.scale_inv.dtype == DType::F32 &&
         w.scale_inv.device == Device::CUDA && w.scale_inv.ndim == 2 && w.scale_inv.is_contiguous() &&
         w.scale_inv.shape[0] == (N + 127) / 128 && w.scale_inv.shape[1] == (K + 127) / 128;
}

bool CudaBackend::dense_rows_on_stream(int64_t M, const Weight& w) const {
  const bool fp8 = w.w.dtype == DType::F8_E4M3;
  return stream_gemm_ && (options_.batch_invariant || M <= stream_max_rows_ || (fp8 && M <= 128));
}

bool CudaBackend::dense_rows_on_pipe(int64_t M, const Weight& w) const {
  const bool fp8 = w.w.dtype == DType::F8_E4M3;
  return stream_gemm_ && pipe_stages_ > 0 && !options_.batch_invariant &&
         M <= (fp8 ? pipe_dense_fp8_rows_ : pipe_dense_bf16_rows_);
}

// One stream-kernel launch of 2 weights over the same rows; else two gemm calls (cuBLASLt
// rows, shapes the kernel does not take). Per row, the bits equal those of two gemm calls
// whenever the fused launch is taken (same kernel, same K order).
void CudaBackend::gemm_pair(const Tensor& x, const Weight& w1, const Weight& w2, Tensor& out1,
                            Tensor& out2) {
  const RowView xv = rows_of(x, "gemm_pair x");
  const RowView o1 = rows_of(out1, "gemm_pair out1");
  const RowView o2 = rows_of(out2, "gemm_pair out2");
  const int64_t M = xv.rows, K = xv.cols;
  const bool weights_ok =
      w1.w.device == Device::CUDA && w2.w.device == Device::CUDA && w1.w.ndim == 2 && w2.w.ndim == 2 &&
      w1.w.is_contiguous() && w2.w.is_contiguous() && w1.w.dtype == w2.w.dtype &&
      (w1.w.dtype == DType::BF16 ||
       (w1.w.dtype == DType::F8_E4M3 && fp8_scales_fit(w1) && fp8_scales_fit(w2))) &&
      w1.w.shape[1] == K && w2.w.shape[1] == K;
  const bool fused = weights_ok && x.dtype == DType::BF16 && x.device == Device::CUDA &&
                     out1.dtype == out2.dtype && (out1.dtype == DType::BF16 || out1.dtype == DType::F32) &&
                     o1.rows == M && o2.rows == M && o1.cols == w1.w.shape[0] && o2.cols == w2.w.shape[0] &&
                     M > 0 && (dense_rows_on_stream(M, w1) || dense_rows_on_pipe(M, w1));
  if (!fused) {
    Backend::gemm_pair(x, w1, w2, out1, out2);
    return;
  }
  const bool fp8 = w1.w.dtype == DType::F8_E4M3;
  GemmProblem p;
  p.a = xv.data;
  p.lda = xv.row_stride;
  p.M = static_cast<int>(M);
  p.max_rows = p.M;
  p.w = w1.w.data;
  p.s = fp8 ? w1.scale_inv.ptr<float>() : nullptr;
  p.w2 = w2.w.data;
  p.s2 = fp8 ? w2.scale_inv.ptr<float>() : nullptr;
  p.w_kind = fp8 ? kWeightFP8 : kWeightBF16;
  p.n_half = static_cast<int>(o1.cols);
  p.N = static_cast<int>(o1.cols + o2.cols);
  p.K = static_cast<int>(K);
  p.scale_cols = static_cast<int>((K + 127) / 128);
  p.c = o1.data;
  p.ldc = o1.row_stride;
  p.c2 = o2.data;
  p.ldc2 = o2.row_stride;
  p.c_bf16 = out1.dtype == DType::BF16;
  if (!stream_gemm_supported(p)) {
    Backend::gemm_pair(x, w1, w2, out1, out2);
    return;
  }
  const auto shapes = [&] { return x.describe() + " · " + w1.w.describe() + " | " + w2.w.describe(); };
  if (dense_rows_on_pipe(M, w1) && launch_pipe(p, "gemm_pair (pipe)", shapes())) return;
  if (!dense_rows_on_stream(M, w1)) {  // the pipe did not take it: two gemm calls as before
    Backend::gemm_pair(x, w1, w2, out1, out2);
    return;
  }
  launch_stream_gemm(p, stream_, pdl_);
  check_launch("gemm_pair", shapes());
}

// Backend::gemm_swiglu's composition (silu_mul, gemm, add) on scratch buffers instead of
// per-call allocations. (SwiGLU applied in the stream kernel's activation load lost its A/B,
// bench/NOTES.md v3.)
void CudaBackend::gemm_swiglu(const Tensor& gate_up, const Weight& w, Tensor& out, bool accumulate) {
  const RowView gv = rows_of(gate_up, "gemm_swiglu gate_up");
  const RowView ov = rows_of(out, "gemm_swiglu out");
  check_float(gate_up, "gemm_swiglu gate_up");
  check_float(out, "gemm_swiglu out");
  DI_CHECK(w.w.ndim == 2 && gv.cols % 2 == 0 && gv.cols / 2 == w.w.shape[1] && ov.rows == gv.rows &&
               ov.cols == w.w.shape[0],
           "gemm_swiglu: gate_up ", gate_up.describe(), " must be [T, 2I] and out ", out.describe(),
           " [T, N] for weight ", w.w.describe(), " [N, I]");
  const int64_t M = gv.rows, I = gv.cols / 2, N = ov.cols;
  if (M == 0 || N == 0) return;
  const DType adt = gate_up.dtype;
  Tensor act(scratch(kSlotSwigluAct, static_cast<size_t>(M * I) * dtype_size(adt), "gemm_swiglu"), adt,
             {M, I}, Device::CUDA);
  silu_mul(gate_up, act);
  if (!accumulate) {
    gemm(act, w, out);
    return;
  }
  Tensor y(scratch(kSlotSwigluOut, static_cast<size_t>(M * N) * dtype_size(ov.dtype), "gemm_swiglu"),
           ov.dtype, {M, N}, Device::CUDA);
  gemm(act, w, y);
  add(out, y);
}

}  // namespace deepinfer::cuda
