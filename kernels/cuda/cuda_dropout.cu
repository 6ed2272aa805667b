// Ops::dropout on the GPU: one thread per element, the mask from the shared counter-based
// hash (kernels/dropout_hash.hpp), so it equals the CPU twin's bit for bit.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/dropout_hash.hpp"

namespace rp::cuda {
namespace {

template <typename T>
__global__ void dropout_kernel(const T* x, T* y, int64_t rows, int64_t cols, float p, float inv,
                               uint64_t seed, int64_t row0) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const bool keep = dropout_uniform(seed, uint64_t(row0 + r), uint64_t(c)) >= p;
    y[i] = from_f<T>(keep ? to_f(x[i]) * inv : 0.0f);
  }
}

}  // namespace

void k_dropout(DType t, const void* x, void* y, int64_t rows, int64_t cols, float p, uint64_t seed,
               int64_t row0, cudaStream_t st) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(num_sms()) * 16);
  const float inv = 1.0f / (1.0f - p);
  RP_DISPATCH_ANY("dropout", t, T,
                  dropout_kernel<T><<<unsigned(blocks), kThreads, 0, st>>>(
                      static_cast<const T*>(x), static_cast<T*>(y), rows, cols, p, inv, seed, row0));
  RP_CUDA_LAUNCH_CHECK("dropout");
}

}  // namespace rp::cuda
