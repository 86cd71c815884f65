// Tensor: a plain view (pointer, dtype, shape, strides, device). It never owns
// memory; owners are mmapped files, backend allocations or HostBuffer.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace deepinfer {

enum class Device : uint8_t { CPU, CUDA };

constexpr int kMaxDims = 5;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements

  Tensor() = default;
  // Contiguous view of `data` with the given shape.
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> dims, Device device = Device::CPU);
  Tensor(void* data, DType dtype, const std::vector<int64_t>& dims, Device device = Device::CPU);

  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  int64_t numel() const;
  size_t num_bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  bool defined() const { return data != nullptr; }
  std::vector<int64_t> dims() const { return {shape.begin(), shape.begin() + ndim}; }

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Row `i` of the first dimension, as a view with one dimension fewer.
  Tensor row(int64_t i) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same data, new contiguous shape (numel must match; tensor must be contiguous).
  Tensor view(std::initializer_list<int64_t> dims) const;

  std::string describe() const;  // "BF16[4, 128] cpu"
};

// Owning host memory with a Tensor view; aligned for vector loads.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(DType dtype, std::vector<int64_t> dims);
  Tensor& tensor() { return tensor_; }
  const Tensor& tensor() const { return tensor_; }
  template <typename T>
  T* ptr() const {
    return tensor_.ptr<T>();
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> memory_;
  Tensor tensor_;
};

std::string shape_string(const std::vector<int64_t>& dims);

}  // namespace deepinfer
