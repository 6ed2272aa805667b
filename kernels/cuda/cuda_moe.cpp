// CudaOps for mixture-of-experts blocks (kernels/ops.hpp documents each op; CPU twin
// kernels/cpu/cpu_moe.cpp): the argument checks of the CPU twin before anything is
// enqueued, the launches of cuda_moe.cu's kernels, and the grouped linears (mode of
// set_grouped_gemm in cuda_backend.hpp): one cuBLASLt GEMM per expert with rows (the GEMMs
// of linear_fwd / linear_bwd_*) on the compute stream or spread over side streams, or one
// cublasGemmGroupedBatchedEx call over all of them; with ExpertGemm::bucketed, in any mode, one
// cublasGemmBatchedEx per segment length first (cuda_moe_bucketed.cpp).
#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"

namespace rp::cuda {
namespace {
void require(bool cond, const char* op, const char* what) {
  if (!cond) throw std::invalid_argument(std::string(op) + ": " + what);
}
void check_route(int64_t T, int64_t E, int64_t k, const char* op) {
  require(T >= 0 && E >= 1 && k >= 1 && k <= E, op, "need T >= 0 and 1 <= k <= E");
  require(E <= INT_MAX && T * E <= INT64_MAX / 4, op, "too many experts");
}
void check_rows(int64_t T, int64_t k, int64_t H, const char* op) {
  require(T >= 0 && k >= 1 && H >= 0, op, "bad dimensions");
  require(k <= INT_MAX && T * k <= INT_MAX, op, "more than 2^31 - 1 assignments");
}
void check_offsets(const int32_t* off, int64_t E, int64_t K, int64_t N, const char* op) {
  require(off != nullptr && E >= 1, op, "offsets_host null or no experts");
  require(K >= 0 && N >= 0, op, "negative dimension");
  require(off[0] == 0, op, "offsets_host[0] must be 0");
  for (int64_t e = 0; e < E; ++e) require(off[e + 1] >= off[e], op, "offsets_host must not decrease");
}
const char* at(const void* p, int64_t elems, size_t es) {
  return static_cast<const char*>(p) + size_t(elems) * es;
}
char* at(void* p, int64_t elems, size_t es) { return static_cast<char*>(p) + size_t(elems) * es; }
}  // namespace

void* CudaOps::blas_handle() {
  if (!blas_) {
    cublasHandle_t h = nullptr;
    RP_CUBLAS_CHECK(cublasCreate(&h));
    blas_ = h;
    RP_CUBLAS_CHECK(cublasSetStream(h, st_));
    RP_CUBLAS_CHECK(cublasSetWorkspace(h, ws_, ws_bytes_));  // shared with cuBLASLt: same stream
  }
  return blas_;
}

void CudaOps::release_moe() {
  release_moe_pad();
  for (auto& [k, p] : batched_plans_) destroy_plan(p);
  batched_plans_.clear();
  if (blas_) cublasDestroy(static_cast<cublasHandle_t>(blas_));
  if (group_ptrs_) cudaFree(group_ptrs_);
  if (moe_hist_) cudaFree(moe_hist_);
  if (moe_off_pinned_) cudaFreeHost(moe_off_pinned_);
  if (moe_sort_done_) cudaEventDestroy(moe_sort_done_);
  moe_sort_done_ = nullptr;
  blas_ = nullptr, group_ptrs_ = nullptr, moe_hist_ = nullptr, moe_off_pinned_ = nullptr,
  moe_off_mapped_ = nullptr;
  moe_off_pinned_n_ = 0;
  for (int i = 0; i < kMoeStreams; ++i) {
    if (moe_streams_[i]) cudaStreamDestroy(moe_streams_[i]);
    if (moe_ws_[i]) cudaFree(moe_ws_[i]);
    if (moe_join_[i]) cudaEventDestroy(moe_join_[i]);
    moe_streams_[i] = nullptr, moe_ws_[i] = nullptr, moe_join_[i] = nullptr;
  }
  if (moe_fork_) cudaEventDestroy(moe_fork_);
  moe_fork_ = nullptr;
}

// ---- routing ---------------------------------------------------------------------------------

void CudaOps::moe_route(const void* logits, float* probs, int32_t* topk_idx, float* topk_w, float* stats,
                        int64_t T, int64_t E, int64_t k, bool norm_topk) {
  check_route(T, E, k, "moe_route");
  set_device(dev_);
  k_moe_route(dtype_, logits, probs, topk_idx, topk_w, T, E, k, norm_topk, st_);
  if (stats) k_moe_route_stats(probs, topk_idx, stats, T, E, k, st_);
}

void CudaOps::moe_route_bwd(const float* probs, const int32_t* topk_idx, const float* dw, const float* counts,
                            float aux_coef, void* dlogits, int64_t T, int64_t E, int64_t k, bool norm_topk) {
  check_route(T, E, k, "moe_route_bwd");
  set_device(dev_);
  k_moe_route_bwd(dtype_, probs, topk_idx, dw, counts, aux_coef, dlogits, T, E, k, norm_topk, st_);
}

// The histogram scratch grows on demand; the stream is idle whenever it is replaced (every
// moe_sort_launch is followed by its wait for the stream before the next one), and cudaFree
// waits for the device anyway.
void CudaOps::moe_sort(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                       int32_t* token, int64_t T, int64_t E, int64_t k) {
  moe_sort_launch(topk_idx, offsets, offsets_host, row, token, T, E, k);
  moe_sort_wait(offsets_host, E);
}

void CudaOps::moe_sort_launch(const int32_t* topk_idx, int32_t* offsets, int32_t* offsets_host, int32_t* row,
                              int32_t* token, int64_t T, int64_t E, int64_t k) {
  require(T >= 0 && E >= 1 && k >= 1, "moe_sort", "need T >= 0, E >= 1 and k >= 1");
  check_rows(T, k, 0, "moe_sort");
  require(E <= 16384, "moe_sort", "at most 16384 experts (one int per expert in shared memory)");
  set_device(dev_);
  const int64_t R = T * k;
  moe_sort_empty_ = R == 0;
  if (R == 0) {
    RP_CUDA_CHECK(cudaMemsetAsync(offsets, 0, size_t(E + 1) * sizeof(int32_t), st_));
    std::fill(offsets_host, offsets_host + E + 1, 0);
    return;
  }
  std::lock_guard lk(moe_mu_);
  const size_t bytes = size_t(moe_sort_plan(R, E).hist_ints) * sizeof(int32_t);
  if (bytes > moe_hist_bytes_) {
    RP_CUDA_CHECK(cudaStreamSynchronize(st_));
    if (moe_hist_) RP_CUDA_CHECK(cudaFree(moe_hist_));
    moe_hist_ = nullptr;
    moe_hist_bytes_ = 0;
    RP_CUDA_CHECK(cudaMalloc(&moe_hist_, bytes));
    moe_hist_bytes_ = bytes;
  }
  if (E + 1 > moe_off_pinned_n_) {  // the stream is idle here: every launch was waited for
    if (moe_off_pinned_) RP_CUDA_CHECK(cudaFreeHost(moe_off_pinned_));
    moe_off_pinned_ = nullptr, moe_off_pinned_n_ = 0;
    RP_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&moe_off_pinned_), size_t(E + 1) * sizeof(int32_t),
                                cudaHostAllocMapped | cudaHostAllocPortable));
    RP_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&moe_off_mapped_), moe_off_pinned_, 0));
    moe_off_pinned_n_ = E + 1;
  }
  // The scan kernel writes the offsets into mapped host memory as well: visible on the host
  // once the stream is past it, without a device-to-host copy waiting behind the copies in flight
  k_moe_sort(topk_idx, offsets, row, token, T, E, k, static_cast<int32_t*>(moe_hist_), err_, st_,
             moe_off_mapped_);
  if (!moe_sort_done_) RP_CUDA_CHECK(cudaEventCreateWithFlags(&moe_sort_done_, cudaEventDisableTiming));
  RP_CUDA_CHECK(cudaEventRecord(moe_sort_done_, st_));
}

void CudaOps::moe_sort_wait(int32_t* offsets_host, int64_t E) {
  if (moe_sort_empty_) return;  // filled by the launch
  require(moe_sort_done_ && E + 1 <= moe_off_pinned_n_, "moe_sort_wait",
          "no moe_sort_launch of E experts to wait for");
  RP_CUDA_CHECK(cudaEventSynchronize(moe_sort_done_));  // the documented host round trip
  std::copy(moe_off_pinned_, moe_off_pinned_ + E + 1, offsets_host);
}

// ---- gathers and combines --------------------------------------------------------------------

void CudaOps::gather_rows(const void* x, const int32_t* token, void* xs, int64_t R, int64_t H) {
  require(R >= 0 && H >= 0, "gather_rows", "negative dimension");
  set_device(dev_);
  k_gather_rows(dtype_, x, token, xs, R, H, st_);
}

void CudaOps::moe_combine(const void* ys, const float* w, const int32_t* row, void* y, int64_t T, int64_t k,
                          int64_t H, bool accumulate) {
  check_rows(T, k, H, "moe_combine");
  set_device(dev_);
  k_moe_combine(dtype_, ys, w, row, y, T, k, H, accumulate, st_);
}

void CudaOps::moe_combine_bwd(const void* dy, const void* ys, const float* w, const int32_t* row, void* dys,
                              float* dw, int64_t T, int64_t k, int64_t H) {
  check_rows(T, k, H, "moe_combine_bwd");
  set_device(dev_);
  k_moe_combine_bwd(dtype_, dy, ys, w, row, dys, dw, T, k, H, st_);
}

void CudaOps::moe_gather_bwd(const void* dxs, const int32_t* row, void* dx, int64_t T, int64_t k, int64_t H,
                             bool accumulate) {
  check_rows(T, k, H, "moe_gather_bwd");
  set_device(dev_);
  k_moe_gather_bwd(dtype_, dxs, row, dx, T, k, H, accumulate, st_);
}

// ---- grouped linears -------------------------------------------------------------------------
// Row-major y = x W^T is column-major y^T = W x^T (see linear_fwd). Per expert e with rows
// [r0, r0 + n): forward (T, N) m = N, n, k = K; input gradient (N, N) m = K, n, k = N;
// weight gradient (N, T) m = K, N, k = n into the f32 accumulator.

bool CudaOps::grouped_gemm_call(int which, const void* a, const void* b, void* c, const int32_t* off,
                                int64_t E, int64_t K, int64_t N, float beta, float alpha_all) {
  const bool f32_out = which == 2;
  if (f32_out && !grouped_f32_out_ok_) return false;
  if (K > INT_MAX || N > INT_MAX) return false;
  MoeGroupTable tab;
  if (!group_table(off, E, tab)) return false;
  if (tab.n == 0) return true;
  const int G = tab.n;
  const size_t es = dtype_size(dtype_);
  MoeGroupOperand A, B, C;
  const size_t ng = size_t(G);
  std::vector<int> m(ng), n(ng), kk(ng), lda(ng), ldb(ng), ldc(ng);
  std::vector<cublasOperation_t> ta(ng), tb(ng);
  for (int g = 0; g < G; ++g) {
    const int rows = off[tab.expert[g] + 1] - off[tab.expert[g]];
    const size_t i = size_t(g);
    switch (which) {
      case 0:
        ta[i] = CUBLAS_OP_T, tb[i] = CUBLAS_OP_N, m[i] = int(N), n[i] = rows, kk[i] = int(K);
        lda[i] = int(K), ldb[i] = int(K), ldc[i] = int(N);
        break;
      case 1:
        ta[i] = CUBLAS_OP_N, tb[i] = CUBLAS_OP_N, m[i] = int(K), n[i] = rows, kk[i] = int(N);
        lda[i] = int(K), ldb[i] = int(N), ldc[i] = int(K);
        break;
      default:
        ta[i] = CUBLAS_OP_N, tb[i] = CUBLAS_OP_T, m[i] = int(K), n[i] = int(N), kk[i] = rows;
        lda[i] = int(K), ldb[i] = int(N), ldc[i] = int(K);
        break;
    }
  }
  moe_group_operands(which, a, b, c, K, N, es, A, B, C);
  std::lock_guard lk(moe_mu_);
  blas_handle();
  if (!group_ptrs_)
    RP_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&group_ptrs_), size_t(3 * kMoeMaxGroups) * sizeof(void*)));
  // the previous call's GEMMs read the array before this kernel rewrites it (stream order)
  k_moe_group_ptrs(tab, A, B, C, group_ptrs_, st_);
  const std::vector<float> alpha(ng, alpha_all), betas(ng, beta);
  const std::vector<int> sizes(ng, 1);
  const cudaDataType_t io = cuda_type(dtype_), out = f32_out ? CUDA_R_32F : io;
  const cublasStatus_t st = cublasGemmGroupedBatchedEx(
      static_cast<cublasHandle_t>(blas_), ta.data(), tb.data(), m.data(), n.data(), kk.data(), alpha.data(),
      const_cast<const void* const*>(group_ptrs_), io, lda.data(),
      const_cast<const void* const*>(group_ptrs_ + G), io, ldb.data(), betas.data(), group_ptrs_ + 2 * G, out,
      ldc.data(), G, sizes.data(), CUBLAS_COMPUTE_32F);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    if (f32_out) grouped_f32_out_ok_ = false;
    return false;
  }
  RP_CUBLAS_CHECK(st);
  return true;
}

void CudaOps::expert_gemm(int which, const void* a, const void* b, void* c, int64_t e, int64_t r0, int64_t n,
                          int64_t K, int64_t N, float beta, cudaStream_t st, void* ws, float alpha) {
  const size_t es = dtype_size(dtype_);
  switch (which) {
    case 0:  // a = W, b = x, c = y
      return gemm_on(st, ws, true, false, N, n, K, at(a, e * N * K, es), K, at(b, r0 * K, es), K,
                     at(c, r0 * N, es), dtype_, N, beta, alpha);
    case 1:  // a = W, b = dy, c = dx
      return gemm_on(st, ws, false, false, K, n, N, at(a, e * N * K, es), K, at(b, r0 * N, es), N,
                     at(c, r0 * K, es), dtype_, K, beta, alpha);
    default:  // a = x, b = dy, c = dW (f32)
      return gemm_on(st, ws, false, true, K, N, n, at(a, r0 * K, es), K, at(b, r0 * N, es), N,
                     at(c, e * N * K, 4), DType::f32, K, 1.f, alpha);
  }
}

// Mode 2 forks the compute stream into the side streams (an event each way), the experts
// taken round-robin; the outputs of different experts are disjoint, so the result does not
// depend on the interleaving.
void CudaOps::grouped_gemms(int which, const void* a, const void* b, void* c, const int32_t* off, int64_t E,
                            int64_t K, int64_t N, float beta, float alpha) {
  if (expert_gemm_ == ExpertGemm::bucketed && bucketed_gemm_call(which, a, b, c, off, E, K, N, beta, alpha))
    return;
  if (grouped_mode_ == 1 && grouped_gemm_call(which, a, b, c, off, E, K, N, beta, alpha)) return;
  int64_t groups = 0;
  for (int64_t e = 0; e < E; ++e) groups += off[e + 1] > off[e] ? 1 : 0;
  if (grouped_mode_ == 0 || groups < 2) {  // a grouped call cuBLAS refused runs on the side streams
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        expert_gemm(which, a, b, c, e, off[e], off[e + 1] - off[e], K, N, beta, st_, ws_, alpha);
    return;
  }
  const int used = int(std::min<int64_t>(groups, kMoeStreams));
  {
    std::lock_guard lk(moe_mu_);
    ensure_moe_streams();
  }
  moe_fork(used);
  int g = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] == off[e]) continue;
    const int i = g++ % kMoeStreams;
    expert_gemm(which, a, b, c, e, off[e], off[e + 1] - off[e], K, N, beta, moe_streams_[i], moe_ws_[i],
                alpha);
  }
  moe_join(used);
}

void CudaOps::ensure_moe_streams() {
  if (moe_fork_) return;
  int prio = 0;
  RP_CUDA_CHECK(cudaStreamGetPriority(st_, &prio));
  for (int i = 0; i < kMoeStreams; ++i) {
    RP_CUDA_CHECK(cudaStreamCreateWithPriority(&moe_streams_[i], cudaStreamNonBlocking, prio));
    RP_CUDA_CHECK(cudaMalloc(&moe_ws_[i], ws_bytes_));
    RP_CUDA_CHECK(cudaEventCreateWithFlags(&moe_join_[i], cudaEventDisableTiming));
  }
  RP_CUDA_CHECK(cudaEventCreateWithFlags(&moe_fork_, cudaEventDisableTiming));
}

void CudaOps::moe_fork(int used) {
  RP_CUDA_CHECK(cudaEventRecord(moe_fork_, st_));
  for (int i = 0; i < used; ++i) RP_CUDA_CHECK(cudaStreamWaitEvent(moe_streams_[i], moe_fork_, 0));
}

void CudaOps::moe_join(int used) {
  for (int i = 0; i < used; ++i) {
    RP_CUDA_CHECK(cudaEventRecord(moe_join_[i], moe_streams_[i]));
    RP_CUDA_CHECK(cudaStreamWaitEvent(st_, moe_join_[i], 0));
  }
}

// The experts with rows of `off` as a kernel's group table; false when there are more than
// kMoeMaxGroups of them.
bool CudaOps::group_table(const int32_t* off, int64_t E, MoeGroupTable& tab) {
  tab.n = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] == off[e]) continue;
    if (tab.n == kMoeMaxGroups) return false;
    tab.expert[tab.n] = int32_t(e), tab.row0[tab.n] = off[e];
    ++tab.n;
  }
  return true;
}

// Whether a grouped product with inner dimension `inner` runs as k_grouped_lowrank (then
// `tab` is filled): mode 1, the kernel on, a 16-bit dtype, inner <= 64.
bool CudaOps::lowrank_call(int64_t inner, const int32_t* off, int64_t E, MoeGroupTable& tab) const {
  return grouped_mode_ == 1 && lowrank_kernel_ && dtype_ != DType::f32 && inner <= 64 &&
         group_table(off, E, tab);
}

void CudaOps::grouped_linear_fwd(const void* x, const void* w, void* y, const int32_t* off, int64_t E,
                                 int64_t K, int64_t N) {
  check_offsets(off, E, K, N, "grouped_linear_fwd");
  set_device(dev_);
  const int64_t R = off[E];
  if (R == 0 || N == 0) return;
  if (K == 0) return fill(dtype_, y, R * N, 0.f);
  MoeGroupTable tab;
  if (lowrank_call(K, off, E, tab))
    return k_grouped_lowrank(dtype_, x, w, y, tab, R, K, N, true, 1.f, 0.f, st_);
  grouped_gemms(0, w, x, y, off, E, K, N, 0.f);
}

void CudaOps::grouped_linear_fwd_add(const void* x, const void* w, void* y, const int32_t* off, int64_t E,
                                     int64_t K, int64_t N, float alpha) {
  check_offsets(off, E, K, N, "grouped_linear_fwd_add");
  set_device(dev_);
  if (off[E] == 0 || N == 0 || K == 0 || alpha == 0.f) return;
  MoeGroupTable tab;
  if (lowrank_call(K, off, E, tab))
    return k_grouped_lowrank(dtype_, x, w, y, tab, off[E], K, N, true, alpha, 1.f, st_);
  grouped_gemms(0, w, x, y, off, E, K, N, 1.f, alpha);
}

void CudaOps::grouped_linear_bwd_input(const void* dy, const void* w, void* dx, const int32_t* off, int64_t E,
                                       int64_t K, int64_t N, bool accumulate) {
  check_offsets(off, E, K, N, "grouped_linear_bwd_input");
  set_device(dev_);
  const int64_t R = off[E];
  if (R == 0 || K == 0) return;
  if (N == 0) {
    if (!accumulate) fill(dtype_, dx, R * K, 0.f);
    return;
  }
  MoeGroupTable tab;
  if (lowrank_call(N, off, E, tab))
    return k_grouped_lowrank(dtype_, dy, w, dx, tab, R, N, K, false, 1.f, accumulate ? 1.f : 0.f, st_);
  grouped_gemms(1, w, dy, dx, off, E, K, N, accumulate ? 1.f : 0.f);
}

void CudaOps::grouped_linear_bwd_weight(const void* dy, const void* x, void* dw, const int32_t* off,
                                        int64_t E, int64_t K, int64_t N) {
  check_offsets(off, E, K, N, "grouped_linear_bwd_weight");
  set_device(dev_);
  if (off[E] == 0 || K == 0 || N == 0) return;
  MoeGroupTable tab;
  if (grouped_mode_ == 1 && std::min(K, N) <= wgrad_kernel_max_ && dtype_ != DType::f32 &&
      group_table(off, E, tab))
    return k_grouped_wgrad(dtype_, dy, x, static_cast<float*>(dw), tab, off[E], K, N, st_);
  grouped_gemms(2, x, dy, dw, off, E, K, N, 1.f);
}

}  // namespace rp::cuda
