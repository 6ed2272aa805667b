// The kernels GPT-OSS adds to the CUDA backend (HF transformers GptOssForCausalLM; CPU twin:
// kernels/cpu/cpu_gptoss.cpp; formulas: kernels/ops.hpp). Its attention with a sliding window
// and per-head sinks runs on the tensor-core kernels (cuda_attention_variant.cu) or on the row
// kernels every attention shares (cuda_attention_rows.cu); here:
//  - dsinks[h] += -sum_rows exp(sinks[h] - lse) * Di, one block per head, a fixed-order
//    fp32 sum (deterministic).
//  - per-group bias add and its deterministic fp32 column sums.
//  - the clamped SwiGLU of GptOssExperts and its backward (torch.clamp's gradient: 0 at the
//    bounds).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"

namespace rp::cuda {
namespace {

// dsinks[h] += -sum_{s,t} exp(sinks[h] - lse[s,h,t]) * Di[s,h,t]: block h, thread i sums the
// rows i, i + 256, ... in order, then a fixed tree over the threads (deterministic).
constexpr int kSinkThreads = 256;
template <typename T>
__global__ void __launch_bounds__(kSinkThreads)
    dsinks_kernel(const T* sinks, const float* lse, const float* di, float* dsinks, int n_seq, int L,
                  int nq) {
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
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
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
__global__ void __launch_bounds__(32 * kRowLanes)
    bias_bwd_kernel(const T* dy, float* db, GroupOffsets go, int64_t N) {
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
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gc = fminf(to_f(g[i]), limit), uc = fminf(fmaxf(to_f(u[i]), -limit), limit);
    const float s = 1.f / (1.f + expf(-alpha * gc));
    h[i] = from_f<T>((uc + 1.f) * (gc * s));
  }
}

template <typename T>
__global__ void swiglu_clamped_bwd_kernel(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n,
                                          float alpha, float limit) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = to_f(g[i]), ui = to_f(u[i]), d = to_f(dh[i]);
    const float gc = fminf(gi, limit), uc = fminf(fmaxf(ui, -limit), limit);
    const float s = 1.f / (1.f + expf(-alpha * gc));
    dg[i] = from_f<T>(gi < limit ? d * (uc + 1.f) * (s + alpha * gc * s * (1.f - s)) : 0.f);
    du[i] = from_f<T>(ui > -limit && ui < limit ? d * gc * s : 0.f);
  }
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

void k_attention_dsinks(DType t, const void* sinks, const float* lse, const float* di, float* dsinks,
                        int64_t n_seq, int64_t L, int64_t nq, cudaStream_t st) {
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

void k_swiglu_clamped_bwd(DType t, const void* g, const void* u, const void* dh, void* dg, void* du,
                          int64_t n, float alpha, float limit, cudaStream_t st) {
  if (n <= 0) return;
  RP_DISPATCH_16("swiglu_clamped_bwd", t, T, {
    swiglu_clamped_bwd_kernel<T><<<grid_for(n, 256), 256, 0, st>>>(
        static_cast<const T*>(g), static_cast<const T*>(u), static_cast<const T*>(dh), static_cast<T*>(dg),
        static_cast<T*>(du), n, alpha, limit);
  });
  RP_CUDA_LAUNCH_CHECK("swiglu_clamped_bwd");
}

}  // namespace rp::cuda
