// Qwen3's per-head q/k RMSNorm followed by RoPE in one pass over the rows (forward), and the
// transposed rotation followed by the norm's backward in one pass (backward): head_dim 64, 128
// or 256 with every feature rotating. The separate kernels (cuda_rowwise.cu) read and write
// q and k twice; this reads them once and writes them once.
//
// A warp takes one token at a time. Its lanes split into groups of D/8 lanes, one head row per
// group (8 features per lane, 16-byte loads), and loop over the token's heads; the cos/sin of a
// lane's 8 frequencies are computed once per token. A feature pair (i, i + D/2) sits in lanes
// l and l ^ (D/16) of a group and meets through a shuffle. The arithmetic is that of
// cuda_norm_rope.cuh in the separate kernels' order (the row sums as warp_sum over a one-warp
// row of lanes holding 0 past D/8), so y and dx equal the two separate calls bit for bit; the
// weight gradient dw is summed in another order (per lane over its rows, then per block).
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_norm_rope.cuh"

namespace rp::cuda {
namespace {

constexpr int kThreadsQk = 256;
constexpr int kWarpsQk = kThreadsQk / 32;

struct QkFreq {
  float f[128];  // inv_freq, D/2 <= 128
};

// A row's sum over its group of LPR lanes, as warp_sum over a warp whose lanes from LPR on
// hold 0 (the separate kernel's one-warp rows): the same adds in the same order, the adds of
// those zeros included (they turn -0 into +0).
template <int LPR>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = 16; o >= LPR; o >>= 1) v += 0.f;
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// This lane's 8 features rotated (sign 1) or rotated back (sign -1), v already rounded to the
// storage type; the pair's other half comes from lane ^ LPR/2.
template <int LPR>
__device__ __forceinline__ void rotate_lane(const float (&v)[8], const float (&c)[8], const float (&s)[8],
                                            bool lo, float (&out)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float other = __shfl_xor_sync(0xffffffffu, v[e], LPR / 2);
    float y0, y1;
    if (lo) rope_rotate(v[e], other, c[e], s[e], y0, y1);
    else rope_rotate(other, v[e], c[e], s[e], y0, y1);
    out[e] = lo ? y0 : y1;
  }
}

template <bool POS>
__device__ __forceinline__ void lane_cos_sin(const int32_t* pos, int64_t t, int64_t L, const QkFreq& fr,
                                             int f0, float scale, float sign, float (&c)[8], float (&s)[8]) {
  const float p = POS ? float(max(pos[t], 0)) : float(t % L);
#pragma unroll
  for (int e = 0; e < 8; ++e) rope_cos_sin(p, fr.f[f0 + e], scale, sign, c[e], s[e]);
}

template <typename T, int LPR, bool POS>
__global__ void __launch_bounds__(kThreadsQk)
    qk_norm_rope_fwd_kernel(const T* x, const T* w, T* y, const int32_t* pos, int64_t tokens, int64_t L,
                            int heads, float eps, float w_off, QkFreq fr, float scale) {
  constexpr int D = LPR * 8, G = 32 / LPR;
  const int lane = threadIdx.x & 31, l = lane % LPR, g = lane / LPR;
  const bool lo = l < LPR / 2;
  float wv[8];
  load_n<8, true>(w + l * 8, wv);
  const int64_t warps = int64_t(gridDim.x) * kWarpsQk;
  for (int64_t t = int64_t(blockIdx.x) * kWarpsQk + threadIdx.x / 32; t < tokens; t += warps) {
    float c[8], s[8];
    lane_cos_sin<POS>(pos, t, L, fr, (l % (LPR / 2)) * 8, scale, 1.f, c, s);
    for (int h0 = 0; h0 < heads; h0 += G) {
      const bool ok = h0 + g < heads;
      const int64_t off = (t * heads + h0 + g) * D + l * 8;
      float a[8] = {};
      if (ok) load_n<8, true>(x + off, a);
      const float rs = rms_inverse(group_sum<LPR>(rms_sum_squares(a, 0.f)), D, eps);
      float v[8], o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = to_f(from_f<T>(rms_output<T>(a[e], rs, wv[e], w_off)));
      rotate_lane<LPR>(v, c, s, lo, o);
      if (ok) store_n<8, true>(y + off, o);
    }
  }
}

template <typename T, int LPR, bool POS>
__global__ void __launch_bounds__(kThreadsQk)
    qk_norm_rope_bwd_kernel(const T* x, const T* w, const T* dy, T* dx, float* dw, const int32_t* pos,
                            int64_t tokens, int64_t L, int heads, float eps, float w_off, QkFreq fr,
                            float scale) {
  constexpr int D = LPR * 8, G = 32 / LPR;
  __shared__ float s_dw[kWarpsQk][D];
  const int lane = threadIdx.x & 31, l = lane % LPR, g = lane / LPR;
  const bool lo = l < LPR / 2;
  float wv[8], acc[8] = {};
  load_n<8, true>(w + l * 8, wv);
  const int64_t warps = int64_t(gridDim.x) * kWarpsQk;
  for (int64_t t = int64_t(blockIdx.x) * kWarpsQk + threadIdx.x / 32; t < tokens; t += warps) {
    float c[8], s[8];
    lane_cos_sin<POS>(pos, t, L, fr, (l % (LPR / 2)) * 8, scale, -1.f, c, s);
    for (int h0 = 0; h0 < heads; h0 += G) {
      const bool ok = h0 + g < heads;
      const int64_t off = (t * heads + h0 + g) * D + l * 8;
      float a[8] = {}, gy[8] = {}, d[8], o[8];
      if (ok) {
        load_n<8, true>(x + off, a);
        load_n<8, true>(dy + off, gy);
      }
      rotate_lane<LPR>(gy, c, s, lo, d);
#pragma unroll
      for (int e = 0; e < 8; ++e) d[e] = to_f(from_f<T>(d[e]));  // as rope_bwd stores it
      const float ss = group_sum<LPR>(rms_sum_squares(a, 0.f));
      const float gx = group_sum<LPR>(rms_grad_dot(d, wv, a, w_off, 0.f));
      const float rs = rms_inverse(ss, D, eps);
      const float cm = gx * rs / float(D);  // mean(g * xh)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        o[e] = rms_input_grad(a[e], d[e], wv[e], w_off, rs, cm);
        if (ok) acc[e] += __fmul_rn(__fmul_rn(d[e], a[e]), rs);
      }
      if (ok) store_n<8, true>(dx + off, o);
    }
  }
  if (dw == nullptr) return;  // a frozen norm
#pragma unroll
  for (int e = 0; e < 8; ++e)
#pragma unroll
    for (int o = 16; o >= LPR; o >>= 1) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
  if (g == 0)
#pragma unroll
    for (int e = 0; e < 8; ++e) s_dw[threadIdx.x / 32][l * 8 + e] = acc[e];
  __syncthreads();
  for (int j = threadIdx.x; j < D; j += kThreadsQk) {
    float sum = 0.f;
#pragma unroll
    for (int wi = 0; wi < kWarpsQk; ++wi) sum += s_dw[wi][j];
    atomicAdd(dw + j, sum);
  }
}

bool fusable(int64_t D, int64_t R, std::initializer_list<const void*> ptrs) {
  if ((D != 64 && D != 128 && D != 256) || R != D) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

QkFreq freq_table(const float* inv_freq, int64_t D) {
  QkFreq fr{};
  for (int64_t i = 0; i < D / 2; ++i) fr.f[i] = inv_freq[i];
  return fr;
}

unsigned qk_grid(int64_t tokens) { return grid_for(tokens, kWarpsQk, int64_t(num_sms()) * 8); }

// Runs body with LPR (lanes per row) and POS bound as compile-time constants.
template <typename F>
void dispatch_rows(int64_t D, bool with_pos, F&& body) {
  auto by_pos = [&](auto lpr) {
    if (with_pos) body(lpr, std::true_type{});
    else body(lpr, std::false_type{});
  };
  if (D == 64) by_pos(std::integral_constant<int, 8>{});
  else if (D == 128) by_pos(std::integral_constant<int, 16>{});
  else by_pos(std::integral_constant<int, 32>{});
}

}  // namespace

bool k_qk_norm_rope_fwd(DType t, const void* x, const void* w, void* y, const int32_t* pos, int64_t tokens,
                        int64_t L, int64_t heads, int64_t D, int64_t R, float eps, float w_off,
                        const float* inv_freq, float scale, cudaStream_t st) {
  if (!fusable(D, R, {x, w, y})) return false;
  if (tokens <= 0 || heads <= 0) return true;
  const QkFreq fr = freq_table(inv_freq, D);
  RP_DISPATCH_16("qk_norm_rope_fwd", t, T, dispatch_rows(D, pos != nullptr, [&](auto lpr, auto with_pos) {
                   qk_norm_rope_fwd_kernel<T, decltype(lpr)::value, decltype(with_pos)::value>
                       <<<qk_grid(tokens), kThreadsQk, 0, st>>>(
                           static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), pos,
                           tokens, L, int(heads), eps, w_off, fr, scale);
                 }));
  RP_CUDA_LAUNCH_CHECK("qk_norm_rope_fwd");
  return true;
}

bool k_qk_norm_rope_bwd(DType t, const void* x, const void* w, const void* dy, void* dx, float* dw,
                        const int32_t* pos, int64_t tokens, int64_t L, int64_t heads, int64_t D, int64_t R,
                        float eps, float w_off, const float* inv_freq, float scale, cudaStream_t st) {
  if (!fusable(D, R, {x, w, dy, dx})) return false;
  if (tokens <= 0 || heads <= 0) return true;
  const QkFreq fr = freq_table(inv_freq, D);
  RP_DISPATCH_16("qk_norm_rope_bwd", t, T, dispatch_rows(D, pos != nullptr, [&](auto lpr, auto with_pos) {
                   qk_norm_rope_bwd_kernel<T, decltype(lpr)::value, decltype(with_pos)::value>
                       <<<qk_grid(tokens), kThreadsQk, 0, st>>>(
                           static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(dy),
                           static_cast<T*>(dx), dw, pos, tokens, L, int(heads), eps, w_off, fr, scale);
                 }));
  RP_CUDA_LAUNCH_CHECK("qk_norm_rope_bwd");
  return true;
}

}  // namespace rp::cuda
