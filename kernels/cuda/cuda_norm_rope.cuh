// The per-element arithmetic of RMSNorm and RoPE, shared by the separate kernels
// (cuda_rowwise.cu, cuda_packed.cu) and the fused q/k norm + RoPE pass (cuda_qk_norm_rope.cu),
// with every multiply-add written out (no contraction left to the compiler): the fused pass
// then stores the same bits as the separate kernels, which its test checks.
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace rp::cuda {

/// RoPE (Su et al. 2021, RoFormer, eq. 34; HF's rotate-half layout) of one feature pair
/// (x0 at i, x1 at i + R/2): y0 = x0 c - x1 s, y1 = x1 c + x0 s.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float& y0, float& y1) {
  y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
  y1 = __fmaf_rn(x1, c, __fmul_rn(x0, s));
}

/// c = cos(p f) * scale, s = sin(p f) * scale * sign (sign -1: the transposed rotation of
/// the backward); p f is the fp32 product, as HF's inv_freq @ position_ids.
__device__ __forceinline__ void rope_cos_sin(float p, float f, float scale, float sign, float& c, float& s) {
  sincosf(__fmul_rn(p, f), &s, &c);
  c = __fmul_rn(c, scale);
  s = __fmul_rn(s, __fmul_rn(scale, sign));
}

/// One lane's share of a row's sum of squares: ss + sum_e a[e]^2, in order.
template <int N>
__device__ __forceinline__ float rms_sum_squares(const float (&a)[N], float ss) {
#pragma unroll
  for (int e = 0; e < N; ++e) ss = __fmaf_rn(a[e], a[e], ss);
  return ss;
}

/// 1 / sqrt(mean(x^2) + eps) from a row's sum of squares over n columns.
__device__ __forceinline__ float rms_inverse(float ss, int64_t n, float eps) {
  return 1.0f / sqrtf(ss / float(n) + eps);
}

/// A warp's row xr of n values held in registers (16-byte chunks: lane l holds values
/// l*8 + k*256 .. +7 in raw[k], k < C; n a multiple of 8, at most C * 256, xr 16-byte aligned)
/// and its inverse RMS (warp-reduced, so every lane gets it): the first half of the register
/// RMSNorm kernels (cuda_rowwise.cu, cuda_norm_fp8.cu).
template <typename T, int C>
__device__ __forceinline__ float rms_row_in_registers(const T* xr, int64_t n, float eps, uint4 (&raw)[C]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < C; ++k)
    if (int64_t(lane) * 8 + k * 256 < n) raw[k] = *reinterpret_cast<const uint4*>(xr + lane * 8 + k * 256);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < C; ++k)
    if (int64_t(lane) * 8 + k * 256 < n) {
      float a[8];
      load_n<8, true>(reinterpret_cast<const T*>(&raw[k]), a);
      ss = rms_sum_squares(a, ss);
    }
  return rms_inverse(warp_sum(ss), n, eps);
}

/// RMSNorm's output before its store: as HF, LLaMA rounds x*r to the storage type first,
/// Gemma (w_off 1) rounds the fp32 x*r*(1+w) once.
template <typename T>
__device__ __forceinline__ float rms_output(float x, float rs, float w, float w_off) {
  return w_off != 0.f ? __fmul_rn(__fmul_rn(x, rs), w + w_off)
                      : __fmul_rn(to_f(from_f<T>(__fmul_rn(x, rs))), w);
}

/// One lane's share of sum_j g_j xh_j / r (g = dy (w + w_off)): gx + sum_e dy[e](w[e]+w_off) x[e].
template <int N>
__device__ __forceinline__ float rms_grad_dot(const float (&d)[N], const float (&w)[N], const float (&a)[N],
                                              float w_off, float gx) {
#pragma unroll
  for (int e = 0; e < N; ++e) gx = __fmaf_rn(__fmul_rn(d[e], w[e] + w_off), a[e], gx);
  return gx;
}

/// RMSNorm's input gradient of one element: r (dy (w + w_off) - x r c), c = mean(g xh).
__device__ __forceinline__ float rms_input_grad(float x, float dy, float w, float w_off, float rs, float c) {
  return __fmul_rn(rs, __fmaf_rn(dy, w + w_off, -__fmul_rn(x, __fmul_rn(rs, c))));
}

}  // namespace rp::cuda
