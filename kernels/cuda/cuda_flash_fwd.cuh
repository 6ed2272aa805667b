// The flash attention forward kernel (kernels/cuda/cuda_flash.cuh; Dao 2023, Alg. 1): W
// warps per block, 16 query rows each, over key tiles of 64 with an online softmax; writes o
// (and, when asked, the rows' log-sum-exp). Internal to kernels/cuda.
#pragma once
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash_mma.cuh"

namespace rp::cuda::flash {

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

}  // namespace rp::cuda::flash
