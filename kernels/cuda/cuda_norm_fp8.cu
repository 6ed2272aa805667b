// RMSNorm whose output feeds FP8 linears with one activation scale per token
// (Ops::rmsnorm_fwd_fp8_rows): y, its row scales and its e4m3/e5m2 codes from one read of x.
// The norm's arithmetic is cuda_rowwise.cu's (cuda_norm_rope.cuh), the codes the shared
// scalar code's (cuda_amax.cuh's encode_pair), so y equals k_rmsnorm_fwd's and the codes
// Ops::fp8_scale_rows + fp8_quantize_rows' over it, bit for bit.
#include <cstdint>

#include "kernels/cuda/cuda_amax.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_norm_rope.cuh"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;
constexpr int kRegChunks = 16;  // chunks of 8 values a lane holds: rows up to 16 x 256 values

// rmsnorm_fwd_regs_kernel's rows (cuda_rowwise.cu) and their FP8 codes with one scale per row: the stored
// (rounded) y of a lane's chunks replaces x in its registers while the warp reduces the row's
// amax, then becomes codes q[r, j] = encode(y / scale[r]): y is not read back. The scale and
// codes are fp8_scale_rows' and fp8_quantize_rows' over the stored y (the shared scalar code).
template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_fwd_rows_fp8_kernel(const T* x, const T* w, T* y, int64_t R, int64_t n, float eps, float w_off,
                                uint8_t* q, float* scale) {
  static_assert(sizeof(T) * 8 == sizeof(uint4), "a chunk of 8 values is one 16-byte register group");
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < R; r += warps) {
    uint4 raw[kRegChunks];
    const float rs = rms_row_in_registers(x + r * n, n, eps, raw);
    T* yr = y + r * n;
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < kRegChunks; ++k) {
      const int64_t j = int64_t(lane) * 8 + k * 256;
      if (j >= n) continue;
      float a[8], b[8];
      load_n<8, true>(reinterpret_cast<const T*>(&raw[k]), a);
      load_n<8, true>(w + j, b);
      alignas(16) T o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        o[e] = from_f<T>(rms_output<T>(a[e], rs, b[e], w_off));
        m = max(m, abs_bits(to_f(o[e])));
      }
      raw[k] = *reinterpret_cast<const uint4*>(o);
      *reinterpret_cast<uint4*>(yr + j) = raw[k];
    }
    m = warp_max_u(m);
    const float s = fp8::scale_from_amax(fp8::float_of(m), F);
    if (lane == 0) scale[r] = s;
#pragma unroll
    for (int k = 0; k < kRegChunks; ++k) {
      const int64_t j = int64_t(lane) * 8 + k * 256;
      if (j >= n) continue;
      float a[8];
      load_n<8, true>(reinterpret_cast<const T*>(&raw[k]), a);
      alignas(8) uint8_t c[8];
#pragma unroll
      for (int e = 0; e < 8; e += 2) encode_pair<F>(a[e] / s, a[e + 1] / s, c[e], c[e + 1]);
      *reinterpret_cast<uint2*>(q + r * n + j) = *reinterpret_cast<const uint2*>(c);
    }
  }
}

}  // namespace

bool k_rmsnorm_fwd_fp8_rows(DType t, const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                            float w_off, Fp8Format f, uint8_t* q, float* scale, cudaStream_t st) {
  // the register rows of k_rmsnorm_fwd, and 8-byte stores of codes
  const bool regs = n % kVec == 0 && aligned16(x) && aligned16(w) && aligned16(y) && n >= 512 &&
                    n <= int64_t(kRegChunks) * 256 && (reinterpret_cast<uintptr_t>(q) & 7u) == 0;
  if (!regs) return false;
  if (R <= 0) return true;
  const unsigned grid = grid_for(R, kThreads / 32, int64_t(num_sms()) * 16);
  RP_DISPATCH_16("rmsnorm_fwd_fp8_rows", t, T, {
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(w);
    T* yt = static_cast<T*>(y);
    if (f == Fp8Format::e4m3)
      rmsnorm_fwd_rows_fp8_kernel<T, Fp8Format::e4m3>
          <<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, q, scale);
    else
      rmsnorm_fwd_rows_fp8_kernel<T, Fp8Format::e5m2>
          <<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, q, scale);
  });
  RP_CUDA_LAUNCH_CHECK("rmsnorm_fwd_fp8_rows");
  return true;
}

}  // namespace rp::cuda
