#include "core/tensor.h"

#include <cstdlib>
#include <sstream>

namespace deepinfer {

Tensor::Tensor(void* data_, DType dtype_, const std::vector<int64_t>& dims, Device device_)
    : data(data_), dtype(dtype_), device(device_) {
  DI_CHECK(dims.size() <= kMaxDims, "tensor rank ", dims.size(), " exceeds ", kMaxDims);
  ndim = static_cast<int>(dims.size());
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    shape[i] = dims[i];
    stride[i] = s;
    s *= dims[i];
  }
}

Tensor::Tensor(void* data_, DType dtype_, std::initializer_list<int64_t> dims, Device device_)
    : Tensor(data_, dtype_, std::vector<int64_t>(dims), device_) {}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

Tensor Tensor::row(int64_t i) const {
  DI_CHECK(ndim >= 1 && i >= 0 && i < shape[0], "row ", i, " out of range for ", describe());
  Tensor t;
  t.data = static_cast<char*>(data) + i * stride[0] * static_cast<int64_t>(dtype_size(dtype));
  t.dtype = dtype;
  t.device = device;
  t.ndim = ndim - 1;
  for (int d = 1; d < ndim; ++d) {
    t.shape[d - 1] = shape[d];
    t.stride[d - 1] = stride[d];
  }
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  DI_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0], "rows [", begin, ", ", end,
           ") out of range for ", describe());
  Tensor t = *this;
  t.data = static_cast<char*>(data) + begin * stride[0] * static_cast<int64_t>(dtype_size(dtype));
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::view(std::initializer_list<int64_t> dims) const {
  DI_CHECK(is_contiguous(), "view of a non-contiguous tensor ", describe());
  Tensor t(data, dtype, dims, device);
  DI_CHECK(t.numel() == numel(), "view ", shape_string(std::vector<int64_t>(dims)), " does not match ",
           describe());
  return t;
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << "]";
  return os.str();
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype)) + shape_string(dims()) +
         (device == Device::CPU ? " cpu" : " cuda");
}

void HostBuffer::Free::operator()(void* p) const { std::free(p); }

HostBuffer::HostBuffer(DType dtype, std::vector<int64_t> dims) {
  Tensor t(nullptr, dtype, dims);
  size_t bytes = (t.num_bytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  DI_CHECK(p != nullptr, "out of host memory allocating ", t.describe(), " (", bytes, " bytes)");
  memory_.reset(p);
  t.data = p;
  tensor_ = t;
}

}  // namespace deepinfer
