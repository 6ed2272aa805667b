// Grouped products with a low-rank side in one launch (kernels/cuda/cuda_kernels.hpp,
// k_grouped_lowrank): for every expert with rows,
//   out_e = beta * out_e + alpha * a_e M_e,   a_e [rows, r], M_e [r, C], out_e [rows, C],
// where r (the LoRA rank, at most 64) is the product's inner dimension. These are the
// per-expert adapters' B products added onto a frozen projection's output (forward: M_e = B_e^T
// with B_e [C, r]) and their input gradients through A (backward: M_e = A_e [r, C]).
//
// cuBLAS's grouped GEMM runs them at 30-55 TFLOP/s, well under the rate at which out_e can be
// read and written (the op's floor: its FLOPs are few). Here one block of 4 warps computes a
// 64 x 128 tile of one expert's out on tensor cores (WMMA 16x16x16, bf16 / f16 in, fp32
// accumulate over the r inner products in order, so reruns give the same bits) while its
// tile of out, read into registers first, is in flight; then adds, rounds and writes the tile
// back with 16-byte accesses.
#include <mma.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kRows = 64;             // out rows per block
constexpr int kCols = 128;            // out columns per block
constexpr int kMaxRank = 64;          // the inner dimension, zero-padded to a multiple of 16
constexpr int kLowRankThreads = 128;  // 4 warps, each 32 rows x 64 columns of the tile
constexpr int kLdA = kMaxRank + 8;    // pitch of the staged a rows (elements)
constexpr int kLdM = kCols + 8;       // pitch of the staged M (row-major [r][cols], elements)
constexpr int kLdOut = kCols + 4;     // pitch of the fp32 tile (elements)

__device__ __forceinline__ bool on16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Block (column tile, row tile, group g). `m_cr`: M_e is stored as [C, r] (a linear's weight
// [N = C, K = r], the forward); otherwise as [r, C] (a weight [N = r, K = C], the input
// gradient). M is staged as [rp][kCols] row-major either way.
template <typename T>
__global__ void __launch_bounds__(kLowRankThreads)
    grouped_lowrank_kernel(const T* __restrict__ a, const T* __restrict__ w, T* __restrict__ out,
                           MoeGroupTable tab, int64_t R, int r, int64_t C, bool m_cr, float alpha, float beta,
                           bool vec) {
  using namespace nvcuda;
  constexpr size_t kStageBytes = (size_t(kRows) * kLdA + size_t(kMaxRank) * kLdM) * sizeof(T);
  constexpr size_t kOutBytes = size_t(kRows) * kLdOut * sizeof(float);
  __shared__ __align__(32) unsigned char smem[kStageBytes > kOutBytes ? kStageBytes : kOutBytes];
  T* s_a = reinterpret_cast<T*>(smem);  // [kRows][kLdA]
  T* s_m = s_a + kRows * kLdA;          // [rp][kLdM]
  float* s_out = reinterpret_cast<float*>(smem);
  const int g = int(blockIdx.z);
  const int64_t g0 = tab.row0[g], g_end = g + 1 < tab.n ? tab.row0[g + 1] : R;
  const int64_t row0 = g0 + int64_t(blockIdx.y) * kRows;
  if (row0 >= g_end) return;  // the grid covers the largest group; this one is shorter
  const int64_t rows = g_end - row0 < kRows ? g_end - row0 : kRows;
  const int64_t c0 = int64_t(blockIdx.x) * kCols;
  const int rp = (r + 15) / 16 * 16;
  const T zero = from_f<T>(0.f);
  // The tile of out is read first, into registers, so its loads are in flight while the
  // operands are staged and multiplied (the op is bound by this read and the write back).
  constexpr int kPer = kRows * kCols / 8 / kLowRankThreads;  // 16-byte pieces per thread
  uint4 prev[kPer];
  if (vec && beta != 0.f) {
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int i = int(threadIdx.x) + q * kLowRankThreads;
      const int row = i / (kCols / 8), col = (i % (kCols / 8)) * 8;
      prev[q] = row < rows && c0 + col < C
                    ? *reinterpret_cast<const uint4*>(out + (row0 + row) * C + c0 + col)
                    : make_uint4(0, 0, 0, 0);
    }
  }
  if (r % 8 == 0 && on16(a)) {  // 8 elements per load: rows of a are r * 2 bytes apart
    for (int i = threadIdx.x; i < kRows * rp / 8; i += kLowRankThreads) {
      const int row = i / (rp / 8), j = (i % (rp / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row < rows && j < r) v = *reinterpret_cast<const uint4*>(a + (row0 + row) * r + j);
      *reinterpret_cast<uint4*>(s_a + row * kLdA + j) = v;
    }
  } else {
    for (int i = threadIdx.x; i < kRows * rp; i += kLowRankThreads) {
      const int row = i / rp, j = i % rp;
      s_a[row * kLdA + j] = row < rows && j < r ? a[(row0 + row) * r + j] : zero;
    }
  }
  const T* we = w + int64_t(tab.expert[g]) * C * r;
  if (m_cr && r % 8 == 0 && on16(we)) {  // [C, r]: 8 consecutive j of one column per load
    for (int i = threadIdx.x; i < kCols * rp / 8; i += kLowRankThreads) {
      const int col = i / (rp / 8), j = (i % (rp / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j < r && c0 + col < C) v = *reinterpret_cast<const uint4*>(we + (c0 + col) * r + j);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int q = 0; q < 8; ++q) s_m[(j + q) * kLdM + col] = e[q];
    }
  } else if (!m_cr && C % 8 == 0 && on16(we)) {  // [r, C]: 8 consecutive columns per load
    for (int i = threadIdx.x; i < rp * kCols / 8; i += kLowRankThreads) {
      const int j = i / (kCols / 8), col = (i % (kCols / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (j < r && c0 + col < C) v = *reinterpret_cast<const uint4*>(we + int64_t(j) * C + c0 + col);
      *reinterpret_cast<uint4*>(s_m + j * kLdM + col) = v;
    }
  } else {
    for (int i = threadIdx.x; i < rp * kCols; i += kLowRankThreads) {
      // consecutive threads walk the dimension that is contiguous in global memory
      const int j = m_cr ? i % rp : i / kCols, col = m_cr ? i / rp : i % kCols;
      const int64_t c = c0 + col;
      T v = zero;
      if (j < r && c < C) v = m_cr ? we[c * r + j] : we[int64_t(j) * C + c];
      s_m[j * kLdM + col] = v;
    }
  }
  __syncthreads();
  const int warp = int(threadIdx.x) / 32;
  const int wr = (warp / 2) * 32, wc = (warp % 2) * 64;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.f);
  for (int kk = 0; kk < rp; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
    for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], s_a + (wr + 16 * i) * kLdA + kk, kLdA);
    for (int j = 0; j < 4; ++j) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, s_m + kk * kLdM + wc + 16 * j, kLdM);
      for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
    }
  }
  __syncthreads();  // the staged operands become s_out
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      wmma::store_matrix_sync(s_out + (wr + 16 * i) * kLdOut + wc + 16 * j, acc[i][j], kLdOut,
                              wmma::mem_row_major);
  __syncthreads();
  if (vec) {  // C a multiple of 8, 16-byte aligned out: 8 elements per access
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int i = int(threadIdx.x) + q * kLowRankThreads;
      const int row = i / (kCols / 8), col = (i % (kCols / 8)) * 8;
      if (row >= rows || c0 + col >= C) continue;
      uint4 raw = beta != 0.f ? prev[q] : make_uint4(0, 0, 0, 0);
      T* e = reinterpret_cast<T*>(&raw);
      const float* s = s_out + row * kLdOut + col;
#pragma unroll
      for (int k = 0; k < 8; ++k) e[k] = from_f<T>((beta != 0.f ? beta * to_f(e[k]) : 0.f) + alpha * s[k]);
      *reinterpret_cast<uint4*>(out + (row0 + row) * C + c0 + col) = raw;
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kCols; i += kLowRankThreads) {
      const int row = i / kCols, col = i % kCols;
      if (row >= rows || c0 + col >= C) continue;
      T* o = out + (row0 + row) * C + c0 + col;
      const float prev = beta != 0.f ? beta * to_f(*o) : 0.f;
      *o = from_f<T>(prev + alpha * s_out[row * kLdOut + col]);
    }
  }
}

template <typename T>
void launch_lowrank(const void* a, const void* w, void* out, const MoeGroupTable& tab, int64_t R, int r,
                    int64_t C, bool m_cr, float alpha, float beta, cudaStream_t st) {
  int64_t most = 0;  // the largest group's rows set the grid's row tiles
  for (int g = 0; g < tab.n; ++g) {
    const int64_t end = g + 1 < tab.n ? tab.row0[g + 1] : R;
    most = std::max<int64_t>(most, end - tab.row0[g]);
  }
  if (most == 0) return;
  const dim3 grid(unsigned((C + kCols - 1) / kCols), unsigned((most + kRows - 1) / kRows), unsigned(tab.n));
  const bool vec = C % 8 == 0 && aligned16(out);
  grouped_lowrank_kernel<T><<<grid, kLowRankThreads, 0, st>>>(static_cast<const T*>(a),
                                                              static_cast<const T*>(w), static_cast<T*>(out),
                                                              tab, R, r, C, m_cr, alpha, beta, vec);
  RP_CUDA_LAUNCH_CHECK("grouped_lowrank_kernel");
}

}  // namespace

void k_grouped_lowrank(DType t, const void* a, const void* w, void* out, const MoeGroupTable& tab, int64_t R,
                       int64_t r, int64_t C, bool m_cr, float alpha, float beta, cudaStream_t st) {
  if (tab.n <= 0 || r <= 0 || C <= 0) return;
  if (r > kMaxRank) throw std::invalid_argument("k_grouped_lowrank: the inner dimension is above 64");
  if ((C + kCols - 1) / kCols > int64_t(INT32_MAX) || R / kRows >= 65535)
    throw std::invalid_argument("k_grouped_lowrank: the output is above the grid's reach");
  switch (t) {
    case DType::bf16: return launch_lowrank<bf16>(a, w, out, tab, R, int(r), C, m_cr, alpha, beta, st);
    case DType::f16: return launch_lowrank<f16>(a, w, out, tab, R, int(r), C, m_cr, alpha, beta, st);
    default: bad_dtype("k_grouped_lowrank", t);
  }
}

}  // namespace rp::cuda
