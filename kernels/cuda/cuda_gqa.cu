// CUDA kernels of the expanded GQA attention backward (cudnn_attention.cpp): copy each KV
// head of a chunk once per query head it serves, and sum the per-query-head dK / dV back
// onto their KV head. Both are memory-bound: 16-byte loads and stores whenever head_dim
// rows are 16-byte multiples at 16-byte-aligned addresses, else one element per thread.
// CPU twins: tests/kernels/ref_ops.hpp (ref::gqa_expand, ref::gqa_group_sum).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;

// Chunk geometry: KV heads [g0, g0 + gc) of [T, nkv, D] tensors, r query heads per KV head;
// the expanded tensors are [T, gc * r, D] (query head h0 + i of the chunk is row i).
struct Chunk {
  int64_t T, nkv, g0, gc, r, D;
};

// out[t, g*r + j, :] = in[t, g0 + g, :] for g < gc, j < r; blockIdx.y picks the (K, V) pair.
// U: the unit one thread moves (uint4 = 16 bytes, or one 16-bit element); D in units.
template <typename U>
__global__ void __launch_bounds__(kThreads)
    gqa_expand_kernel(const U* __restrict__ k, const U* __restrict__ v, U* __restrict__ ke,
                      U* __restrict__ ve, Chunk c) {
  const U* src = blockIdx.y == 0 ? k : v;
  U* dst = blockIdx.y == 0 ? ke : ve;
  const int64_t row = c.gc * c.D;  // units per token of the chunk
  const int64_t work = c.T * row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < work; i += stride) {
    const int64_t t = i / row, e = i - t * row;  // e = g*D + d
    const int64_t g = e / c.D, d = e - g * c.D;
    const U x = src[(t * c.nkv + c.g0) * c.D + e];
    U* o = dst + ((t * c.gc + g) * c.r) * c.D + d;
    for (int64_t j = 0; j < c.r; ++j) o[j * c.D] = x;
  }
}

// out[t, g0 + g, :] = sum_j in[t, g*r + j, :] (fp32 sum, rounded once to T);
// blockIdx.y picks the (dK, dV) pair. N elements per thread (8 with 16-byte vectors).
template <typename T, int N, bool VEC>
__global__ void __launch_bounds__(kThreads)
    gqa_group_sum_kernel(const T* __restrict__ dke, const T* __restrict__ dve,
                         T* __restrict__ dk, T* __restrict__ dv, Chunk c) {
  const T* src = blockIdx.y == 0 ? dke : dve;
  T* dst = blockIdx.y == 0 ? dk : dv;
  const int64_t row = c.gc * c.D / N;  // N-element groups per token of the chunk
  const int64_t work = c.T * row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < work; i += stride) {
    const int64_t t = i / row, e = (i - t * row) * N;  // e = g*D + d
    const int64_t g = e / c.D, d = e - g * c.D;
    const T* p = src + ((t * c.gc + g) * c.r) * c.D + d;
    float acc[N], x[N];
    load_n<N, VEC>(p, acc);
    for (int64_t j = 1; j < c.r; ++j) {
      load_n<N, VEC>(p + j * c.D, x);
#pragma unroll
      for (int q = 0; q < N; ++q) acc[q] += x[q];
    }
    store_n<N, VEC>(dst + (t * c.nkv + c.g0) * c.D + e, acc);
  }
}

void check_chunk(const Chunk& c, const char* op) {
  if (c.T < 0 || c.nkv <= 0 || c.g0 < 0 || c.gc <= 0 || c.g0 + c.gc > c.nkv || c.r <= 0 ||
      c.D <= 0)
    throw std::invalid_argument(std::string(op) + ": bad chunk (need 0 <= g0 < g0+gc <= nkv, "
                                                  "r > 0, D > 0, T >= 0)");
}

bool all_aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!aligned16(p)) return false;
  return true;
}

}  // namespace

void k_gqa_expand_kv(DType t, const void* k, const void* v, void* ke, void* ve, int64_t T,
                     int64_t nkv, int64_t g0, int64_t gc, int64_t r, int64_t D,
                     cudaStream_t st) {
  Chunk c{T, nkv, g0, gc, r, D};
  check_chunk(c, "gqa_expand_kv");
  if (dtype_size(t) != 2) bad_dtype("gqa_expand_kv", t);
  if (T == 0) return;
  const int64_t bytes_row = D * 2;
  const bool vec = bytes_row % 16 == 0 && all_aligned16({k, v, ke, ve});
  const int64_t cap = int64_t(num_sms()) * 16;
  if (vec) {
    c.D = bytes_row / 16;
    const dim3 grid(grid_for(T * gc * c.D, kThreads, cap), 2);
    gqa_expand_kernel<uint4><<<grid, kThreads, 0, st>>>(
        static_cast<const uint4*>(k), static_cast<const uint4*>(v), static_cast<uint4*>(ke),
        static_cast<uint4*>(ve), c);
  } else {
    const dim3 grid(grid_for(T * gc * D, kThreads, cap), 2);
    gqa_expand_kernel<uint16_t><<<grid, kThreads, 0, st>>>(
        static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v),
        static_cast<uint16_t*>(ke), static_cast<uint16_t*>(ve), c);
  }
  RP_CUDA_LAUNCH_CHECK("gqa_expand_kv");
}

void k_gqa_group_sum(DType t, const void* dke, const void* dve, void* dk, void* dv, int64_t T,
                     int64_t nkv, int64_t g0, int64_t gc, int64_t r, int64_t D,
                     cudaStream_t st) {
  const Chunk c{T, nkv, g0, gc, r, D};
  check_chunk(c, "gqa_group_sum");
  if (T == 0) return;
  const bool vec = D % 8 == 0 && all_aligned16({dke, dve, dk, dv});
  const int64_t cap = int64_t(num_sms()) * 16;
  RP_DISPATCH_16("gqa_group_sum", t, E, {
    const E* a = static_cast<const E*>(dke);
    const E* b = static_cast<const E*>(dve);
    E* x = static_cast<E*>(dk);
    E* y = static_cast<E*>(dv);
    if (vec) {
      const dim3 grid(grid_for(T * gc * D / 8, kThreads, cap), 2);
      gqa_group_sum_kernel<E, 8, true><<<grid, kThreads, 0, st>>>(a, b, x, y, c);
    } else {
      const dim3 grid(grid_for(T * gc * D, kThreads, cap), 2);
      gqa_group_sum_kernel<E, 1, false><<<grid, kThreads, 0, st>>>(a, b, x, y, c);
    }
  });
  RP_CUDA_LAUNCH_CHECK("gqa_group_sum");
}

}  // namespace rp::cuda
