#include "backend/backend.h"

namespace deepinfer {

DeviceBuffer Backend::alloc_host(DType dtype, const std::vector<int64_t>& dims) {
  auto buffer = std::make_shared<HostBuffer>(dtype, dims);
  return DeviceBuffer(buffer->tensor(), buffer);
}

#ifndef DEEPINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) { return nullptr; }
#endif

}  // namespace deepinfer
