// cuda_options: the DEEPINFER_CUDA_* settings (core/settings.h) -> CudaOptions. The other
// CudaOptions fields keep their measured defaults: their alternatives lost their A/Bs and only
// tests and benches set them in code (bench/NOTES.md, "Kernel switches against their A/Bs").
#include "backend/backend.h"
#include "core/settings.h"

namespace deepinfer {

CudaOptions cuda_options(const Settings& s) {
  CudaOptions o;
  o.sync_each_op = s.get_bool("DEEPINFER_CUDA_SYNC");
  return o;
}

}  // namespace deepinfer
