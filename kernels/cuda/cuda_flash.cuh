// FlashAttention-2 style causal GQA attention kernels on mma.sync (Dao 2023, Alg. 1 and 2),
// shared by the plain attention of cuda_attention.cu (VAR = false) and GPT-OSS's variant of
// cuda_attention_variant.cu (VAR = true: a sliding window, per-head sink logits, packed
// positions and Gemma 2's score soft-capping, kernels/ops.hpp "attention variants"). The VAR
// code sits behind `if constexpr`, so the plain instantiations are the kernels as they were.
// Internal to kernels/cuda.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <initializer_list>

#include "kernels/cuda/cuda_arch.hpp"
#include "kernels/cuda/cuda_common.cuh"

namespace rp::cuda::flash {

/// The variant's arguments (VAR = true). Query row r of sequence s sees keys j with
/// lo(r) <= j <= r, lo(r) = max(r - clamp(pos[s*L + r], 0, r) (0 without pos),
/// r - window + 1 (window > 0)); sinks [nq] in T (or null) join every row's softmax.
/// cap > 0: every score s = q.k * scale becomes cap * tanh(s / cap) (cap_in = scale / cap).
struct Variant {
  const int32_t* pos = nullptr;
  const void* sinks = nullptr;
  int window = 0;
  float cap = 0.f, cap_in = 0.f;
};

/// lo(r) of Variant for a row r < L of sequence sq.
__device__ __forceinline__ int first_key(const Variant& var, int sq, int L, int r) {
  int lo = var.pos ? r - min(max(var.pos[int64_t(sq) * L + r], 0), r) : 0;
  if (var.window > 0) lo = max(lo, r - var.window + 1);
  return lo;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kB = 64;  // rows of every tile (queries and keys)

// ---- PTX wrappers -----------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int n = pred ? 16 : 0;  // 0 source bytes: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// p[0] += a, p[1] += b (p 8-byte aligned); one vector atomic on sm_90.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Rows [row0, row0+ROWS) of a [*, ld] matrix (D columns from g) into a smem tile of
// row stride D+8; rows >= L are zero-filled.
template <int D, int NT, int ROWS = kB, typename T>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t ld, int row0, int L) {
  constexpr int CH = D / 8;
  for (int c = threadIdx.x; c < ROWS * CH; c += NT) {
    const int r = c / CH, cc = c % CH;
    const bool ok = row0 + r < L;
    const T* src = ok ? g + int64_t(row0 + r) * ld + cc * 8 : g;
    cp_async16(s + r * (D + 8) + cc * 8, src, ok);
  }
}

// ---- forward ---------------------------------------------------------------------------------
// W warps per block, 16 query rows each (Br = 16*W); key tiles of 64.

template <typename T, int D, int W>
constexpr int fwd_smem() {
  return (16 * W + 4 * kB) * (D + 8) * int(sizeof(T));
}

// VAR: only the key tiles from the block's first visible key on are loaded, a warp skips the
// tiles before its rows' first keys, and the sink enters as the initial running max / sum.
template <typename T, int D, int W, bool VAR = false>
__global__ void __launch_bounds__(32 * W)
    flash_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     T* __restrict__ o, float* __restrict__ lse, int L, int nq, int nkv, float scale_log2,
                     Variant var = {}) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int S = D + 8, BR = 16 * W, NT = 32 * W;
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BR * S;                                  // [2][kB*S]
  T* sV = sK + 2 * kB * S;                              // [2][kB*S]
  const int qb = int(gridDim.x) - 1 - int(blockIdx.x);  // heavy (late) blocks first
  const int h = blockIdx.y, sq = blockIdx.z;
  const int kh = h / (nq / nkv);
  const int64_t ldq = int64_t(nq) * D, ldk = int64_t(nkv) * D;
  const T* qg = q + (int64_t(sq) * L * nq + h) * D;
  const T* kg = k + (int64_t(sq) * L * nkv + kh) * D;
  const T* vg = v + (int64_t(sq) * L * nkv + kh) * D;
  const int q0 = qb * BR;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int wq0 = q0 + warp * 16;       // first query row of this warp
  const int ra = wq0 + g, rc = ra + 8;  // this thread's absolute query rows
  int j0 = 0;                           // first key tile of the block
  int lo_a = 0, lo_c = 0, wlo = 0;      // VAR: first keys of rows ra, rc and of the warp's rows
  if constexpr (VAR) {
    __shared__ int s_lo;
    if (threadIdx.x == 0) s_lo = L;
    __syncthreads();
    int mn = L;
    for (int r = q0 + int(threadIdx.x); r < min(q0 + BR, L); r += NT) mn = min(mn, first_key(var, sq, L, r));
    atomicMin(&s_lo, mn);
    lo_a = ra < L ? first_key(var, sq, L, ra) : 0;
    lo_c = rc < L ? first_key(var, sq, L, rc) : 0;
    wlo = min(lo_a, lo_c);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, off));
    __syncthreads();
    j0 = s_lo / kB;
  }

  load_tile<D, NT, BR>(sQ, qg, ldq, q0, L);
  load_tile<D, NT>(sK, kg, ldk, j0 * kB, L);
  load_tile<D, NT>(sV, vg, ldk, j0 * kB, L);
  cp_async_commit();

  uint32_t qf[D / 16][4];
  float oacc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  if constexpr (VAR) {
    if (var.sinks) {  // the sink logit (natural units, unscaled) as a first column of weight 1
      m0 = m1 = to_f(static_cast<const T*>(var.sinks)[h]) * 1.4426950408889634f;
      l0 = l1 = tq == 0 ? 1.f : 0.f;  // counted once in the sum over the row's 4 lanes
    }
  }
  const int nkb = min((L + kB - 1) / kB, (q0 + BR - 1) / kB + 1);
  for (int j = j0; j < nkb; ++j) {
    const int buf = (j - j0) & 1;
    if (j + 1 < nkb) {
      load_tile<D, NT>(sK + (buf ^ 1) * kB * S, kg, ldk, (j + 1) * kB, L);
      load_tile<D, NT>(sV + (buf ^ 1) * kB * S, vg, ldk, (j + 1) * kB, L);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (j == j0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldsm_x4(qf[kk], sQ + (warp * 16 + (lane % 16)) * S + kk * 16 + (lane / 16) * 8);
    }
    const int k0 = j * kB;
    // else every key of the tile is after every row of this warp (or before its first keys)
    if (k0 <= wq0 + 15 && (!VAR || k0 + kB > wlo)) {
      const T* cK = sK + buf * kB * S;
      const T* cV = sV + buf * kB * S;
      float sacc[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          ldsm_x4(b, cK + (np * 16 + (lane % 8) + (lane / 16) * 8) * S + kk * 16 + ((lane / 8) % 2) * 8);
          mma16816<T>(sacc[2 * np], qf[kk], b[0], b[1]);
          mma16816<T>(sacc[2 * np + 1], qf[kk], b[2], b[3]);
        }
      }
      const bool mask = VAR || k0 + kB - 1 > wq0;  // some key of the tile is after some row
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + nt * 8 + tq * 2 + (e & 1);
          const int row = e < 2 ? ra : rc;
          float x = sacc[nt][e] * scale_log2;
          if constexpr (VAR) {  // soft-capping, in log2 units: cap * log2(e) * tanh(s / cap)
            if (var.cap > 0.f) x = var.cap * kLog2e * tanhf(sacc[nt][e] * var.cap_in);
          }
          if (mask && (key > row || (VAR && key < (e < 2 ? lo_a : lo_c)))) x = -INFINITY;
          sacc[nt][e] = x;
        }
        mx0 = fmaxf(mx0, fmaxf(sacc[nt][0], sacc[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(sacc[nt][2], sacc[nt][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // a row whose keys are all masked in this tile keeps m (its first tile, j = 0,
      // always holds key 0 <= row, so m is finite from then on). VAR: a row may have seen no
      // key yet (window, no sink): m stays -inf and the exponentials are taken against 0
      // (all of them 0) instead of -inf - -inf = NaN.
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float r0 = VAR && mn0 == -INFINITY ? 0.f : mn0, r1 = VAR && mn1 == -INFINITY ? 0.f : mn1;
      const float c0 = exp2f(m0 - r0), c1 = exp2f(m1 - r1);
      m0 = mn0;
      m1 = mn1;
      float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        sacc[nt][0] = exp2f(sacc[nt][0] - r0);
        sacc[nt][1] = exp2f(sacc[nt][1] - r0);
        sacc[nt][2] = exp2f(sacc[nt][2] - r1);
        sacc[nt][3] = exp2f(sacc[nt][3] - r1);
        ps0 += sacc[nt][0] + sacc[nt][1];
        ps1 += sacc[nt][2] + sacc[nt][3];
      }
      l0 = l0 * c0 + ps0;
      l1 = l1 * c1 + ps1;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        oacc[nt][0] *= c0;
        oacc[nt][1] *= c0;
        oacc[nt][2] *= c1;
        oacc[nt][3] *= c1;
      }
#pragma unroll
      for (int kt = 0; kt < 4; ++kt) {
        const uint32_t a[4] = {pack2<T>(sacc[2 * kt][0], sacc[2 * kt][1]),
                               pack2<T>(sacc[2 * kt][2], sacc[2 * kt][3]),
                               pack2<T>(sacc[2 * kt + 1][0], sacc[2 * kt + 1][1]),
                               pack2<T>(sacc[2 * kt + 1][2], sacc[2 * kt + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldsm_x4_t(b, cV + (kt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * S + dp * 16 + (lane / 16) * 8);
          mma16816<T>(oacc[2 * dp], a, b[0], b[1]);
          mma16816<T>(oacc[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next prefetch overwrites this buffer
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
  T* og = o + (int64_t(sq) * L * nq + h) * D;
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    const int d = nt * 8 + tq * 2;
    if (ra < L)
      *reinterpret_cast<uint32_t*>(og + int64_t(ra) * ldq + d) =
          pack2<T>(oacc[nt][0] * inv0, oacc[nt][1] * inv0);
    if (rc < L)
      *reinterpret_cast<uint32_t*>(og + int64_t(rc) * ldq + d) =
          pack2<T>(oacc[nt][2] * inv1, oacc[nt][3] * inv1);
  }
  if (lse && tq == 0) {
    float* lr = lse + (int64_t(sq) * nq + h) * L;
    if (ra < L) lr[ra] = (m0 + log2f(l0)) * kLn2;
    if (rc < L) lr[rc] = (m1 + log2f(l1)) * kLn2;
  }
}

// ---- backward -------------------------------------------------------------------------------

constexpr int kSP = kB + 8;  // row stride of the P^T / dS^T tiles

// PIPE: Q/dO tiles (and their lse/Di rows) are double-buffered, the next one loading
// while the current one is processed.
// VAR: one more int per buffered row (its first visible key).
template <typename T, int D, bool PIPE, bool VAR = false>
constexpr int bwd_smem() {
  constexpr int nb = PIPE ? 2 : 1;
  return ((2 + 2 * nb) * kB * (D + 8) + 2 * kB * kSP) * int(sizeof(T)) +
         (VAR ? 3 : 2) * nb * kB * int(sizeof(float));
}

// VAR: rows before a key's window are masked (their first keys staged with lse and Di), the
// query tiles past the window of the block's last key are not visited, and tiles whose rows
// all start after the block's keys (later packed examples) are skipped after their load.
// The sinks enter through lse only (dsinks: a kernel of its own).
template <typename T, int D, bool PIPE, bool VAR = false>
__global__ void __launch_bounds__(256)
    flash_bwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ di,
                     float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv, int L, int nq,
                     int nkv, float scale, float scale_log2, Variant var = {}) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int S = D + 8;
  constexpr int NB = PIPE ? 2 : 1;
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kB * S;
  T* sQb = sV + kB * S;                                      // [NB][kB*S]
  T* sdOb = sQb + NB * kB * S;                               // [NB][kB*S]
  T* sP = sdOb + NB * kB * S;                                // P^T  [key][query]
  T* sdS = sP + kB * kSP;                                    // dS^T [key][query]
  float* s_lseb = reinterpret_cast<float*>(sdS + kB * kSP);  // [NB][kB]
  float* s_dib = s_lseb + NB * kB;                           // [NB][kB]
  int* s_lob = reinterpret_cast<int*>(s_dib + NB * kB);      // VAR: [NB][kB]

  const int kb = blockIdx.x, kh = blockIdx.y, sq = blockIdx.z;
  const int rep = nq / nkv;
  const int k0 = kb * kB;
  const int64_t ldq = int64_t(nq) * D, ldk = int64_t(nkv) * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int kw = (warp % 4) * 16;        // keys of this warp's S^T rows (and dK/dV rows)
  const int qw = (warp / 4) * 32;        // queries of this warp's S^T columns
  const int dh0 = (warp / 4) * (D / 2);  // head-dim half of this warp's dK/dV/dQ columns
  const int qr = (warp % 4) * 16;        // queries of this warp's dQ rows

  const T* kg = k + (int64_t(sq) * L * nkv + kh) * D;
  const T* vg = v + (int64_t(sq) * L * nkv + kh) * D;
  load_tile<D, 256>(sK, kg, ldk, k0, L);
  load_tile<D, 256>(sV, vg, ldk, k0, L);
  cp_async_commit();

  float dva[D / 16][4], dka[D / 16][4];
#pragma unroll
  for (int i = 0; i < D / 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dva[i][e] = dka[i][e] = 0.f;

  // iterations: (query head of the group) x (query tiles at or below the diagonal)
  const int nqb = (L + kB - 1) / kB;
  const int last_qb = VAR && var.window > 0 ? min(nqb, (k0 + kB - 1 + var.window - 1) / kB + 1) : nqb;
  const int ntile = last_qb - kb, n_it = rep * ntile;
  const int64_t seq_q = int64_t(sq) * L * nq;
  auto issue = [&](int it, int b) {  // cp.async of tile it's Q and dO into buffer b
    const int h = kh * rep + it / ntile, q0 = (kb + it % ntile) * kB;
    load_tile<D, 256>(sQb + b * kB * S, q + (seq_q + h) * D, ldq, q0, L);
    load_tile<D, 256>(sdOb + b * kB * S, dout + (seq_q + h) * D, ldq, q0, L);
  };
  auto stats = [&](int it, float& ls, float& dd) {  // lse*log2(e) and Di of row threadIdx.x
    const int h = kh * rep + it / ntile, qq = (kb + it % ntile) * kB + int(threadIdx.x);
    const int64_t r = (int64_t(sq) * nq + h) * L + qq;
    ls = qq < L ? lse[r] * kLog2e : 0.f;
    dd = qq < L ? di[r] : 0.f;
  };
  [[maybe_unused]] auto first = [&](int it) {  // VAR: the first visible key of row threadIdx.x of tile it
    const int qq = (kb + it % ntile) * kB + int(threadIdx.x);
    return qq < L ? first_key(var, sq, L, qq) : 0;
  };
  if (PIPE && n_it > 0) {
    issue(0, 0);
    cp_async_commit();
    if (threadIdx.x < kB) {
      stats(0, s_lseb[threadIdx.x], s_dib[threadIdx.x]);
      if constexpr (VAR) s_lob[threadIdx.x] = first(0);
    }
  }
  for (int it = 0; it < n_it; ++it) {
    const int h = kh * rep + it / ntile, q0 = (kb + it % ntile) * kB;
    const int b = PIPE ? (it & 1) : 0;
    float nls = 0.f, ndd = 0.f;
    [[maybe_unused]] int nlo = 0;
    if constexpr (PIPE) {
      if (it + 1 < n_it) {
        issue(it + 1, b ^ 1);
        if (threadIdx.x < kB) {
          stats(it + 1, nls, ndd);
          if constexpr (VAR) nlo = first(it + 1);
        }
      }
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      issue(it, 0);
      cp_async_commit();
      if (threadIdx.x < kB) {
        stats(it, s_lseb[threadIdx.x], s_dib[threadIdx.x]);
        if constexpr (VAR) s_lob[threadIdx.x] = first(it);
      }
      cp_async_wait<0>();
    }
    if constexpr (VAR) {
      // a tile none of whose rows sees a key of this block (examples packed after it) is
      // skipped; the barrier also decides that for the whole block
      const bool some =
          threadIdx.x < kB && q0 + int(threadIdx.x) < L && s_lob[b * kB + threadIdx.x] <= k0 + kB - 1;
      if (!__syncthreads_or(some)) {
        if (PIPE && threadIdx.x < kB && it + 1 < n_it) {
          s_lseb[(b ^ 1) * kB + threadIdx.x] = nls;
          s_dib[(b ^ 1) * kB + threadIdx.x] = ndd;
          s_lob[(b ^ 1) * kB + threadIdx.x] = nlo;
        }
        __syncthreads();
        continue;
      }
    } else {
      __syncthreads();
    }
    const T* sQ = sQb + b * kB * S;
    const T* sdO = sdOb + b * kB * S;
    const float* s_lse = s_lseb + b * kB;
    const float* s_di = s_dib + b * kB;
    const int* s_lo = s_lob + b * kB;
    float* dqg = dq_acc + (seq_q + h) * D;
    {
      // S^T = K Q^T and dP^T = V dO^T for 16 keys x 32 queries
      float st[4][4], dpt[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[a][e] = dpt[a][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ak[4], av[4];
        ldsm_x4(ak, sK + (kw + (lane % 16)) * S + kk * 16 + (lane / 16) * 8);
        ldsm_x4(av, sV + (kw + (lane % 16)) * S + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t b[4];
          const int off = (qw + np * 16 + (lane % 8) + (lane / 16) * 8) * S + kk * 16 + ((lane / 8) % 2) * 8;
          ldsm_x4(b, sQ + off);
          mma16816<T>(st[2 * np], ak, b[0], b[1]);
          mma16816<T>(st[2 * np + 1], ak, b[2], b[3]);
          ldsm_x4(b, sdO + off);
          mma16816<T>(dpt[2 * np], av, b[0], b[1]);
          mma16816<T>(dpt[2 * np + 1], av, b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + kw + g + (e / 2) * 8;
          const int ql = qw + nt * 8 + tq * 2 + (e & 1);
          const int qq = q0 + ql;
          const bool seen = key <= qq && qq < L && (!VAR || key >= s_lo[ql]);
          float x = st[nt][e] * scale_log2, dcap = 1.f;
          if constexpr (VAR) {  // soft-capping: P of the capped score, dS through the tanh
            if (var.cap > 0.f) {
              const float th = tanhf(st[nt][e] * var.cap_in);
              x = var.cap * kLog2e * th;
              dcap = 1.f - th * th;
            }
          }
          const float p = seen ? exp2f(x - s_lse[ql]) : 0.f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - s_di[ql]) * dcap;
        }
        const int c = qw + nt * 8 + tq * 2;
        *reinterpret_cast<uint32_t*>(sP + (kw + g) * kSP + c) = pack2<T>(st[nt][0], st[nt][1]);
        *reinterpret_cast<uint32_t*>(sP + (kw + g + 8) * kSP + c) = pack2<T>(st[nt][2], st[nt][3]);
        *reinterpret_cast<uint32_t*>(sdS + (kw + g) * kSP + c) = pack2<T>(dpt[nt][0], dpt[nt][1]);
        *reinterpret_cast<uint32_t*>(sdS + (kw + g + 8) * kSP + c) = pack2<T>(dpt[nt][2], dpt[nt][3]);
      }
      __syncthreads();

      // dV += P^T dO, dK += dS^T Q   (16 keys x D/2 columns per warp)
#pragma unroll
      for (int kt = 0; kt < 4; ++kt) {
        uint32_t ap[4], as[4];
        ldsm_x4(ap, sP + (kw + (lane % 16)) * kSP + kt * 16 + (lane / 16) * 8);
        ldsm_x4(as, sdS + (kw + (lane % 16)) * kSP + kt * 16 + (lane / 16) * 8);
#pragma unroll
        for (int dp = 0; dp < D / 32; ++dp) {
          uint32_t b[4];
          const int off = (kt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * S + dh0 + dp * 16 + (lane / 16) * 8;
          ldsm_x4_t(b, sdO + off);
          mma16816<T>(dva[2 * dp], ap, b[0], b[1]);
          mma16816<T>(dva[2 * dp + 1], ap, b[2], b[3]);
          ldsm_x4_t(b, sQ + off);
          mma16816<T>(dka[2 * dp], as, b[0], b[1]);
          mma16816<T>(dka[2 * dp + 1], as, b[2], b[3]);
        }
      }
      // dQ = dS K   (16 queries x D/2 columns per warp), accumulated in fp32
      {
        float dqa[D / 16][4];
#pragma unroll
        for (int a = 0; a < D / 16; ++a) dqa[a][0] = dqa[a][1] = dqa[a][2] = dqa[a][3] = 0.f;
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
          uint32_t a[4];
          ldsm_x4_t(a, sdS + (kt * 16 + (lane % 8) + (lane / 16) * 8) * kSP + qr + ((lane / 8) % 2) * 8);
#pragma unroll
          for (int dp = 0; dp < D / 32; ++dp) {
            uint32_t b[4];
            ldsm_x4_t(
                b, sK + (kt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * S + dh0 + dp * 16 + (lane / 16) * 8);
            mma16816<T>(dqa[2 * dp], a, b[0], b[1]);
            mma16816<T>(dqa[2 * dp + 1], a, b[2], b[3]);
          }
        }
        const int qa = q0 + qr + g, qc = qa + 8;
#pragma unroll
        for (int nt = 0; nt < D / 16; ++nt) {
          const int d = dh0 + nt * 8 + tq * 2;
          if (qa < L) atomic_add2(dqg + int64_t(qa) * ldq + d, dqa[nt][0] * scale, dqa[nt][1] * scale);
          if (qc < L) atomic_add2(dqg + int64_t(qc) * ldq + d, dqa[nt][2] * scale, dqa[nt][3] * scale);
        }
      }
      if (PIPE && threadIdx.x < kB && it + 1 < n_it) {
        s_lseb[(b ^ 1) * kB + threadIdx.x] = nls;
        s_dib[(b ^ 1) * kB + threadIdx.x] = ndd;
        if constexpr (VAR) s_lob[(b ^ 1) * kB + threadIdx.x] = nlo;
      }
      __syncthreads();  // the next tiles overwrite this Q/dO buffer, sP, sdS
    }
  }
  T* dkg = dk + (int64_t(sq) * L * nkv + kh) * D;
  T* dvg = dv + (int64_t(sq) * L * nkv + kh) * D;
  const int ka = k0 + kw + g, kc = ka + 8;
#pragma unroll
  for (int nt = 0; nt < D / 16; ++nt) {
    const int d = dh0 + nt * 8 + tq * 2;
    if (ka < L) {
      *reinterpret_cast<uint32_t*>(dkg + int64_t(ka) * ldk + d) =
          pack2<T>(dka[nt][0] * scale, dka[nt][1] * scale);
      *reinterpret_cast<uint32_t*>(dvg + int64_t(ka) * ldk + d) = pack2<T>(dva[nt][0], dva[nt][1]);
    }
    if (kc < L) {
      *reinterpret_cast<uint32_t*>(dkg + int64_t(kc) * ldk + d) =
          pack2<T>(dka[nt][2] * scale, dka[nt][3] * scale);
      *reinterpret_cast<uint32_t*>(dvg + int64_t(kc) * ldk + d) = pack2<T>(dva[nt][2], dva[nt][3]);
    }
  }
}

// ---- launch helpers ----------------------------------------------------------------------------

template <typename T, int D, int W, bool VAR = false>
void launch_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int n_seq, int L, int nq,
                int nkv, float scale, cudaStream_t st, Variant var = {}) {
  constexpr int smem = fwd_smem<T, D, W>();
  // per device (the attribute belongs to the current device's context); cheap
  RP_CUDA_CHECK(cudaFuncSetAttribute(flash_fwd_kernel<T, D, W, VAR>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dim3 grid(unsigned((L + 16 * W - 1) / (16 * W)), unsigned(nq), unsigned(n_seq));
  flash_fwd_kernel<T, D, W, VAR><<<grid, 32 * W, smem, st>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o), lse,
      L, nq, nkv, scale * kLog2e, var);
  RP_CUDA_LAUNCH_CHECK("flash_fwd");
}

template <typename T, int D, bool PIPE, bool VAR = false>
void launch_bwd(const void* q, const void* k, const void* v, const void* dout, const float* lse,
                const float* di, float* dq_acc, void* dk, void* dv, int n_seq, int L, int nq, int nkv,
                float scale, cudaStream_t st, Variant var = {}) {
  constexpr int smem = bwd_smem<T, D, PIPE, VAR>();
  RP_CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_kernel<T, D, PIPE, VAR>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dim3 grid(unsigned((L + kB - 1) / kB), unsigned(nkv), unsigned(n_seq));
  flash_bwd_kernel<T, D, PIPE, VAR>
      <<<grid, 256, smem, st>>>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                static_cast<const T*>(dout), lse, di, dq_acc, static_cast<T*>(dk),
                                static_cast<T*>(dv), L, nq, nkv, scale, scale * kLog2e, var);
  RP_CUDA_LAUNCH_CHECK("flash_bwd");
}

/// Shared memory of head_dim D's narrow configuration (4-warp forward, unpipelined backward):
/// 85 / 87 KiB at D = 128, 165 / 151 KiB at D = 256.
inline int narrow_smem(int64_t D) {
  if (D == 256) return std::max(fwd_smem<bf16, 256, 4>(), bwd_smem<bf16, 256, false, true>());
  if (D == 128) return std::max(fwd_smem<bf16, 128, 4>(), bwd_smem<bf16, 128, false, true>());
  return std::max(fwd_smem<bf16, 64, 4>(), bwd_smem<bf16, 64, false, true>());
}

/// Whether the kernels apply: head_dim 64, 128 or 256 (Gemma's; only in the narrow configuration,
/// which fits a 227 KiB block of Hopper or Blackwell, not a 99 KiB consumer GPU or an A100's 163),
/// every tensor 16-byte aligned (null counts as aligned), impl not 1 (the row kernels forced), and
/// the narrow configuration's shared memory within the device's limit.
inline bool usable(int impl, int64_t D, std::initializer_list<const void*> ptrs) {
  if (impl == 1 || (D != 64 && D != 128 && D != 256)) return false;
  if (narrow_smem(D) > max_dynamic_smem()) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

/// Whether the wide configuration (8-warp forward, pipelined backward) of head_dim D fits the
/// current device's shared memory per block. It does not on GPUs with 99 KiB (RTX 30xx, 40xx,
/// 50xx, L40S) at D = 128 (102 / 121 KiB): they run the narrow one, which the log says once.
inline bool wide_fits(int D) {
  if (D == 256) return false;  // its accumulators fill the registers of a 4-warp block already
  const int wide = D == 128 ? std::max(fwd_smem<bf16, 128, 8>(), bwd_smem<bf16, 128, true, true>())
                            : std::max(fwd_smem<bf16, 64, 8>(), bwd_smem<bf16, 64, true, true>());
  const int limit = max_dynamic_smem();
  if (wide <= limit) return true;
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    std::fprintf(
        stderr,
        "roundpipe: this GPU allows %d KiB of shared memory per block, the 8-warp flash attention blocks "
        "need %d KiB at head_dim %d: using 4-warp forward blocks and the unpipelined backward\n",
        limit >> 10, (wide + 1023) >> 10, D);
  return false;
}

/// launch_fwd for head_dim D (64, 128 or 256) with W = 8 (wide) or 4 warps (256: always 4).
template <typename T, bool VAR = false>
void launch_fwd_dim(int D, bool wide, const void* q, const void* k, const void* v, void* o, float* lse,
                    int n_seq, int L, int nq, int nkv, float scale, cudaStream_t st, Variant var = {}) {
  wide = wide && wide_fits(D);
  if (D == 256) launch_fwd<T, 256, 4, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128 && wide) launch_fwd<T, 128, 8, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128) launch_fwd<T, 128, 4, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else if (wide) launch_fwd<T, 64, 8, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
  else launch_fwd<T, 64, 4, VAR>(q, k, v, o, lse, n_seq, L, nq, nkv, scale, st, var);
}

/// launch_bwd for head_dim D (64, 128 or 256), pipelined (pipe) or not (256: never).
template <typename T, bool VAR = false>
void launch_bwd_dim(int D, bool pipe, const void* q, const void* k, const void* v, const void* dout,
                    const float* lse, const float* di, float* dq_acc, void* dk, void* dv, int n_seq, int L,
                    int nq, int nkv, float scale, cudaStream_t st, Variant var = {}) {
  pipe = pipe && wide_fits(D);
  if (D == 256)
    launch_bwd<T, 256, false, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128 && pipe)
    launch_bwd<T, 128, true, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else if (D == 128)
    launch_bwd<T, 128, false, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else if (pipe)
    launch_bwd<T, 64, true, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
  else
    launch_bwd<T, 64, false, VAR>(q, k, v, dout, lse, di, dq_acc, dk, dv, n_seq, L, nq, nkv, scale, st, var);
}

}  // namespace rp::cuda::flash
