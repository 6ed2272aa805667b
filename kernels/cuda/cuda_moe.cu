// CUDA kernels of the mixture-of-experts ops (kernels/ops.hpp, "mixture of experts"; host
// side in cuda_moe.cpp; CPU twin kernels/cpu/cpu_moe.cpp). fp32 arithmetic on bf16 / f16 /
// f32 storage. Every reduction runs in a fixed order (no floating-point atomics), so two
// runs on the same inputs are bit-identical; integer counts use integer atomics (exact).
#include <algorithm>
#include <climits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;

/// Runs the statement list with `T` bound to the storage type of a float dtype.
#define RP_MOE_DISPATCH(op, t, T, ...)       \
  do {                                       \
    switch (t) {                             \
      case ::rp::DType::f32: {               \
        using T = float;                     \
        __VA_ARGS__;                         \
        break;                               \
      }                                      \
      case ::rp::DType::bf16: {              \
        using T = ::rp::cuda::bf16;          \
        __VA_ARGS__;                         \
        break;                               \
      }                                      \
      case ::rp::DType::f16: {               \
        using T = ::rp::cuda::f16;           \
        __VA_ARGS__;                         \
        break;                               \
      }                                      \
      default: ::rp::cuda::bad_dtype(op, t); \
    }                                        \
  } while (0)

// ---- routing: one warp per token ---------------------------------------------------------

// Ordering key of a probability: NaN (from NaN logits) sorts below every number, so the
// top-k stays a set of valid, distinct expert indices whatever the logits hold.
__device__ __forceinline__ float route_key(float p) { return p == p ? p : -INFINITY; }

// a = (av, ai) comes before b in the order "larger key first, then lower index"; an index
// of INT_MAX marks "no candidate" and comes after everything.
__device__ __forceinline__ bool route_before(float av, int ai, float bv, int bi) {
  if (ai == INT_MAX) return false;
  if (bi == INT_MAX) return true;
  return av > bv || (av == bv && ai < bi);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    moe_route_kernel(const T* logits, float* probs, int32_t* topk_idx, float* topk_w, int64_t T_, int E,
                     int k, bool norm) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; t < T_; t += warps) {
    const T* z = logits + t * E;
    float* p = probs + t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, to_f(z[e]));
    mx = warp_max(mx);
    float s = 0.f;
    for (int e = lane; e < E; e += 32) s += expf(to_f(z[e]) - mx);
    s = warp_sum(s);
    for (int e = lane; e < E; e += 32) p[e] = expf(to_f(z[e]) - mx) / s;
    __syncwarp();  // lane 0 reads the picks' probabilities written by other lanes
    // the j-th pick is the first of the entries that come after pick j-1 in the order
    // (key descending, index ascending): repeated argmax without a "taken" mask
    float pv = INFINITY, sum = 0.f;
    int pi = -1;
    for (int j = 0; j < k; ++j) {
      float bv = -INFINITY;
      int bi = INT_MAX;
      for (int e = lane; e < E; e += 32) {
        const float v = route_key(p[e]);
        const bool after = v < pv || (v == pv && e > pi);
        if (after && route_before(v, e, bv, bi)) bv = v, bi = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (route_before(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      pv = bv, pi = bi;
      if (lane == 0) {
        const float w = p[bi];
        topk_idx[t * k + j] = bi;
        topk_w[t * k + j] = w;
        sum += w;
      }
    }
    if (norm && lane == 0)
      for (int j = 0; j < k; ++j) topk_w[t * k + j] = topk_w[t * k + j] / sum;
  }
}

// stats[e] += #assignments to e, stats[E+e] += sum_t probs[t,e]: a block per 32 experts
// (lane = expert), warp w summing the tokens t = w mod kStatsWarps in order, then the
// warps' sums added in warp order.
constexpr int kStatsThreads = 1024, kStatsWarps = kStatsThreads / 32;
__global__ void __launch_bounds__(kStatsThreads)
    moe_route_stats_kernel(const float* probs, const int32_t* idx, float* stats, int64_t T_, int E,
                           int64_t R) {
  __shared__ float part[kStatsWarps][32];
  __shared__ int cnt[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x / 32;
  const int e0 = int(blockIdx.x) * 32, e = e0 + lane;
  if (threadIdx.x < 32) cnt[threadIdx.x] = 0;
  float acc = 0.f;
  if (e < E)
    for (int64_t t = w; t < T_; t += kStatsWarps) acc += probs[t * E + e];
  part[w][lane] = acc;
  __syncthreads();
  for (int64_t a = threadIdx.x; a < R; a += kStatsThreads) {
    const int x = idx[a] - e0;
    if (x >= 0 && x < 32) atomicAdd(&cnt[x], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32 && e < E) {
    float s = 0.f;
    for (int i = 0; i < kStatsWarps; ++i) s += part[i][lane];
    stats[e] += float(cnt[lane]);
    stats[E + e] += s;
  }
}

// dlogits[t,:] = p * (dp - <p, dp>), dp as moe_route_bwd documents; one warp per token.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    moe_route_bwd_kernel(const float* probs, const int32_t* topk_idx, const float* dw, const float* counts,
                         float aux, T* dlogits, int64_t T_, int E, int k, bool norm) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; t < T_; t += warps) {
    const float* p = probs + t * E;
    const int32_t* idx = topk_idx + t * k;
    const float* g = dw + t * k;
    float S = 0.f, gp = 0.f;
    if (norm)
      for (int j = 0; j < k; ++j) {
        S += p[idx[j]];
        gp += g[j] * p[idx[j]];
      }
    auto dp_of = [&](int e) {
      float d = counts ? aux * counts[e] : 0.f;
      for (int j = 0; j < k; ++j)
        if (idx[j] == e) d += norm ? g[j] / S - gp / (S * S) : g[j];
      return d;
    };
    float dot = 0.f;
    for (int e = lane; e < E; e += 32) dot += p[e] * dp_of(e);
    dot = warp_sum(dot);
    T* dz = dlogits + t * E;
    for (int e = lane; e < E; e += 32) dz[e] = from_f<T>(p[e] * (dp_of(e) - dot));
  }
}

// ---- grouping by expert: stable counting sort over chunks of assignments -------------------
// Chunk c holds assignments [c*C, (c+1)*C). hist[e*nc + c] = #assignments of chunk c to e;
// its exclusive scan in (expert, chunk) order is the first sorted row of chunk c's
// assignments to e, so placing each chunk's assignments in order keeps the sort stable.

__device__ __forceinline__ int checked_expert(int32_t e, int E, unsigned* err) {
  if (e >= 0 && e < E) return e;
  *(volatile unsigned*)(err + kErrMoeExpert) = 1u;
  return e < 0 ? 0 : E - 1;  // placed somewhere valid; the stream reports the error
}

__global__ void __launch_bounds__(kThreads)
    moe_hist_kernel(const int32_t* idx, int32_t* hist, int64_t R, int E, int64_t C, int nc, unsigned* err) {
  extern __shared__ int cnt[];
  for (int e = threadIdx.x; e < E; e += kThreads) cnt[e] = 0;
  __syncthreads();
  const int64_t a0 = int64_t(blockIdx.x) * C, a1 = min(a0 + C, R);
  for (int64_t a = a0 + threadIdx.x; a < a1; a += kThreads)
    atomicAdd(&cnt[checked_expert(idx[a], E, err)], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kThreads) hist[int64_t(e) * nc + blockIdx.x] = cnt[e];
}

// One block: hist (n entries) replaced by its exclusive scan; offsets[e] = the scan at
// (e, chunk 0), offsets[E] = R.
constexpr int kScanThreads = 1024;
__global__ void __launch_bounds__(kScanThreads)
    moe_scan_kernel(int32_t* hist, int64_t n, int32_t* offsets, int32_t* offsets_mapped, int E, int nc,
                    int64_t R) {
  __shared__ int32_t sums[kScanThreads];
  const int64_t per = (n + kScanThreads - 1) / kScanThreads;
  const int64_t i0 = min(n, int64_t(threadIdx.x) * per), i1 = min(n, i0 + per);
  int32_t s = 0;
  for (int64_t i = i0; i < i1; ++i) s += hist[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int o = 1; o < kScanThreads; o <<= 1) {  // inclusive Hillis-Steele scan of the sums
    const int32_t v = threadIdx.x >= o ? sums[threadIdx.x - o] : 0;
    __syncthreads();
    sums[threadIdx.x] += v;
    __syncthreads();
  }
  int32_t run = threadIdx.x > 0 ? sums[threadIdx.x - 1] : 0;
  for (int64_t i = i0; i < i1; ++i) {
    const int32_t h = hist[i];
    hist[i] = run;
    run += h;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kScanThreads) {
    const int32_t v = hist[int64_t(e) * nc];
    offsets[e] = v;
    if (offsets_mapped) offsets_mapped[e] = v;
  }
  if (threadIdx.x == 0) offsets[E] = int32_t(R);
  if (threadIdx.x == 0 && offsets_mapped) offsets_mapped[E] = int32_t(R);
}

// One warp per chunk, 32 assignments at a time in order: lanes with the same expert rank
// themselves by lane (match_any), then the cursor of that expert advances.
__global__ void __launch_bounds__(32)
    moe_place_kernel(const int32_t* idx, const int32_t* base, int32_t* row, int32_t* token, int64_t R, int E,
                     int64_t C, int nc, int k, unsigned* err) {
  extern __shared__ int cur[];
  const int lane = threadIdx.x;
  for (int e = lane; e < E; e += 32) cur[e] = base[int64_t(e) * nc + blockIdx.x];
  __syncwarp();
  const int64_t a0 = int64_t(blockIdx.x) * C, a1 = min(a0 + C, R);
  for (int64_t s = a0; s < a1; s += 32) {
    const int64_t a = s + lane;
    const int e = a < a1 ? checked_expert(idx[a], E, err) : -1 - lane;  // -1-lane: never matches
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const unsigned below = same & ((1u << lane) - 1u);
    if (a < a1) {
      const int r = cur[e] + __popc(below);
      row[a] = r;
      token[r] = int32_t(a / k);
    }
    __syncwarp();
    if (a < a1 && (same >> lane) == 1u) cur[e] += __popc(same);  // the group's highest lane
    __syncwarp();
  }
}

// ---- row gathers and weighted combines -----------------------------------------------------

template <typename W>
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const W* x, const int32_t* token, W* xs, int64_t R, int64_t words) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int32_t t = token[r];
    W* dst = xs + r * words;
    if (t < 0) {  // a pad row of the padded layout (Ops::moe_pad)
      for (int64_t i = threadIdx.x; i < words; i += kThreads) dst[i] = W{};
      continue;
    }
    const W* src = x + int64_t(t) * words;
    for (int64_t i = threadIdx.x; i < words; i += kThreads) dst[i] = src[i];
  }
}

// y[t,:] (+)= sum_j w[t,j] * ys[row[t*k+j],:] (w null: weights 1), fp32 sums in j order.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const T* ys, const float* w, const int32_t* row, T* y, int64_t T_, int k, int64_t H,
                   bool accumulate) {
  constexpr int N = VEC ? kVec : 1;
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    T* dst = y + t * H;
    for (int64_t c = int64_t(threadIdx.x) * N; c < H; c += int64_t(kThreads) * N) {
      float acc[N], v[N];
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = 0.f;
      for (int j = 0; j < k; ++j) {
        const float wj = w ? w[t * k + j] : 1.f;
        load_n<N, VEC>(ys + int64_t(row[t * k + j]) * H + c, v);
#pragma unroll
        for (int i = 0; i < N; ++i) acc[i] += wj * v[i];
      }
      if (accumulate) {
        load_n<N, VEC>(dst + c, v);
#pragma unroll
        for (int i = 0; i < N; ++i) acc[i] = v[i] + acc[i];
      }
      store_n<N, VEC>(dst + c, acc);
    }
  }
}

// dys[row[t*k+j],:] = w[t,j] dy[t,:] and dw[t,j] = <dy[t,:], ys[row[t*k+j],:]> (a block per
// token; per-thread sums over fixed columns, then warps, then warps in order).
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    combine_bwd_kernel(const T* dy, const T* ys, const float* w, const int32_t* row, T* dys, float* dw,
                       int64_t T_, int k, int64_t H) {
  constexpr int N = VEC ? kVec : 1;
  __shared__ float part[kWarps];
  const int lane = threadIdx.x & 31, wp = threadIdx.x / 32;
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const T* g = dy + t * H;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      const float wj = w[t * k + j];
      float dot = 0.f;
      for (int64_t c = int64_t(threadIdx.x) * N; c < H; c += int64_t(kThreads) * N) {
        float a[N], b[N];
        load_n<N, VEC>(g + c, a);
        load_n<N, VEC>(ys + r * H + c, b);
#pragma unroll
        for (int i = 0; i < N; ++i) {
          dot += a[i] * b[i];
          a[i] *= wj;
        }
        store_n<N, VEC>(dys + r * H + c, a);
      }
      dot = warp_sum(dot);
      if (lane == 0) part[wp] = dot;
      __syncthreads();
      if (threadIdx.x == 0) {
        float s = 0.f;
        for (int i = 0; i < kWarps; ++i) s += part[i];
        dw[t * k + j] = s;
      }
      __syncthreads();
    }
  }
}

// ---- pointer arrays of the grouped GEMM ---------------------------------------------------

__global__ void group_ptrs_kernel(MoeGroupTable tab, MoeGroupOperand a, MoeGroupOperand b, MoeGroupOperand c,
                                  const void** pa, const void** pb, void** pc) {
  const int g = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= tab.n) return;
  const int64_t e = tab.expert[g], r0 = tab.row0[g];
  pa[g] = a.base + e * a.per_expert + r0 * a.per_row;
  pb[g] = b.base + e * b.per_expert + r0 * b.per_row;
  pc[g] = c.base + e * c.per_expert + r0 * c.per_row;
}

// kVec-element vectors: whole vectors per row, 16-byte multiples at 16-byte-aligned rows
bool vec_ok(int64_t H, const void* a, const void* b, const void* c, size_t es) {
  return H % kVec == 0 && (size_t(H) * es) % 16 == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

}  // namespace

// ---- launchers -------------------------------------------------------------------------------

void k_moe_route(DType t, const void* logits, float* probs, int32_t* topk_idx, float* topk_w, int64_t T,
                 int64_t E, int64_t k, bool norm, cudaStream_t st) {
  if (T <= 0) return;
  RP_MOE_DISPATCH("moe_route", t, S,
                  moe_route_kernel<S><<<grid_for(T, kWarps), kThreads, 0, st>>>(
                      static_cast<const S*>(logits), probs, topk_idx, topk_w, T, int(E), int(k), norm));
  RP_CUDA_LAUNCH_CHECK("moe_route_kernel");
}

void k_moe_route_stats(const float* probs, const int32_t* topk_idx, float* stats, int64_t T, int64_t E,
                       int64_t k, cudaStream_t st) {
  if (T <= 0) return;
  moe_route_stats_kernel<<<unsigned((E + 31) / 32), kStatsThreads, 0, st>>>(probs, topk_idx, stats, T, int(E),
                                                                            T * k);
  RP_CUDA_LAUNCH_CHECK("moe_route_stats_kernel");
}

void k_moe_route_bwd(DType t, const float* probs, const int32_t* topk_idx, const float* dw,
                     const float* counts, float aux_coef, void* dlogits, int64_t T, int64_t E, int64_t k,
                     bool norm, cudaStream_t st) {
  if (T <= 0) return;
  RP_MOE_DISPATCH(
      "moe_route_bwd", t, S,
      moe_route_bwd_kernel<S><<<grid_for(T, kWarps), kThreads, 0, st>>>(
          probs, topk_idx, dw, counts, aux_coef, static_cast<S*>(dlogits), T, int(E), int(k), norm));
  RP_CUDA_LAUNCH_CHECK("moe_route_bwd_kernel");
}

MoeSortPlan moe_sort_plan(int64_t R, int64_t E) {
  MoeSortPlan p;
  // at most 512 chunks (bounded scan), at least 256 assignments each, whole warps
  int64_t C = std::max<int64_t>(256, (R + 511) / 512);
  C = (C + 31) / 32 * 32;
  p.chunk = C;
  p.chunks = int((R + C - 1) / C);
  p.hist_ints = int64_t(p.chunks) * E;
  return p;
}

void k_moe_sort(const int32_t* topk_idx, int32_t* offsets, int32_t* row, int32_t* token, int64_t T, int64_t E,
                int64_t k, int32_t* hist, unsigned* err, cudaStream_t st, int32_t* offsets_mapped) {
  const int64_t R = T * k;
  const MoeSortPlan p = moe_sort_plan(R, E);
  if (p.chunks == 0) return;
  const size_t smem = size_t(E) * sizeof(int);
  if (smem > 48 * 1024) {
    check(cudaFuncSetAttribute(moe_hist_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "moe_sort shared memory", __FILE__, __LINE__);
    check(cudaFuncSetAttribute(moe_place_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "moe_sort shared memory", __FILE__, __LINE__);
  }
  moe_hist_kernel<<<unsigned(p.chunks), kThreads, smem, st>>>(topk_idx, hist, R, int(E), p.chunk, p.chunks,
                                                              err);
  RP_CUDA_LAUNCH_CHECK("moe_hist_kernel");
  moe_scan_kernel<<<1, kScanThreads, 0, st>>>(hist, p.hist_ints, offsets, offsets_mapped, int(E), p.chunks,
                                              R);
  RP_CUDA_LAUNCH_CHECK("moe_scan_kernel");
  moe_place_kernel<<<unsigned(p.chunks), 32, smem, st>>>(topk_idx, hist, row, token, R, int(E), p.chunk,
                                                         p.chunks, int(k), err);
  RP_CUDA_LAUNCH_CHECK("moe_place_kernel");
}

void k_gather_rows(DType t, const void* x, const int32_t* token, void* xs, int64_t R, int64_t H,
                   cudaStream_t st) {
  if (R <= 0 || H <= 0) return;
  const int64_t bytes = H * int64_t(dtype_size(t));
  const unsigned grid = grid_for(R, 1);
  if (bytes % 16 == 0 && aligned16(x) && aligned16(xs)) {
    gather_rows_kernel<<<grid, kThreads, 0, st>>>(static_cast<const uint4*>(x), token,
                                                  static_cast<uint4*>(xs), R, bytes / 16);
  } else if (bytes % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 3u) == 0 &&
             (reinterpret_cast<uintptr_t>(xs) & 3u) == 0) {
    gather_rows_kernel<<<grid, kThreads, 0, st>>>(static_cast<const uint32_t*>(x), token,
                                                  static_cast<uint32_t*>(xs), R, bytes / 4);
  } else {
    gather_rows_kernel<<<grid, kThreads, 0, st>>>(static_cast<const uint16_t*>(x), token,
                                                  static_cast<uint16_t*>(xs), R, bytes / 2);
  }
  RP_CUDA_LAUNCH_CHECK("gather_rows_kernel");
}

void k_moe_combine(DType t, const void* ys, const float* w, const int32_t* row, void* y, int64_t T, int64_t k,
                   int64_t H, bool accumulate, cudaStream_t st) {
  if (T <= 0 || H <= 0) return;
  const unsigned grid = grid_for(T, 1);
  RP_MOE_DISPATCH("moe_combine", t, S, {
    const S* a = static_cast<const S*>(ys);
    S* b = static_cast<S*>(y);
    if (vec_ok(H, ys, y, y, sizeof(S)))
      combine_kernel<S, true><<<grid, kThreads, 0, st>>>(a, w, row, b, T, int(k), H, accumulate);
    else combine_kernel<S, false><<<grid, kThreads, 0, st>>>(a, w, row, b, T, int(k), H, accumulate);
  });
  RP_CUDA_LAUNCH_CHECK("combine_kernel");
}

void k_moe_combine_bwd(DType t, const void* dy, const void* ys, const float* w, const int32_t* row, void* dys,
                       float* dw, int64_t T, int64_t k, int64_t H, cudaStream_t st) {
  if (T <= 0) return;
  const unsigned grid = grid_for(T, 1);
  RP_MOE_DISPATCH("moe_combine_bwd", t, S, {
    const S *g = static_cast<const S*>(dy), *a = static_cast<const S*>(ys);
    S* d = static_cast<S*>(dys);
    if (vec_ok(H, dy, ys, dys, sizeof(S)))
      combine_bwd_kernel<S, true><<<grid, kThreads, 0, st>>>(g, a, w, row, d, dw, T, int(k), H);
    else combine_bwd_kernel<S, false><<<grid, kThreads, 0, st>>>(g, a, w, row, d, dw, T, int(k), H);
  });
  RP_CUDA_LAUNCH_CHECK("combine_bwd_kernel");
}

void k_moe_gather_bwd(DType t, const void* dxs, const int32_t* row, void* dx, int64_t T, int64_t k, int64_t H,
                      bool accumulate, cudaStream_t st) {
  k_moe_combine(t, dxs, nullptr, row, dx, T, k, H, accumulate, st);
}

void k_moe_group_ptrs(const MoeGroupTable& tab, const MoeGroupOperand& a, const MoeGroupOperand& b,
                      const MoeGroupOperand& c, void** ptrs, cudaStream_t st) {
  if (tab.n <= 0) return;
  const int g = tab.n;
  group_ptrs_kernel<<<unsigned((g + 127) / 128), 128, 0, st>>>(
      tab, a, b, c, const_cast<const void**>(ptrs), const_cast<const void**>(ptrs + g), ptrs + 2 * g);
  RP_CUDA_LAUNCH_CHECK("group_ptrs_kernel");
}

}  // namespace rp::cuda
