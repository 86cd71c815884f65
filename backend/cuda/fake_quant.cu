// DeepSeek-V4.1's cache formats on CUDA (the reference: backend/cpu/fake_quant.cpp; backend.h gives
// the math): fake_quant in place, store_packed_rows into a paged U8 cache, gather_packed_rows back.
// One block per row; thread i of a pass holds channel c0 + i, so a quantization block (32 or 16
// channels) is 32 or 16 adjacent lanes of one warp: its amax is a shuffle max (exact in any order),
// the scale follows the CPU's float steps (pow2_ceil on the bits, IEEE division by 6 / 448, RNE e4m3
// and e2m1), so codes, scale bytes and values are the CPU's bit for bit for finite inputs. A
// packed FP4 byte is written by its even channel's lane with its odd neighbour's nibble (a shuffle).
// Rows F32 or BF16 (every value of these formats is exact in BF16). Slots outside the cache and
// -1 are skipped; an id outside the cache gathers NaN (the host reference throws).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 128;  // a multiple of 32: passes keep blocks inside warps

// kind: 0 Fp8Ue8m0x32, 1 Fp4Ue8m0x32, 2 Fp4E4m3x16 (Backend::FakeQuant's order).
__device__ __forceinline__ int block_of(int kind) { return kind == 2 ? 16 : 32; }

__device__ __forceinline__ float pow2_ceil_exp(float t, int* k_out) {
  const uint32_t bits = __float_as_uint(t);
  const int k = static_cast<int>((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0u ? 1 : 0);
  *k_out = k;
  return ldexpf(1.0f, k);
}

__device__ __forceinline__ uint8_t e4m3_code(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// The e2m1 code (sign in bit 3) of a value clamped to [-6, 6], rounded to nearest even.
__device__ __forceinline__ uint8_t e2m1_code(float q) {
  const float m = fabsf(q);
  int code = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) + (m >= 3.5f) + (m > 5.0f);
  return static_cast<uint8_t>(code | (signbit(q) ? 8 : 0));
}

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const float m[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = m[code & 7u];
  return (code & 8u) ? -v : v;
}

__device__ __forceinline__ float decode(uint8_t code, int kind) {
  return kind == 0 ? fp8_to_f(code) : e2m1_value(code);
}

// The lane's value v (0 for lanes past the row: whole blocks of them) -> its code, the block's scale
// and scale byte. Every lane of the warp calls it.
__device__ __forceinline__ uint8_t quantize_lane(float v, int kind, float* scale_out, uint8_t* byte_out) {
  const int block = block_of(kind);
  float amax = fabsf(v);
  for (int o = block / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float scale, qmax;
  uint8_t byte;
  if (kind == 0) {
    int k;
    scale = pow2_ceil_exp(fmaxf(amax, 1e-4f) * (1.0f / 448.0f), &k);
    byte = static_cast<uint8_t>(k + 127);
    qmax = 448.0f;
  } else if (kind == 1) {
    int k;
    scale = pow2_ceil_exp(fmaxf(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f), &k);
    byte = static_cast<uint8_t>(k + 127);
    qmax = 6.0f;
  } else {
    byte = e4m3_code(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f);
    scale = fp8_to_f(byte);
    qmax = 6.0f;
  }
  *scale_out = scale;
  *byte_out = byte;
  const float q = fminf(fmaxf(v / scale, -qmax), qmax);
  return kind == 0 ? e4m3_code(q) : e2m1_code(q);
}

__global__ void __launch_bounds__(kThreads) fake_quant_kernel(void* x, int x_kind, int64_t ldx, int C, int kind) {
  const int64_t r = blockIdx.x;
  for (int c0 = 0; c0 < C; c0 += kThreads) {
    const int c = c0 + static_cast<int>(threadIdx.x);
    const float v = c < C ? ld(x, r * ldx + c, x_kind) : 0.0f;
    float scale;
    uint8_t byte;
    const uint8_t code = quantize_lane(v, kind, &scale, &byte);
    if (c < C) st(x, r * ldx + c, x_kind, decode(code, kind) * scale);
  }
}

__global__ void __launch_bounds__(kThreads) store_packed_kernel(const void* x, int x_kind, int64_t ldx, int C,
                                                                int kind, const int32_t* slots, int64_t num_slots,
                                                                uint8_t* cache, int64_t bytes) {
  const int64_t r = blockIdx.x;
  const int32_t slot = slots[r];
  if (slot < 0 || slot >= num_slots) return;  // the whole block leaves together
  uint8_t* row = cache + static_cast<int64_t>(slot) * bytes;
  const int block = block_of(kind);
  uint8_t* scales = row + (kind == 0 ? C : C / 2);
  for (int c0 = 0; c0 < C; c0 += kThreads) {
    const int c = c0 + static_cast<int>(threadIdx.x);
    const float v = c < C ? ld(x, r * ldx + c, x_kind) : 0.0f;
    float scale;
    uint8_t byte;
    const uint8_t code = quantize_lane(v, kind, &scale, &byte);
    const uint8_t odd = static_cast<uint8_t>(__shfl_down_sync(0xffffffffu, static_cast<uint32_t>(code), 1));
    if (c >= C) continue;
    if (kind == 0)
      row[c] = code;
    else if (c % 2 == 0)
      row[c / 2] = static_cast<uint8_t>(code | (odd << 4));  // low nibble first
    if (c % block == 0) scales[c / block] = byte;
  }
}

__global__ void __launch_bounds__(kThreads) gather_packed_kernel(const int32_t* ids, const uint8_t* cache,
                                                                 int64_t num_rows, int64_t bytes, int C, int kind,
                                                                 void* out, int o_kind, int64_t ldo) {
  const int64_t n = blockIdx.x;
  const int32_t id = ids[n];
  const int block = block_of(kind);
  const uint8_t* row = cache + static_cast<int64_t>(id) * bytes;
  const uint8_t* scales = row + (kind == 0 ? C : C / 2);
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float v = __int_as_float(0x7fc00000);
    if (id >= 0 && id < num_rows) {
      const uint8_t b = scales[c / block];
      const float scale = kind == 2 ? fp8_to_f(b) : (b == 0xffu ? __int_as_float(0x7fc00000) : ldexpf(1.0f, int(b) - 127));
      const uint8_t code = kind == 0 ? row[c] : static_cast<uint8_t>(c % 2 == 0 ? row[c / 2] & 0xfu : row[c / 2] >> 4);
      v = decode(code, kind) * scale;
    }
    st(out, n * ldo + c, o_kind, v);
  }
}

int kind_index(Backend::FakeQuant kind) {
  switch (kind) {
    case Backend::FakeQuant::Fp8Ue8m0x32: return 0;
    case Backend::FakeQuant::Fp4Ue8m0x32: return 1;
    default: return 2;
  }
}

RowView quant_rows(const Tensor& x, Backend::FakeQuant kind, const char* what) {
  const RowView v = rows_of(x, what);
  check_float(x, what);
  const int block = kind == Backend::FakeQuant::Fp4E4m3x16 ? 16 : 32;
  DI_CHECK(x.ndim == 2 && v.cols % block == 0, what, ": rows [R, C] with C a multiple of ", block,
           " expected, got ", x.describe());
  return v;
}

}  // namespace

void CudaBackend::fake_quant(Tensor& x, FakeQuant kind) {
  const RowView v = quant_rows(x, kind, "fake_quant x");
  if (v.rows == 0 || v.cols == 0) return;
  fake_quant_kernel<<<static_cast<unsigned>(v.rows), kThreads, 0, stream_>>>(
      v.data, float_kind(v.dtype), v.row_stride, static_cast<int>(v.cols), kind_index(kind));
  check_launch("fake_quant", x.describe());
}

void CudaBackend::store_packed_rows(const Tensor& x, FakeQuant kind, const PagedKV& kv) {
  const RowView v = quant_rows(x, kind, "store_packed_rows x");
  const int64_t bytes = packed_row_bytes(kind, v.cols);
  check_device(kv.cache, "store_packed_rows cache");
  DI_CHECK(kv.cache.dtype == DType::U8 && kv.cache.ndim == 3 && kv.cache.is_contiguous() && kv.cache.size(2) == bytes,
           "store_packed_rows: cache must be U8 [blocks, block_size, ", bytes, "], got ", kv.cache.describe());
  check_dtype(kv.slot_mapping, DType::I32, "store_packed_rows slot_mapping");
  DI_CHECK(kv.slot_mapping.numel() == v.rows && kv.slot_mapping.is_contiguous(), "store_packed_rows: slot_mapping must be I32 [",
           v.rows, "], got ", kv.slot_mapping.describe());
  if (v.rows == 0 || v.cols == 0) return;
  store_packed_kernel<<<static_cast<unsigned>(v.rows), kThreads, 0, stream_>>>(
      v.data, float_kind(v.dtype), v.row_stride, static_cast<int>(v.cols), kind_index(kind),
      kv.slot_mapping.ptr<int32_t>(), kv.cache.size(0) * kv.cache.size(1), kv.cache.ptr<uint8_t>(), bytes);
  check_launch("store_packed_rows", x.describe() + " -> " + kv.cache.describe());
}

void CudaBackend::gather_packed_rows(const Tensor& ids, const Tensor& cache, FakeQuant kind, Tensor& out) {
  const RowView o = quant_rows(out, kind, "gather_packed_rows out");
  const int64_t bytes = packed_row_bytes(kind, o.cols);
  check_device(cache, "gather_packed_rows cache");
  DI_CHECK(cache.dtype == DType::U8 && cache.ndim == 2 && cache.is_contiguous() && cache.size(1) == bytes,
           "gather_packed_rows: cache rows must be U8 [rows, ", bytes, "], got ", cache.describe());
  check_dtype(ids, DType::I32, "gather_packed_rows ids");
  DI_CHECK(ids.numel() == o.rows && ids.is_contiguous(), "gather_packed_rows: ids must be I32 [", o.rows, "], got ",
           ids.describe());
  if (o.rows == 0 || o.cols == 0) return;
  gather_packed_kernel<<<static_cast<unsigned>(o.rows), kThreads, 0, stream_>>>(
      ids.ptr<int32_t>(), cache.ptr<uint8_t>(), cache.size(0), bytes, static_cast<int>(o.cols), kind_index(kind),
      o.data, float_kind(o.dtype), o.row_stride);
  check_launch("gather_packed_rows", cache.describe() + " -> " + out.describe());
}

}  // namespace deepinfer::cuda
