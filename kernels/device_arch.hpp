// Which GPUs a build's CUDA kernels run on, and which features a GPU has (docs/gpu.md,
// "Architectures"). Pure functions of compute capabilities and CMake's architecture list, so
// the CPU tests check them; the CUDA backend asks the driver (kernels/cuda/cuda_arch.cu).
#pragma once
#include <string>

namespace rp {

/// The oldest compute capability the kernels support (x10): cp.async, bf16 mma.sync, ldmatrix.
constexpr int kMinComputeCapability = 80;

/// Whether a build whose CMAKE_CUDA_ARCHITECTURES was `compiled` (entries separated by ',' or
/// ';': "90", "80-real", "120-virtual", "90a-real", "native") holds code that runs on compute
/// capability major.minor: a cubin sm_XY runs on X.y for y >= Y (an "a" cubin only on X.Y,
/// an "f" cubin on X.y, y >= Y), PTX compute_XY on every capability >= X.Y (JIT-compiled by
/// the driver). "native" or an unreadable list count as covering (the driver decides).
bool arch_list_runs_on(const std::string& compiled, int major, int minor);
/// Whether `compiled` holds a cubin that runs on major.minor (no JIT at start).
bool arch_list_has_cubin_for(const std::string& compiled, int major, int minor);

/// The one line a device that the build does not cover fails with: the GPU, its capability,
/// what the build holds and the command that rebuilds for it.
std::string arch_mismatch_line(const std::string& device, int major, int minor, const std::string& compiled);
/// The one line a GPU older than kMinComputeCapability is refused with.
std::string arch_too_old_line(const std::string& device, int major, int minor);

/// FP8 tensor-core GEMMs (e4m3/e5m2) exist from sm_89 (Ada, Hopper and later).
bool device_supports_fp8(int major, int minor);

/// The one line refusing FP8 linears (DeviceOptions::fp8) on `device` of compute capability
/// major.minor ("" when it has FP8 tensor cores).
std::string fp8_refusal_line(const std::string& device, int major, int minor);

}  // namespace rp
