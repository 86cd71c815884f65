// FP8 activations: DeepSeek-V3's 1x128 quantization of x (e4m3, one fp32 scale = amax / 448 per
// row and 128 columns) and the FP8 x FP8 GEMM with 1x128 (x) and 128x128 (W) block scales on
// cuBLASLt (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F, CUDA >= 12.9, sm_90).
//
// gemm() on an FP8 weight takes this path for at least fp8 min_rows rows (default 129: up to
// 128 rows the weight-streaming W8A16 kernel runs, decode) and never in batch-invariant mode
// (cuBLASLt's reduction order is its own). cuBLASLt gets a multiple of 4 rows (16-byte aligned
// activation-scale vectors); the 1-3 rows left over run W8A16 on the stream kernel. (H200,
// bench/NOTES.md "fp8grp": CUTLASS's blockwise-scaled kernel of cutlass_fp8.cu as one group lost
// to cuBLASLt here by 4-8% of the bench model's FP8 prefill step; the routed experts run there.)
// CudaOptions::fp8_act_min_rows sets the threshold; 0 turns the path off (W8A16 everywhere,
// for A/B timing in code).
//
// cuBLASLt's column-major view of out[M, N] = x[M, K] · W[N, K]^T: D [N, M] = op(A) · B with
// A = W as K x N (ld K, transposed) carrying BLK128x128 scales and B = q as K x M (ld K) carrying
// VEC128 scales. Scale layouts it reads: BLK128x128: [ceil(N/128), L4] row-major with
// L4 = ceil(K/128) rounded up to 4 (our scale_inv when ceil(K/128) % 4 == 0, else a padded copy
// made per call); VEC128: [ceil(K/128), M] (M fastest), what quantize_fp8_1x128 writes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/fp8_quant.cuh"
#include "backend/cuda/gemm_problem.h"

namespace deepinfer::cuda {

struct CudaBackend::Fp8State {
  int64_t min_rows = 129;
  struct Plan {
    bool ok = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    // Weight scales as VEC128 (each 128x128 block's scale repeated for its 128 rows) when
    // cuBLASLt refused BLK128x128 for this shape: the same products.
    bool w_vec = false;
  };
  bool refusal_reported = false;
  // (M, N, K, ldo, out dtype) -> plan; the scale pointers are set per call.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int>, Plan> plans;
  ~Fp8State() {
    for (auto& [key, p] : plans) {
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.c) cublasLtMatrixLayoutDestroy(p.c);
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }
  }
};

namespace {

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// One warp per (row m, 128-column block b): lane l holds columns 128b + 4l .. + 3.
// scale = amax / 448 (1 when the block is all zero); q = e4m3(x / scale), RNE, saturating.
// The same float division and conversion as the CPU reference, so q and scales match it bit
// for bit.
template <typename T>
__global__ void quantize_1x128_kernel(const T* x, int64_t ldx, int M, int K, uint8_t* q,
                                      float* scales) {
  const int blocks = (K + kFp8Block - 1) / kFp8Block;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (item >= static_cast<int64_t>(M) * blocks) return;
  const int m = static_cast<int>(item / blocks), b = static_cast<int>(item % blocks);
  const int lane = threadIdx.x & 31;
  const int k0 = b * kFp8Block + lane * 4;
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = k0 + j < K ? to_f(x[static_cast<int64_t>(m) * ldx + k0 + j]) : 0.0f;
  const float scale = quantize_warp_block(v, k0, K, q + static_cast<int64_t>(m) * K);
  if (lane == 0) scales[static_cast<int64_t>(b) * M + m] = scale;
}

// Fallback for shapes cuBLASLt does not take (odd K, unaligned rows): one thread per output,
// the reference's order (per 128-wide block: exact e4m3 products summed, then both scales).
__global__ void fp8_gemm_simple_kernel(const uint8_t* q, const float* sa, const uint8_t* w,
                                       const float* sw, int64_t sw_stride, int M, int N, int K,
                                       void* out, int64_t ldo, int out_kind) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(M) * N) return;
  const int m = static_cast<int>(i / N), n = static_cast<int>(i % N);
  const int blocks = (K + kFp8Block - 1) / kFp8Block;
  float acc = 0.0f;
  for (int b = 0; b < blocks; ++b) {
    float part = 0.0f;
    for (int k = b * kFp8Block; k < min(K, (b + 1) * kFp8Block); ++k)
      part += fp8_to_f(q[static_cast<int64_t>(m) * K + k]) * fp8_to_f(w[static_cast<int64_t>(n) * K + k]);
    acc += part * (sa[static_cast<int64_t>(b) * M + m] * sw[(n / kFp8Block) * sw_stride + b]);
  }
  st(out, static_cast<int64_t>(m) * ldo + n, out_kind, acc);
}

// W's 128x128 scales [nb, kb] as VEC128 scales [kb, N]: out[b * N + n] = s[(n / 128) * kb + b].
__global__ void expand_weight_scales_kernel(const float* s, int kb, int N, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(kb) * N) return;
  const int b = static_cast<int>(i / N), n = static_cast<int>(i % N);
  out[i] = s[static_cast<int64_t>(n / kFp8Block) * kb + b];
}

void launch_quantize(const void* x, DType x_dtype, int64_t ldx, int64_t M, int64_t K, uint8_t* q,
                     float* scales, cudaStream_t stream) {
  const int64_t items = M * ((K + kFp8Block - 1) / kFp8Block);
  const unsigned grid = ceil_div(items, 8);  // 8 warps per block
  if (grid == 0) return;
  if (x_dtype == DType::BF16)
    quantize_1x128_kernel<bf16><<<grid, 256, 0, stream>>>(static_cast<const bf16*>(x), ldx,
                                                          static_cast<int>(M), static_cast<int>(K), q, scales);
  else
    quantize_1x128_kernel<float><<<grid, 256, 0, stream>>>(static_cast<const float*>(x), ldx,
                                                           static_cast<int>(M), static_cast<int>(K), q, scales);
}

}  // namespace

CudaBackend::Fp8State& CudaBackend::fp8_state() {
  if (!fp8_) {
    fp8_ = std::make_shared<Fp8State>();
    fp8_->min_rows = options_.cuda.fp8_act_min_rows;
  }
  return *fp8_;
}

bool CudaBackend::cublaslt_fp8(const void* q, const float* act_scales, int64_t M, const Weight& w,
                               void* out, int64_t ldo, DType out_dtype, float* w_scale_space) {
  const bool plan_only = q == nullptr;
  const int64_t N = w.w.shape[0], K = w.w.shape[1];
  const int64_t kb = (K + kFp8Block - 1) / kFp8Block, nb = (N + kFp8Block - 1) / kFp8Block, kb4 = round_up(kb, 4);
  const size_t out_elem = dtype_size(out_dtype);
  // FP8 tensor-core GEMMs need 16-byte rows and bases; the scale vectors 16-byte aligned.
  // M % 4: each 128-column block's M activation scales start 16-byte aligned.
  if (K % 16 || M % 4 || !aligned16(w.w.data) || !aligned16(out) ||
      (ldo * static_cast<int64_t>(out_elem)) % 16 || !fp8_scales_fit(w) || M <= 0 || N <= 0)
    return false;
  if (!plan_only && (!aligned16(q) || !aligned16(act_scales))) return false;
  Fp8State& st = fp8_state();
  const auto key = std::make_tuple(M, N, K, ldo, static_cast<int>(out_dtype));
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    Fp8State::Plan plan;
    const cudaDataType_t ctype = out_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
    const auto ok_ = [](cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; };
    cublasStatus_t last = CUBLAS_STATUS_SUCCESS;
    for (const bool w_vec : {false, true}) {
      Fp8State::Plan p;
      p.w_vec = w_vec;
      bool ok = !(w_vec && N % 4) && ok_(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
      const cublasLtMatmulMatrixScale_t a_mode =
          w_vec ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      // The heuristic wants scale pointers set; an aligned placeholder until the call.
      const void* placeholder = lt_workspace_;
      ok = ok && ok_(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
      ok = ok && ok_(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
      ok = ok && ok_(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                                    sizeof(a_mode)));
      ok = ok && ok_(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                                    sizeof(b_mode)));
      ok = ok && ok_(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder,
                                                    sizeof(placeholder)));
      ok = ok && ok_(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder,
                                                    sizeof(placeholder)));
      ok = ok && ok_(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, K, N, K));
      ok = ok && ok_(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, K, M, K));
      ok = ok && ok_(cublasLtMatrixLayoutCreate(&p.c, ctype, N, M, ldo));
      cublasLtMatmulPreference_t pref = nullptr;
      ok = ok && ok_(cublasLtMatmulPreferenceCreate(&pref));
      ok = ok && ok_(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &lt_workspace_bytes_, sizeof(lt_workspace_bytes_)));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      if (ok) {
        last = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
        ok = ok_(last) && found > 0;
      }
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      p.ok = ok;
      if (ok) p.algo = result.algo;
      if (ok || w_vec) {
        plan = p;
        break;
      }
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.c) cublasLtMatrixLayoutDestroy(p.c);
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }
    if (!plan.ok && !st.refusal_reported) {
      st.refusal_reported = true;  // once per backend: the W8A16 kernels run instead
      std::fprintf(stderr, "deepinfer cuda: cuBLASLt block-scaled FP8 GEMM refused (status %d) for M %lld N %lld K %lld\n",
                   static_cast<int>(last), static_cast<long long>(M), static_cast<long long>(N),
                   static_cast<long long>(K));
    }
    it = st.plans.emplace(key, plan).first;
  }
  const Fp8State::Plan& plan = it->second;
  if (!plan.ok || plan_only) return plan.ok;
  // Weight scales with rows padded to kb4 entries (cuBLASLt's BLK128x128 layout), or expanded
  // to VEC128 [kb, N].
  const float* w_scales = w.scale_inv.ptr<float>();
  if (plan.w_vec) {
    expand_weight_scales_kernel<<<ceil_div(kb * N, 256), 256, 0, stream_>>>(w_scales, static_cast<int>(kb),
                                                                          static_cast<int>(N), w_scale_space);
    check_launch("gemm (fp8 weight scales)", w.scale_inv.describe());
    w_scales = w_scale_space;
  } else if (kb4 != kb) {
    float* padded = w_scale_space;
    DI_CUDA(cudaMemsetAsync(padded, 0, static_cast<size_t>(nb * kb4) * 4, stream_), "gemm (fp8 scales)");
    DI_CUDA(cudaMemcpy2DAsync(padded, static_cast<size_t>(kb4) * 4, w_scales, static_cast<size_t>(kb) * 4,
                              static_cast<size_t>(kb) * 4, static_cast<size_t>(nb), cudaMemcpyDeviceToDevice,
                              stream_),
            "gemm (fp8 scales)");
    w_scales = padded;
  }
  bool ok = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales,
                                           sizeof(w_scales)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &act_scales,
                                            sizeof(act_scales)) == CUBLAS_STATUS_SUCCESS;
  DI_CHECK(ok, "gemm (cuBLASLt fp8): setting the scale pointers failed, W ", w.w.describe());
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(lt_, plan.desc, &alpha, w.w.data, plan.a, q, plan.b, &beta, out, plan.c, out, plan.c,
                     &plan.algo, lt_workspace_, lt_workspace_bytes_, stream_);
  DI_CHECK(status == CUBLAS_STATUS_SUCCESS, "gemm (cuBLASLt fp8) failed with status ", static_cast<int>(status),
           ": q [", M, ", ", K, "], W ", w.w.describe(), ", out ld ", ldo);
  check_launch("gemm (cuBLASLt fp8)", w.w.describe());
  return true;
}

bool CudaBackend::gemm_fp8_act(const void* x, int64_t ldx, int64_t M_all, const Weight& w, const RowView& ov) {
  const int64_t min_rows = fp8_state().min_rows;
  if (min_rows <= 0 || M_all < min_rows || options_.batch_invariant) return false;
  // cuBLASLt takes a multiple of 4 rows; the last 1-3 rows run W8A16 on the stream kernel.
  const int64_t M = M_all / 4 * 4;
  if (M == 0 || !cublaslt_fp8(nullptr, nullptr, M, w, ov.data, ov.row_stride, ov.dtype, nullptr)) return false;
  const int64_t N = w.w.shape[0], K = w.w.shape[1], kb = (K + kFp8Block - 1) / kFp8Block;
  if (M < M_all) {
    GemmProblem p;
    p.a = static_cast<const bf16*>(x) + M * ldx;
    p.lda = ldx;
    p.M = static_cast<int>(M_all - M);
    p.max_rows = p.M;
    p.w = w.w.data;
    p.s = w.scale_inv.ptr<float>();
    p.w_kind = kWeightFP8;
    p.N = static_cast<int>(N);
    p.K = static_cast<int>(K);
    p.scale_cols = static_cast<int>(kb);
    p.c = static_cast<char*>(ov.data) + M * ov.row_stride * static_cast<int64_t>(dtype_size(ov.dtype));
    p.ldc = ov.row_stride;
    p.c_bf16 = ov.dtype == DType::BF16;
    launch_gemm(p, "gemm (fp8 tail rows)", /*prefer_gemv=*/true);
  }
  // kSlotGemmW: [q: M x K bytes | act scales: kb x M floats | padded weight scales], each part
  // 256-byte aligned (x itself may sit in kSlotGemmA, converted from F32).
  const size_t q_bytes = static_cast<size_t>(round_up(M * K, 256));
  const size_t s_bytes = static_cast<size_t>(round_up(kb * M * 4, 256));
  const size_t w_bytes = static_cast<size_t>((((N + kFp8Block - 1) / kFp8Block) * round_up(kb, 4) + kb * N) * 4);
  char* base = static_cast<char*>(scratch(kSlotGemmW, q_bytes + s_bytes + w_bytes, "gemm (fp8 act)"));
  uint8_t* q = reinterpret_cast<uint8_t*>(base);
  float* scales = reinterpret_cast<float*>(base + q_bytes);
  launch_quantize(x, DType::BF16, ldx, M, K, q, scales, stream_);
  check_launch("gemm (fp8 act quantize)", w.w.describe());
  return cublaslt_fp8(q, scales, M, w, ov.data, ov.row_stride, ov.dtype,
                      reinterpret_cast<float*>(base + q_bytes + s_bytes));
}

void CudaBackend::quantize_fp8_1x128(const Tensor& x, Tensor& q, Tensor& scales) {
  const RowView xv = rows_of(x, "quantize_fp8_1x128 x");
  check_float(x, "quantize_fp8_1x128 x");
  check_device(q, "quantize_fp8_1x128 q");
  check_device(scales, "quantize_fp8_1x128 scales");
  const int64_t M = xv.rows, K = xv.cols, kb = (K + kFp8Block - 1) / kFp8Block;
  DI_CHECK(q.dtype == DType::F8_E4M3 && q.ndim == 2 && q.is_contiguous() && q.size(0) == M && q.size(1) == K,
           "quantize_fp8_1x128: q ", q.describe(), " must be contiguous F8_E4M3 [", M, ", ", K, "]");
  DI_CHECK(scales.dtype == DType::F32 && scales.ndim == 2 && scales.is_contiguous() && scales.size(0) == kb &&
               scales.size(1) == M,
           "quantize_fp8_1x128: scales ", scales.describe(), " must be contiguous F32 [", kb, ", ", M, "]");
  launch_quantize(xv.data, xv.dtype, xv.row_stride, M, K, q.ptr<uint8_t>(), scales.ptr<float>(), stream_);
  check_launch("quantize_fp8_1x128", x.describe());
}

void CudaBackend::gemm_fp8_1x128(const Tensor& q, const Tensor& scales, const Weight& w, Tensor& out) {
  check_device(q, "gemm_fp8_1x128 q");
  check_device(scales, "gemm_fp8_1x128 scales");
  check_device(w.w, "gemm_fp8_1x128 weight");
  const RowView ov = rows_of(out, "gemm_fp8_1x128 out");
  check_float(out, "gemm_fp8_1x128 out");
  DI_CHECK(q.dtype == DType::F8_E4M3 && q.ndim == 2 && q.is_contiguous(), "gemm_fp8_1x128: q ", q.describe(),
           " must be contiguous F8_E4M3 [M, K]");
  const int64_t M = q.size(0), K = q.size(1), kb = (K + kFp8Block - 1) / kFp8Block;
  DI_CHECK(scales.dtype == DType::F32 && scales.ndim == 2 && scales.is_contiguous() && scales.size(0) == kb &&
               scales.size(1) == M,
           "gemm_fp8_1x128: scales ", scales.describe(), " must be contiguous F32 [", kb, ", ", M, "]");
  DI_CHECK(w.w.dtype == DType::F8_E4M3 && w.w.ndim == 2 && w.w.is_contiguous() && w.w.shape[1] == K &&
               fp8_scales_fit(w),
           "gemm_fp8_1x128: weight ", w.w.describe(), " must be contiguous F8_E4M3 [N, ", K,
           "] with 128x128 blocks and scale_inv F32 [ceil(N/128), ", kb, "] on the device, got scale_inv ",
           w.scale_inv.describe(), " blocks ", w.block_n, "x", w.block_k);
  const int64_t N = w.w.shape[0];
  DI_CHECK(ov.rows == M && ov.cols == N, "gemm_fp8_1x128: out ", out.describe(), " must be [", M, ", ", N, "]");
  if (M == 0 || N == 0) return;
  const size_t w_bytes = static_cast<size_t>((((N + kFp8Block - 1) / kFp8Block) * round_up(kb, 4) + kb * N) * 4);
  float* w_scale_space = static_cast<float*>(scratch(kSlotGemmW, w_bytes, "gemm_fp8_1x128"));
  if (cublaslt_fp8(q.data, scales.ptr<float>(), M, w, ov.data, ov.row_stride, ov.dtype, w_scale_space)) return;
  const int64_t n = M * N;
  fp8_gemm_simple_kernel<<<ceil_div(n, 256), 256, 0, stream_>>>(
      q.ptr<uint8_t>(), scales.ptr<float>(), w.w.ptr<uint8_t>(), w.scale_inv.ptr<float>(), w.scale_inv.stride[0],
      static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), ov.data, ov.row_stride, float_kind(ov.dtype));
  check_launch("gemm_fp8_1x128 (simple)", q.describe() + " · " + w.w.describe());
}

}  // namespace deepinfer::cuda
