// CudaOps for the padded expert layout (Ops::moe_pad, ExpertGemm::bucketed; kernels/ops.hpp):
// moe_pad_rows and moe_zero_pad_rows (kernels in cuda_moe_pad.cu, CPU twin
// kernels/cpu/cpu_moe.cpp), and the grouped linears as one batched GEMM per distinct segment
// length (bench/results/moe.md, "Expert GEMMs bucketed and split": 1.8-1.9x cuBLAS's grouped call
// on uniform routing): cuBLASLt's pointer-array batches with an algorithm kept per length class,
// else cublasGemmBatchedEx.
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

// One batch's GEMM in cuBLAS's column-major terms: row-major y = x W^T as y^T = W x^T
// (grouped_gemm_call's shapes). which: 0 forward (W, x -> y), 1 input gradient (W, dy -> dx),
// 2 weight gradient (x, dy -> dW); rows: the segment length of every matrix of the batch.
struct BatchShape {
  bool ta, tb;
  int m, n, k, lda, ldb, ldc;
};
BatchShape batch_shape(int which, int K, int N, int rows) {
  const bool fwd = which == 0, dx = which == 1;
  return {fwd, which == 2,  fwd ? N : K, which == 2 ? N : rows, fwd ? K : dx ? N : rows,
          K,   fwd ? K : N, fwd ? N : K};
}

int pow2_at_least(int x, int floor) {
  int c = floor;
  while (c < x && c < (1 << 30)) c <<= 1;
  return c;
}

// The three layouts of `p` for `rows` and `count` matrices (rows and columns as cublasLtMatmul
// reads op(A) m x k, op(B) k x n, C m x n).
void set_batch_layouts(const BatchShape& b, int count, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc) {
  auto set = [](cublasLtMatrixLayout_t l, uint64_t r, uint64_t c, int n) {
    RP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
    RP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
    RP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)));
  };
  set(la, uint64_t(b.ta ? b.k : b.m), uint64_t(b.ta ? b.m : b.k), count);
  set(lb, uint64_t(b.tb ? b.n : b.k), uint64_t(b.tb ? b.k : b.n), count);
  set(lc, uint64_t(b.m), uint64_t(b.n), count);
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

// The plan of a length class and count class, its algorithm chosen by cuBLASLt's heuristic at
// the class's upper ends; a plan without an operation (op null) records that cuBLASLt found none.
CudaOps::Plan* CudaOps::batched_plan(int which, int64_t K, int64_t N, int rows, int count) {
  const int rc = pow2_at_least(rows, 16), cc = pow2_at_least(count, 1);
  const BatchedKey key{which, K, N, rc, cc};
  auto it = batched_plans_.find(key);
  if (it != batched_plans_.end()) return it->second.op ? &it->second : nullptr;
  Plan p;
  const BatchShape b = batch_shape(which, int(K), int(N), rc);
  const cudaDataType_t io = cuda_type(dtype_), out = which == 2 ? CUDA_R_32F : io;
  RP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = b.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = b.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  RP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  RP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  RP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, io, 1, 1, b.lda));
  RP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, io, 1, 1, b.ldb));
  RP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out, 1, 1, b.ldc));
  const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
  for (auto l : {p.a, p.b, p.c})
    RP_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
  set_batch_layouts(b, cc, p.op, p.a, p.b, p.c);
  cublasLtMatmulPreference_t pref = nullptr;
  RP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ws_bytes_;
  const uint32_t align = 16;  // bucketed_gemm_call sends only 16-byte aligned matrices
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                 CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, a, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) destroy_plan(p);
  else p.algo = res.algo;
  Plan& kept = batched_plans_.emplace(key, p).first->second;
  return kept.op ? &kept : nullptr;
}

// `count` GEMMs of `rows` rows through cuBLASLt, their operands the pointer arrays ptrs[0..count),
// ptrs[G..G+count), ptrs[2G..2G+count) (device). NOT_SUPPORTED when no plan or algorithm takes
// the shape (then nothing was enqueued).
cublasStatus_t CudaOps::lt_batched_gemm(int which, int64_t K, int64_t N, int rows, int count,
                                        void* const* ptrs, int G, float beta, float alpha, cudaStream_t st,
                                        void* ws) {
  Plan* p = batched_plan(which, K, N, rows, count);
  if (!p) return CUBLAS_STATUS_NOT_SUPPORTED;
  set_batch_layouts(batch_shape(which, int(K), int(N), rows), count, p->op, p->a, p->b, p->c);
  const void *A = ptrs, *B = ptrs + G;
  void* C = const_cast<void**>(ptrs + 2 * G);
  cublasStatus_t s = cublasLtMatmul(lt_, p->op, &alpha, A, p->a, B, p->b, &beta, C, p->c, C, p->c, &p->algo,
                                    ws, ws_bytes_, st);
  if (s != CUBLAS_STATUS_NOT_SUPPORTED && s != CUBLAS_STATUS_INVALID_VALUE) return s;
  // the class's algorithm does not take this length: one heuristic call for the exact shape
  cublasLtMatmulPreference_t pref = nullptr;
  RP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t wsb = ws_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(lt_, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  return cublasLtMatmul(lt_, p->op, &alpha, A, p->a, B, p->b, &beta, C, p->c, C, p->c, &res.algo, ws,
                        ws_bytes_, st);
}

// One batch of `count` matrices of `rows` rows, its pointers from index s of the arrays (G
// groups): through cuBLASLt on `st` with workspace `ws`, else cublasGemmBatchedEx on the compute
// stream. False (nothing enqueued) only when the first batch finds cuBLAS refusing the types.
bool CudaOps::bucketed_batch(int which, int64_t K, int64_t N, int s, int count, int rows, int G, float beta,
                             float alpha, cudaStream_t st, void* ws, bool first) {
  if (lt_batched_ok_) {
    const cublasStatus_t r =
        lt_batched_gemm(which, K, N, rows, count, group_ptrs_ + s, G, beta, alpha, st, ws);
    if (r != CUBLAS_STATUS_NOT_SUPPORTED) {
      RP_CUBLAS_CHECK(r);
      ++lt_batches_;
      return true;
    }
  }
  const bool f32_out = which == 2;
  const cudaDataType_t io = cuda_type(dtype_), out = f32_out ? CUDA_R_32F : io;
  const BatchShape bs = batch_shape(which, int(K), int(N), rows);
  const cublasStatus_t r = cublasGemmBatchedEx(
      static_cast<cublasHandle_t>(blas_handle()), bs.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      bs.tb ? CUBLAS_OP_T : CUBLAS_OP_N, bs.m, bs.n, bs.k, &alpha,
      const_cast<const void* const*>(group_ptrs_ + s), io, bs.lda,
      const_cast<const void* const*>(group_ptrs_ + G + s), io, bs.ldb, &beta, group_ptrs_ + 2 * G + s, out,
      bs.ldc, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (first && (r == CUBLAS_STATUS_NOT_SUPPORTED || r == CUBLAS_STATUS_INVALID_VALUE)) {
    if (f32_out) bucketed_f32_out_ok_ = false;
    return false;
  }
  RP_CUBLAS_CHECK(r);
  ++legacy_batches_;
  return true;
}

// The experts with rows in order of segment length (longest first, then by index), one group
// table for all of them (one pointer-array kernel), and a batched GEMM over each run of equal
// lengths, its pointers a slice of the arrays: cuBLASLt's when it takes the shape, else
// cublasGemmBatchedEx. cuBLAS refusing the types shows at the first call, before any GEMM ran;
// the pointer kernel it leaves behind is harmless. cuBLAS cannot see the pointers in a device
// array, and its fast kernels assume them 16-byte aligned: rows whose bytes are not a multiple
// of 16 (an odd rank) or unaligned bases go the grouped way instead.
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
  blas_handle();
  if (!group_ptrs_)
    RP_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&group_ptrs_), size_t(3 * kMoeMaxGroups) * sizeof(void*)));
  k_moe_group_ptrs(tab, A, B, C, group_ptrs_, st_);  // after the previous call's GEMMs read them
  const int G = tab.n;
  std::vector<std::pair<int, int>> runs;  // [s, e): equal lengths
  for (int s = 0, e = 0; s < G; s = e) {
    while (e < G && len(order[size_t(e)]) == len(order[size_t(s)])) ++e;
    runs.emplace_back(s, e);
  }
  // with set_bucketed_streams(n > 1), the batches go round-robin to side streams, so the small
  // ones fill the GPU together; their outputs are disjoint, the join orders what follows
  const int used = lt_batched_ok_ ? int(std::min<size_t>(size_t(bucketed_streams_), runs.size())) : 1;
  if (used > 1) ensure_moe_streams(), moe_fork(used);
  bool ok = true;
  for (size_t r = 0; r < runs.size() && ok; ++r) {
    const auto [s, e] = runs[r];
    const int i = int(r % size_t(used));
    ok = bucketed_batch(which, K, N, s, e - s, len(order[size_t(s)]), G, beta, alpha,
                        used > 1 ? moe_streams_[i] : st_, used > 1 ? moe_ws_[i] : ws_, r == 0);
  }
  if (used > 1) moe_join(used);
  return ok;
}

}  // namespace rp::cuda
