// launch_pdl: a kernel launch that may be a programmatic dependent of the stream's previous
// kernel (CudaBackend::pdl_, CudaOptions::pdl; pdl17). Such a kernel must call pdl_wait()
// (device_utils.cuh) before it reads anything an earlier kernel wrote, and on every path
// before it exits: a dependent may finish only after the kernels before it, or a later
// kernel's wait would not cover them. It should call pdl_trigger() early so that its own
// dependents launch while it runs. After a kernel that never triggers (cuBLASLt, CUTLASS) or
// a copy, the attribute changes nothing: the launch waits as a plain one does.
// The rule every kernel here keeps: pdl_trigger() only after its own pdl_wait(). So when a
// kernel starts, the kernel two launches back has completed and its writes are visible, and a
// kernel may read before its wait what that kernel and earlier ones wrote (attn18: the paged
// attention's rows of earlier steps; the grouped GEMMs' tile lists). A kernel that triggered
// before waiting would break every such read in the kernels after it.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace deepinfer::cuda {

// The configuration of such a launch; `attr` (its one attribute) must outlive the launch.
inline cudaLaunchConfig_t pdl_config(bool pdl, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                     cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  return config;
}

template <typename... Params, typename... Args>
void launch_pdl(bool pdl, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*kernel)(Params...),
                Args&&... args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = pdl_config(pdl, grid, block, smem, stream, &attr);
  // A failed launch is the runtime's last error too: the caller's check_launch reports it.
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace deepinfer::cuda
