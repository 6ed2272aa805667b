// CUDA kernels: memory helpers (fill, cast, add_into), residual add, SwiGLU and GeGLU, all
// through one element-wise launcher (kVec elements at a time where the pointers are 16-byte
// aligned). fp32 arithmetic on 16-bit storage; the formulas are those of the CPU twin
// (kernels/cpu/cpu_ops.cpp). The row kernels (embedding, RMSNorm, RoPE, cross-entropy):
// kernels/cuda/cuda_rowwise.cu.
#include "kernels/cuda/cuda_amax.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;

// ---- generic element-wise launcher ------------------------------------------------
// f(i, n_valid) handles elements [i, i+N) (N = kVec on the vector path, 1 on the tail).
template <bool VEC, typename F>
__global__ void __launch_bounds__(kThreads) ew_kernel(int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (VEC) {
    const int64_t nv = n / kVec;
    for (int64_t i = tid; i < nv; i += stride) f.template apply<kVec, true>(i * kVec);
    for (int64_t i = nv * kVec + tid; i < n; i += stride) f.template apply<1, false>(i);
  } else {
    for (int64_t i = tid; i < n; i += stride) f.template apply<1, false>(i);
  }
}

// The same for a functor whose apply_amax also returns the largest |value| it stored (fp32
// bits): the block's largest is max-ed into *amax (an FP8 scale computed in this pass).
template <bool VEC, typename F>
__global__ void __launch_bounds__(kThreads) ew_amax_kernel(int64_t n, F f, unsigned* amax) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned m = 0;
  if constexpr (VEC) {
    const int64_t nv = n / kVec;
    for (int64_t i = tid; i < nv; i += stride) m = max(m, f.template apply_amax<kVec, true>(i * kVec));
    for (int64_t i = nv * kVec + tid; i < n; i += stride) m = max(m, f.template apply_amax<1, false>(i));
  } else {
    for (int64_t i = tid; i < n; i += stride) m = max(m, f.template apply_amax<1, false>(i));
  }
  block_amax_into<kThreads>(m, amax);
}

// The same for a functor whose apply_amax2 returns the largest |value| of each of its two
// outputs (fp32 bits): max-ed into *amax_a and *amax_b (two FP8 scales computed in this pass).
template <bool VEC, typename F>
__global__ void __launch_bounds__(kThreads)
    ew_amax2_kernel(int64_t n, F f, unsigned* amax_a, unsigned* amax_b) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint2 m{0u, 0u};
  const auto take = [&m](uint2 v) {
    m.x = max(m.x, v.x);
    m.y = max(m.y, v.y);
  };
  if constexpr (VEC) {
    const int64_t nv = n / kVec;
    for (int64_t i = tid; i < nv; i += stride) take(f.template apply_amax2<kVec, true>(i * kVec));
    for (int64_t i = nv * kVec + tid; i < n; i += stride) take(f.template apply_amax2<1, false>(i));
  } else {
    for (int64_t i = tid; i < n; i += stride) take(f.template apply_amax2<1, false>(i));
  }
  block_amax_into<kThreads>(m.x, amax_a);
  block_amax_into<kThreads>(m.y, amax_b);
}

template <typename F>
void launch_ew(const char* name, int64_t n, bool vec, F f, cudaStream_t st) {
  if (n <= 0) return;
  if (vec) {
    ew_kernel<true><<<grid_for(n, int64_t(kThreads) * kVec), kThreads, 0, st>>>(n, f);
  } else {
    ew_kernel<false><<<grid_for(n, kThreads), kThreads, 0, st>>>(n, f);
  }
  RP_CUDA_LAUNCH_CHECK(name);
}

template <typename F>
void launch_ew_amax(const char* name, int64_t n, bool vec, F f, unsigned* amax, cudaStream_t st) {
  if (n <= 0) return;
  if (vec) {
    ew_amax_kernel<true><<<grid_for(n, int64_t(kThreads) * kVec), kThreads, 0, st>>>(n, f, amax);
  } else {
    ew_amax_kernel<false><<<grid_for(n, kThreads), kThreads, 0, st>>>(n, f, amax);
  }
  RP_CUDA_LAUNCH_CHECK(name);
}

template <typename F>
void launch_ew_amax2(const char* name, int64_t n, bool vec, F f, unsigned* amax_a, unsigned* amax_b,
                     cudaStream_t st) {
  if (n <= 0) return;
  if (vec) {
    ew_amax2_kernel<true><<<grid_for(n, int64_t(kThreads) * kVec), kThreads, 0, st>>>(n, f, amax_a, amax_b);
  } else {
    ew_amax2_kernel<false><<<grid_for(n, kThreads), kThreads, 0, st>>>(n, f, amax_a, amax_b);
  }
  RP_CUDA_LAUNCH_CHECK(name);
}

template <typename T>
struct FillF {
  T* x;
  float v;
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    float a[N];
#pragma unroll
    for (int j = 0; j < N; ++j) a[j] = v;
    store_n<N, V>(x + i, a);
  }
};

template <typename D, typename S>
struct CastF {
  D* dst;
  const S* src;
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    float a[N];
    load_n<N, V>(src + i, a);
    store_n<N, V>(dst + i, a);
  }
};

template <typename D, typename S>
struct AddIntoF {
  D* dst;
  const S* src;
  float alpha;
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    float a[N], b[N];
    load_n<N, V>(dst + i, a);
    load_n<N, V>(src + i, b);
#pragma unroll
    for (int j = 0; j < N; ++j) a[j] = a[j] + alpha * b[j];
    store_n<N, V>(dst + i, a);
  }
};

template <typename T>
struct AddF {
  const T *a, *b;
  T* y;
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    float x[N], z[N];
    load_n<N, V>(a + i, x);
    load_n<N, V>(b + i, z);
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] += z[j];
    store_n<N, V>(y + i, x);
  }
};

template <typename T>
struct SwigluFwdF {
  const T *g, *u;
  T* h;
  // stores h[i, i+N) and returns the largest |h| stored (as rounded to T; fp32 bits)
  template <int N, bool V>
  __device__ unsigned apply_amax(int64_t i) const {
    float a[N], b[N];
    load_n<N, V>(g + i, a);
    load_n<N, V>(u + i, b);
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      a[j] = to_f(from_f<T>(a[j] / (1.0f + expf(-a[j])) * b[j]));
      m = max(m, abs_bits(a[j]));
    }
    store_n<N, V>(h + i, a);
    return m;
  }
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    apply_amax<N, V>(i);
  }
};

template <typename T>
struct SwigluBwdF {
  const T *g, *u, *dh;
  T *dg, *du;
  // stores dg, du [i, i+N) and returns the largest |dg| and |du| stored (as rounded to T; fp32
  // bits), in .x and .y
  template <int N, bool V>
  __device__ uint2 apply_amax2(int64_t i) const {
    float a[N], b[N], d[N], rg[N], ru[N];
    load_n<N, V>(g + i, a);
    load_n<N, V>(u + i, b);
    load_n<N, V>(dh + i, d);
    uint2 m{0u, 0u};
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float s = 1.0f / (1.0f + expf(-a[j]));
      ru[j] = to_f(from_f<T>(d[j] * a[j] * s));
      rg[j] = to_f(from_f<T>(d[j] * b[j] * s * (1.0f + a[j] * (1.0f - s))));
      m.x = max(m.x, abs_bits(rg[j]));
      m.y = max(m.y, abs_bits(ru[j]));
    }
    store_n<N, V>(du + i, ru);
    store_n<N, V>(dg + i, rg);
    return m;
  }
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    apply_amax2<N, V>(i);
  }
};

// GeGLU (Gemma's MLP): h = gelu_tanh(g) * u, as CpuOps::geglu_fwd / geglu_bwd
__device__ __forceinline__ float gelu_tanh_t(float z) {
  return tanhf(0.7978845608028654f * (z + 0.044715f * z * z * z));
}

template <typename T>
struct GegluFwdF {
  const T *g, *u;
  T* h;
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    float a[N], b[N];
    load_n<N, V>(g + i, a);
    load_n<N, V>(u + i, b);
#pragma unroll
    for (int j = 0; j < N; ++j) a[j] = 0.5f * a[j] * (1.0f + gelu_tanh_t(a[j])) * b[j];
    store_n<N, V>(h + i, a);
  }
};

template <typename T>
struct GegluBwdF {
  const T *g, *u, *dh;
  T *dg, *du;
  template <int N, bool V>
  __device__ void apply(int64_t i) const {
    float a[N], b[N], d[N], rg[N], ru[N];
    load_n<N, V>(g + i, a);
    load_n<N, V>(u + i, b);
    load_n<N, V>(dh + i, d);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float t = gelu_tanh_t(a[j]);
      ru[j] = d[j] * 0.5f * a[j] * (1.0f + t);
      rg[j] = d[j] * b[j] *
              (0.5f * (1.0f + t) +
               0.5f * a[j] * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * a[j] * a[j]));
    }
    store_n<N, V>(du + i, ru);
    store_n<N, V>(dg + i, rg);
  }
};

}  // namespace

// ---- launchers ----------------------------------------------------------------------------

void k_fill(DType t, void* x, int64_t n, float v, cudaStream_t st) {
  RP_DISPATCH_ANY("fill", t, T, launch_ew("fill", n, aligned16(x), FillF<T>{static_cast<T*>(x), v}, st));
}

void k_cast(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, cudaStream_t st) {
  const bool vec = aligned16(dst) && aligned16(src);
  RP_DISPATCH_ANY(
      "cast", dst_t, D,
      RP_DISPATCH_ANY(
          "cast", src_t, S,
          launch_ew("cast", n, vec, CastF<D, S>{static_cast<D*>(dst), static_cast<const S*>(src)}, st)));
}

void k_add_into(DType dst_t, void* dst, DType src_t, const void* src, int64_t n, float alpha,
                cudaStream_t st) {
  const bool vec = aligned16(dst) && aligned16(src);
  RP_DISPATCH_ANY(
      "add_into", dst_t, D,
      RP_DISPATCH_ANY(
          "add_into", src_t, S,
          launch_ew("add_into", n, vec,
                    AddIntoF<D, S>{static_cast<D*>(dst), static_cast<const S*>(src), alpha}, st)));
}

void k_add(DType t, const void* a, const void* b, void* y, int64_t n, cudaStream_t st) {
  const bool vec = aligned16(a) && aligned16(b) && aligned16(y);
  RP_DISPATCH_16(
      "add", t, T,
      launch_ew("add", n, vec,
                AddF<T>{static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y)}, st));
}

void k_swiglu_fwd(DType t, const void* g, const void* u, void* h, int64_t n, cudaStream_t st,
                  unsigned* amax) {
  const bool vec = aligned16(g) && aligned16(u) && aligned16(h);
  RP_DISPATCH_16("swiglu_fwd", t, T, {
    const SwigluFwdF<T> f{static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(h)};
    if (amax) launch_ew_amax("swiglu_fwd", n, vec, f, amax, st);
    else launch_ew("swiglu_fwd", n, vec, f, st);
  });
}

void k_swiglu_bwd(DType t, const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                  cudaStream_t st, unsigned* amax_dg, unsigned* amax_du) {
  const bool vec = aligned16(g) && aligned16(u) && aligned16(dh) && aligned16(dg) && aligned16(du);
  RP_DISPATCH_16("swiglu_bwd", t, T, {
    const SwigluBwdF<T> f{static_cast<const T*>(g), static_cast<const T*>(u), static_cast<const T*>(dh),
                          static_cast<T*>(dg), static_cast<T*>(du)};
    if (amax_dg && amax_du) launch_ew_amax2("swiglu_bwd", n, vec, f, amax_dg, amax_du, st);
    else launch_ew("swiglu_bwd", n, vec, f, st);
  });
}

void k_geglu_fwd(DType t, const void* g, const void* u, void* h, int64_t n, cudaStream_t st) {
  const bool vec = aligned16(g) && aligned16(u) && aligned16(h);
  RP_DISPATCH_16(
      "geglu_fwd", t, T,
      launch_ew("geglu_fwd", n, vec,
                GegluFwdF<T>{static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(h)}, st));
}

void k_geglu_bwd(DType t, const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                 cudaStream_t st) {
  const bool vec = aligned16(g) && aligned16(u) && aligned16(dh) && aligned16(dg) && aligned16(du);
  RP_DISPATCH_16("geglu_bwd", t, T,
                 launch_ew("geglu_bwd", n, vec,
                           GegluBwdF<T>{static_cast<const T*>(g), static_cast<const T*>(u),
                                        static_cast<const T*>(dh), static_cast<T*>(dg), static_cast<T*>(du)},
                           st));
}

}  // namespace rp::cuda
