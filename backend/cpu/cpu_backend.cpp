// CpuBackend construction, memory ops and the small helpers every op file uses.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace deepinfer {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

namespace cpu {

CpuBackend::CpuBackend(const BackendOptions& options) : options_(options) {
  if (options.num_threads > 0) {
    owned_pool_ = std::make_unique<ThreadPool>(options.num_threads);
    pool_ = owned_pool_.get();
  } else {
    pool_ = &default_thread_pool();
  }
}

DeviceBuffer CpuBackend::alloc(DType dtype, const std::vector<int64_t>& dims) {
  auto buffer = std::make_shared<HostBuffer>(dtype, dims);
  Tensor view = buffer->tensor();
  return DeviceBuffer(view, std::move(buffer));
}

namespace {
// Copies a strided tensor (both on the CPU, same dtype and shape) one run of the last
// dimension at a time when both have unit last stride, else element by element.
void copy_strided(const Tensor& src, Tensor& dst) {
  const int64_t elem = static_cast<int64_t>(dtype_size(src.dtype));
  const int last = src.ndim - 1;
  const bool runs = src.ndim > 0 && src.stride[last] == 1 && dst.stride[last] == 1;
  const int64_t run = runs ? src.shape[last] : 1;  // elements per memcpy
  const int outer_dims = runs ? last : src.ndim;   // dims iterated one index at a time
  const int64_t n = src.numel() / std::max<int64_t>(run, 1);
  std::array<int64_t, kMaxDims> index{};
  for (int64_t i = 0; i < n; ++i) {
    int64_t so = 0, d_o = 0;
    for (int d = 0; d < outer_dims; ++d) {
      so += index[d] * src.stride[d];
      d_o += index[d] * dst.stride[d];
    }
    std::memcpy(static_cast<char*>(dst.data) + d_o * elem,
                static_cast<const char*>(src.data) + so * elem, static_cast<size_t>(run * elem));
    for (int d = outer_dims - 1; d >= 0; --d) {
      if (++index[d] < src.shape[d]) break;
      index[d] = 0;
    }
  }
}
}  // namespace

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  check_cpu(src, "copy src");
  check_cpu(dst, "copy dst");
  DI_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(), "copy: ", src.describe(),
           " -> ", dst.describe(), " needs equal dtype and element count");
  if (src.is_contiguous() && dst.is_contiguous()) {
    if (src.numel() > 0) std::memmove(dst.data, src.data, src.num_bytes());
    return;
  }
  DI_CHECK(src.dims() == dst.dims(), "copy: strided ", src.describe(), " -> ", dst.describe(),
           " needs equal shapes");
  copy_strided(src, dst);
}

// --- helpers -------------------------------------------------------------------

void check_cpu(const Tensor& t, const char* what) {
  DI_CHECK(t.defined() || t.numel() == 0, what, ": tensor is undefined");
  DI_CHECK(t.device == Device::CPU, what, ": expected a CPU tensor, got ", t.describe());
}

void check_cpu(const Tensor& t, DType dtype, const char* what) {
  check_cpu(t, what);
  DI_CHECK(t.dtype == dtype, what, ": expected dtype ", dtype_name(dtype), ", got ",
           t.describe());
}

Rows as_rows(const Tensor& t, const char* what) {
  check_cpu(t, what);
  DI_CHECK(t.ndim >= 1, what, ": expected at least 1 dimension, got ", t.describe());
  Rows r;
  r.base = static_cast<char*>(t.data);
  r.dtype = t.dtype;
  r.cols = t.shape[t.ndim - 1];
  if (t.ndim == 1) {
    r.rows = 1;
    r.row_stride = r.cols;
    DI_CHECK(t.stride[0] == 1 || r.cols <= 1, what, ": column stride must be 1 in ", t.describe());
    return r;
  }
  // Trailing dims after the first must be contiguous; the first may have any stride.
  int64_t expect = 1;
  for (int d = t.ndim - 1; d >= 1; --d) {
    DI_CHECK(t.shape[d] == 1 || t.stride[d] == expect, what,
             ": expected contiguous trailing dimensions, got ", t.describe());
    expect *= t.shape[d];
  }
  const int64_t inner = expect;  // elements per first-dim index
  if (t.ndim == 2) {
    r.rows = t.shape[0];
    r.row_stride = t.stride[0];
  } else {
    // Rows of the last dimension: only possible when the first-dim stride equals inner.
    DI_CHECK(t.shape[0] <= 1 || t.stride[0] == inner, what,
             ": a strided tensor of rank > 2 cannot be viewed as rows: ", t.describe());
    r.rows = t.shape[0] * (inner / std::max<int64_t>(r.cols, 1));
    r.row_stride = r.cols;
  }
  return r;
}

void fp8_row_to_float(const uint8_t* src, int64_t n, float scale, float* dst) {
  // e4m3fn bits [s eeee mmm], value 2^(e-7) (1 + m/8) for e > 0, m * 2^-9 for e = 0,
  // NaN for 0x7f / 0xff. Normal codes: rebias the exponent with one integer add
  // (eeee mmm at float bits 20..26, plus (127 - 7) << 23); subnormal codes convert m
  // exactly through an int-to-float. No float subnormals, no table: vectorizable.
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = src[i];
    const uint32_t normal_bits = ((b & 0x7fu) << 20) + (120u << 23);
    const float subnormal = static_cast<float>(b & 7u) * 0x1p-9f;
    uint32_t subnormal_bits;
    std::memcpy(&subnormal_bits, &subnormal, 4);
    // Mask arithmetic instead of branches, so the loop vectorizes.
    const uint32_t normal_mask = 0u - (((b & 0x78u) + 0x78u) >> 7);  // all ones when e > 0
    const uint32_t nan_bits = (((b & 0x7fu) + 1u) >> 7) * 0x7fc00000u;  // 0x7f: force NaN
    uint32_t bits = (normal_bits & normal_mask) | (subnormal_bits & ~normal_mask);
    bits |= nan_bits | ((b & 0x80u) << 24);
    float v;
    std::memcpy(&v, &bits, 4);
    dst[i] = v * scale;
  }
}

void row_to_float(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u = static_cast<uint32_t>(s[i]) << 16;
        std::memcpy(dst + i, &u, 4);
      }
      return;
    }
    case DType::F8_E4M3:
      fp8_row_to_float(static_cast<const uint8_t*>(src), n, 1.0f, dst);
      return;
    default:
      fail("row_to_float: unsupported dtype ", dtype_name(dtype));
  }
}

float* scratch_floats(int slot, size_t n) {
  thread_local std::array<std::vector<float>, 8> buffers;
  DI_CHECK(slot >= 0 && slot < 8, "scratch slot ", slot, " out of range");
  auto& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace cpu
}  // namespace deepinfer
