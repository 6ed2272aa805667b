// The GPU an FP8 benchmark measures on: device 0 when it has FP8 tensor cores (compute
// capability 8.9+: Ada, Hopper and later); otherwise one line saying there is nothing to measure
// (no device, or one without them), which is not an error.
#pragma once
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

namespace bench {

/// Device 0's properties, or nullopt after printing why nothing will be measured. Throws
/// std::runtime_error when the properties of a visible device cannot be read.
inline std::optional<cudaDeviceProp> fp8_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device visible: nothing to measure\n");
    return std::nullopt;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in cudaGetDeviceProperties: ") + cudaGetErrorString(e));
  if (prop.major * 10 + prop.minor < 89) {
    std::printf("%s: no FP8 tensor cores (compute capability %d.%d): nothing to measure\n", prop.name,
                prop.major, prop.minor);
    return std::nullopt;
  }
  return prop;
}

}  // namespace bench
