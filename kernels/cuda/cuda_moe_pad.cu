// CUDA kernels of the padded expert layout (Ops::moe_pad_rows, Ops::moe_zero_pad_rows; host
// side in cuda_moe_bucketed.cpp; CPU twin kernels/cpu/cpu_moe.cpp).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;

// shift = [delta E][padded offsets E+1] (delta[e] = padded[e] - offsets[e]); token already -1
__global__ void __launch_bounds__(kThreads)
    pad_rows_kernel(const int32_t* topk_idx, const int32_t* shift, int32_t* offsets, int32_t* row,
                    int32_t* token, int64_t R, int64_t E, int k) {
  const int64_t n = R > E + 1 ? R : E + 1;
  for (int64_t a = int64_t(blockIdx.x) * kThreads + threadIdx.x; a < n; a += int64_t(gridDim.x) * kThreads) {
    const int32_t e = a < R ? topk_idx[a] : -1;
    if (e >= 0 && e < E) {  // a bad index was reported by moe_sort; leave its row alone
      const int32_t r = row[a] + shift[e];
      row[a] = r;
      token[r] = int32_t(a / k);
    }
    if (a <= E) offsets[a] = shift[E + a];
  }
}

template <typename W>
__global__ void __launch_bounds__(kThreads)
    zero_pad_rows_kernel(W* x, const int32_t* token, int64_t R, int64_t words) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    if (token[r] >= 0) continue;
    W* dst = x + r * words;
    for (int64_t i = threadIdx.x; i < words; i += kThreads) dst[i] = W{};
  }
}

}  // namespace

void k_moe_pad_rows(const int32_t* topk_idx, const int32_t* shift, int32_t* offsets, int32_t* row,
                    int32_t* token, int64_t R, int64_t Rp, int64_t E, int64_t k, cudaStream_t st) {
  if (Rp > 0) RP_CUDA_CHECK(cudaMemsetAsync(token, 0xFF, size_t(Rp) * sizeof(int32_t), st));  // all -1
  const int64_t n = R > E + 1 ? R : E + 1;
  pad_rows_kernel<<<grid_for(n, kThreads), kThreads, 0, st>>>(topk_idx, shift, offsets, row, token, R, E,
                                                              int(k));
  RP_CUDA_LAUNCH_CHECK("pad_rows_kernel");
}

void k_moe_zero_pad_rows(DType t, void* x, const int32_t* token, int64_t R, int64_t H, cudaStream_t st) {
  if (R <= 0 || H <= 0) return;
  const int64_t bytes = H * int64_t(dtype_size(t));
  const unsigned grid = grid_for(R, 1);
  if (bytes % 16 == 0 && aligned16(x))
    zero_pad_rows_kernel<<<grid, kThreads, 0, st>>>(static_cast<uint4*>(x), token, R, bytes / 16);
  else if (bytes % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 3u) == 0)
    zero_pad_rows_kernel<<<grid, kThreads, 0, st>>>(static_cast<uint32_t*>(x), token, R, bytes / 4);
  else zero_pad_rows_kernel<<<grid, kThreads, 0, st>>>(static_cast<uint16_t*>(x), token, R, bytes / 2);
  RP_CUDA_LAUNCH_CHECK("zero_pad_rows_kernel");
}

}  // namespace rp::cuda
