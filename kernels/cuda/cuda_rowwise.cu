// CUDA kernels that work row by row: the embedding lookup and its scatter-add, RMSNorm (one
// warp per row), RoPE and the cross-entropy rows of the chunked LM head. fp32 arithmetic on
// 16-bit storage; the formulas are those of the CPU twin (kernels/cpu/cpu_ops.cpp,
// cpu_attention.cpp). The element-wise kernels: kernels/cuda/cuda_elementwise.cu.
#include <algorithm>
#include <map>
#include <utility>

#include "kernels/cuda/cuda_amax.cuh"
#include "kernels/cuda/cuda_arch.hpp"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_norm_rope.cuh"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;

// ---- embedding ----------------------------------------------------------------------

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    embedding_fwd_kernel(const int32_t* ids, const T* table, T* y, int64_t H, int64_t V,
                         volatile unsigned* err) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  T* yr = y + t * H;
  const bool ok = id >= 0 && id < V;
  if (!ok && threadIdx.x == 0) err[kErrEmbeddingId] = 1u;
  const T* tr = table + (ok ? int64_t(id) * H : 0);
  constexpr int N = VEC ? kVec : 1;
  for (int64_t j = int64_t(threadIdx.x) * N; j < H; j += int64_t(blockDim.x) * N) {
    float a[N];
    if (ok) {
      load_n<N, VEC>(tr + j, a);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) a[e] = 0.f;
    }
    store_n<N, VEC>(yr + j, a);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    embedding_bwd_kernel(const int32_t* ids, const T* dy, float* dtable, int64_t H, int64_t V,
                         int64_t padding_idx, volatile unsigned* err) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0) err[kErrEmbeddingId] = 1u;
    return;
  }
  if (id == padding_idx) return;  // nn.Embedding(padding_idx=...): that row gets no gradient
  const T* dr = dy + t * H;
  float* out = dtable + int64_t(id) * H;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) atomicAdd(out + j, to_f(dr[j]));
}

// ---- RMSNorm: one warp per row ---------------------------------------------------------

// AMAX: also max-es the largest |y| stored (fp32 bits) into *amax, one atomic per block.
template <typename T, bool VEC, bool AMAX>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_fwd_kernel(const T* x, const T* w, T* y, int64_t R, int64_t n, float eps, float w_off,
                       unsigned* amax) {
  constexpr int N = VEC ? kVec : 1;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  unsigned m = 0;
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < R; r += warps) {
    const T* xr = x + r * n;
    float ss = 0.f;
    for (int64_t j = int64_t(lane) * N; j < n; j += 32 * N) {
      float a[N];
      load_n<N, VEC>(xr + j, a);
      ss = rms_sum_squares(a, ss);
    }
    ss = warp_sum(ss);
    const float rs = rms_inverse(ss, n, eps);
    T* yr = y + r * n;
    for (int64_t j = int64_t(lane) * N; j < n; j += 32 * N) {
      float a[N], b[N];
      load_n<N, VEC>(xr + j, a);
      load_n<N, VEC>(w + j, b);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        a[e] = rms_output<T>(a[e], rs, b[e], w_off);
        if constexpr (AMAX) m = max(m, abs_bits(to_f(from_f<T>(a[e]))));
      }
      store_n<N, VEC>(yr + j, a);
    }
  }
  if constexpr (AMAX) block_amax_into<kThreads>(m, amax);
}

// rmsnorm_fwd_kernel for rows of at most kRegChunks * 256 columns (n % 8 == 0, 16-byte aligned
// rows): a lane's chunks j = lane*8 + k*256 are all loaded before any is used and stay in
// registers for the output, so a row costs one memory round trip instead of one per chunk plus
// a second pass. Same adds in the same order as rmsnorm_fwd_kernel: the same bits.
constexpr int kRegChunks = 16;
template <typename T, bool AMAX>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_fwd_regs_kernel(const T* x, const T* w, T* y, int64_t R, int64_t n, float eps, float w_off,
                            unsigned* amax) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  unsigned m = 0;
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < R; r += warps) {
    uint4 raw[kRegChunks];
    const float rs = rms_row_in_registers(x + r * n, n, eps, raw);
    T* yr = y + r * n;
#pragma unroll
    for (int k = 0; k < kRegChunks; ++k) {
      const int64_t j = int64_t(lane) * 8 + k * 256;
      if (j >= n) continue;
      float a[8], b[8];
      load_n<8, true>(reinterpret_cast<const T*>(&raw[k]), a);
      load_n<8, true>(w + j, b);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        a[e] = rms_output<T>(a[e], rs, b[e], w_off);
        if constexpr (AMAX) m = max(m, abs_bits(to_f(from_f<T>(a[e]))));
      }
      store_n<8, true>(yr + j, a);
    }
  }
  if constexpr (AMAX) block_amax_into<kThreads>(m, amax);
}

// dw partial sums live in shared memory and are added to dw once per block: one row of
// n floats per warp (PER_WARP: plain adds, each lane owns its columns) or one row shared
// by the block's warps (shared-memory atomics; for long rows). C > 0 (VEC rows of at most
// C * 256 columns): a lane's chunks of x and dy are all loaded before any is used and stay in
// registers for the second pass, as rmsnorm_fwd_regs_kernel; the same adds in the same order.
template <typename T, bool VEC, bool PER_WARP, int C = 0>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_bwd_kernel(const T* x, const T* w, const T* dy, T* dx, float* dw, int64_t R, int64_t n, float eps,
                       bool acc, float w_off) {
  static_assert(C == 0 || VEC, "register rows need 16-byte chunks");
  extern __shared__ float s_all[];
  constexpr int N = VEC ? kVec : 1;
  constexpr int kWarps = kThreads / 32;
  const bool want_dw = dw != nullptr;  // null: a frozen norm, no weight gradient
  if (want_dw)
    for (int64_t j = threadIdx.x; j < n * (PER_WARP ? kWarps : 1); j += blockDim.x) s_all[j] = 0.f;
  __syncthreads();
  float* s_dw = PER_WARP ? s_all + (threadIdx.x / 32) * n : s_all;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < R; r += warps) {
    const T* xr = x + r * n;
    const T* dr = dy + r * n;
    T* dxr = dx + r * n;
    float ss = 0.f, gx = 0.f, rs = 0.f, c = 0.f;
    auto sums = [&](const float(&a)[N], const float(&d)[N], int64_t j) {
      float b[N];
      load_n<N, VEC>(w + j, b);
      ss = rms_sum_squares(a, ss);
      gx = rms_grad_dot(d, b, a, w_off, gx);
    };
    auto finish = [&] {
      ss = warp_sum(ss);
      gx = warp_sum(gx);
      rs = rms_inverse(ss, n, eps);
      c = gx * rs / float(n);  // mean(g * xh)
    };
    auto output = [&](const float(&a)[N], const float(&d)[N], int64_t j) {
      float b[N], o[N];
      load_n<N, VEC>(w + j, b);
      if (acc) load_n<N, VEC>(dxr + j, o);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float v = rms_input_grad(a[e], d[e], b[e], w_off, rs, c);
        o[e] = acc ? o[e] + v : v;
        if (!want_dw) continue;
        if constexpr (PER_WARP) s_dw[j + e] += __fmul_rn(__fmul_rn(d[e], a[e]), rs);
        else atomicAdd(&s_dw[j + e], __fmul_rn(__fmul_rn(d[e], a[e]), rs));
      }
      store_n<N, VEC>(dxr + j, o);
    };
    if constexpr (C > 0) {
      uint4 xa[C], da[C];
#pragma unroll
      for (int k = 0; k < C; ++k)
        if (int64_t(lane) * 8 + k * 256 < n) {
          xa[k] = *reinterpret_cast<const uint4*>(xr + lane * 8 + k * 256);
          da[k] = *reinterpret_cast<const uint4*>(dr + lane * 8 + k * 256);
        }
      float a[N], d[N];
#pragma unroll
      for (int k = 0; k < C; ++k)
        if (int64_t(lane) * 8 + k * 256 < n) {
          load_n<N, true>(reinterpret_cast<const T*>(&xa[k]), a);
          load_n<N, true>(reinterpret_cast<const T*>(&da[k]), d);
          sums(a, d, lane * 8 + k * 256);
        }
      finish();
#pragma unroll
      for (int k = 0; k < C; ++k)
        if (int64_t(lane) * 8 + k * 256 < n) {
          load_n<N, true>(reinterpret_cast<const T*>(&xa[k]), a);
          load_n<N, true>(reinterpret_cast<const T*>(&da[k]), d);
          output(a, d, lane * 8 + k * 256);
        }
    } else {
      float a[N], d[N];
      for (int64_t j = int64_t(lane) * N; j < n; j += 32 * N) {
        load_n<N, VEC>(xr + j, a);
        load_n<N, VEC>(dr + j, d);
        sums(a, d, j);
      }
      finish();
      for (int64_t j = int64_t(lane) * N; j < n; j += 32 * N) {
        load_n<N, VEC>(xr + j, a);
        load_n<N, VEC>(dr + j, d);
        output(a, d, j);
      }
    }
  }
  if (!want_dw) return;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float t = 0.f;
#pragma unroll
    for (int wi = 0; wi < (PER_WARP ? kWarps : 1); ++wi) t += s_all[wi * n + j];
    atomicAdd(dw + j, t);
  }
}

// ---- RoPE ------------------------------------------------------------------------------

struct RopeFreq {
  float f[256];
};

// One thread per (token, pair i, i+1 of frequencies): sincos once, applied to every head
// with 4-byte loads (half and D must be even and x 4-byte aligned). Heads are D apart; the
// first 2*half features of each rotate (partial rotary when 2*half < D).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rope_pairs_kernel(T* x, int64_t tokens, int64_t L, int64_t heads, int64_t D, int half, RopeFreq fr,
                      float scale, float sign) {
  const int hp = half / 2;
  const int64_t total = tokens * hp;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int i = int(idx % hp) * 2;
    const int64_t t = idx / hp;
    const float p = float(t % L);
    float s0, c0, s1, c1;
    rope_cos_sin(p, fr.f[i], scale, sign, c0, s0);
    rope_cos_sin(p, fr.f[i + 1], scale, sign, c1, s1);
    T* base = x + t * heads * D;
    for (int64_t hd = 0; hd < heads; ++hd) {
      T* r = base + hd * D;
      alignas(4) T lo2[2];
      alignas(4) T hi2[2];
      *reinterpret_cast<uint32_t*>(lo2) = *reinterpret_cast<const uint32_t*>(r + i);
      *reinterpret_cast<uint32_t*>(hi2) = *reinterpret_cast<const uint32_t*>(r + i + half);
      float y0, y1, z0, z1;
      rope_rotate(to_f(lo2[0]), to_f(hi2[0]), c0, s0, y0, z0);
      rope_rotate(to_f(lo2[1]), to_f(hi2[1]), c1, s1, y1, z1);
      lo2[0] = from_f<T>(y0);
      lo2[1] = from_f<T>(y1);
      hi2[0] = from_f<T>(z0);
      hi2[1] = from_f<T>(z1);
      *reinterpret_cast<uint32_t*>(r + i) = *reinterpret_cast<const uint32_t*>(lo2);
      *reinterpret_cast<uint32_t*>(r + i + half) = *reinterpret_cast<const uint32_t*>(hi2);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(T* x, int64_t total, int64_t L, int64_t heads, int64_t D, int half, RopeFreq fr, float scale,
                float sign) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int i = int(idx % half);
    const int64_t row = idx / half;  // (token, head)
    const int64_t t = row / heads;
    float s, c, y0, y1;
    rope_cos_sin(float(t % L), fr.f[i], scale, sign, c, s);
    T* p = x + row * D;
    rope_rotate(to_f(p[i]), to_f(p[i + half]), c, s, y0, y1);
    p[i] = from_f<T>(y0);
    p[i + half] = from_f<T>(y1);
  }
}

// ---- cross-entropy rows -----------------------------------------------------------------

constexpr int kCeThreads = 1024;

__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;
  s = s * expf(m - mm) + s2 * expf(m2 - mm);
  m = mm;
}

template <typename T, bool VEC>
__global__ void __launch_bounds__(kCeThreads)
    ce_rows_kernel(T* z, const int32_t* targets, int64_t V, float* row_loss, bool grad, float cap,
                   volatile unsigned* err) {
  constexpr int N = VEC ? kVec : 1;
  __shared__ float sm[32], ss[32];
  __shared__ float s_lse;
  const int64_t r = blockIdx.x;
  T* zr = z + r * V;
  const int32_t tg = targets[r];
  if (tg >= V && threadIdx.x == 0) err[kErrTarget] = 1u;
  if (tg < 0 || tg >= V) {
    if (threadIdx.x == 0) row_loss[r] = 0.f;
    if (grad) {
      float zero[N];
#pragma unroll
      for (int e = 0; e < N; ++e) zero[e] = 0.f;
      for (int64_t j = int64_t(threadIdx.x) * N; j < V; j += int64_t(blockDim.x) * N)
        store_n<N, VEC>(zr + j, zero);
    }
    return;
  }
  float m = -INFINITY, s = 0.f;
  for (int64_t j = int64_t(threadIdx.x) * N; j < V; j += int64_t(blockDim.x) * N) {
    float a[N];
    load_n<N, VEC>(zr + j, a);
#pragma unroll
    for (int e = 0; e < N; ++e) a[e] = soft_cap(a[e], cap);
    float lm = a[0];
#pragma unroll
    for (int e = 1; e < N; ++e) lm = fmaxf(lm, a[e]);
    float ls = 0.f;
#pragma unroll
    for (int e = 0; e < N; ++e) ls += expf(a[e] - lm);
    online_merge(m, s, lm, ls);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  const int wid = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[wid] = m;
    ss[wid] = s;
  }
  __syncthreads();
  if (wid == 0) {
    const int nw = blockDim.x / 32;
    m = lane < nw ? sm[lane] : -INFINITY;
    s = lane < nw ? ss[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      online_merge(m, s, m2, s2);
    }
    if (lane == 0) {
      const float lse = m + logf(s);
      s_lse = lse;
      row_loss[r] = lse - soft_cap(to_f(zr[tg]), cap);
    }
  }
  __syncthreads();
  if (!grad) return;
  const float lse = s_lse;
  for (int64_t j = int64_t(threadIdx.x) * N; j < V; j += int64_t(blockDim.x) * N) {
    float a[N];
    load_n<N, VEC>(zr + j, a);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      // soft-capped: d/dz of cap * tanh(z / cap) is 1 - tanh^2
      const float th = cap > 0.f ? tanhf(a[e] / cap) : 0.f;
      const float zc = cap > 0.f ? cap * th : a[e];
      a[e] = (expf(zc - lse) - (j + e == tg ? 1.0f : 0.0f)) * (cap > 0.f ? 1.f - th * th : 1.f);
    }
    store_n<N, VEC>(zr + j, a);
  }
}

__global__ void __launch_bounds__(1024)
    ce_reduce_kernel(const float* row_loss, const int32_t* targets, int64_t n, int64_t V, float* loss) {
  __shared__ float s1[1024], s2[1024];
  float a = 0.f, c = 0.f;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    a += row_loss[r];
    c += (targets[r] >= 0 && targets[r] < V) ? 1.f : 0.f;
  }
  s1[threadIdx.x] = a;
  s2[threadIdx.x] = c;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) {
      s1[threadIdx.x] += s1[threadIdx.x + o];
      s2[threadIdx.x] += s2[threadIdx.x + o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss[0] += s1[0];
    loss[1] += s2[0];
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------

void k_embedding_fwd(DType t, const int32_t* ids, const void* table, void* y, int64_t T_, int64_t H,
                     int64_t V, unsigned* err, cudaStream_t st) {
  if (T_ <= 0 || H <= 0) return;
  const bool vec = H % kVec == 0 && aligned16(table) && aligned16(y);
  RP_DISPATCH_16("embedding_fwd", t, T, {
    if (vec)
      embedding_fwd_kernel<T, true><<<unsigned(T_), kThreads, 0, st>>>(ids, static_cast<const T*>(table),
                                                                       static_cast<T*>(y), H, V, err);
    else
      embedding_fwd_kernel<T, false><<<unsigned(T_), kThreads, 0, st>>>(ids, static_cast<const T*>(table),
                                                                        static_cast<T*>(y), H, V, err);
  });
  RP_CUDA_LAUNCH_CHECK("embedding_fwd");
}

void k_embedding_bwd(DType t, const int32_t* ids, const void* dy, float* dtable, int64_t T_, int64_t H,
                     int64_t V, int64_t padding_idx, unsigned* err, cudaStream_t st) {
  if (T_ <= 0 || H <= 0) return;
  RP_DISPATCH_16("embedding_bwd", t, T,
                 embedding_bwd_kernel<T><<<unsigned(T_), kThreads, 0, st>>>(ids, static_cast<const T*>(dy),
                                                                            dtable, H, V, padding_idx, err));
  RP_CUDA_LAUNCH_CHECK("embedding_bwd");
}

void k_rmsnorm_fwd(DType t, const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                   float w_off, cudaStream_t st, unsigned* amax) {
  if (R <= 0) return;
  const bool vec = n % kVec == 0 && aligned16(x) && aligned16(w) && aligned16(y);
  const unsigned grid = grid_for(R, kThreads / 32, int64_t(num_sms()) * 16);
  // rows of 2-16 chunks a lane in registers; a row of one chunk has no second pass to save, and
  // there the register kernel's unused chunks only cost occupancy (q/k norms: 3x slower)
  const bool regs = vec && n >= 512 && n <= int64_t(kRegChunks) * 256;
  RP_DISPATCH_16("rmsnorm_fwd", t, T, {
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(w);
    T* yt = static_cast<T*>(y);
    if (regs && amax)
      rmsnorm_fwd_regs_kernel<T, true><<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, amax);
    else if (regs)
      rmsnorm_fwd_regs_kernel<T, false><<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, nullptr);
    else if (vec && amax)
      rmsnorm_fwd_kernel<T, true, true><<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, amax);
    else if (vec)
      rmsnorm_fwd_kernel<T, true, false><<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, nullptr);
    else if (amax)
      rmsnorm_fwd_kernel<T, false, true><<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, amax);
    else
      rmsnorm_fwd_kernel<T, false, false><<<grid, kThreads, 0, st>>>(xt, wt, yt, R, n, eps, w_off, nullptr);
  });
  RP_CUDA_LAUNCH_CHECK("rmsnorm_fwd");
}

void k_rmsnorm_bwd(DType t, const void* x, const void* w, const void* dy, void* dx, float* dw, int64_t R,
                   int64_t n, float eps, bool accumulate_dx, float w_off, cudaStream_t st) {
  if (R <= 0) return;
  const bool vec = n % kVec == 0 && aligned16(x) && aligned16(w) && aligned16(dy) && aligned16(dx);
  const bool per_warp = size_t(n) * sizeof(float) * (kThreads / 32) <= size_t(96) << 10;
  const size_t smem = size_t(n) * sizeof(float) * (per_warp ? kThreads / 32 : 1);
  if (smem > size_t(max_dynamic_smem()))
    throw std::invalid_argument("rmsnorm_bwd: rows longer than " + std::to_string(max_dynamic_smem() / 4) +
                                " columns are not supported on this GPU");
  RP_DISPATCH_16("rmsnorm_bwd", t, T, {
    // rows of 512 to 2048 / 3072 columns keep x and dy in registers (2-8 / 12 chunks a lane;
    // shorter rows have no second pass to save, as in k_rmsnorm_fwd)
    auto kern = vec && per_warp && n >= 512 && n <= 2048   ? rmsnorm_bwd_kernel<T, true, true, 8>
                : vec && per_warp && n >= 512 && n <= 3072 ? rmsnorm_bwd_kernel<T, true, true, 12>
                : vec ? (per_warp ? rmsnorm_bwd_kernel<T, true, true> : rmsnorm_bwd_kernel<T, true, false>)
                      : (per_warp ? rmsnorm_bwd_kernel<T, false, true> : rmsnorm_bwd_kernel<T, false, false>);
    if (smem > 48 * 1024)
      RP_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    // exactly the blocks that fit on the chip at once, each summing many rows into its shared
    // dw partial: with more, the shared memory of the partials (64 KiB per block at 2048
    // columns) leaves a last wave that runs a fraction of the chip
    thread_local std::map<std::pair<const void*, size_t>, int> fits;  // (kernel, smem) -> blocks per SM
    auto [it, fresh] = fits.try_emplace({reinterpret_cast<const void*>(kern), smem}, 0);
    if (fresh)
      RP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kern, kThreads, smem));
    const int per_sm = it->second;
    const unsigned grid = grid_for(R, kThreads / 32, int64_t(num_sms()) * std::max(per_sm, 1));
    kern<<<grid, kThreads, smem, st>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                       static_cast<const T*>(dy), static_cast<T*>(dx), dw, R, n, eps,
                                       accumulate_dx, w_off);
  });
  RP_CUDA_LAUNCH_CHECK("rmsnorm_bwd");
}

void k_rope(DType t, void* x, int64_t n_seq, int64_t L, int64_t heads, int64_t D, int64_t R,
            const float* inv_freq, float scale, bool transpose, cudaStream_t st) {
  const int64_t half = R / 2;
  if (half > 256) throw std::invalid_argument("rope: rotary_dim > 512 is not supported on CUDA");
  const int64_t total = n_seq * L * heads * half;
  if (total <= 0) return;
  RopeFreq fr{};
  for (int64_t i = 0; i < half; ++i) fr.f[i] = inv_freq[i];
  const float sign = transpose ? -1.f : 1.f;
  if (half % 2 == 0 && (reinterpret_cast<uintptr_t>(x) & 3u) == 0) {
    const int64_t work = n_seq * L * (half / 2);
    RP_DISPATCH_16("rope", t, T,
                   rope_pairs_kernel<T>
                   <<<grid_for(work, kThreads, int64_t(num_sms()) * 32), kThreads, 0, st>>>(
                       static_cast<T*>(x), n_seq * L, L, heads, D, int(half), fr, scale, sign));
  } else {
    RP_DISPATCH_16("rope", t, T,
                   rope_kernel<T><<<grid_for(total, kThreads, int64_t(num_sms()) * 32), kThreads, 0, st>>>(
                       static_cast<T*>(x), total, L, heads, D, int(half), fr, scale, sign));
  }
  RP_CUDA_LAUNCH_CHECK("rope");
}

void k_ce_rows(DType t, void* z, const int32_t* targets, int64_t n, int64_t V, float* row_loss, bool grad,
               unsigned* err, cudaStream_t st, float softcap) {
  if (n <= 0) return;
  const bool vec = V % kVec == 0 && aligned16(z);
  RP_DISPATCH_16("lm_head_cross_entropy", t, T, {
    if (vec)
      ce_rows_kernel<T, true>
          <<<unsigned(n), kCeThreads, 0, st>>>(static_cast<T*>(z), targets, V, row_loss, grad, softcap, err);
    else
      ce_rows_kernel<T, false>
          <<<unsigned(n), kCeThreads, 0, st>>>(static_cast<T*>(z), targets, V, row_loss, grad, softcap, err);
  });
  RP_CUDA_LAUNCH_CHECK("ce_rows");
}

void k_ce_reduce(const float* row_loss, const int32_t* targets, int64_t n, int64_t V, float* loss,
                 cudaStream_t st) {
  if (n <= 0) return;
  ce_reduce_kernel<<<1, 1024, 0, st>>>(row_loss, targets, n, V, loss);
  RP_CUDA_LAUNCH_CHECK("ce_reduce");
}

}  // namespace rp::cuda
