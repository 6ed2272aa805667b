// Packed sequences and KV-cache attention for the CUDA backend (CPU twin:
// kernels/cpu/cpu_packed.cpp): RoPE at given positions, and causal attention whose keys
// are restricted per query row, one warp per (row, head) with shuffles (the "simple path"
// of cuda_attention.cu with a first key per row): O(rows * keys * D) work, no shared memory.
// Query row t of sequence s attends to keys [t - pos[s*Lq + t], past + t] of that sequence
// (pos null: from key 0); packing uses past = 0 and positions that restart per example,
// generation uses one sequence of n new rows after `past` cached ones.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kE = 8;  // elements per lane (head_dim <= 256)
constexpr int kThreadsRope = 256;

struct Freq {
  float f[256];
};

template <typename T>
__global__ void rope_at_kernel(T* x, const int32_t* pos, int64_t total, int heads, int half, Freq fr, float scale,
                               float sign) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(i % half);
    const int64_t th = i / half;  // (token, head)
    const int64_t t = th / heads;
    const float a = float(max(pos[t], 0)) * fr.f[d];
    const float c = cosf(a) * scale, s = sign * sinf(a) * scale;
    T* x0 = x + th * 2 * half;
    const float u = to_f(x0[d]), w = to_f(x0[d + half]);
    x0[d] = from_f<T>(u * c - w * s);
    x0[d + half] = from_f<T>(w * c + u * s);
  }
}

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
/// First key of query row t (its example's first token), clamped into [0, t].
__device__ __forceinline__ int first_key(const int32_t* pos, int64_t row, int t) {
  return pos ? t - min(max(pos[row], 0), t) : 0;
}

// q, o [n_seq*Lq, nq, D]; k, v rows of sequence sq at (sq*Lk + j); lse [n_seq, nq, Lq].
template <typename T>
__global__ void __launch_bounds__(128) fwd_kernel(const T* q, const T* k, const T* v, T* o, float* lse,
                                                  const int32_t* pos, int n_seq, int Lq, int Lk, int past, int nq,
                                                  int nkv, int D, float scale) {
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
  float m = -INFINITY, l = 0.f;
  for (int j = first_key(pos, tok, t); j <= past + t; ++j) {
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

// Di = rowsum(dO * O) per (row, head), fp32 [n_seq, nq, L].
template <typename T>
__global__ void __launch_bounds__(128) di_kernel(const T* o, const T* dout, float* di, int64_t rows, int L, int nq,
                                                 int D) {
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

template <typename T>
__global__ void __launch_bounds__(128) bwd_dq_kernel(const T* q, const T* k, const T* v, const float* lse,
                                                     const float* di, const T* dout, const int32_t* pos, T* dq,
                                                     int n_seq, int L, int nq, int nkv, int D, float scale) {
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
  for (int j = first_key(pos, tok, t); j <= t; ++j) {
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

// Key row j takes the query rows t >= j of its example (first_key(t) <= j).
template <typename T>
__global__ void __launch_bounds__(128) bwd_dkdv_kernel(const T* q, const T* k, const T* v, const float* lse,
                                                       const float* di, const T* dout, const int32_t* pos, T* dk,
                                                       T* dv, int n_seq, int L, int nq, int nkv, int D, float scale) {
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
  for (int t = j; t < L && first_key(pos, int64_t(sq) * L + t, t) <= j; ++t) {
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

void check(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, const char* op) {
  if (n_seq < 0 || L < 0 || nq <= 0 || nkv <= 0 || nq % nkv != 0 || D <= 0 || D % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": bad dimensions");
  if (D > 32 * kE) throw std::invalid_argument(std::string(op) + ": head_dim > 256 is not supported on CUDA");
}

}  // namespace

void k_rope_at(DType t, void* x, const int32_t* pos, int64_t T, int64_t heads, int64_t D, const float* inv_freq,
               float scale, bool transpose, cudaStream_t st) {
  const int64_t half = D / 2;
  if (half > 256) throw std::invalid_argument("rope_at: head_dim > 512 is not supported on CUDA");
  const int64_t total = T * heads * half;
  if (total <= 0) return;
  Freq fr{};
  for (int64_t i = 0; i < half; ++i) fr.f[i] = inv_freq[i];
  RP_DISPATCH_16("rope_at", t, T_,
                 rope_at_kernel<T_><<<grid_for(total, kThreadsRope), kThreadsRope, 0, st>>>(
                     static_cast<T_*>(x), pos, total, int(heads), int(half), fr, scale, transpose ? -1.f : 1.f));
  RP_CUDA_LAUNCH_CHECK("rope_at");
}

void k_attention_rows_fwd(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                          const int32_t* pos, int64_t n_seq, int64_t Lq, int64_t Lk, int64_t past, int64_t nq,
                          int64_t nkv, int64_t D, float scale, cudaStream_t st) {
  check(n_seq, Lq, nq, nkv, D, "attention_fwd_packed");
  const int64_t warps = n_seq * Lq * nq;
  if (warps == 0) return;
  RP_DISPATCH_16("attention_fwd_packed", t, T, {
    fwd_kernel<T><<<unsigned((warps + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), lse, pos,
        int(n_seq), int(Lq), int(Lk), int(past), int(nq), int(nkv), int(D), scale);
  });
  RP_CUDA_LAUNCH_CHECK("attention_fwd_packed");
}

void k_attention_packed_bwd(DType t, const void* q, const void* k, const void* v, const void* o, const float* lse,
                            const void* dout, const int32_t* pos, void* dq, void* dk, void* dv, int64_t n_seq,
                            int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale, void* scratch,
                            cudaStream_t st) {
  check(n_seq, L, nq, nkv, D, "attention_bwd_packed");
  const int64_t rows = n_seq * L * nq;
  if (rows == 0) return;
  float* di = static_cast<float*>(scratch);  // [n_seq, nq, L], within the attention scratch contract
  RP_DISPATCH_16("attention_bwd_packed", t, T, {
    di_kernel<T><<<unsigned((rows + 3) / 4), 128, 0, st>>>(static_cast<const T*>(o), static_cast<const T*>(dout), di,
                                                           rows, int(L), int(nq), int(D));
    bwd_dq_kernel<T><<<unsigned((rows + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
        static_cast<const T*>(dout), pos, static_cast<T*>(dq), int(n_seq), int(L), int(nq), int(nkv), int(D), scale);
    const int64_t kr = n_seq * L * nkv;
    bwd_dkdv_kernel<T><<<unsigned((kr + 3) / 4), 128, 0, st>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
        static_cast<const T*>(dout), pos, static_cast<T*>(dk), static_cast<T*>(dv), int(n_seq), int(L), int(nq),
        int(nkv), int(D), scale);
  });
  RP_CUDA_LAUNCH_CHECK("attention_bwd_packed");
}

}  // namespace rp::cuda
