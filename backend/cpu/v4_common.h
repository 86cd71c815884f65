// Shared checks of the DeepSeek-V4 host reference ops (hyper_connection, v4_routing,
// sink_attention, compressor): host tensors, dtype, contiguous layout, exact shape.
#pragma once
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer::v4_ops {

inline void check_host(const Tensor& t, DType dtype, const std::vector<int64_t>& dims, const char* op,
                       const char* name) {
  DI_CHECK(t.defined(), op, ": ", name, " is undefined");
  DI_CHECK(t.device == Device::CPU, op, ": ", name, " must be host memory (the CPU "
           "reference; CUDA overrides the op), got ", t.describe());
  DI_CHECK(t.dtype == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", t.describe());
  DI_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got ", t.describe());
  DI_CHECK(t.dims() == dims, op, ": ", name, " must have shape ", shape_string(dims), ", got ",
           t.describe());
}

// As check_host, but rows [R, C] may be a row-strided view (unit column stride, row stride >= C).
inline void check_host_rows(const Tensor& t, DType dtype, const std::vector<int64_t>& dims, const char* op,
                            const char* name) {
  DI_CHECK(t.defined(), op, ": ", name, " is undefined");
  DI_CHECK(t.device == Device::CPU, op, ": ", name, " must be host memory, got ", t.describe());
  DI_CHECK(t.dtype == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", t.describe());
  DI_CHECK(t.ndim == 2 && t.dims() == dims && t.stride[1] == 1 && t.stride[0] >= dims[1], op, ": ", name,
           " must be rows of shape ", shape_string(dims), " (unit column stride), got ", t.describe());
}

}  // namespace deepinfer::v4_ops
