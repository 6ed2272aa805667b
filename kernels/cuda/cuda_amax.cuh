// Device helpers for FP8 scales (kernels/fp8.hpp): the largest magnitude of a tensor reduced
// as the unsigned fp32 bits of |x| (for non-negative floats the bit order is the value order,
// and a NaN's bits exceed inf's, so a NaN anywhere wins, as fp8::scale_from_amax expects), and
// the float -> FP8 conversion of the quantize kernels. Shared by the quantization kernels
// (cuda_fp8.cu) and the producers that fuse the reduction into their own pass (RMSNorm,
// cuda_rowwise.cu; SwiGLU, cuda_elementwise.cu).
#pragma once
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/fp8.hpp"

namespace rp::cuda {

__device__ __forceinline__ unsigned abs_bits(float v) { return fp8::bits_of(v) & 0x7fffffffu; }

__device__ __forceinline__ unsigned warp_max_u(unsigned v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// The block's largest v, returned to every thread (THREADS = blockDim.x, a multiple of 32;
/// every thread of the block must call it).
template <int THREADS>
__device__ unsigned block_max_u(unsigned v) {
  __shared__ unsigned part[THREADS / 32];
  v = warp_max_u(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "one part per warp, at most 32 warps");
  // every warp reduces all the parts, so every thread (not just warp 0) gets the maximum
  const unsigned lane = threadIdx.x & 31;
  v = lane < THREADS / 32 ? part[lane] : 0u;
  v = warp_max_u(v);
  __syncthreads();
  return v;
}

/// Adds the block's largest of m into *amax (the amax bits; zeroed before the launch): one
/// atomic per block. Every thread of the block must call it.
template <int THREADS>
__device__ __forceinline__ void block_amax_into(unsigned m, unsigned* amax) {
  m = block_max_u<THREADS>(m);
  if (threadIdx.x == 0 && m != 0) atomicMax(amax, m);
}

/// fp8::encode<F>(a), fp8::encode<F>(b) as (low, high) bytes. On sm_89+ one cvt.rn.satfinite
/// instruction converts the pair (the same codes as fp8::encode for every non-NaN float:
/// CudaFp8.SharedConversionEqualsTheHardwareOnEveryFloat checks all 2^32); NaN inputs take
/// the shared code so the CPU twin's NaN codes are reproduced too. Elsewhere the shared code.
template <Fp8Format F>
__device__ __forceinline__ void encode_pair(float a, float b, uint8_t& lo, uint8_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr __nv_fp8_interpretation_t kFmt = F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;
  const __nv_fp8x2_storage_t p = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFmt);
  lo = a == a ? uint8_t(p & 0xffu) : fp8::encode<F>(a);
  hi = b == b ? uint8_t(p >> 8) : fp8::encode<F>(b);
#else
  lo = fp8::encode<F>(a);
  hi = fp8::encode<F>(b);
#endif
}

}  // namespace rp::cuda
