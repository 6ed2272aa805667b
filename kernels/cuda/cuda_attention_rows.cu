// Causal GQA attention on rows, the one implementation behind every non-tensor-core attention
// of the CUDA backend (CPU twins: kernels/cpu/cpu_packed.cpp, kernels/cpu/cpu_gptoss.cpp,
// kernels/cpu/cpu_attention.cpp; formulas: kernels/ops.hpp):
//  - the simple path of the plain attention (cuda_attention.cu: odd head_dims, impl 1),
//  - packed sequences and KV-cache decoding (cuda_ops_packed.cpp),
//  - GPT-OSS's attention with a sliding window and per-head sink logits (Xiao et al. 2023)
//    where the tensor-core variant kernels (cuda_attention_variant.cu) do not apply, and their
//    cross-check.
// One warp per (query row, head) with shuffles: O(rows * visible keys * D) work, no shared
// memory, any even head_dim <= 256. Query row t of sequence s (absolute position past + t)
// sees keys j with lo(t) <= j <= past + t, lo = max(first key of its example
// (t - pos[s*Lq + t], clamped into [0, t]; 0 without pos), past + t - window + 1 (window > 0)).
// A sink joins the softmax as one more logit sinks[h] without a value row. The window and the
// sinks are template flags, so the plain instantiations carry no code for them. cap > 0 soft-caps
// every score (Gemma 2: s = cap * tanh(s / cap) before the softmax; 0: none).
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kE = 8;  // elements per lane (head_dim <= 256)

template <typename T>
__device__ __forceinline__ void load_row(const T* p, int D, int lane, float (&x)[kE]) {
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int d = lane + 32 * e;
    x[e] = d < D ? to_f(p[d]) : 0.f;
  }
}
__device__ __forceinline__ float dot_row(const float (&a)[kE], const float (&b)[kE]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < kE; ++e) s += a[e] * b[e];
  return warp_sum(s);
}
/// exp(soft_cap(raw, cap) - ls), and in dcap the derivative of the cap at raw (1 - tanh^2; 1
/// without a cap): the backward's P and its dS factor.
__device__ __forceinline__ float capped_p(float raw, float cap, float ls, float& dcap) {
  if (cap > 0.f) {
    const float th = tanhf(raw / cap);
    dcap = 1.f - th * th;
    return expf(cap * th - ls);
  }
  dcap = 1.f;
  return expf(raw - ls);
}
/// First visible key of query row t (token index `row` of pos) at absolute position past + t.
template <bool kWindow>
__device__ __forceinline__ int first_key(const int32_t* pos, int64_t row, int t, int past, int window) {
  int lo = pos ? t - min(max(pos[row], 0), t) : 0;
  if constexpr (kWindow) lo = max(lo, past + t - window + 1);
  return lo;
}

// q, o [n_seq*Lq, nq, D]; k, v rows of sequence sq at (sq*Lk + j); lse [n_seq, nq, Lq].
template <typename T, bool kWindow, bool kSinks>
__global__ void __launch_bounds__(128)
    rows_fwd_kernel(const T* q, const T* k, const T* v, T* o, float* lse, const int32_t* pos, const T* sinks,
                    int window, int n_seq, int Lq, int Lk, int past, int nq, int nkv, int D, float scale,
                    float cap) {
  const int64_t w = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // (s, t, h)
  if (w >= int64_t(n_seq) * Lq * nq) return;
  const int lane = threadIdx.x % 32;
  const int h = int(w % nq);
  const int64_t tok = w / nq;
  const int t = int(tok % Lq), sq = int(tok / Lq);
  const int kh = h / (nq / nkv);
  float qv[kE], acc[kE], x[kE];
  load_row(q + w * D, D, lane, qv);
#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = 0.f;
  // the sink: a logit of its own, exp(sink - m) in the denominator, no value row
  float m = -INFINITY, l = 0.f;
  if constexpr (kSinks) m = to_f(sinks[h]), l = 1.f;
  for (int j = first_key<kWindow>(pos, tok, t, past, window); j <= past + t; ++j) {
    const int64_t kr = (int64_t(sq) * Lk + j) * nkv + kh;
    load_row(k + kr * D, D, lane, x);
    const float s = soft_cap(dot_row(qv, x) * scale, cap);
    const float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
    l = l * c + p;
    m = mn;
    load_row(v + kr * D, D, lane, x);
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[e] = acc[e] * c + p * x[e];
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int d = lane + 32 * e;
    if (d < D) o[w * D + d] = from_f<T>(acc[e] / l);
  }
  if (lse && lane == 0) lse[(int64_t(sq) * nq + h) * Lq + t] = m + logf(l);
}

// Di = rowsum(dO * O) per (row, head), fp32 [n_seq, nq, L]; one warp per row, any D.
template <typename T>
__global__ void __launch_bounds__(256)
    di_kernel(const T* o, const T* dout, float* di, int64_t rows, int L, int nq, int D) {
  const int64_t r = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = r / nq, h = r % nq;  // r = token * nq + head
  const T* a = o + r * D;
  const T* b = dout + r * D;
  float s = 0.f;
  for (int d = lane; d < D; d += 32) s += to_f(a[d]) * to_f(b[d]);
  s = warp_sum(s);
  if (lane == 0) {
    const int64_t sq = t / L, tt = t % L;
    di[(sq * nq + h) * L + tt] = s;
  }
}

template <typename T, bool kWindow>
__global__ void __launch_bounds__(128)
    rows_bwd_dq_kernel(const T* q, const T* k, const T* v, const float* lse, const float* di, const T* dout,
                       const int32_t* pos, T* dq, int window, int n_seq, int L, int nq, int nkv, int D,
                       float scale, float cap) {
  const int64_t w = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (w >= int64_t(n_seq) * L * nq) return;
  const int lane = threadIdx.x % 32;
  const int h = int(w % nq);
  const int64_t tok = w / nq;
  const int t = int(tok % L), sq = int(tok / L);
  const int kh = h / (nq / nkv);
  const float ls = lse[(int64_t(sq) * nq + h) * L + t], dd = di[(int64_t(sq) * nq + h) * L + t];
  float qv[kE], gv[kE], acc[kE], x[kE], y[kE];
  load_row(q + w * D, D, lane, qv);
  load_row(dout + w * D, D, lane, gv);
#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = 0.f;
  for (int j = first_key<kWindow>(pos, tok, t, 0, window); j <= t; ++j) {
    const int64_t kr = (int64_t(sq) * L + j) * nkv + kh;
    load_row(k + kr * D, D, lane, x);
    float dcap;
    const float p = capped_p(dot_row(qv, x) * scale, cap, ls, dcap);
    load_row(v + kr * D, D, lane, y);
    const float ds = p * (dot_row(gv, y) - dd) * dcap;
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[e] += ds * x[e];
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int d = lane + 32 * e;
    if (d < D) dq[w * D + d] = from_f<T>(acc[e] * scale);
  }
}

/// One (query row, head) term of key row kv/vv's dV and dK sums (x, y: scratch rows).
template <typename T>
__device__ __forceinline__ void dkdv_step(const T* qr, const T* gr, float ls, float dd, const float (&kv)[kE],
                                          const float (&vv)[kE], float (&ak)[kE], float (&av)[kE],
                                          float (&x)[kE], float (&y)[kE], int D, int lane, float scale,
                                          float cap) {
  load_row(qr, D, lane, x);
  load_row(gr, D, lane, y);
  float dcap;
  const float p = capped_p(dot_row(x, kv) * scale, cap, ls, dcap);
  const float ds = p * (dot_row(y, vv) - dd) * dcap;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    av[e] += p * y[e];
    ak[e] += ds * x[e];
  }
}

// Key row j takes the query rows t >= j that see it: inside the window (t < j + window) and
// of its example (first key <= j; the first keys of packed examples do not decrease with t),
// row by row, each row's query heads in turn. kHeadsOuter (no pos, no window: every t >= j)
// sums head by head instead, the order of the plain attention's simple path.
template <typename T, bool kWindow, bool kHeadsOuter>
__global__ void __launch_bounds__(128)
    rows_bwd_dkdv_kernel(const T* q, const T* k, const T* v, const float* lse, const float* di, const T* dout,
                         const int32_t* pos, T* dk, T* dv, int window, int n_seq, int L, int nq, int nkv,
                         int D, float scale, float cap) {
  const int64_t w = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // (s, j, kh)
  if (w >= int64_t(n_seq) * L * nkv) return;
  const int lane = threadIdx.x % 32;
  const int kh = int(w % nkv);
  const int64_t tok = w / nkv;
  const int j = int(tok % L), sq = int(tok / L);
  const int rep = nq / nkv;
  float kv[kE], vv[kE], ak[kE], av[kE], x[kE], y[kE];
  load_row(k + w * D, D, lane, kv);
  load_row(v + w * D, D, lane, vv);
#pragma unroll
  for (int e = 0; e < kE; ++e) ak[e] = av[e] = 0.f;
  if constexpr (kHeadsOuter) {
    for (int h = kh * rep; h < (kh + 1) * rep; ++h) {
      const float* lr = lse + (int64_t(sq) * nq + h) * L;
      const float* dr = di + (int64_t(sq) * nq + h) * L;
      for (int t = j; t < L; ++t) {
        const int64_t qrw = (int64_t(sq) * L + t) * nq + h;
        dkdv_step(q + qrw * D, dout + qrw * D, lr[t], dr[t], kv, vv, ak, av, x, y, D, lane, scale, cap);
      }
    }
  } else {
    const int t_end = kWindow ? min(L, j + window) : L;
    for (int t = j; t < t_end && first_key<false>(pos, int64_t(sq) * L + t, t, 0, 0) <= j; ++t) {
      for (int h = kh * rep; h < (kh + 1) * rep; ++h) {
        const int64_t qrw = (int64_t(sq) * L + t) * nq + h;
        const int64_t sr = (int64_t(sq) * nq + h) * L + t;
        dkdv_step(q + qrw * D, dout + qrw * D, lse[sr], di[sr], kv, vv, ak, av, x, y, D, lane, scale, cap);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int d = lane + 32 * e;
    if (d < D) {
      dk[w * D + d] = from_f<T>(ak[e] * scale);
      dv[w * D + d] = from_f<T>(av[e]);
    }
  }
}

void check(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, const char* op) {
  if (n_seq < 0 || L < 0 || nq <= 0 || nkv <= 0 || nq % nkv != 0 || D <= 0 || D % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": bad dimensions");
  if (D > 32 * kE) throw std::invalid_argument(std::string(op) + ": head_dim > 256 is not supported on CUDA");
  if (L > (int64_t(1) << 30)) throw std::invalid_argument(std::string(op) + ": sequence too long");
}

}  // namespace

void k_attention_rows_fwd_v(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                            const int32_t* pos, const void* sinks, int64_t window, int64_t n_seq, int64_t Lq,
                            int64_t Lk, int64_t past, int64_t nq, int64_t nkv, int64_t D, float scale,
                            cudaStream_t st, float softcap) {
  check(n_seq, Lq, nq, nkv, D, "attention_fwd (rows)");
  const int64_t warps = n_seq * Lq * nq;
  if (warps == 0) return;
  const int win = int(std::min<int64_t>(window, int64_t(1) << 30));
  RP_DISPATCH_16("attention_fwd (rows)", t, T, {
    auto launch = [&](auto kernel) {
      kernel<<<unsigned((warps + 3) / 4), 128, 0, st>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o),
          lse, pos, static_cast<const T*>(sinks), win, int(n_seq), int(Lq), int(Lk), int(past), int(nq),
          int(nkv), int(D), scale, softcap);
    };
    if (win > 0 && sinks) launch(rows_fwd_kernel<T, true, true>);
    else if (win > 0) launch(rows_fwd_kernel<T, true, false>);
    else if (sinks) launch(rows_fwd_kernel<T, false, true>);
    else launch(rows_fwd_kernel<T, false, false>);
  });
  RP_CUDA_LAUNCH_CHECK("attention_fwd (rows)");
}

void k_attention_di(DType t, const void* o, const void* dout, float* di, int64_t n_seq, int64_t L, int64_t nq,
                    int64_t D, cudaStream_t st) {
  const int64_t rows = n_seq * L * nq;
  if (rows == 0) return;
  RP_DISPATCH_16("attention Di", t, T, {
    di_kernel<T><<<unsigned((rows + 7) / 8), 256, 0, st>>>(
        static_cast<const T*>(o), static_cast<const T*>(dout), di, rows, int(L), int(nq), int(D));
  });
  RP_CUDA_LAUNCH_CHECK("attention Di");
}

void k_attention_rows_bwd_v(DType t, const void* q, const void* k, const void* v, const float* lse,
                            const float* di, const void* dout, const int32_t* pos, void* dq, void* dk,
                            void* dv, int64_t window, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv,
                            int64_t D, float scale, cudaStream_t st, bool heads_outer, float softcap) {
  check(n_seq, L, nq, nkv, D, "attention_bwd (rows)");
  if (heads_outer && (pos != nullptr || window > 0))
    throw std::invalid_argument("attention_bwd (rows): heads_outer needs pos null and window 0");
  const int64_t rows = n_seq * L * nq;
  if (rows == 0) return;
  const int win = int(std::min<int64_t>(window, int64_t(1) << 30));
  RP_DISPATCH_16("attention_bwd (rows)", t, T, {
    auto dq_kernel = win > 0 ? rows_bwd_dq_kernel<T, true> : rows_bwd_dq_kernel<T, false>;
    dq_kernel<<<unsigned((rows + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
        static_cast<const T*>(dout), pos, static_cast<T*>(dq), win, int(n_seq), int(L), int(nq), int(nkv),
        int(D), scale, softcap);
    const int64_t kr = n_seq * L * nkv;
    auto dkdv_kernel = heads_outer ? rows_bwd_dkdv_kernel<T, false, true>
                       : win > 0   ? rows_bwd_dkdv_kernel<T, true, false>
                                   : rows_bwd_dkdv_kernel<T, false, false>;
    dkdv_kernel<<<unsigned((kr + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
        static_cast<const T*>(dout), pos, static_cast<T*>(dk), static_cast<T*>(dv), win, int(n_seq), int(L),
        int(nq), int(nkv), int(D), scale, softcap);
  });
  RP_CUDA_LAUNCH_CHECK("attention_bwd (rows)");
}

}  // namespace rp::cuda
