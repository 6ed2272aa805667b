// CUDA kernels of the expanded GQA attention backward (cudnn_attention.cpp): copy the KV head
// of each query head of a pass into a per-query-head tensor, and sum the per-query-head dK / dV
// back onto their KV head (or into an fp32 accumulator). Both are memory-bound: 16-byte
// loads and stores whenever rows are 16-byte multiples at 16-byte-aligned addresses, else one
// element per thread. CPU twins: tests/kernels/ref_ops.hpp (ref::gqa_expand, ref::gqa_group_sum).
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;

// ke[t, i, :] = k[t, (h0 + i) / r, :] for i < hc; blockIdx.y picks the (K, V) pair.
// U: the unit one thread moves (uint4 = 16 bytes, or one 16-bit element); D in units.
template <typename U>
__global__ void __launch_bounds__(kThreads)
    gqa_expand_kernel(const U* __restrict__ k, const U* __restrict__ v, U* __restrict__ ke,
                      U* __restrict__ ve, int64_t T, int64_t nkv, int64_t h0, int64_t hc, int64_t r,
                      int64_t D) {
  const U* src = blockIdx.y == 0 ? k : v;
  U* dst = blockIdx.y == 0 ? ke : ve;
  const int64_t row = hc * D;  // units per token of the pass
  const int64_t work = T * row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < work; i += stride) {
    const int64_t t = i / row, e = i - t * row;  // e = h*D + d
    const int64_t h = e / D, d = e - h * D;
    dst[i] = src[(t * nkv + (h0 + h) / r) * D + d];
  }
}

// out[t*out_row + g*D + d] (+)= sum_{j<m} in[((t*G + g)*m + j)*D + d]; blockIdx.y picks the
// (dK, dV) pair. N elements per thread (8 with 16-byte-multiple vectors).
template <typename TI, typename TO, int N, bool VEC>
__global__ void __launch_bounds__(kThreads)
    gqa_group_sum_kernel(const TI* __restrict__ in_k, const TI* __restrict__ in_v, TO* __restrict__ out_k,
                         TO* __restrict__ out_v, int64_t out_row, int64_t T, int64_t G, int64_t m, int64_t D,
                         bool accumulate) {
  const TI* src = blockIdx.y == 0 ? in_k : in_v;
  TO* dst = blockIdx.y == 0 ? out_k : out_v;
  const int64_t row = G * D / N;  // N-element groups per token
  const int64_t work = T * row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < work; i += stride) {
    const int64_t t = i / row, e = (i - t * row) * N;  // e = g*D + d
    const int64_t g = e / D, d = e - g * D;
    const TI* p = src + ((t * G + g) * m) * D + d;
    TO* o = dst + t * out_row + e;
    float acc[N], x[N];
    if (accumulate) {
      load_n<N, VEC>(o, acc);
    } else {
#pragma unroll
      for (int q = 0; q < N; ++q) acc[q] = 0.f;
    }
    for (int64_t j = 0; j < m; ++j) {
      load_n<N, VEC>(p + j * D, x);
#pragma unroll
      for (int q = 0; q < N; ++q) acc[q] += x[q];
    }
    store_n<N, VEC>(o, acc);
  }
}

bool all_aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!aligned16(p)) return false;
  return true;
}

[[noreturn]] void bad_heads(const char* op, const char* what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

template <typename TI, typename TO>
void launch_group_sum(const void* in_k, const void* in_v, void* out_k, void* out_v, int64_t out_row,
                      int64_t T, int64_t G, int64_t m, int64_t D, bool accumulate, cudaStream_t st) {
  const TI* a = static_cast<const TI*>(in_k);
  const TI* b = static_cast<const TI*>(in_v);
  TO* x = static_cast<TO*>(out_k);
  TO* y = static_cast<TO*>(out_v);
  const int64_t cap = int64_t(num_sms()) * 16;
  if (D % 8 == 0 && out_row % 8 == 0 && all_aligned16({in_k, in_v, out_k, out_v})) {
    const dim3 grid(grid_for(T * G * D / 8, kThreads, cap), 2);
    gqa_group_sum_kernel<TI, TO, 8, true>
        <<<grid, kThreads, 0, st>>>(a, b, x, y, out_row, T, G, m, D, accumulate);
  } else {
    const dim3 grid(grid_for(T * G * D, kThreads, cap), 2);
    gqa_group_sum_kernel<TI, TO, 1, false>
        <<<grid, kThreads, 0, st>>>(a, b, x, y, out_row, T, G, m, D, accumulate);
  }
}

}  // namespace

void k_gqa_expand_kv(DType t, const void* k, const void* v, void* ke, void* ve, int64_t T, int64_t nkv,
                     int64_t h0, int64_t hc, int64_t r, int64_t D, cudaStream_t st) {
  if (T < 0 || nkv <= 0 || r <= 0 || D <= 0 || h0 < 0 || hc <= 0 || h0 + hc > nkv * r)
    bad_heads("gqa_expand_kv", "need T >= 0 and 0 <= h0 < h0 + hc <= nkv * r");
  if (t != DType::bf16 && t != DType::f16) bad_dtype("gqa_expand_kv", t);
  if (T == 0) return;
  const int64_t cap = int64_t(num_sms()) * 16;
  if ((D * 2) % 16 == 0 && all_aligned16({k, v, ke, ve})) {
    const int64_t Du = D * 2 / 16;
    const dim3 grid(grid_for(T * hc * Du, kThreads, cap), 2);
    gqa_expand_kernel<uint4><<<grid, kThreads, 0, st>>>(static_cast<const uint4*>(k),
                                                        static_cast<const uint4*>(v), static_cast<uint4*>(ke),
                                                        static_cast<uint4*>(ve), T, nkv, h0, hc, r, Du);
  } else {
    const dim3 grid(grid_for(T * hc * D, kThreads, cap), 2);
    gqa_expand_kernel<uint16_t><<<grid, kThreads, 0, st>>>(
        static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v), static_cast<uint16_t*>(ke),
        static_cast<uint16_t*>(ve), T, nkv, h0, hc, r, D);
  }
  RP_CUDA_LAUNCH_CHECK("gqa_expand_kv");
}

void k_gqa_group_sum(DType in_t, const void* in_k, const void* in_v, DType out_t, void* out_k, void* out_v,
                     int64_t out_row, int64_t T, int64_t G, int64_t m, int64_t D, bool accumulate,
                     cudaStream_t st) {
  if (T < 0 || G <= 0 || m <= 0 || D <= 0 || out_row < G * D)
    bad_heads("gqa_group_sum", "need T >= 0, G > 0, m > 0, D > 0 and out_row >= G * D");
  if (in_t == DType::i32) bad_dtype("gqa_group_sum", in_t);
  if (out_t == DType::i32) bad_dtype("gqa_group_sum", out_t);
  if (T == 0) return;
  RP_DISPATCH_ANY("gqa_group_sum", in_t, TI, {
    RP_DISPATCH_ANY("gqa_group_sum", out_t, TO, {
      if constexpr (!std::is_same_v<TI, int32_t> && !std::is_same_v<TO, int32_t>)
        launch_group_sum<TI, TO>(in_k, in_v, out_k, out_v, out_row, T, G, m, D, accumulate, st);
    });
  });
  RP_CUDA_LAUNCH_CHECK("gqa_group_sum");
}

}  // namespace rp::cuda
