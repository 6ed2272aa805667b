// Causal grouped-query attention for the CUDA backend, memory linear in sequence length.
//
// Tensor-core path (head_dim 64 or 128, 16-byte aligned tensors): FlashAttention-2
// style kernels (Dao 2023, "FlashAttention-2", Alg. 1 and 2) on mma.sync m16n8k16 with
// bf16/f16 operands and fp32 accumulation:
//  - forward: one block of W warps (16 query rows each) per (16*W query rows, query
//    head, sequence); K/V tiles of 64 keys stream through shared memory (cp.async,
//    double-buffered); online softmax in registers; writes O and the row logsumexp.
//  - backward: Di = rowsum(dO*O) first; then one block of 8 warps per (64 keys, kv
//    head, sequence) walks the query heads of its group and the query tiles at or below
//    the diagonal, recomputing P from the saved logsumexp; dK and dV stay in registers,
//    dQ is accumulated in fp32 with (float2) atomics and cast at the end.
//  Two configurations, both tested: 2 = W 4 and an unpipelined backward, 3 = W 8 and
//  Q/dO tiles double-buffered in the backward. On the H200 they time within noise of
//  each other (bench/results/cuda_ops.md); 3 is the default.
//  Measured (H200, L=8192, 16/8 heads, D=128): forward ~175 TFLOP/s, backward ~133;
//  the next step for speed is Hopper's wgmma (FlashAttention-3 style) or cuDNN's SDPA.
// Simple path (any even head_dim <= 256, or forced): one warp per row with shuffles,
// O(L^2 D) work and no shared memory; used for odd shapes and as a cross-check.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

using namespace flash;

// ---- simple path: one warp per row ------------------------------------------------------------

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

template <typename T>
__global__ void __launch_bounds__(128) simple_fwd_kernel(const T* q, const T* k, const T* v, T* o,
                                                         float* lse, int n_seq, int L, int nq,
                                                         int nkv, int D, float scale) {
  const int64_t w = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // (s, t, h)
  if (w >= int64_t(n_seq) * L * nq) return;
  const int lane = threadIdx.x % 32;
  const int h = int(w % nq);
  const int64_t tok = w / nq;
  const int t = int(tok % L), sq = int(tok / L);
  const int kh = h / (nq / nkv);
  float qv[kE], acc[kE], x[kE];
  load_row(q + w * D, D, lane, qv);
#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j <= t; ++j) {
    const int64_t kr = (int64_t(sq) * L + j) * nkv + kh;
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
  if (lse && lane == 0) lse[(int64_t(sq) * nq + h) * L + t] = m + logf(l);
}

template <typename T>
__global__ void __launch_bounds__(128) simple_bwd_dq_kernel(const T* q, const T* k, const T* v,
                                                            const float* lse, const float* di,
                                                            const T* dout, T* dq, int n_seq, int L,
                                                            int nq, int nkv, int D, float scale) {
  const int64_t w = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (w >= int64_t(n_seq) * L * nq) return;
  const int lane = threadIdx.x % 32;
  const int h = int(w % nq);
  const int64_t tok = w / nq;
  const int t = int(tok % L), sq = int(tok / L);
  const int kh = h / (nq / nkv);
  const float ls = lse[(int64_t(sq) * nq + h) * L + t], dd = di[(int64_t(sq) * nq + h) * L + t];
  float qv[kE], gv[kE], acc[kE], x[kE];
  load_row(q + w * D, D, lane, qv);
  load_row(dout + w * D, D, lane, gv);
#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = 0.f;
  for (int j = 0; j <= t; ++j) {
    const int64_t kr = (int64_t(sq) * L + j) * nkv + kh;
    load_row(k + kr * D, D, lane, x);
    const float p = expf(dot_row(qv, x) * scale - ls);
    float y[kE];
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

template <typename T>
__global__ void __launch_bounds__(128) simple_bwd_dkdv_kernel(const T* q, const T* k, const T* v,
                                                              const float* lse, const float* di,
                                                              const T* dout, T* dk, T* dv,
                                                              int n_seq, int L, int nq, int nkv,
                                                              int D, float scale) {
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
  for (int h = kh * rep; h < (kh + 1) * rep; ++h) {
    const float* lr = lse + (int64_t(sq) * nq + h) * L;
    const float* dr = di + (int64_t(sq) * nq + h) * L;
    for (int t = j; t < L; ++t) {
      const int64_t qrw = (int64_t(sq) * L + t) * nq + h;
      load_row(q + qrw * D, D, lane, x);
      load_row(dout + qrw * D, D, lane, y);
      const float p = expf(dot_row(x, kv) * scale - lr[t]);
      const float ds = p * (dot_row(y, vv) - dr[t]);
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


// impl: 0 automatic (= kDefaultImpl), 1 simple, 2 flash with 4-warp forward blocks and an
// unpipelined backward, 3 flash with 8-warp forward blocks and a pipelined backward.
constexpr int kDefaultImpl = 3;

bool use_flash(int impl, int64_t D, std::initializer_list<const void*> ptrs) {
  if (impl == 1 || (D != 64 && D != 128)) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

void check_shape(int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, const char* op) {
  if (n_seq < 0 || L < 0 || nq <= 0 || nkv <= 0 || nq % nkv != 0 || D <= 0 || D % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": bad dimensions");
  if (D > 256) throw std::invalid_argument(std::string(op) + ": head_dim > 256 is not supported on CUDA");
  if (L > (int64_t(1) << 30) || n_seq > 65535 || nq > 65535)
    throw std::invalid_argument(std::string(op) + ": shape too large");
}

}  // namespace

void k_attention_fwd(DType t, const void* q, const void* k, const void* v, void* o, float* lse,
                     int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale,
                     int impl, cudaStream_t st) {
  check_shape(n_seq, L, nq, nkv, D, "attention_fwd");
  if (n_seq * L == 0) return;
  const bool flash = use_flash(impl, D, {q, k, v, o});
  const bool wide = (impl == 0 ? kDefaultImpl : impl) == 3;
  RP_DISPATCH_16("attention_fwd", t, T, {
    if (flash && D == 128 && wide)
      launch_fwd<T, 128, 8>(q, k, v, o, lse, int(n_seq), int(L), int(nq), int(nkv), scale, st);
    else if (flash && D == 128)
      launch_fwd<T, 128, 4>(q, k, v, o, lse, int(n_seq), int(L), int(nq), int(nkv), scale, st);
    else if (flash && D == 64 && wide)
      launch_fwd<T, 64, 8>(q, k, v, o, lse, int(n_seq), int(L), int(nq), int(nkv), scale, st);
    else if (flash && D == 64)
      launch_fwd<T, 64, 4>(q, k, v, o, lse, int(n_seq), int(L), int(nq), int(nkv), scale, st);
    else {
      const int64_t warps = n_seq * L * nq;
      simple_fwd_kernel<T><<<unsigned((warps + 3) / 4), 128, 0, st>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<T*>(o), lse, int(n_seq), int(L), int(nq), int(nkv), int(D), scale);
      RP_CUDA_LAUNCH_CHECK("attention simple_fwd");
    }
  });
}

void k_attention_bwd(DType t, const void* q, const void* k, const void* v, const void* o,
                     const float* lse, const void* dout, void* dq, void* dk, void* dv,
                     int64_t n_seq, int64_t L, int64_t nq, int64_t nkv, int64_t D, float scale,
                     void* scratch, int impl, cudaStream_t st) {
  check_shape(n_seq, L, nq, nkv, D, "attention_bwd");
  if (n_seq * L == 0) return;
  // scratch: dq accumulator [T, nq, D] fp32, then Di [n_seq, nq, L] fp32
  float* dq_acc = static_cast<float*>(scratch);
  float* di = dq_acc + n_seq * L * nq * D;
  const int64_t rows = n_seq * L * nq;
  const bool flash = use_flash(impl, D, {q, k, v, o, dout, dq, dk, dv});
  RP_DISPATCH_16("attention_bwd", t, T, {
    attn_di_kernel<T><<<unsigned((rows + 7) / 8), 256, 0, st>>>(
        static_cast<const T*>(o), static_cast<const T*>(dout), di, rows, int(L), int(nq), int(D));
    RP_CUDA_LAUNCH_CHECK("attention_bwd Di");
    if (flash) {
      RP_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(rows * D) * sizeof(float), st));
      const bool pipe = (impl == 0 ? kDefaultImpl : impl) == 3;
      const int n = int(n_seq), l = int(L), a = int(nq), b = int(nkv);
      if (D == 128 && pipe)
        launch_bwd<T, 128, true>(q, k, v, dout, lse, di, dq_acc, dk, dv, n, l, a, b, scale, st);
      else if (D == 128)
        launch_bwd<T, 128, false>(q, k, v, dout, lse, di, dq_acc, dk, dv, n, l, a, b, scale, st);
      else if (pipe)
        launch_bwd<T, 64, true>(q, k, v, dout, lse, di, dq_acc, dk, dv, n, l, a, b, scale, st);
      else
        launch_bwd<T, 64, false>(q, k, v, dout, lse, di, dq_acc, dk, dv, n, l, a, b, scale, st);
      k_cast(t, dq, DType::f32, dq_acc, rows * D, st);
    } else {
      simple_bwd_dq_kernel<T><<<unsigned((rows + 3) / 4), 128, 0, st>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
          static_cast<const T*>(dout), static_cast<T*>(dq), int(n_seq), int(L), int(nq),
          int(nkv), int(D), scale);
      RP_CUDA_LAUNCH_CHECK("attention simple_bwd_dq");
      const int64_t kr = n_seq * L * nkv;
      simple_bwd_dkdv_kernel<T><<<unsigned((kr + 3) / 4), 128, 0, st>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse, di,
          static_cast<const T*>(dout), static_cast<T*>(dk), static_cast<T*>(dv), int(n_seq),
          int(L), int(nq), int(nkv), int(D), scale);
      RP_CUDA_LAUNCH_CHECK("attention simple_bwd_dkdv");
    }
  });
}

}  // namespace rp::cuda
