// The flash attention backward kernel (kernels/cuda/cuda_flash.cuh; Dao 2023, Alg. 2): one
// block per key tile of 64 and kv head, over the query tiles of its query heads; dk and dv
// written, dq accumulated in fp32. Internal to kernels/cuda.
#pragma once
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_flash_mma.cuh"

namespace rp::cuda::flash {

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

}  // namespace rp::cuda::flash
