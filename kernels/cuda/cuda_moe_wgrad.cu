// Weight gradients of a grouped linear in one launch (kernels/cuda/cuda_kernels.hpp,
// k_grouped_wgrad): for every expert with rows, dW_e += dy_e^T x_e with fp32 accumulators.
//
// cuBLAS's grouped GEMM refuses fp32 outputs for bf16 / f16 inputs, so without this kernel
// each expert is its own cuBLASLt call. For the low-rank shapes of per-expert LoRA adapters
// (one side of dW is the rank, 8..64) those 128 calls per op are host-bound: a few
// microseconds of issue each against a GPU time of about one microsecond. Here one thread
// block of 4 warps computes a tile of one expert's dW on tensor cores (WMMA 16x16x16, bf16
// or f16 in, fp32 accumulate; each warp a 32 x 32 part), walking the expert's rows in order
// in chunks of 32, so two runs give the same bits. The tile follows dW's shape: 128 x 32 when
// K (x's side) is at most 32, 32 x 128 when N (dy's side) is, 64 x 64 otherwise, so the
// rank side is not padded to 64 and every warp has work. The next chunk's rows are copied
// into shared memory (cp.async) while the current one is multiplied: the op is bound by
// reading dy and x once, which needs many loads in flight.
#include <cuda_pipeline.h>
#include <mma.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kChunk = 32;          // rows of dy / x staged per step (the MMA's k dimension)
constexpr int kPad = 8;             // shared-memory row padding of the staged operands (elements)
constexpr int kWgradThreads = 128;  // 4 warps, each a 32 x 32 part of the tile

// Stages rows [r, r + kChunk) of src (row pitch `cols` elements), columns [c0, c0 + W), into
// dst[row][col] (pitch W + kPad); rows past `rows_end` and columns past `cols` are zero. The
// vector path copies 16 bytes per cp.async (cols a multiple of 8, 16-byte aligned rows); the
// caller commits and waits.
template <typename T, bool VEC, int W>
__device__ __forceinline__ void stage(T* dst, const T* src, int64_t r, int64_t rows_end, int64_t cols,
                                      int64_t c0) {
  constexpr int kLd = W + kPad;
  if constexpr (VEC) {
    for (int i = threadIdx.x; i < kChunk * W / 8; i += kWgradThreads) {
      const int row = i / (W / 8), col = (i % (W / 8)) * 8;
      T* d = dst + row * kLd + col;
      if (r + row < rows_end && c0 + col < cols)
        __pipeline_memcpy_async(d, src + (r + row) * cols + c0 + col, 16);
      else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int i = threadIdx.x; i < kChunk * W; i += kWgradThreads) {
      const int row = i / W, col = i % W;
      T v = from_f<T>(0.f);
      if (r + row < rows_end && c0 + col < cols) v = src[(r + row) * cols + c0 + col];
      dst[row * kLd + col] = v;
    }
  }
}

// Block (k tile, n tile, group g): dw[expert][n][k] += sum over the group's rows of
// dy[row][n] * x[row][k], for a TN x TK tile. A = dy^T (n x row: dy staged row-major is A
// column-major), B = x (row x k, row-major). Two staging buffers: chunk c + 1 is in flight
// while chunk c is multiplied.
template <typename T, bool VEC, int TN, int TK>
__global__ void __launch_bounds__(kWgradThreads)
    grouped_wgrad_kernel(const T* __restrict__ dy, const T* __restrict__ x, float* __restrict__ dw,
                         MoeGroupTable tab, int64_t R, int64_t K, int64_t N) {
  using namespace nvcuda;
  static_assert((TN / 32) * (TK / 32) == kWgradThreads / 32, "one 32 x 32 part per warp");
  constexpr int kLdN = TN + kPad, kLdK = TK + kPad, kLdOut = TK + 4;
  constexpr size_t kStageBytes = 2 * size_t(kChunk) * (kLdN + kLdK) * sizeof(T);
  constexpr size_t kOutBytes = size_t(TN) * kLdOut * sizeof(float);
  __shared__ __align__(16) unsigned char smem[kStageBytes > kOutBytes ? kStageBytes : kOutBytes];
  T* s_dy = reinterpret_cast<T*>(smem);           // [2][kChunk][kLdN]
  T* s_x = s_dy + 2 * kChunk * kLdN;              // [2][kChunk][kLdK]
  float* s_out = reinterpret_cast<float*>(smem);  // [TN][kLdOut], after the last chunk
  const int g = int(blockIdx.z);
  const int64_t k0 = int64_t(blockIdx.x) * TK, n0 = int64_t(blockIdx.y) * TN;
  const int64_t row0 = tab.row0[g], row_end = g + 1 < tab.n ? tab.row0[g + 1] : R;
  const int warp = int(threadIdx.x) / 32;
  const int wn = (warp / (TK / 32)) * 32, wk = (warp % (TK / 32)) * 32;  // the warp's part of the tile
  const bool active = n0 + wn < N && k0 + wk < K;  // warp-uniform: a part past dW's edge idles
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.f);
  stage<T, VEC, TN>(s_dy, dy, row0, row_end, N, n0);
  stage<T, VEC, TK>(s_x, x, row0, row_end, K, k0);
  __pipeline_commit();
  int buf = 0;
  for (int64_t r = row0; r < row_end; r += kChunk, buf ^= 1) {
    if (r + kChunk < row_end) {  // the next chunk into the other buffer, freed by the last sync
      stage<T, VEC, TN>(s_dy + (buf ^ 1) * kChunk * kLdN, dy, r + kChunk, row_end, N, n0);
      stage<T, VEC, TK>(s_x + (buf ^ 1) * kChunk * kLdK, x, r + kChunk, row_end, K, k0);
    }
    __pipeline_commit();
    __pipeline_wait_prior(1);  // this chunk's copies have landed
    __syncthreads();
    if (active) {
      const T* cdy = s_dy + buf * kChunk * kLdN;
      const T* cx = s_x + buf * kChunk * kLdK;
      for (int kk = 0; kk < kChunk; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> a[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b[2];
        for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], cdy + kk * kLdN + wn + 16 * i, kLdN);
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], cx + kk * kLdK + wk + 16 * j, kLdK);
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  __pipeline_wait_prior(0);
  __syncthreads();  // the staging buffers become s_out
  if (active)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(s_out + (wn + 16 * i) * kLdOut + wk + 16 * j, acc[i][j], kLdOut,
                                wmma::mem_row_major);
  __syncthreads();
  float* out = dw + int64_t(tab.expert[g]) * N * K;
  for (int i = threadIdx.x; i < TN * TK; i += kWgradThreads) {
    const int64_t n = n0 + i / TK, k = k0 + i % TK;
    if (n < N && k < K) out[n * K + k] += s_out[(i / TK) * kLdOut + i % TK];
  }
}

template <typename T, int TN, int TK>
void launch_tiles(const void* dy, const void* x, float* dw, const MoeGroupTable& tab, int64_t R, int64_t K,
                  int64_t N, cudaStream_t st) {
  const dim3 grid(unsigned((K + TK - 1) / TK), unsigned((N + TN - 1) / TN), unsigned(tab.n));
  const bool vec = K % 8 == 0 && N % 8 == 0 && aligned16(dy) && aligned16(x);
  if (vec)
    grouped_wgrad_kernel<T, true, TN, TK><<<grid, kWgradThreads, 0, st>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), dw, tab, R, K, N);
  else
    grouped_wgrad_kernel<T, false, TN, TK><<<grid, kWgradThreads, 0, st>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), dw, tab, R, K, N);
  RP_CUDA_LAUNCH_CHECK("grouped_wgrad_kernel");
}

template <typename T>
void launch_wgrad(const void* dy, const void* x, float* dw, const MoeGroupTable& tab, int64_t R, int64_t K,
                  int64_t N, cudaStream_t st) {
  if (K <= 32) return launch_tiles<T, 128, 32>(dy, x, dw, tab, R, K, N, st);
  if (N <= 32) return launch_tiles<T, 32, 128>(dy, x, dw, tab, R, K, N, st);
  launch_tiles<T, 64, 64>(dy, x, dw, tab, R, K, N, st);
}

}  // namespace

void k_grouped_wgrad(DType t, const void* dy, const void* x, float* dw, const MoeGroupTable& tab, int64_t R,
                     int64_t K, int64_t N, cudaStream_t st) {
  if (tab.n <= 0 || K <= 0 || N <= 0) return;
  if (K > int64_t(32) * 65535 || N > int64_t(32) * 65535)
    throw std::invalid_argument("k_grouped_wgrad: K or N above the grid's reach");
  switch (t) {
    case DType::bf16: return launch_wgrad<bf16>(dy, x, dw, tab, R, K, N, st);
    case DType::f16: return launch_wgrad<f16>(dy, x, dw, tab, R, K, N, st);
    default: bad_dtype("k_grouped_wgrad", t);
  }
}

}  // namespace rp::cuda
