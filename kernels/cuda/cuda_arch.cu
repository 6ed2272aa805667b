// The probe kernel of the architecture check (kernels/cuda/cuda_arch.hpp): compiled with the same
// CMAKE_CUDA_ARCHITECTURES as every other kernel, so whether the driver finds an image of it
// for a device is whether it finds one of ours.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_arch.hpp"

namespace rp::cuda {
namespace {

__global__ void arch_probe_kernel(int* p) {
  if (p) *p = 0;
}

}  // namespace

cudaError_t probe_kernel_attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, arch_probe_kernel);
}

}  // namespace rp::cuda
