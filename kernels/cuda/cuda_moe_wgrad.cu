// Weight gradients of a grouped linear in one launch (kernels/cuda/cuda_kernels.hpp,
// k_grouped_wgrad): for every expert with rows, dW_e += dy_e^T x_e with fp32 accumulators.
//
// cuBLAS's grouped GEMM refuses fp32 outputs for bf16 / f16 inputs, so without this kernel
// each expert is its own cuBLASLt call. For the low-rank shapes of per-expert LoRA adapters
// (one side of dW is the rank, 8..64) those 128 calls per op are host-bound: a few
// microseconds of issue each against a GPU time of about one microsecond. Here one thread
// block computes a 64 x 64 tile of one expert's dW on tensor cores (WMMA 16x16x16, bf16 or
// f16 in, fp32 accumulate), walking the expert's rows in order in chunks of 32, so two runs
// give the same bits.
#include <mma.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kTile = 64;          // dW tile: kTile rows (N) x kTile columns (K)
constexpr int kChunk = 32;         // rows of dy / x staged per step (the MMA's k dimension)
constexpr int kLd = kTile + 8;     // shared-memory row pitch of the staged operands (elements)
constexpr int kLdOut = kTile + 4;  // pitch of the fp32 tile written back
constexpr int kWgradThreads = 128;  // 4 warps, each a 32 x 32 quarter of the tile

// Stages rows [r, r + kChunk) of src (row pitch `cols` elements), columns [c0, c0 + kTile),
// into dst[row][col]; rows past `rows_end` and columns past `cols` are zero.
template <typename T, bool VEC>
__device__ __forceinline__ void stage(T* dst, const T* src, int64_t r, int64_t rows_end, int64_t cols,
                                      int64_t c0) {
  if constexpr (VEC) {  // 8 elements (16 bytes) per load; cols is a multiple of 8
    for (int i = threadIdx.x; i < kChunk * kTile / 8; i += kWgradThreads) {
      const int row = i / (kTile / 8), col = (i % (kTile / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r + row < rows_end && c0 + col < cols) v = *reinterpret_cast<const uint4*>(src + (r + row) * cols + c0 + col);
      *reinterpret_cast<uint4*>(dst + row * kLd + col) = v;
    }
  } else {
    for (int i = threadIdx.x; i < kChunk * kTile; i += kWgradThreads) {
      const int row = i / kTile, col = i % kTile;
      T v = from_f<T>(0.f);
      if (r + row < rows_end && c0 + col < cols) v = src[(r + row) * cols + c0 + col];
      dst[row * kLd + col] = v;
    }
  }
}

// Block (k tile, n tile, group g): dw[expert][n][k] += sum over the group's rows of
// dy[row][n] * x[row][k]. A = dy^T (n x row: dy staged row-major is A column-major),
// B = x (row x k, row-major).
template <typename T, bool VEC>
__global__ void __launch_bounds__(kWgradThreads)
    grouped_wgrad_kernel(const T* __restrict__ dy, const T* __restrict__ x, float* __restrict__ dw,
                         MoeGroupTable tab, int64_t R, int64_t K, int64_t N) {
  using namespace nvcuda;
  __shared__ __align__(16) T s_dy[kChunk * kLd];
  __shared__ __align__(16) T s_x[kChunk * kLd];
  __shared__ __align__(16) float s_out[kTile * kLdOut];
  const int g = int(blockIdx.z);
  const int64_t k0 = int64_t(blockIdx.x) * kTile, n0 = int64_t(blockIdx.y) * kTile;
  const int64_t row0 = tab.row0[g], row_end = g + 1 < tab.n ? tab.row0[g + 1] : R;
  const int warp = int(threadIdx.x) / 32;
  const int wn = (warp / 2) * 32, wk = (warp % 2) * 32;  // the warp's quarter of the tile
  const bool active = n0 + wn < N && k0 + wk < K;        // warp-uniform: a quarter past dW's edge idles
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.f);
  for (int64_t r = row0; r < row_end; r += kChunk) {
    stage<T, VEC>(s_dy, dy, r, row_end, N, n0);
    stage<T, VEC>(s_x, x, r, row_end, K, k0);
    __syncthreads();
    if (active) {
      for (int kk = 0; kk < kChunk; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> a[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b[2];
        for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], s_dy + kk * kLd + wn + 16 * i, kLd);
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], s_x + kk * kLd + wk + 16 * j, kLd);
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  if (active)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(s_out + (wn + 16 * i) * kLdOut + wk + 16 * j, acc[i][j], kLdOut, wmma::mem_row_major);
  __syncthreads();
  float* out = dw + int64_t(tab.expert[g]) * N * K;
  for (int i = threadIdx.x; i < kTile * kTile; i += kWgradThreads) {
    const int64_t n = n0 + i / kTile, k = k0 + i % kTile;
    if (n < N && k < K) out[n * K + k] += s_out[(i / kTile) * kLdOut + i % kTile];
  }
}

template <typename T>
void launch_wgrad(const void* dy, const void* x, float* dw, const MoeGroupTable& tab, int64_t R, int64_t K,
                  int64_t N, cudaStream_t st) {
  const dim3 grid(unsigned((K + kTile - 1) / kTile), unsigned((N + kTile - 1) / kTile), unsigned(tab.n));
  const bool vec = K % 8 == 0 && N % 8 == 0 && aligned16(dy) && aligned16(x);
  if (vec)
    grouped_wgrad_kernel<T, true><<<grid, kWgradThreads, 0, st>>>(static_cast<const T*>(dy),
                                                                  static_cast<const T*>(x), dw, tab, R, K, N);
  else
    grouped_wgrad_kernel<T, false><<<grid, kWgradThreads, 0, st>>>(static_cast<const T*>(dy),
                                                                   static_cast<const T*>(x), dw, tab, R, K, N);
  check(cudaGetLastError(), "grouped_wgrad_kernel", __FILE__, __LINE__);
}

}  // namespace

void k_grouped_wgrad(DType t, const void* dy, const void* x, float* dw, const MoeGroupTable& tab, int64_t R,
                     int64_t K, int64_t N, cudaStream_t st) {
  if (tab.n <= 0 || K <= 0 || N <= 0) return;
  if (K > int64_t(kTile) * 65535 || N > int64_t(kTile) * 65535)
    throw std::invalid_argument("k_grouped_wgrad: K or N above the grid's reach");
  switch (t) {
    case DType::bf16: return launch_wgrad<bf16>(dy, x, dw, tab, R, K, N, st);
    case DType::f16: return launch_wgrad<f16>(dy, x, dw, tab, R, K, N, st);
    default: bad_dtype("k_grouped_wgrad", t);
  }
}

}  // namespace rp::cuda
