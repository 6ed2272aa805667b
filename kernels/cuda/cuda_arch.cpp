// Architecture check of the CUDA backend (kernels/cuda/cuda_arch.hpp); its probe kernel is in
// cuda_arch.cu.
#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "kernels/cuda/cuda_arch.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/device_arch.hpp"
#include "roundpipe/errors.hpp"

#ifndef RP_CUDA_ARCHS_COMPILED
#define RP_CUDA_ARCHS_COMPILED ""
#endif

namespace rp::cuda {

const char* compiled_archs() { return RP_CUDA_ARCHS_COMPILED; }

void check_device_arch(int index) {
  cudaDeviceProp prop{};
  RP_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  const std::string dev = fmt::format("cuda:{} ({})", index, prop.name);
  if (prop.major * 10 + prop.minor < kMinComputeCapability)
    throw DeviceError(arch_too_old_line(dev, prop.major, prop.minor));
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != index) RP_CUDA_CHECK(cudaSetDevice(index));
  cudaFuncAttributes attr{};
  const cudaError_t e = probe_kernel_attributes(&attr);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    const std::string line = arch_mismatch_line(dev, prop.major, prop.minor, compiled_archs());
    throw DeviceError(e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction
                          ? line
                          : fmt::format("{} ({})", line, cudaGetErrorName(e)));
  }
  if (arch_list_has_cubin_for(compiled_archs(), prop.major, prop.minor)) return;
  static std::mutex mu;
  static std::set<int> said;  // capability (x10) already announced
  std::lock_guard lk(mu);
  if (!said.insert(prop.major * 10 + prop.minor).second) return;
  fmt::print(stderr,
             "roundpipe: {} (sm_{}{}) runs this build's PTX (compute_{}), compiled by the driver at start; "
             "build with -DCMAKE_CUDA_ARCHITECTURES={}{} to skip that\n",
             dev, prop.major, prop.minor, attr.ptxVersion, prop.major, prop.minor);
}

int max_dynamic_smem() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 48 << 10;
  int have = cached[dev].load(std::memory_order_relaxed);
  if (have == 0) {
    int v = 48 << 10;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      v = 48 << 10;
    }
    if (const char* cap = std::getenv("RP_CUDA_MAX_SMEM_KIB")) {
      const long kib = std::strtol(cap, nullptr, 10);
      if (kib > 0 && kib * 1024 < v) v = int(kib * 1024);
    }
    cached[dev].store(v, std::memory_order_relaxed);  // every thread computes the same value
    have = v;
  }
  return have;
}

}  // namespace rp::cuda
