// Memory-bound ops: embedding, rms_norm (+ fused residual add), layer_norm, rope, silu_mul, add,
// kv_store, argmax and fill_random. Activations may be F32 or BF16; the dtype is a
// uniform run-time flag (one instantiation per kernel keeps the build small; the branch
// costs nothing next to the memory traffic). Reductions use fixed-order block trees.
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/rms_norm_row.cuh"
#include "backend/random.h"

namespace deepinfer::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const void* table, int table_kind, int64_t H,
                                 int64_t vocab, void* out, int out_kind, int64_t ldo) {
  pdl_wait();  // launched as a programmatic dependent (pdl_launch.cuh): ids may come from argmax
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    const float v = ok ? ld(table, id * H + c, table_kind) : __int_as_float(0x7fc00000);
    st(out, t * ldo + c, out_kind, v);
  }
}

// One block per row. out = rms_norm(res + x) with res updated (ADD) or rms_norm(x): the row
// summed in one pass, then read again for the output; for rows longer than rms_norm_regs_kernel
// takes (or a residual of another dtype than x). Each pass is a chain of dependent loads (the
// store may alias the next element's load): at 2,048 columns 16 L2 round trips a row, against
// the register form's one (bench/NOTES.md norm18: -160 us per bf16 batch-1 step on the H200).
__global__ void rms_norm_kernel(const void* x, int x_kind, int64_t ldx, void* res, int res_kind,
                                int64_t ldr, const void* w, int w_kind, int64_t H, float eps,
                                void* out, int out_kind, int64_t ldo, bool add) {
  pdl_wait();     // a programmatic dependent (pdl_launch.cuh): x and res after the kernel before
  pdl_trigger();  // the next GEMM may start streaming its weights (dec18)
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float v = ld(x, r * ldx + c, x_kind);
    if (add) {
      v = round_to(ld(res, r * ldr + c, res_kind) + v, res_kind);
      st(res, r * ldr + c, res_kind, v);
    }
    ss += v * v;
  }
  const float total = block_sum(ss, scratch);
  const float inv = rsqrtf(total / static_cast<float>(H) + eps);
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    const float v = add ? ld(res, r * ldr + c, res_kind) : ld(x, r * ldx + c, x_kind);
    st(out, r * ldo + c, out_kind, v * inv * ld(w, c, w_kind));
  }
}

// One block per row, the register form of rms_norm_kernel (rms_norm_row.cuh): rows of 1 to
// kNormRegs x blockDim columns, x and res of one dtype (x_kind), the weight's w_kind; same bits.
__global__ void rms_norm_regs_kernel(NormRow n, int x_kind, int w_kind, float eps, bool add) {
  __shared__ float scratch[32];
  rms_norm_row_regs(n, x_kind, w_kind, blockIdx.x, blockDim.x, eps, add, scratch);
}

// One block per row: out = (x - mean) * rsqrt(var + eps) * w + b (biased variance, fp32; two
// fixed-order block sums). out may be x (each element is read before its own write).
__global__ void layer_norm_kernel(const void* x, int x_kind, int64_t ldx, const void* w, int w_kind,
                                  const void* b, int b_kind, int64_t H, float eps, void* out,
                                  int out_kind, int64_t ldo) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) s += ld(x, r * ldx + c, x_kind);
  const float mean = block_sum(s, scratch) / static_cast<float>(H);
  float v = 0.0f;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    const float d = ld(x, r * ldx + c, x_kind) - mean;
    v += d * d;
  }
  const float inv = rsqrtf(block_sum(v, scratch) / static_cast<float>(H) + eps);
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    const float y = (ld(x, r * ldx + c, x_kind) - mean) * inv * ld(w, c, w_kind) + ld(b, c, b_kind);
    st(out, r * ldo + c, out_kind, y);
  }
}

__global__ void rope_kernel(void* x, int kind, int64_t T, int64_t H, int64_t s0, int64_t s1,
                            const int32_t* positions, const float* cos_sin, int offset,
                            int rope_dim, bool interleave) {
  const int half = rope_dim / 2;
  const int64_t n = T * H * half;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int p = static_cast<int>(i % half);
    const int64_t h = (i / half) % H;
    const int64_t t = i / (half * H);
    const float* cs = cos_sin + static_cast<int64_t>(positions[t]) * rope_dim;
    const float c = cs[p], s = cs[half + p];
    const int64_t base = t * s0 + h * s1 + offset;
    const int64_t ia = base + (interleave ? 2 * p : p);
    const int64_t ib = base + (interleave ? 2 * p + 1 : p + half);
    const float x0 = ld(x, ia, kind), x1 = ld(x, ib, kind);
    st(x, ia, kind, x0 * c - x1 * s);
    st(x, ib, kind, x1 * c + x0 * s);
  }
}

__global__ void silu_mul_kernel(const void* g, int g_kind, int64_t ldg, int64_t rows, int64_t I,
                                void* out, int out_kind, int64_t ldo) {
  pdl_wait();     // a programmatic dependent (pdl_launch.cuh)
  pdl_trigger();  // the down GEMM may start (dec18)
  const int64_t n = rows * I;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / I, c = i % I;
    const float a = ld(g, r * ldg + c, g_kind), b = ld(g, r * ldg + I + c, g_kind);
    st(out, r * ldo + c, out_kind, a / (1.0f + __expf(-a)) * b);
  }
}

__global__ void add_kernel(void* x, int x_kind, int64_t ldx, const void* y, int y_kind,
                           int64_t ldy, int64_t rows, int64_t cols) {
  pdl_wait();  // a programmatic dependent (pdl_launch.cuh)
  pdl_trigger();
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    st(x, r * ldx + c, x_kind, ld(x, r * ldx + c, x_kind) + ld(y, r * ldy + c, y_kind));
  }
}

__global__ void kv_store_kernel(const void* rows, int rows_kind, int64_t ldr, int64_t T,
                                int64_t D, const int32_t* slots, int64_t num_slots, void* cache,
                                int cache_kind) {
  const int64_t n = T * D;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / D, c = i % D;
    const int32_t slot = slots[t];
    if (slot < 0 || slot >= num_slots) continue;  // -1: do not store
    st(cache, static_cast<int64_t>(slot) * D + c, cache_kind, ld(rows, t * ldr + c, rows_kind));
  }
}

// grid (num_seqs, ceil(max_seq_len / kGatherRows)), 256 threads: the block copies positions
// [y * kGatherRows, ...) of sequence x from the cache to rows c_x + p (c_x: the sum of the earlier
// seq_lens). Rows past the output's N rows and block ids outside the cache are skipped.
constexpr int kGatherRows = 32;
__global__ void kv_gather_kernel(const void* cache, int cache_kind, int64_t num_blocks, int block_size,
                                 const int32_t* tables, int max_blocks, const int32_t* seq_lens, void* rows,
                                 int rows_kind, int64_t ldr, int64_t N, int64_t D) {
  const int s = blockIdx.x;
  int64_t c = 0;
  for (int i = 0; i < s; ++i) c += seq_lens[i];
  const int len = seq_lens[s], p0 = blockIdx.y * kGatherRows;
  for (int p = p0; p < min(p0 + kGatherRows, len); ++p) {
    const int32_t block = tables[int64_t{s} * max_blocks + p / block_size];
    if (c + p >= N || block < 0 || block >= num_blocks) continue;
    const int64_t src = (int64_t{block} * block_size + p % block_size) * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      st(rows, (c + p) * ldr + j, rows_kind, ld(cache, src + j, cache_kind));
  }
}

// The block's best (v, i) on thread 0 (a larger value wins, an equal one goes to the lower
// index) and, on every thread, whether any thread's `nan` was set; every thread must call it.
// best_v / best_i: one entry per warp in shared memory.
__device__ __forceinline__ bool block_argmax(float& v, int32_t& i, int nan, float* best_v, int32_t* best_i) {
  warp_argmax(v, i);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_v[warp] = v;
    best_i[warp] = i;
  }
  const int any_nan = __syncthreads_or(nan);
  if (threadIdx.x == 0) {
    v = best_v[0];
    i = best_i[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
      if (best_v[w] > v || (best_v[w] == v && best_i[w] < i)) {
        v = best_v[w];
        i = best_i[w];
      }
    }
  }
  return any_nan != 0;
}

// argmax: a row's logits in slices of kArgmaxSlice, one block of kArgmaxThreads each
// (kArgmaxUnroll independent loads a thread: one L2 round trip), then one block per row over the
// slices' partial maxima. The rules of the CPU op: the largest value, the lowest index among
// equal ones (a slice's lowest, then the lowest slice's), -1 (sample_rule::kNoToken) for a row
// holding a NaN; the id is a function of the row alone, so the split changes none. (One block of
// 1,024 threads walking the row took 24 us per step at batch 1, the split ~2 us; bench/NOTES.md
// norm18.)
constexpr int kArgmaxThreads = 256, kArgmaxUnroll = 8;
constexpr int64_t kArgmaxSlice = int64_t{kArgmaxThreads} * kArgmaxUnroll;
struct ArgmaxPartial {
  float v;
  int32_t i;  // -1: the slice holds a NaN
};

// grid (rows x slices): block b reduces slice b % slices of row b / slices.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_slice_kernel(const void* logits, int kind, int64_t ld_row,
                                                                      int64_t V, int64_t slices,
                                                                      ArgmaxPartial* partial) {
  pdl_wait();     // a programmatic dependent (pdl_launch.cuh)
  pdl_trigger();  // argmax_finish_kernel may launch
  __shared__ float best_v[kArgmaxThreads / 32];
  __shared__ int32_t best_i[kArgmaxThreads / 32];
  const int64_t r = blockIdx.x / slices, c0 = (blockIdx.x % slices) * kArgmaxSlice + threadIdx.x;
  float v[kArgmaxUnroll];
#pragma unroll
  for (int u = 0; u < kArgmaxUnroll; ++u) {  // clamped into the row: no branch between the loads
    const int64_t c = c0 + int64_t{u} * kArgmaxThreads;
    v[u] = ld(logits, r * ld_row + (c < V ? c : V - 1), kind);
  }
  float bv = -INFINITY;
  int32_t bi = INT32_MAX;  // larger than any index
  int nan = 0;
#pragma unroll
  for (int u = 0; u < kArgmaxUnroll; ++u) {  // increasing indices: the first of equal values stays
    const int64_t c = c0 + int64_t{u} * kArgmaxThreads;
    if (c >= V) continue;
    nan |= (__float_as_uint(v[u]) & 0x7fffffffu) > 0x7f800000u;
    if (v[u] > bv || (v[u] == bv && c < bi)) {
      bv = v[u];
      bi = static_cast<int32_t>(c);
    }
  }
  const bool any_nan = block_argmax(bv, bi, nan, best_v, best_i);
  if (threadIdx.x == 0) partial[blockIdx.x] = ArgmaxPartial{bv, any_nan ? -1 : bi};
}

// One block of kArgmaxThreads per row over its `slices` partials.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_finish_kernel(const ArgmaxPartial* partial, int64_t slices,
                                                                       int64_t V, int32_t* ids) {
  pdl_wait();     // a programmatic dependent (pdl_launch.cuh): the partials
  pdl_trigger();  // the next step's embedding may launch
  __shared__ float best_v[kArgmaxThreads / 32];
  __shared__ int32_t best_i[kArgmaxThreads / 32];
  const int64_t r = blockIdx.x;
  float bv = -INFINITY;
  int32_t bi = INT32_MAX;
  int nan = 0;
  for (int64_t s = threadIdx.x; s < slices; s += kArgmaxThreads) {
    const ArgmaxPartial p = partial[r * slices + s];
    if (p.i < 0) {
      nan = 1;
    } else if (p.v > bv || (p.v == bv && p.i < bi)) {
      bv = p.v;
      bi = p.i;
    }
  }
  const bool any_nan = block_argmax(bv, bi, nan, best_v, best_i);
  if (threadIdx.x == 0) ids[r] = any_nan ? -1 : (bi < V ? bi : 0);
}

// kind: 0 = F32, 1 = BF16, 2 = F8_E4M3.
__global__ void fill_random_kernel(void* data, int kind, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = scale * random_uniform(seed, static_cast<uint64_t>(i));
    if (kind == 0)
      static_cast<float*>(data)[i] = v;
    else if (kind == 1)
      static_cast<bf16*>(data)[i] = __float2bfloat16_rn(v);
    else
      static_cast<uint8_t*>(data)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }
}

// Strided copy of up to kMaxDims dims (same dtype, element size 1/2/4/8 bytes); strides may
// be 0 (broadcast source).
struct StridedCopy {
  const char* src;
  char* dst;
  int ndim, elem;
  int64_t shape[kMaxDims], src_stride[kMaxDims], dst_stride[kMaxDims];
};

__global__ void copy_strided_kernel(StridedCopy c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rem = i, so = 0, d_off = 0;
    for (int d = c.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % c.shape[d];
      rem /= c.shape[d];
      so += idx * c.src_stride[d];
      d_off += idx * c.dst_stride[d];
    }
    const char* s = c.src + so * c.elem;
    char* t = c.dst + d_off * c.elem;
    switch (c.elem) {
      case 1: *reinterpret_cast<uint8_t*>(t) = *reinterpret_cast<const uint8_t*>(s); break;
      case 2: *reinterpret_cast<uint16_t*>(t) = *reinterpret_cast<const uint16_t*>(s); break;
      case 4: *reinterpret_cast<uint32_t*>(t) = *reinterpret_cast<const uint32_t*>(s); break;
      default: *reinterpret_cast<uint64_t*>(t) = *reinterpret_cast<const uint64_t*>(s); break;
    }
  }
}

unsigned grid_for(int64_t n, int threads, int num_sms) {
  const int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = int64_t{num_sms} * 16;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

}  // namespace

void CudaBackend::copy_strided(const Tensor& src, Tensor& dst) {
  DI_CHECK(src.device == Device::CUDA && dst.device == Device::CUDA,
           "copy: strided copies between host and device are not supported (", src.describe(), " -> ",
           dst.describe(), "); make one side contiguous");
  DI_CHECK(src.ndim == dst.ndim, "copy: ", src.describe(), " -> ", dst.describe(), " differ in rank");
  StridedCopy c{};
  c.src = static_cast<const char*>(src.data);
  c.dst = static_cast<char*>(dst.data);
  c.ndim = dst.ndim;
  c.elem = static_cast<int>(dtype_size(dst.dtype));
  for (int d = 0; d < dst.ndim; ++d) {
    DI_CHECK(src.shape[d] == dst.shape[d], "copy: ", src.describe(), " -> ", dst.describe(),
             " differ in shape");
    c.shape[d] = dst.shape[d];
    c.src_stride[d] = src.stride[d];
    c.dst_stride[d] = dst.stride[d];
  }
  const int64_t n = dst.numel();
  if (n == 0) return;
  copy_strided_kernel<<<grid_for(n, 256, num_sms_), 256, 0, stream_>>>(c, n);
  check_launch("copy (strided)", src.describe() + " -> " + dst.describe());
}

void CudaBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  check_dtype(ids, DType::I32, "embedding ids");
  check_float(table, "embedding table");
  DI_CHECK(table.ndim == 2 && table.is_contiguous(), "embedding: table must be contiguous [V, H], got ",
           table.describe());
  const RowView o = rows_of(out, "embedding out");
  check_float(out, "embedding out");
  const int64_t T = ids.numel();
  DI_CHECK(o.rows == T && o.cols == table.shape[1], "embedding: out ", out.describe(), " must be [",
           T, ", ", table.shape[1], "]");
  if (T == 0) return;
  launch_pdl(pdl_, static_cast<unsigned>(T), 256, 0, stream_, embedding_kernel,
      ids.ptr<int32_t>(), table.data, float_kind(table.dtype), table.shape[1], table.shape[0], o.data,
      float_kind(o.dtype), o.row_stride);
  check_launch("embedding", ids.describe() + " " + table.describe());
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const RowView xv = rows_of(x, "rms_norm x");
  const RowView ov = rows_of(out, "rms_norm out");
  check_float(x, "rms_norm x");
  check_float(out, "rms_norm out");
  check_float(weight, "rms_norm weight");
  DI_CHECK(weight.numel() == xv.cols && weight.is_contiguous() && ov.rows == xv.rows &&
               ov.cols == xv.cols,
           "rms_norm: x ", x.describe(), ", weight ", weight.describe(), ", out ", out.describe(),
           " do not match");
  if (xv.rows == 0) return;
  const int threads = xv.cols >= 1024 ? 256 : 128;
  if (xv.cols >= 1 && xv.cols <= int64_t{kNormRegs} * threads) {
    const NormRow n{xv.data, nullptr, weight.data, ov.data, xv.row_stride, 0, ov.row_stride, xv.cols,
                    float_kind(ov.dtype)};
    launch_pdl(pdl_, static_cast<unsigned>(xv.rows), threads, 0, stream_, rms_norm_regs_kernel, n,
               float_kind(xv.dtype), float_kind(weight.dtype), eps, false);
  } else {
    launch_pdl(pdl_, static_cast<unsigned>(xv.rows), threads, 0, stream_, rms_norm_kernel,
        xv.data, float_kind(xv.dtype), xv.row_stride, nullptr, 0, 0, weight.data,
        float_kind(weight.dtype), xv.cols, eps, ov.data, float_kind(ov.dtype), ov.row_stride, false);
  }
  check_launch("rms_norm", x.describe() + " -> " + out.describe());
}

void CudaBackend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                               Tensor& out) {
  const RowView rv = rows_of(residual, "add_rms_norm residual");
  const RowView xv = rows_of(x, "add_rms_norm x");
  const RowView ov = rows_of(out, "add_rms_norm out");
  check_float(residual, "add_rms_norm residual");
  check_float(x, "add_rms_norm x");
  check_float(out, "add_rms_norm out");
  check_float(weight, "add_rms_norm weight");
  DI_CHECK(rv.rows == xv.rows && rv.cols == xv.cols && ov.rows == xv.rows && ov.cols == xv.cols &&
               weight.numel() == xv.cols && weight.is_contiguous(),
           "add_rms_norm: residual ", residual.describe(), ", x ", x.describe(), ", weight ",
           weight.describe(), ", out ", out.describe(), " do not match");
  if (xv.rows == 0) return;
  const int threads = xv.cols >= 1024 ? 256 : 128;
  if (xv.cols >= 1 && xv.cols <= int64_t{kNormRegs} * threads && rv.dtype == xv.dtype) {
    const NormRow n{xv.data, rv.data, weight.data, ov.data, xv.row_stride, rv.row_stride, ov.row_stride, xv.cols,
                    float_kind(ov.dtype)};
    launch_pdl(pdl_, static_cast<unsigned>(xv.rows), threads, 0, stream_, rms_norm_regs_kernel, n,
               float_kind(xv.dtype), float_kind(weight.dtype), eps, true);
  } else {
    launch_pdl(pdl_, static_cast<unsigned>(xv.rows), threads, 0, stream_, rms_norm_kernel,
        xv.data, float_kind(xv.dtype), xv.row_stride, rv.data, float_kind(rv.dtype), rv.row_stride,
        weight.data, float_kind(weight.dtype), xv.cols, eps, ov.data, float_kind(ov.dtype),
        ov.row_stride, true);
  }
  check_launch("add_rms_norm", x.describe() + " -> " + out.describe());
}

void CudaBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                             Tensor& out) {
  const RowView xv = rows_of(x, "layer_norm x");
  const RowView ov = rows_of(out, "layer_norm out");
  check_float(x, "layer_norm x");
  check_float(out, "layer_norm out");
  check_float(weight, "layer_norm weight");
  check_float(bias, "layer_norm bias");
  DI_CHECK(weight.numel() == xv.cols && weight.is_contiguous() && bias.numel() == xv.cols &&
               bias.is_contiguous() && ov.rows == xv.rows && ov.cols == xv.cols,
           "layer_norm: x ", x.describe(), ", weight ", weight.describe(), ", bias ", bias.describe(),
           ", out ", out.describe(), " do not match");
  if (xv.rows == 0) return;
  const int threads = xv.cols >= 1024 ? 256 : 128;
  layer_norm_kernel<<<static_cast<unsigned>(xv.rows), threads, 0, stream_>>>(
      xv.data, float_kind(xv.dtype), xv.row_stride, weight.data, float_kind(weight.dtype), bias.data,
      float_kind(bias.dtype), xv.cols, eps, ov.data, float_kind(ov.dtype), ov.row_stride);
  check_launch("layer_norm", x.describe() + " -> " + out.describe());
}

void CudaBackend::rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset,
                       int rope_dim, bool interleave) {
  check_float(x, "rope x");
  check_dtype(positions, DType::I32, "rope positions");
  check_dtype(cos_sin, DType::F32, "rope cos_sin");
  DI_CHECK(x.ndim == 2 || x.ndim == 3, "rope: x must be [T, dim] or [T, heads, dim], got ",
           x.describe());
  DI_CHECK(x.stride[x.ndim - 1] == 1, "rope: last dimension must be contiguous, got ", x.describe());
  const int64_t T = x.shape[0];
  const int64_t H = x.ndim == 3 ? x.shape[1] : 1;
  const int64_t dim = x.shape[x.ndim - 1];
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_offset >= 0 && rope_offset + rope_dim <= dim,
           "rope: rope_offset ", rope_offset, " + rope_dim ", rope_dim, " outside ", x.describe());
  DI_CHECK(positions.numel() == T && cos_sin.ndim == 2 && cos_sin.shape[1] == rope_dim &&
               cos_sin.is_contiguous(),
           "rope: positions ", positions.describe(), " / cos_sin ", cos_sin.describe(),
           " do not match x ", x.describe());
  const int64_t n = T * H * (rope_dim / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, 256, num_sms_), 256, 0, stream_>>>(
      x.data, float_kind(x.dtype), T, H, x.stride[0], x.ndim == 3 ? x.stride[1] : 0,
      positions.ptr<int32_t>(), cos_sin.ptr<float>(), rope_offset, rope_dim, interleave);
  check_launch("rope", x.describe());
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  const RowView g = rows_of(gate_up, "silu_mul gate_up");
  const RowView o = rows_of(out, "silu_mul out");
  check_float(gate_up, "silu_mul gate_up");
  check_float(out, "silu_mul out");
  DI_CHECK(g.rows == o.rows && g.cols == 2 * o.cols, "silu_mul: gate_up ", gate_up.describe(),
           " must be [T, 2 * I] for out ", out.describe());
  const int64_t n = o.rows * o.cols;
  if (n == 0) return;
  launch_pdl(pdl_, grid_for(n, 256, num_sms_), 256, 0, stream_, silu_mul_kernel,
      g.data, float_kind(g.dtype), g.row_stride, o.rows, o.cols, o.data, float_kind(o.dtype),
      o.row_stride);
  check_launch("silu_mul", gate_up.describe());
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  const RowView xv = rows_of(x, "add x");
  const RowView yv = rows_of(y, "add y");
  check_float(x, "add x");
  check_float(y, "add y");
  DI_CHECK(xv.rows == yv.rows && xv.cols == yv.cols, "add: ", x.describe(), " and ", y.describe(),
           " differ in shape");
  const int64_t n = xv.rows * xv.cols;
  if (n == 0) return;
  launch_pdl(pdl_, grid_for(n, 256, num_sms_), 256, 0, stream_, add_kernel,
      xv.data, float_kind(xv.dtype), xv.row_stride, yv.data, float_kind(yv.dtype), yv.row_stride,
      xv.rows, xv.cols);
  check_launch("add", x.describe());
}

void CudaBackend::kv_store(const Tensor& rows, PagedKV& kv) {
  const RowView r = rows_of(rows, "kv_store rows");
  check_float(rows, "kv_store rows");
  check_float(kv.cache, "kv_store cache");
  check_dtype(kv.slot_mapping, DType::I32, "kv_store slot_mapping");
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() && kv.cache.shape[2] == r.cols,
           "kv_store: cache ", kv.cache.describe(), " must be contiguous [blocks, block_size, ", r.cols,
           "]");
  DI_CHECK(kv.slot_mapping.numel() == r.rows, "kv_store: slot_mapping ", kv.slot_mapping.describe(),
           " must have one slot per row of ", rows.describe());
  const int64_t n = r.rows * r.cols;
  if (n == 0) return;
  kv_store_kernel<<<grid_for(n, 256, num_sms_), 256, 0, stream_>>>(
      r.data, float_kind(r.dtype), r.row_stride, r.rows, r.cols, kv.slot_mapping.ptr<int32_t>(),
      kv.cache.shape[0] * kv.cache.shape[1], kv.cache.data, float_kind(kv.cache.dtype));
  check_launch("kv_store", rows.describe() + " -> " + kv.cache.describe());
}

void CudaBackend::kv_gather(const PagedKV& kv, Tensor& rows) {
  const RowView r = rows_of(rows, "kv_gather rows");
  check_float(rows, "kv_gather rows");
  check_float(kv.cache, "kv_gather cache");
  check_dtype(kv.block_tables, DType::I32, "kv_gather block_tables");
  check_dtype(kv.seq_lens, DType::I32, "kv_gather seq_lens");
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() && kv.cache.shape[2] == r.cols,
           "kv_gather: cache ", kv.cache.describe(), " must be contiguous [blocks, block_size, ", r.cols, "]");
  DI_CHECK(kv.num_seqs >= 1 && kv.seq_lens.numel() == kv.num_seqs && kv.block_tables.ndim == 2 &&
               kv.block_tables.shape[0] >= kv.num_seqs && kv.block_tables.is_contiguous() && kv.max_seq_len > 0,
           "kv_gather: seq_lens ", kv.seq_lens.describe(), " / block_tables ", kv.block_tables.describe(),
           " / max_seq_len ", kv.max_seq_len, " for ", kv.num_seqs, " sequences");
  if (r.rows == 0) return;
  const dim3 grid(kv.num_seqs, (kv.max_seq_len + kGatherRows - 1) / kGatherRows);
  kv_gather_kernel<<<grid, 256, 0, stream_>>>(
      kv.cache.data, float_kind(kv.cache.dtype), kv.cache.shape[0], static_cast<int>(kv.cache.shape[1]),
      kv.block_tables.ptr<int32_t>(), static_cast<int>(kv.block_tables.shape[1]), kv.seq_lens.ptr<int32_t>(),
      r.data, float_kind(r.dtype), r.row_stride, r.rows, r.cols);
  check_launch("kv_gather", kv.cache.describe() + " -> " + rows.describe());
}

void CudaBackend::argmax(const Tensor& logits, Tensor& ids) {
  const RowView l = rows_of(logits, "argmax logits");
  check_float(logits, "argmax logits");
  check_dtype(ids, DType::I32, "argmax ids");
  DI_CHECK(ids.numel() == l.rows, "argmax: ids ", ids.describe(), " must have one entry per row of ",
           logits.describe());
  if (l.rows == 0) return;
  const int64_t slices = (l.cols + kArgmaxSlice - 1) / kArgmaxSlice;
  DI_CHECK(l.cols <= INT32_MAX && l.rows * slices <= INT32_MAX && l.rows <= INT32_MAX, "argmax: ",
           logits.describe(), " is too large (ids are I32; at most 2^31 - 1 blocks of ", kArgmaxSlice,
           " logits per launch)");
  // The sampling ops' slot: its contents live only between the two kernels (sample()'s only
  // within that op).
  auto* partial = static_cast<ArgmaxPartial*>(
      scratch(kSlotSample, static_cast<size_t>(l.rows * slices) * sizeof(ArgmaxPartial), "argmax"));
  if (slices > 0) {  // no logits (V = 0): every id 0, from the rows' kernel alone
    launch_pdl(pdl_, static_cast<unsigned>(l.rows * slices), kArgmaxThreads, 0, stream_, argmax_slice_kernel,
        l.data, float_kind(l.dtype), l.row_stride, l.cols, slices, partial);
    check_launch("argmax (slices)", logits.describe());
  }
  launch_pdl(pdl_, static_cast<unsigned>(l.rows), kArgmaxThreads, 0, stream_, argmax_finish_kernel,
      static_cast<const ArgmaxPartial*>(partial), slices, l.cols, ids.ptr<int32_t>());
  check_launch("argmax (rows)", logits.describe());
}

void CudaBackend::fill_random(Tensor& t, uint64_t seed, float scale) {
  check_device(t, "fill_random");
  DI_CHECK(t.is_contiguous(), "fill_random: tensor must be contiguous, got ", t.describe());
  int kind = 0;
  if (t.dtype == DType::BF16)
    kind = 1;
  else if (t.dtype == DType::F8_E4M3)
    kind = 2;
  else
    DI_CHECK(t.dtype == DType::F32, "fill_random: dtype must be F32, BF16 or F8_E4M3, got ",
             t.describe());
  const int64_t n = t.numel();
  if (n == 0) return;
  fill_random_kernel<<<grid_for(n, 256, num_sms_), 256, 0, stream_>>>(t.data, kind, n, seed, scale);
  check_launch("fill_random", t.describe());
}

}  // namespace deepinfer::cuda
