#include "backend/backend.h"

namespace deepinfer {

#ifndef DEEPINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) { return nullptr; }
#endif

}  // namespace deepinfer
