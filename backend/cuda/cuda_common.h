// Shared by every backend/cuda source: error checks that name the op and shapes,
// device-side conversions, and host-side helpers that view tensors as rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace deepinfer::cuda {

// Throws Error("CUDA error in <op> (<detail>): <name>: <string>").
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const std::string& where);

}  // namespace deepinfer::cuda

// DI_CUDA(call, "op", shapes...): throws Error naming the op and shapes when call fails.
#define DI_CUDA(call, ...)                                                              \
  do {                                                                                  \
    cudaError_t di_err_ = (call);                                                       \
    if (di_err_ != cudaSuccess)                                                         \
      ::deepinfer::cuda::throw_cuda_error(di_err_, #call, ::deepinfer::detail::concat(__VA_ARGS__)); \
  } while (0)

namespace deepinfer::cuda {

// A tensor viewed as rows of its last dimension: [rows, cols], unit column stride,
// uniform row stride (elements). Throws naming `what` when the layout does not fit.
struct RowView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0, row_stride = 0;
};
RowView rows_of(const Tensor& t, const char* what);

void check_device(const Tensor& t, const char* what);
void check_dtype(const Tensor& t, DType dtype, const char* what);
// F32 or BF16 (the activation dtypes the CUDA kernels read and write).
void check_float(const Tensor& t, const char* what);

// A CUDA tensor of exactly `dims`, contiguous, of one of `dtypes` (V4 ops; errors name `what`).
void check_exact(const Tensor& t, std::initializer_list<DType> dtypes, const std::vector<int64_t>& dims,
                 const char* what);

// 0 = F32, 1 = BF16 (kernel template selector).
inline int float_kind(DType d) { return d == DType::BF16 ? 1 : 0; }

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace deepinfer::cuda
