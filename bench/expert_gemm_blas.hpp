// cuBLAS pieces of bench_expert_gemm (CUDA builds only): the two passes' GEMM shapes, one
// cuBLASLt matmul (strided or pointer-array batch), pointer arrays copied to the device once per
// call, cublasGemmBatchedEx and cublasGemmGroupedBatchedEx over them, expert layouts and the
// comparison of a variant's output with the reference. Every CUDA and cuBLAS call is checked
// (std::runtime_error naming the call).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"

namespace rp::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc"); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

// Median seconds of 10 calls of `fn` on `st` (CUDA events), after 3 warm-up calls.
template <class Fn>
double time_stream(cudaStream_t st, Fn fn) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < 10; ++i) {
    check(cudaEventRecord(a, st), "cudaEventRecord");
    fn();
    check(cudaEventRecord(b, st), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One pass of the experts' linear with weights W_e [N, K] (row-major): forward y = x W_e^T
// (input rows of K, output rows of N) or input gradient dx = dy W_e (input N, output K). As
// column-major cuBLAS: out^T [o, rows] = op(W) in^T, W a K x N matrix with ld K, op = T
// forward and N for the gradient; m = out, k = in.
struct Pass {
  bool dx = false;
  int64_t K = 0, N = 0;
  int64_t in() const { return dx ? N : K; }
  int64_t out() const { return dx ? K : N; }
  cublasOperation_t transa() const { return dx ? CUBLAS_OP_N : CUBLAS_OP_T; }
};

// One cuBLASLt bf16 matmul (fp32 accumulate) of `batch` products of `rows` rows: strided
// (weights `w_stride` elements apart, inputs and outputs `rows` rows apart) or, with
// `pointer_array`, from device arrays of pointers. `found` is false when the heuristic has no
// algorithm for it (then run must not be called); a strided matmul throws where the heuristic
// query fails otherwise, a pointer-array one keeps the failed call's status in `status`.
struct LtGemm {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulHeuristicResult_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = 0;
  bool found = false;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // the batch-mode setting's or heuristic query's
  LtGemm(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes, const Pass& p, int64_t rows,
         int batch, bool pointer_array, int64_t w_stride)
      : h(handle), ws(workspace), ws_bytes(workspace_bytes) {
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = p.transa(), tb = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
    const uint64_t in = uint64_t(p.in()), out = uint64_t(p.out()), n = uint64_t(rows);
    check(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, uint64_t(p.K), uint64_t(p.N), p.K), "layout a");
    check(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, in, n, int64_t(in)), "layout b");
    check(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, out, n, int64_t(out)), "layout c");
    const int64_t sb = rows * p.in(), sc = rows * p.out();
    const uint32_t mode = pointer_array ? CUBLASLT_BATCH_MODE_POINTER_ARRAY : CUBLASLT_BATCH_MODE_STRIDED;
    for (auto [l, s] : {std::pair{a, w_stride}, std::pair{b, sb}, std::pair{c, sc}}) {
      check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
            "batch count");
      if (pointer_array) {
        status = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode);
        if (status != CUBLAS_STATUS_SUCCESS) return;  // this cuBLASLt has no pointer-array mode: not found
      } else
        check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s),
              "batch stride");
    }
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const cublasStatus_t ps = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
    int n_found = 0;
    const cublasStatus_t hs = ps == CUBLAS_STATUS_SUCCESS ? cublasLtMatmulAlgoGetHeuristic(
                                                                h, op, a, b, c, c, pref, 1, &algo, &n_found)
                                                          : ps;
    cublasLtMatmulPreferenceDestroy(pref);
    status = hs;
    if (!pointer_array && hs != CUBLAS_STATUS_NOT_SUPPORTED) check(hs, "cublasLtMatmulAlgoGetHeuristic");
    found = hs == CUBLAS_STATUS_SUCCESS && n_found > 0;
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  // Strided: the first weight, input and output; pointer array: the three device arrays.
  void run(const void* w, const void* in, const void* out, cudaStream_t st) const {
    const float one = 1.f, zero = 0.f;
    void* d = const_cast<void*>(out);
    check(cublasLtMatmul(h, op, &one, w, a, in, b, &zero, d, c, d, c, &algo.algo, ws, ws_bytes, st),
          "cublasLtMatmul");
  }
};

// Lists of expert products, each list's weight, input and output pointers consecutive in one
// device array ([A x count][B x count][C x count] per list) that `upload` fills from pinned host
// memory with one copy: what a runtime would issue per call, as the routing changes.
class PtrTable {
 public:
  struct List {
    size_t base = 0;
    std::vector<int32_t> experts, rows;
  };
  PtrTable(const Pass& p, const void* w, const void* in, void* out) : p_(p), w_(w), in_(in), out_(out) {}
  PtrTable(const PtrTable&) = delete;
  PtrTable& operator=(const PtrTable&) = delete;
  ~PtrTable() {
    cudaFree(dev_);
    cudaFreeHost(pin_);
  }
  // A list of products: expert experts[i] over rows[i] rows from row row0[i] of the input and
  // output (in the layout the pointers go into).
  void add(const std::vector<int32_t>& experts, const std::vector<int32_t>& rows,
           const std::vector<int64_t>& row0) {
    List l{host_.size(), experts, rows};
    const size_t n = experts.size();
    host_.resize(host_.size() + 3 * n);
    for (size_t i = 0; i < n; ++i) {
      host_[l.base + i] = at(w_, int64_t(experts[i]) * p_.N * p_.K);
      host_[l.base + n + i] = at(in_, row0[i] * p_.in());
      host_[l.base + 2 * n + i] = at(out_, row0[i] * p_.out());
    }
    lists_.push_back(std::move(l));
  }
  // Allocates the device array and the pinned staging copy (once, after the last add).
  void finish() {
    const size_t bytes = host_.size() * sizeof(void*);
    check(cudaMalloc(reinterpret_cast<void**>(&dev_), std::max<size_t>(bytes, 1)),
          "cudaMalloc pointer arrays");
    check(cudaMallocHost(&pin_, std::max<size_t>(bytes, 1)), "cudaMallocHost pointer arrays");
    std::copy(host_.begin(), host_.end(), static_cast<const void**>(pin_));
  }
  void upload(cudaStream_t st) const {
    check(cudaMemcpyAsync(dev_, pin_, host_.size() * sizeof(void*), cudaMemcpyHostToDevice, st),
          "cudaMemcpyAsync pointer arrays");
  }
  const std::vector<List>& lists() const { return lists_; }
  const void* const* a(size_t l) const { return dev_ + lists_[l].base; }
  const void* const* b(size_t l) const { return a(l) + lists_[l].experts.size(); }
  void* const* c(size_t l) const { return const_cast<void* const*>(a(l) + 2 * lists_[l].experts.size()); }

 private:
  static const void* at(const void* p, int64_t elems) { return static_cast<const uint16_t*>(p) + elems; }
  Pass p_;
  const void *w_, *in_;
  void* out_;
  std::vector<List> lists_;
  std::vector<const void*> host_;
  const void** dev_ = nullptr;
  void* pin_ = nullptr;
};

// List l of `t` (all its products of one row count) as one cublasGemmBatchedEx call.
inline void batched_ex(cublasHandle_t h, const Pass& p, const PtrTable& t, size_t l) {
  const float one = 1.f, zero = 0.f;
  const PtrTable::List& li = t.lists()[l];
  check(
      cublasGemmBatchedEx(h, p.transa(), CUBLAS_OP_N, int(p.out()), li.rows.at(0), int(p.in()), &one, t.a(l),
                          CUDA_R_16BF, int(p.K), t.b(l), CUDA_R_16BF, int(p.in()), &zero, t.c(l), CUDA_R_16BF,
                          int(p.out()), int(li.experts.size()), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmBatchedEx");
}

// List l of `t` as one cublasGemmGroupedBatchedEx call, a group per product (as the runtime's
// Ops::grouped_linear_* call it).
inline void grouped_ex(cublasHandle_t h, const Pass& p, const PtrTable& t, size_t l) {
  const PtrTable::List& li = t.lists()[l];
  const size_t g = li.experts.size();
  if (g == 0) return;
  const std::vector<cublasOperation_t> ta(g, p.transa()), tb(g, CUBLAS_OP_N);
  const std::vector<int> m(g, int(p.out())), k(g, int(p.in())), lda(g, int(p.K)), ldb(g, int(p.in())),
      ldc(g, int(p.out())), sizes(g, 1);
  const std::vector<float> alpha(g, 1.f), beta(g, 0.f);
  check(cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m.data(), li.rows.data(), k.data(), alpha.data(),
                                   t.a(l), CUDA_R_16BF, lda.data(), t.b(l), CUDA_R_16BF, ldb.data(),
                                   beta.data(), t.c(l), CUDA_R_16BF, ldc.data(), int(g), sizes.data(),
                                   CUBLAS_COMPUTE_32F),
        "cublasGemmGroupedBatchedEx");
}

// dst [rows, cols] (bf16) = the ragged rows of src (expert e's at off[e]) with expert e's rows
// from row0[e] on, every other row zero.
inline void to_layout(const void* src, void* dst, int64_t rows, const std::vector<int32_t>& off,
                      const std::vector<int64_t>& row0, int64_t cols) {
  const size_t row_bytes = size_t(cols) * 2;
  check(cudaMemset(dst, 0, size_t(rows) * row_bytes), "cudaMemset layout");
  for (size_t e = 0; e + 1 < off.size(); ++e)
    if (off[e + 1] > off[e])
      check(cudaMemcpy(static_cast<char*>(dst) + size_t(row0[e]) * row_bytes,
                       static_cast<const char*>(src) + size_t(off[e]) * row_bytes,
                       size_t(off[e + 1] - off[e]) * row_bytes, cudaMemcpyDeviceToDevice),
            "cudaMemcpy layout");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after a layout copy");  // other streams read dst
}

// The real rows of an output in a layout (expert e's rows from row0[e]) on the host, in ragged
// order (expert e's at off[e]).
inline std::vector<uint16_t> gather(const void* dev, const std::vector<int32_t>& off,
                                    const std::vector<int64_t>& row0, int64_t cols) {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before a check");
  std::vector<uint16_t> h(size_t(off.back()) * size_t(cols));
  const size_t row_bytes = size_t(cols) * 2;
  for (size_t e = 0; e + 1 < off.size(); ++e)
    if (off[e + 1] > off[e])
      check(cudaMemcpy(h.data() + size_t(off[e]) * size_t(cols),
                       static_cast<const char*>(dev) + size_t(row0[e]) * row_bytes,
                       size_t(off[e + 1] - off[e]) * row_bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy check rows");
  return h;
}

// Largest |got - ref| over every third row (and each expert's last row, `last` marks them);
// `ok` becomes false where a value is not finite or off by more than 0.02 + 0.02 |ref| (a few
// bf16 steps: both sums are fp32, rounded once to bf16).
inline double compare(const std::vector<uint16_t>& ref, const std::vector<uint16_t>& got, int64_t cols,
                      const std::vector<int32_t>& off, bool& ok) {
  double worst = 0;
  for (size_t e = 0; e + 1 < off.size(); ++e)
    for (int64_t r = off[e]; r < off[e + 1]; ++r) {
      if (r % 3 != 0 && r != off[e + 1] - 1) continue;
      for (int64_t j = 0; j < cols; ++j) {
        const size_t i = size_t(r * cols + j);
        const double a = bf16_to_f32(ref[i]), b = bf16_to_f32(got[i]), d = std::fabs(a - b);
        if (!std::isfinite(b) || !(d <= 0.02 + 0.02 * std::fabs(a))) ok = false;
        if (std::isfinite(d)) worst = std::max(worst, d);
        else worst = INFINITY;
      }
    }
  return worst;
}

}  // namespace rp::bench
