// FP8 activations: DeepSeek-V3's 1x128 quantization of x (e4m3, one fp32 scale = amax / 448 per
// row and 128 columns) and the FP8 x FP8 GEMM with 1x128 (x) and 128x128 (W) block scales on
// cuBLASLt (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F, CUDA >= 12.9, sm_90).
//
// gemm() on an FP8 weight takes this path for at least fp8 min_rows rows (default 129: up to
// 128 rows the weight-streaming W8A16 kernel runs, decode) and never in batch-invariant mode
// (cuBLASLt's reduction order is its own). The GEMM itself runs on CUTLASS's blockwise-scaled
// kernel (cutlass_fp8.cu, CudaOptions::fp8_dense_cutlass) where it takes the shape, else here. cuBLASLt gets a multiple of 4 rows (16-byte aligned
// activation-scale vectors); the 1-3 rows left over run W8A16 on the stream kernel.
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
  // Routed experts (moe_fp8_act): on/off (CudaOptions::fp8_moe_act) and the least average
  // rows per expert (CudaOptions::fp8_moe_min_rows). H200, bench model (bench/NOTES.md,
  // "moe-fp8"): prefill 4096 (384 rows per expert) 27,400 -> 47,000 tok/s, 2048 (192) 29,160 ->
  // 45,300, but 512 (48) 32,200 -> 17,800: 192 cuBLASLt calls and a host sync per layer cost
  // more than they save on small slices. Hence on, from 128 rows per expert.
  bool moe_act = true;
  int64_t moe_min_rows = 128;
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
    fp8_->moe_act = options_.cuda.fp8_moe_act;
    fp8_->moe_min_rows = options_.cuda.fp8_moe_min_rows;
  }
  return *fp8_;
}

bool CudaBackend::cublaslt_fp8(const void* q, const float* act_scales, int64_t M, const Weight& w,
                               void* out, int64_t ldo, DType out_dtype, float* w_scale_space,
                               const float* w_scales_padded) {
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
  } else if (kb4 != kb && w_scales_padded) {
    w_scales = w_scales_padded;
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
  // CUTLASS's blockwise-scaled kernel (cutlass_fp8.cu) takes every row count: all rows quantized
  // into kSlotGemmW ([q: M x K bytes | scales: kb x M floats]), one GEMM.
  if (fp8_dense_cutlass_ && cutlass_fp8_dense_fits(w, ov)) {
    const int64_t K = w.w.shape[1], kb = (K + kFp8Block - 1) / kFp8Block;
    const size_t q_bytes = static_cast<size_t>(round_up(M_all * K, 256));
    char* base = static_cast<char*>(scratch(kSlotGemmW, q_bytes + static_cast<size_t>(kb * M_all * 4), "gemm (fp8 act)"));
    launch_quantize(x, DType::BF16, ldx, M_all, K, reinterpret_cast<uint8_t*>(base), reinterpret_cast<float*>(base + q_bytes),
                    stream_);
    check_launch("gemm (fp8 act quantize)", w.w.describe());
    gemm_fp8_cutlass(reinterpret_cast<uint8_t*>(base), reinterpret_cast<float*>(base + q_bytes), M_all, w, ov);
    return true;
  }
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

namespace {

// Routed experts with FP8 activations: each expert's permuted rows padded to a multiple of
// kMoeRowGrain (a multiple of 4 for cuBLASLt; 32 keeps the number of distinct M, hence plans,
// small). Padded layout: expert e owns rows [poff[e], poff[e + 1]) of q, hidden and y; its
// count = off[e + 1] - off[e] real rows first, zeros after.
constexpr int kMoeRowGrain = 32;

// Every expert's 128x128 weight scales [nb, kb] with rows padded to kb4 (cuBLASLt's
// BLK128x128 layout): out [E, nb, kb4], one launch instead of a copy per expert call.
__global__ void pad_expert_scales_kernel(const float* const* s_ptrs, int E, int nb, int kb, int kb4, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(E) * nb * kb4) return;
  const int e = static_cast<int>(i / (nb * kb4)), rem = static_cast<int>(i % (nb * kb4));
  const int n = rem / kb4, b = rem % kb4;
  out[i] = b < kb ? s_ptrs[e][n * kb + b] : 0.0f;
}

// Pair i's row in the padded layout: poff[e] + (entry_pos[i] - off[e]), -1 stays -1.
__global__ void padded_positions_kernel(const int32_t* ids, int P, const int32_t* off, const int32_t* poff,
                                        const int32_t* entry_pos, int32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= P) return;
  const int pos = entry_pos[i];
  out[i] = pos < 0 ? -1 : poff[ids[i]] + pos - off[ids[i]];
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

bool CudaBackend::moe_fp8_act(const void* x, int64_t ldx, int64_t T, int top_k, const int32_t* topk_ids,
                              const std::vector<ExpertWeights>& experts, const int32_t* row_token,
                              const int32_t* offsets, const int32_t* entry_pos, const float** y,
                              const int32_t** y_pos) {
  const Fp8State& cfg = fp8_state();
  const int E = static_cast<int>(experts.size());
  const int64_t P = T * top_k, H = experts[0].gate.w.shape[1], I = experts[0].gate.w.shape[0];
  if (!cfg.moe_act || options_.batch_invariant || capturing() || P < cfg.moe_min_rows * E) return false;
  // cuBLASLt's FP8 GEMMs need K % 16 (both GEMMs) and 16-byte output rows (2I bf16, H f32).
  if (H % 16 || I % 16) return false;
  const int64_t kbH = (H + kFp8Block - 1) / kFp8Block, kbI = (I + kFp8Block - 1) / kFp8Block;
  const int64_t nbH = (H + kFp8Block - 1) / kFp8Block, kbI4 = round_up(kbI, 4);
  const ExpertTable& table = expert_table(experts);
  const void* const* ptrs = static_cast<const void* const*>(table.ptrs.tensor().data);
  bf16* hidden_probe = static_cast<bf16*>(scratch(kSlotMoeHidden, 16, "moe_experts (fp8 act)"));
  // Plans for one row grain first: when cuBLASLt refuses the shapes, W8A16 runs as before.
  if (!cublaslt_fp8(nullptr, nullptr, kMoeRowGrain, experts[0].gate, hidden_probe, 2 * I, DType::BF16, nullptr))
    return false;
  float* y_probe = static_cast<float*>(scratch(kSlotMoeOut, 16, "moe_experts (fp8 act)"));
  if (!cublaslt_fp8(nullptr, nullptr, kMoeRowGrain, experts[0].down, y_probe, H, DType::F32, nullptr)) return false;

  // The per-expert row counts on the host (one synchronisation per MoE layer in prefill).
  std::vector<int32_t> off(static_cast<size_t>(E) + 1), poff(static_cast<size_t>(E) + 1);
  DI_CUDA(cudaMemcpyAsync(off.data(), offsets, off.size() * 4, cudaMemcpyDeviceToHost, stream_),
          "moe_experts (fp8 act offsets)");
  DI_CUDA(cudaStreamSynchronize(stream_), "moe_experts (fp8 act offsets)");
  poff[0] = 0;
  for (int e = 0; e < E; ++e) poff[e + 1] = poff[e] + static_cast<int32_t>(round_up(off[e + 1] - off[e], kMoeRowGrain));
  const int64_t rows = poff[E];

  // Buffers: hidden bf16 [rows, 2I]; y f32 [rows, H]; q [rows, max(H, I)] + scales; and in
  // kSlotGemmW off/poff [2(E + 1)], y_pos [P], padded down scales [E, nbH, kbI4], the weight
  // scale space cublaslt_fp8 may need (VEC128 expansion).
  bf16* hidden = static_cast<bf16*>(scratch(kSlotMoeHidden, static_cast<size_t>(rows * 2 * I) * 2, "moe_experts (fp8 act)"));
  float* yb = static_cast<float*>(scratch(kSlotMoeOut, static_cast<size_t>(rows * H) * 4, "moe_experts (fp8 act)"));
  const size_t q_bytes = align256(static_cast<size_t>(rows * std::max(H, I)));
  const size_t s_bytes = align256(static_cast<size_t>(rows * std::max(kbH, kbI)) * 4);
  char* qs = static_cast<char*>(scratch(kSlotMoeAct, q_bytes + s_bytes, "moe_experts (fp8 act)"));
  uint8_t* q = reinterpret_cast<uint8_t*>(qs);
  float* act_scales = reinterpret_cast<float*>(qs + q_bytes);
  const size_t idx_bytes = align256(static_cast<size_t>(2 * (E + 1) + P) * 4);
  const size_t pad_bytes = align256(static_cast<size_t>(E * nbH * kbI4) * 4);
  const int64_t nbI = (I + kFp8Block - 1) / kFp8Block, kbH4 = round_up(kbH, 4);
  const size_t space_bytes = static_cast<size_t>(std::max(nbI * kbH4 + kbH * I, nbH * kbI4 + kbI * H)) * 4;
  char* wb = static_cast<char*>(scratch(kSlotGemmW, idx_bytes + pad_bytes + space_bytes, "moe_experts (fp8 act)"));
  int32_t* d_off = reinterpret_cast<int32_t*>(wb);
  int32_t* d_poff = d_off + E + 1;
  int32_t* d_pos = d_poff + E + 1;
  float* down_scales = reinterpret_cast<float*>(wb + idx_bytes);
  float* space = reinterpret_cast<float*>(wb + idx_bytes + pad_bytes);
  std::vector<int32_t> both(off);
  both.insert(both.end(), poff.begin(), poff.end());
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so `both` may go.
  DI_CUDA(cudaMemcpyAsync(d_off, both.data(), both.size() * 4, cudaMemcpyHostToDevice, stream_),
          "moe_experts (fp8 act offsets)");
  const std::string shapes = "T " + std::to_string(T) + " top_k " + std::to_string(top_k) + " experts " +
                             std::to_string(E) + " " + experts[0].gate.w.describe();
  if (kbI4 != kbI) {
    pad_expert_scales_kernel<<<ceil_div(E * nbH * kbI4, 256), 256, 0, stream_>>>(
        reinterpret_cast<const float* const*>(ptrs + size_t{5} * E), E, static_cast<int>(nbH),
        static_cast<int>(kbI), static_cast<int>(kbI4), down_scales);
    check_launch("moe_experts (fp8 down scales)", shapes);
  }

  // One expert GEMM on its row slice: cuBLASLt, or the simple kernel for a slice it refuses.
  auto expert_gemm = [&](const uint8_t* qe, const float* se, int64_t rows_e, const Weight& w, void* out,
                         int64_t ldo, DType out_dtype, const float* padded, const char* op) {
    if (cublaslt_fp8(qe, se, rows_e, w, out, ldo, out_dtype, space, padded)) return;
    const int64_t N = w.w.shape[0], K = w.w.shape[1];
    fp8_gemm_simple_kernel<<<ceil_div(rows_e * N, 256), 256, 0, stream_>>>(
        qe, se, w.w.ptr<uint8_t>(), w.scale_inv.ptr<float>(), w.scale_inv.stride[0], static_cast<int>(rows_e),
        static_cast<int>(N), static_cast<int>(K), out, ldo, float_kind(out_dtype));
    check_launch(op, shapes);
  };
  // gate | up: x rows gathered and quantized once, [rows, H] -> hidden [rows, 2I] (bf16).
  quantize_segments_kernel<false><<<ceil_div(rows * kbH, 8), 256, 0, stream_>>>(
      static_cast<const bf16*>(x), ldx, row_token, 0, d_off, d_poff, E, static_cast<int>(rows), static_cast<int>(H),
      q, act_scales);
  check_launch("moe_experts (fp8 act quantize x)", shapes);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = poff[e], rows_e = poff[e + 1] - poff[e];
    if (rows_e == 0) continue;
    const uint8_t* qe = q + r0 * H;
    const float* se = act_scales + r0 * kbH;
    expert_gemm(qe, se, rows_e, experts[e].gate, hidden + r0 * 2 * I, 2 * I, DType::BF16, nullptr,
                "moe_experts (fp8 gate)");
    expert_gemm(qe, se, rows_e, experts[e].up, hidden + r0 * 2 * I + I, 2 * I, DType::BF16, nullptr,
                "moe_experts (fp8 up)");
  }
  // down: bf16(silu(gate) * up) quantized, [rows, I] -> y [rows, H] (f32 for the combine).
  quantize_segments_kernel<true><<<ceil_div(rows * kbI, 8), 256, 0, stream_>>>(
      hidden, 2 * I, nullptr, I, d_off, d_poff, E, static_cast<int>(rows), static_cast<int>(I), q, act_scales);
  check_launch("moe_experts (fp8 act quantize swiglu)", shapes);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = poff[e], rows_e = poff[e + 1] - poff[e];
    if (rows_e == 0) continue;
    expert_gemm(q + r0 * I, act_scales + r0 * kbI, rows_e, experts[e].down, yb + r0 * H, H, DType::F32,
                kbI4 != kbI ? down_scales + static_cast<int64_t>(e) * nbH * kbI4 : nullptr, "moe_experts (fp8 down)");
  }
  padded_positions_kernel<<<ceil_div(P, 256), 256, 0, stream_>>>(topk_ids, static_cast<int>(P), d_off, d_poff,
                                                                 entry_pos, d_pos);
  check_launch("moe_experts (fp8 act positions)", shapes);
  *y = yb;
  *y_pos = d_pos;
  return true;
}

}  // namespace deepinfer::cuda
