// The kernels GPT-OSS adds to the CUDA backend (HF transformers GptOssForCausalLM; CPU twin:
// kernels/cpu/cpu_gptoss.cpp; formulas: kernels/ops.hpp):
//  - attention with a sliding window and per-head sink logits (Xiao et al. 2023) on rows: one
//    warp per (query row, head) with shuffles, O(rows * visible keys * D); the path for any
//    even head_dim <= 256, for KV-cache decoding, and the cross-check of the tensor-core
//    variant kernels (cuda_attention_variant.cu). Query row t of sequence s (absolute position
//    past + t) sees keys j with lo(t) <= j <= past + t, lo = max(first key of its example
//    (t - pos[s*Lq + t], clamped into [0, t]; 0 without pos), past + t - window + 1 (window
//    > 0)). A sink joins the softmax as one more logit sinks[h] without a value row.
//  - dsinks[h] += -sum_rows exp(sinks[h] - lse) * Di, one block per head, a fixed-order
//    fp32 sum (deterministic).
//  - per-group bias add and its deterministic fp32 column sums.
//  - the clamped SwiGLU of GptOssExperts and its backward (torch.clamp's gradient: 0 at the
//    bounds).
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
/// First visible key of query row t (token index `row` of pos) at absolute position past + t.
__device__ __forceinline__ int first_key_v(const int32_t* pos, int64_t row, int t, int past, int window) {
  int lo = pos ? t - min(max(pos[row], 0), t) : 0;
  if (window > 0) lo = max(lo, past + t - window + 1);
  return lo;
}

// q, o [n_seq*Lq, nq, D]; k, v rows of sequence sq at (sq*Lk + j); lse [n_seq, nq, Lq].
template <typename T>
__global__ void __launch_bounds__(128) var_fwd_kernel(const T* q, const T* k, const T* v, T* o, float* lse,
                                                      const int32_t* pos, const T* sinks, int window, int n_seq,
                                                      int Lq, int Lk, int past, int nq, int nkv, int D,
                                                      float scale) {
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
  float m = sinks ? to_f(sinks[h]) : -INFINITY, l = sinks ? 1.f : 0.f;
  for (int j = first_key_v(pos, tok, t, past, window); j <= past + t; ++j) {
    const int64_t kr = (int64_t(sq) * Lk + j) * nkv + kh;
    load_row(k + kr * D, D, lane, x);
    const float s = dot_row(qv, x) * scale;
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

template <typename T>
__global__ void __launch_bounds__(128) var_bwd_dq_kernel(const T* q, const T* k, const T* v, const float* lse,
                                                         const float* di, const T* dout, const int32_t* pos, T* dq,
                                                         int window, int n_seq, int L, int nq, int nkv, int D,
                                                         float scale) {
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
  for (int j = first_key_v(pos, tok, t, 0, window); j <= t; ++j) {
    const int64_t kr = (int64_t(sq) * L + j) * nkv + kh;
    load_row(k + kr * D, D, lane, x);
    const float p = expf(dot_row(qv, x) * scale - ls);
    load_row(v + kr * D, D, lane, y);
    const float ds = p * (dot_row(gv, y) - dd);
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[e] += ds * x[e];
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int d = lane + 32 * e;
    if (d < D) dq[w * D + d] = from_f<T>(acc[e] * scale);
  }
}

// Key row j takes the query rows t >= j that see it: inside the window (t < j + window) and
// of its example (first key <= j; the first keys of packed examples do not decrease with t).
template <typename T>
__global__ void __launch_bounds__(128) var_bwd_dkdv_kernel(const T* q, const T* k, const T* v, const float* lse,
                                                           const float* di, const T* dout, const int32_t* pos,
                                                           T* dk, T* dv, int window, int n_seq, int L, int nq,
                                                           int nkv, int D, float scale) {
  const int64_t w = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // (s, j, kh)
  if (w >= int64_t(n_seq) * L * nkv) return;
  const int lane = threadIdx.x % 32;
  const int kh = int(w % nkv);
  const int64_t tok = w / nkv;
  const int j = int(tok % L), sq = int(tok / L);
  const int rep = nq / nkv;
  const int t_end = window > 0 ? min(L, j + window) : L;
  float kv[kE], vv[kE], ak[kE], av[kE], x[kE], y[kE];
  load_row(k + w * D, D, lane, kv);
  load_row(v + w * D, D, lane, vv);
#pragma unroll
  for (int e = 0; e < kE; ++e) ak[e] = av[e] = 0.f;
  for (int t = j; t < t_end && first_key_v(pos, int64_t(sq) * L + t, t, 0, 0) <= j; ++t) {
    for (int h = kh * rep; h < (kh + 1) * rep; ++h) {
      const int64_t qrw = (int64_t(sq) * L + t) * nq + h;
      load_row(q + qrw * D, D, lane, x);
      load_row(dout + qrw * D, D, lane, y);
      const float p = expf(dot_row(x, kv) * scale - lse[(int64_t(sq) * nq + h) * L + t]);
      const float ds = p * (dot_row(y, vv) - di[(int64_t(sq) * nq + h) * L + t]);
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        av[e] += p * y[e];
        ak[e] += ds * x[e];
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

// Di = rowsum(dO * O) per (row, head), fp32 [n_seq, nq, L].
template <typename T>
__global__ void __launch_bounds__(128) var_di_kernel(const T* o, const T* dout, float* di, int64_t rows, int L,
                                                     int nq, int D) {
  const int64_t w = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // (s, t, h)
  if (w >= rows) return;
  const int lane = threadIdx.x % 32;
  float a[kE], b[kE];
  load_row(o + w * D, D, lane, a);
  load_row(dout + w * D, D, lane, b);
  const float d = dot_row(a, b);
  const int h = int(w % nq);
  const int64_t tok = w / nq;
  if (lane == 0) di[(tok / L * nq + h) * L + tok % L] = d;
}

// dsinks[h] += -sum_{s,t} exp(sinks[h] - lse[s,h,t]) * Di[s,h,t]: block h, thread i sums the
// rows i, i + 256, ... in order, then a fixed tree over the threads (deterministic).
constexpr int kSinkThreads = 256;
template <typename T>
__global__ void __launch_bounds__(kSinkThreads) dsinks_kernel(const T* sinks, const float* lse, const float* di,
                                                              float* dsinks, int n_seq, int L, int nq) {
  __shared__ float part[kSinkThreads];
  const int h = blockIdx.x;
  const float sk = to_f(sinks[h]);
  float acc = 0.f;
  for (int64_t r = threadIdx.x; r < int64_t(n_seq) * L; r += kSinkThreads) {
    const int64_t i = (r / L * nq + h) * L + r % L;
    acc += expf(sk - lse[i]) * di[i];
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int o = kSinkThreads / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) part[threadIdx.x] += part[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks[h] -= part[0];
}

// ---- per-group bias ----------------------------------------------------------------------

/// The row offsets of up to kGroups groups (by value: kernel parameters).
constexpr int kGroups = 256;
struct GroupOffsets {
  int32_t off[kGroups + 1];
};

// y[r, c] += b[g, c] for the rows r of group g (binary search of r in the offsets).
template <typename T>
__global__ void bias_fwd_kernel(T* y, const T* b, GroupOffsets go, int ng, int64_t N) {
  const int64_t r0 = go.off[0], total = (int64_t(go.off[ng]) - r0) * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = r0 + i / N, c = i % N;
    int lo = 0, hi = ng - 1;  // the last group whose first row <= r
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (go.off[mid] <= r) lo = mid;
      else hi = mid - 1;
    }
    T* p = y + r * N + c;
    *p = from_f<T>(to_f(*p) + to_f(b[int64_t(lo) * N + c]));
  }
}

// db[g, c] += sum of dy[r, c] over the rows of group g: block (32 columns, group); each of
// kRowLanes row lanes sums the rows r = first + lane, first + lane + kRowLanes, ... in order,
// then the lanes are added in a fixed order (deterministic, no atomics).
constexpr int kRowLanes = 16;
template <typename T>
__global__ void __launch_bounds__(32 * kRowLanes) bias_bwd_kernel(const T* dy, float* db, GroupOffsets go,
                                                                  int64_t N) {
  __shared__ float part[kRowLanes][33];
  const int g = blockIdx.y, cx = threadIdx.x % 32, lane = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * 32 + cx;
  float acc = 0.f;
  if (c < N)
    for (int64_t r = go.off[g] + lane; r < go.off[g + 1]; r += kRowLanes) acc += to_f(dy[r * N + c]);
  part[lane][cx] = acc;
  __syncthreads();
  if (lane == 0 && c < N) {
    float s = 0.f;
    for (int i = 0; i < kRowLanes; ++i) s += part[i][cx];
    db[int64_t(g) * N + c] += s;
  }
}

// ---- clamped SwiGLU ----------------------------------------------------------------------

template <typename T>
__global__ void swiglu_clamped_fwd_kernel(const T* g, const T* u, T* h, int64_t n, float alpha, float limit) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gc = fminf(to_f(g[i]), limit), uc = fminf(fmaxf(to_f(u[i]), -limit), limit);
    const float s = 1.f / (1.f + expf(-alpha * gc));
    h[i] = from_f<T>((uc + 1.f) * (gc * s));
  }
}

template <typename T>
__global__ void swiglu_clamped_bwd_kernel(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n, float alpha,
                                          float limit) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = to_f(g[i]), ui = to_f(u[i]), d = to_f(dh[i]);
    const float gc = fminf(gi, limit), uc = fminf(fmaxf(ui, -limit), limit);
    const float s = 1.f / (1.f + expf(-alpha * gc));
    dg[i] = from_f<T>(gi < limit ? d * (uc + 1.f) * (s + alpha * gc * s * (1.f - s)) : 0.f);
    du[i] = from_f<T>(ui > -limit && ui < limit ? d * gc * s : 0.f);
  }
}

void check(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, const char* op) {
  if (n_seq < 0 || L < 0 || nq <= 0 || nkv <= 0 || nq % nkv != 0 || D <= 0 || D % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": bad dimensions");
  if (D > 32 * kE) throw std::invalid_argument(std::string(op) + ": head_dim > 256 is not supported on CUDA");
  if (L > (int64_t(1) << 30)) throw std::invalid_argument(std::string(op) + ": sequence too long");
}

// Calls fn(first group, group count) for chunks of at most kGroups groups, with their offsets.
template <class Fn>
void for_group_chunks(const int32_t* offsets_host, int64_t E, Fn&& fn) {
  for (int64_t e0 = 0; e0 < E; e0 += kGroups) {
    const int ng = int(std::min<int64_t>(kGroups, E - e0));
    GroupOffsets go{};
    for (int i = 0; i <= ng; ++i) go.off[i] = offsets_host[e0 + i];
    fn(e0, ng, go);
  }
}

}  // namespace

void k_attention_rows_fwd_v(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                            const int32_t* pos, const void* sinks, int64_t window, int64_t n_seq, int64_t Lq,
                            int64_t Lk, int64_t past, int64_t nq, int64_t nkv, int64_t D, float scale,
                            cudaStream_t st) {
  check(n_seq, Lq, nq, nkv, D, "attention_fwd_v");
  const int64_t warps = n_seq * Lq * nq;
  if (warps == 0) return;
  const int win = int(std::min<int64_t>(window, int64_t(1) << 30));
  RP_DISPATCH_16("attention_fwd_v", t, T, {
    var_fwd_kernel<T><<<unsigned((warps + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), lse, pos,
        static_cast<const T*>(sinks), win, int(n_seq), int(Lq), int(Lk), int(past), int(nq), int(nkv), int(D),
        scale);
  });
  RP_CUDA_LAUNCH_CHECK("attention_fwd_v (rows)");
}

void k_attention_di(DType t, const void* o, const void* dout, float* di, int64_t n_seq, int64_t L, int64_t nq,
                    int64_t D, cudaStream_t st) {
  const int64_t rows = n_seq * L * nq;
  if (rows == 0) return;
  RP_DISPATCH_16("attention_bwd_v Di", t, T, {
    var_di_kernel<T><<<unsigned((rows + 3) / 4), 128, 0, st>>>(static_cast<const T*>(o),
                                                               static_cast<const T*>(dout), di, rows, int(L),
                                                               int(nq), int(D));
  });
  RP_CUDA_LAUNCH_CHECK("attention_bwd_v Di");
}

void k_attention_rows_bwd_v(DType t, const void* q, const void* k, const void* v, const float* lse,
                            const float* di, const void* dout, const int32_t* pos, void* dq, void* dk, void* dv,
                            int64_t window, int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D,
                            float scale, cudaStream_t st) {
  check(n_seq, L, nq, nkv, D, "attention_bwd_v");
  const int64_t rows = n_seq * L * nq;
  if (rows == 0) return;
  const int win = int(std::min<int64_t>(window, int64_t(1) << 30));
  RP_DISPATCH_16("attention_bwd_v", t, T, {
    var_bwd_dq_kernel<T><<<unsigned((rows + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
        static_cast<const T*>(dout), pos, static_cast<T*>(dq), win, int(n_seq), int(L), int(nq), int(nkv), int(D),
        scale);
    const int64_t kr = n_seq * L * nkv;
    var_bwd_dkdv_kernel<T><<<unsigned((kr + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
        static_cast<const T*>(dout), pos, static_cast<T*>(dk), static_cast<T*>(dv), win, int(n_seq), int(L),
        int(nq), int(nkv), int(D), scale);
  });
  RP_CUDA_LAUNCH_CHECK("attention_bwd_v (rows)");
}

void k_attention_dsinks(DType t, const void* sinks, const float* lse, const float* di, float* dsinks, int64_t n_seq,
                        int64_t L, int64_t nq, cudaStream_t st) {
  if (n_seq * L == 0 || nq == 0) return;
  RP_DISPATCH_16("attention_bwd_v dsinks", t, T, {
    dsinks_kernel<T><<<unsigned(nq), kSinkThreads, 0, st>>>(static_cast<const T*>(sinks), lse, di, dsinks,
                                                            int(n_seq), int(L), int(nq));
  });
  RP_CUDA_LAUNCH_CHECK("attention_bwd_v dsinks");
}

void k_grouped_bias_fwd(DType t, void* y, const void* b, const int32_t* offsets_host, int64_t E, int64_t N,
                        cudaStream_t st) {
  if (N == 0) return;
  RP_DISPATCH_16("grouped_bias_fwd", t, T, {
    for_group_chunks(offsets_host, E, [&](int64_t e0, int ng, const GroupOffsets& go) {
      const int64_t total = (int64_t(go.off[ng]) - go.off[0]) * N;
      if (total == 0) return;
      bias_fwd_kernel<T><<<grid_for(total, 256), 256, 0, st>>>(static_cast<T*>(y),
                                                               static_cast<const T*>(b) + e0 * N, go, ng, N);
      RP_CUDA_LAUNCH_CHECK("grouped_bias_fwd");
    });
  });
}

void k_grouped_bias_bwd(DType t, const void* dy, float* db, const int32_t* offsets_host, int64_t E, int64_t N,
                        cudaStream_t st) {
  if (N == 0) return;
  RP_DISPATCH_16("grouped_bias_bwd", t, T, {
    for_group_chunks(offsets_host, E, [&](int64_t e0, int ng, const GroupOffsets& go) {
      const dim3 grid(unsigned((N + 31) / 32), unsigned(ng));
      bias_bwd_kernel<T><<<grid, 32 * kRowLanes, 0, st>>>(static_cast<const T*>(dy), db + e0 * N, go, N);
      RP_CUDA_LAUNCH_CHECK("grouped_bias_bwd");
    });
  });
}

void k_swiglu_clamped_fwd(DType t, const void* g, const void* u, void* h, int64_t n, float alpha, float limit,
                          cudaStream_t st) {
  if (n <= 0) return;
  RP_DISPATCH_16("swiglu_clamped_fwd", t, T, {
    swiglu_clamped_fwd_kernel<T><<<grid_for(n, 256), 256, 0, st>>>(
        static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(h), n, alpha, limit);
  });
  RP_CUDA_LAUNCH_CHECK("swiglu_clamped_fwd");
}

void k_swiglu_clamped_bwd(DType t, const void* g, const void* u, const void* dh, void* dg, void* du, int64_t n,
                          float alpha, float limit, cudaStream_t st) {
  if (n <= 0) return;
  RP_DISPATCH_16("swiglu_clamped_bwd", t, T, {
    swiglu_clamped_bwd_kernel<T><<<grid_for(n, 256), 256, 0, st>>>(
        static_cast<const T*>(g), static_cast<const T*>(u), static_cast<const T*>(dh), static_cast<T*>(dg),
        static_cast<T*>(du), n, alpha, limit);
  });
  RP_CUDA_LAUNCH_CHECK("swiglu_clamped_bwd");
}

}  // namespace rp::cuda
