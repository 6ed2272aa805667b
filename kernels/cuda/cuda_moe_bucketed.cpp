// CudaOps for the padded expert layout (Ops::moe_pad, ExpertGemm::bucketed; kernels/ops.hpp):
// moe_pad_rows and moe_zero_pad_rows (kernels in cuda_moe_pad.cu, CPU twin
// kernels/cpu/cpu_moe.cpp), and the grouped linears as one cublasGemmBatchedEx per distinct
// segment length (bench/results/moe.md, "Expert GEMMs bucketed and split": 1.8-1.9x cuBLAS's
// grouped call on uniform routing).
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>
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
}  // namespace

void CudaOps::release_moe_pad() {
  if (moe_pad_pinned_) cudaFreeHost(moe_pad_pinned_);
  if (moe_pad_dev_) cudaFree(moe_pad_dev_);
  if (moe_pad_done_) cudaEventDestroy(moe_pad_done_);
  moe_pad_pinned_ = nullptr, moe_pad_dev_ = nullptr, moe_pad_done_ = nullptr;
  moe_pad_n_ = 0;
}

// The shift table goes host -> pinned staging -> device on the compute stream; the staging is
// rewritten only after the previous copy completed (its event), the device table only after
// the previous kernel read it (stream order).
void CudaOps::moe_pad_rows(const int32_t* topk_idx, const int32_t* offsets_host, const int32_t* padded_host,
                           int32_t* offsets, int32_t* row, int32_t* token, int64_t T, int64_t E, int64_t k) {
  require(T >= 0 && E >= 1 && k >= 1, "moe_pad_rows", "need T >= 0, E >= 1 and k >= 1");
  require(k <= INT_MAX && T * k <= INT_MAX && padded_host[E] <= INT_MAX, "moe_pad_rows",
          "more than 2^31 - 1 rows");
  for (int64_t e = 0; e < E; ++e)
    require(padded_host[e + 1] - padded_host[e] >= offsets_host[e + 1] - offsets_host[e], "moe_pad_rows",
            "a padded segment is shorter than its expert's rows");
  set_device(dev_);
  std::lock_guard lk(moe_mu_);
  const int64_t n = 2 * E + 1;
  if (moe_pad_done_) RP_CUDA_CHECK(cudaEventSynchronize(moe_pad_done_));
  if (n > moe_pad_n_) {  // cudaFree waits for the device: no kernel still reads the old table
    release_moe_pad();
    RP_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&moe_pad_pinned_), size_t(n) * sizeof(int32_t),
                                cudaHostAllocPortable));
    RP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&moe_pad_dev_), size_t(n) * sizeof(int32_t)));
    RP_CUDA_CHECK(cudaEventCreateWithFlags(&moe_pad_done_, cudaEventDisableTiming));
    moe_pad_n_ = n;
  }
  for (int64_t e = 0; e < E; ++e) moe_pad_pinned_[e] = padded_host[e] - offsets_host[e];
  std::copy(padded_host, padded_host + E + 1, moe_pad_pinned_ + E);
  RP_CUDA_CHECK(cudaMemcpyAsync(moe_pad_dev_, moe_pad_pinned_, size_t(n) * sizeof(int32_t),
                                cudaMemcpyHostToDevice, st_));
  RP_CUDA_CHECK(cudaEventRecord(moe_pad_done_, st_));
  k_moe_pad_rows(topk_idx, moe_pad_dev_, offsets, row, token, T * k, padded_host[E], E, k, st_);
}

void CudaOps::moe_zero_pad_rows(void* x, const int32_t* token, int64_t R, int64_t H) {
  require(R >= 0 && H >= 0, "moe_zero_pad_rows", "negative dimension");
  set_device(dev_);
  k_moe_zero_pad_rows(dtype_, x, token, R, H, st_);
}

// The experts with rows in order of segment length (longest first, then by index), one group
// table for all of them (one pointer-array kernel), and a batched call over each run of equal
// lengths, its pointers a slice of the arrays. cuBLAS refusing the types shows at the first call,
// before any GEMM ran; the pointer kernel it leaves behind is harmless. cuBLAS cannot see the
// pointers in a device array, and its fast kernels assume them 16-byte aligned: rows whose bytes
// are not a multiple of 16 (an odd rank) or unaligned bases go the grouped way instead.
bool CudaOps::bucketed_gemm_call(int which, const void* a, const void* b, void* c, const int32_t* off,
                                 int64_t E, int64_t K, int64_t N, float beta, float alpha) {
  const bool f32_out = which == 2;
  if ((f32_out && !bucketed_f32_out_ok_) || K > INT_MAX || N > INT_MAX) return false;
  const size_t es = dtype_size(dtype_);
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if ((size_t(K) * es) % 16 != 0 || (size_t(N) * es) % 16 != 0 || !aligned(a) || !aligned(b) || !aligned(c))
    return false;
  auto len = [&](int32_t e) { return off[e + 1] - off[e]; };
  std::vector<int32_t> order;
  for (int32_t e = 0; e < int32_t(E); ++e)
    if (len(e) > 0) order.push_back(e);
  if (order.empty()) return true;
  if (order.size() > size_t(kMoeMaxGroups)) return false;
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return len(x) > len(y); });
  MoeGroupTable tab;
  tab.n = int32_t(order.size());
  for (int32_t g = 0; g < tab.n; ++g) tab.expert[g] = order[size_t(g)], tab.row0[g] = off[order[size_t(g)]];
  MoeGroupOperand A, B, C;
  moe_group_operands(which, a, b, c, K, N, es, A, B, C);
  std::lock_guard lk(moe_mu_);
  auto h = static_cast<cublasHandle_t>(blas_handle());
  if (!group_ptrs_)
    RP_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&group_ptrs_), size_t(3 * kMoeMaxGroups) * sizeof(void*)));
  k_moe_group_ptrs(tab, A, B, C, group_ptrs_, st_);  // after the previous call's GEMMs read them
  const int G = tab.n, k32 = int(K), n32 = int(N);
  const cudaDataType_t io = dtype_ == DType::f32    ? CUDA_R_32F
                            : dtype_ == DType::bf16 ? CUDA_R_16BF
                                                    : CUDA_R_16F;
  const cudaDataType_t out = f32_out ? CUDA_R_32F : io;
  for (int s = 0; s < G;) {
    const int rows = len(order[size_t(s)]);
    int e = s;
    while (e < G && len(order[size_t(e)]) == rows) ++e;
    // row-major y = x W^T as column-major y^T = W x^T (grouped_gemm_call's shapes)
    const bool fwd = which == 0, dx = which == 1;
    const cublasOperation_t ta = fwd ? CUBLAS_OP_T : CUBLAS_OP_N, tb = which == 2 ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int m = fwd ? n32 : k32, n = which == 2 ? n32 : rows, kk = fwd ? k32 : dx ? n32 : rows;
    const int lda = k32, ldb = fwd ? k32 : n32, ldc = fwd ? n32 : k32;
    const cublasStatus_t st = cublasGemmBatchedEx(
        h, ta, tb, m, n, kk, &alpha, const_cast<const void* const*>(group_ptrs_ + s), io, lda,
        const_cast<const void* const*>(group_ptrs_ + G + s), io, ldb, &beta, group_ptrs_ + 2 * G + s, out,
        ldc, e - s, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s == 0 && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
      if (f32_out) bucketed_f32_out_ok_ = false;
      return false;
    }
    RP_CUBLAS_CHECK(st);
    s = e;
  }
  return true;
}

}  // namespace rp::cuda
