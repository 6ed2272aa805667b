// The CUDA backend's architecture check (docs/gpu.md, "Architectures"): run before a device is
// opened, so a GPU the build does not cover fails with one line instead of a launch error
// deep in a stage. Internal to kernels/cuda.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace rp::cuda {

/// CMAKE_CUDA_ARCHITECTURES of this build, ','-separated ("80-real,90-real,100-real,120").
const char* compiled_archs();

/// Throws DeviceError with one line when device `index` is older than sm_80 or has no kernel
/// image in this build (naming the GPU, its capability, the compiled list and the rebuild
/// command). When the driver JIT-compiles the build's PTX for it, says so once on stderr.
void check_device_arch(int index);

/// cudaFuncGetAttributes of a kernel of this build on the current device: cudaSuccess when the
/// driver has (or JIT-compiled) an image of the build's kernels for it.
cudaError_t probe_kernel_attributes(cudaFuncAttributes* attr);

/// Bytes of dynamic shared memory one block of the current device may use (the opt-in
/// maximum: 227 KiB on Hopper, 163 KiB on A100, 99 KiB on RTX 30xx/40xx/50xx), capped by
/// RP_CUDA_MAX_SMEM_KIB when set (to exercise a GeForce card's limits on a larger GPU).
int max_dynamic_smem();

}  // namespace rp::cuda
