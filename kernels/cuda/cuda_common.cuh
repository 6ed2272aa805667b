// Device-side helpers shared by the CUDA backend's .cu files (internal).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/dtype.hpp"

namespace rp::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_f(int32_t x) { return float(x); }

/// Logit soft-capping (Ops::soft_cap's device twin; kernels/ops.hpp): cap * tanh(x / cap),
/// x for cap 0.
__device__ __forceinline__ float soft_cap(float x, float cap) { return cap > 0.f ? cap * tanhf(x / cap) : x; }

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ f16 from_f<f16>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ int32_t from_f<int32_t>(float v) {
  return int32_t(v);
}

/// Loads N consecutive elements of p as floats; with VEC the address must be 16-byte
/// aligned and N*sizeof(T) a multiple of 16 (then 16-byte loads are used).
template <int N, bool VEC, typename T>
__device__ __forceinline__ void load_n(const T* p, float (&out)[N]) {
  if constexpr (VEC && (N * sizeof(T)) % 16 == 0) {
    alignas(16) T tmp[N];
#pragma unroll
    for (int j = 0; j < int(N * sizeof(T) / 16); ++j)
      reinterpret_cast<uint4*>(tmp)[j] = reinterpret_cast<const uint4*>(p)[j];
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(tmp[j]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(p[j]);
  }
}
template <int N, bool VEC, typename T>
__device__ __forceinline__ void store_n(T* p, const float (&in)[N]) {
  if constexpr (VEC && (N * sizeof(T)) % 16 == 0) {
    alignas(16) T tmp[N];
#pragma unroll
    for (int j = 0; j < N; ++j) tmp[j] = from_f<T>(in[j]);
#pragma unroll
    for (int j = 0; j < int(N * sizeof(T) / 16); ++j)
      reinterpret_cast<uint4*>(p)[j] = reinterpret_cast<const uint4*>(tmp)[j];
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = from_f<T>(in[j]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// Streaming multiprocessors of the current device (132 on an H100/H200 when the query
/// fails), read once per process.
inline int num_sms() {
  static const int n = [] {
    int dev = 0, v = 132;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
      return v;
    return 132;
  }();
  return n;
}

/// Blocks for a grid-stride loop over `work` items of `per_block` each.
inline unsigned grid_for(int64_t work, int64_t per_block, int64_t cap = 65536) {
  int64_t b = (work + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return unsigned(b);
}

[[noreturn]] inline void bad_dtype(const char* op, DType t) {
  throw std::invalid_argument(std::string(op) + ": unsupported dtype " + dtype_name(t));
}

}  // namespace rp::cuda

/// Runs the statement list with `T` bound to the 16-bit storage type of dtype `t`.
#define RP_DISPATCH_16(op, t, T, ...)     \
  do {                                    \
    if ((t) == ::rp::DType::bf16) {       \
      using T = ::rp::cuda::bf16;         \
      __VA_ARGS__;                        \
    } else if ((t) == ::rp::DType::f16) { \
      using T = ::rp::cuda::f16;          \
      __VA_ARGS__;                        \
    } else {                              \
      ::rp::cuda::bad_dtype(op, t);       \
    }                                     \
  } while (0)

/// Same for any of the four storage types.
#define RP_DISPATCH_ANY(op, t, T, ...)       \
  do {                                       \
    switch (t) {                             \
      case ::rp::DType::f32: {               \
        using T = float;                     \
        __VA_ARGS__;                         \
        break;                               \
      }                                      \
      case ::rp::DType::bf16: {              \
        using T = ::rp::cuda::bf16;          \
        __VA_ARGS__;                         \
        break;                               \
      }                                      \
      case ::rp::DType::f16: {               \
        using T = ::rp::cuda::f16;           \
        __VA_ARGS__;                         \
        break;                               \
      }                                      \
      case ::rp::DType::i32: {               \
        using T = int32_t;                   \
        __VA_ARGS__;                         \
        break;                               \
      }                                      \
      default: ::rp::cuda::bad_dtype(op, t); \
    }                                        \
  } while (0)
