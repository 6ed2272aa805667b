// RoPE at given positions for packed sequences and KV-cache decoding on the CUDA backend
// (CPU twin: kernels/cpu/cpu_packed.cpp). Their attention runs on the row kernels every
// attention shares (cuda_attention_rows.cu) with a first key per row.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_norm_rope.cuh"

namespace rp::cuda {
namespace {

constexpr int kThreadsRope = 256;

struct Freq {
  float f[256];
};

template <typename T>
__global__ void rope_at_kernel(T* x, const int32_t* pos, int64_t total, int heads, int64_t D, int half,
                               Freq fr, float scale, float sign) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(i % half);
    const int64_t th = i / half;  // (token, head)
    const int64_t t = th / heads;
    float c, s, y0, y1;
    rope_cos_sin(float(max(pos[t], 0)), fr.f[d], scale, sign, c, s);
    T* x0 = x + th * D;
    rope_rotate(to_f(x0[d]), to_f(x0[d + half]), c, s, y0, y1);
    x0[d] = from_f<T>(y0);
    x0[d + half] = from_f<T>(y1);
  }
}

}  // namespace

void k_rope_at(DType t, void* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D, int64_t R,
               const float* inv_freq, float scale, bool transpose, cudaStream_t st) {
  const int64_t half = R / 2;
  if (half > 256) throw std::invalid_argument("rope_at: rotary_dim > 512 is not supported on CUDA");
  const int64_t total = T * heads * half;
  if (total <= 0) return;
  Freq fr{};
  for (int64_t i = 0; i < half; ++i) fr.f[i] = inv_freq[i];
  RP_DISPATCH_16(
      "rope_at", t, T_,
      rope_at_kernel<T_><<<grid_for(total, kThreadsRope), kThreadsRope, 0, st>>>(
          static_cast<T_*>(x), pos, total, int(heads), D, int(half), fr, scale, transpose ? -1.f : 1.f));
  RP_CUDA_LAUNCH_CHECK("rope_at");
}

}  // namespace rp::cuda
