// CudaOps for FP8 compute (kernels/ops.hpp, "FP8 compute"): argument checks (as the CPU twin's,
// before anything is enqueued), the quantization launches (cuda_fp8.cu) and the FP8 GEMM
// through cuBLASLt.
//
// cuBLASLt's FP8 GEMM on Hopper needs the "TN" layout (A transposed, B not, column-major
// terms: both operands with K contiguous), fp32 compute and scale type, leading dimensions
// that are multiples of 16 bytes, and 16-byte aligned operands and scale pointers. Row-major D[M,N] = A[M,K]
// B[N,K]^T is column-major D^T[N,M] = B^T(T) A^T(N): cuBLASLt's A is our B (op T, ld K), its B our A (op N,
// ld K), its D ours with ld N; its A/B scale pointers are our scale_b/scale_a. The scales (device fp32)
// multiply the fp32 sum: D = scale_a*scale_b*sum (+ C when beta = 1).
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <vector>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_fp8.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"

namespace rp::cuda {
namespace {

void require(bool cond, const char* op, const std::string& what) {
  if (!cond) throw std::invalid_argument(std::string(op) + ": " + what);
}
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
// Element i of a host copy of a bf16, f16 or f32 array, as a float.
float element_f32(const char* p, DType t, int64_t i) {
  uint16_t h = 0;
  if (t == DType::f32) {
    float f = 0;
    std::memcpy(&f, p + i * 4, 4);
    return f;
  }
  std::memcpy(&h, p + i * 2, 2);
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

}  // namespace

void CudaOps::fp8_scale(const void* x, int64_t n, Fp8Format f, float* scale) {
  require(n >= 0, "fp8_scale", "negative element count");
  require(scale != nullptr && (n == 0 || x != nullptr), "fp8_scale", "null input or scale");
  set_device(dev_);
  k_fp8_scale(dtype_, x, n, f, scale, st_);
}

void CudaOps::fp8_scale_rows(const void* x, int64_t rows, int64_t cols, Fp8Format f, float* scale) {
  require(rows >= 0 && cols >= 0, "fp8_scale_rows", "negative dimension");
  set_device(dev_);
  k_fp8_scale_rows(dtype_, x, rows, cols, f, scale, st_);
}

void CudaOps::rmsnorm_fwd_fp8_scale(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                                    Fp8Format f, float* scale, float w_offset) {
  require(R >= 0 && n > 0, "rmsnorm_fwd", "need R >= 0 rows of n > 0 columns");
  require(scale != nullptr, "rmsnorm_fwd_fp8_scale", "null scale");
  set_device(dev_);
  k_fp8_amax_begin(scale, st_);
  k_rmsnorm_fwd(dtype_, x, w, y, R, n, eps, w_offset, st_, reinterpret_cast<unsigned*>(scale));
  k_fp8_amax_end(scale, f, st_);
}

void CudaOps::rmsnorm_fwd_fp8_rows(const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                                   Fp8Format f, uint8_t* q, float* scale, float w_offset) {
  require(R >= 0 && n > 0, "rmsnorm_fwd", "need R >= 0 rows of n > 0 columns");
  require(R == 0 || (q != nullptr && scale != nullptr), "rmsnorm_fwd_fp8_rows", "null codes or scales");
  set_device(dev_);
  if (!k_rmsnorm_fwd_fp8_rows(dtype_, x, w, y, R, n, eps, w_offset, f, q, scale, st_))
    Ops::rmsnorm_fwd_fp8_rows(x, w, y, R, n, eps, f, q, scale, w_offset);
}

void CudaOps::swiglu_fwd_fp8_scale(const void* g, const void* u, void* h, int64_t n, Fp8Format f,
                                   float* scale) {
  require(n >= 0, "swiglu_fwd", "negative element count");
  require(scale != nullptr, "swiglu_fwd_fp8_scale", "null scale");
  set_device(dev_);
  k_fp8_amax_begin(scale, st_);
  k_swiglu_fwd(dtype_, g, u, h, n, st_, reinterpret_cast<unsigned*>(scale));
  k_fp8_amax_end(scale, f, st_);
}

void CudaOps::swiglu_bwd_fp8_scale(const void* g, const void* u, const void* dh, void* dg, void* du,
                                   int64_t n, Fp8Format f, float* scale_dg, float* scale_du) {
  require(n >= 0, "swiglu_bwd", "negative element count");
  require(scale_dg != nullptr && scale_du != nullptr && scale_dg != scale_du, "swiglu_bwd_fp8_scale",
          "null or shared scales");
  set_device(dev_);
  k_fp8_amax_begin(scale_dg, st_);
  k_fp8_amax_begin(scale_du, st_);
  k_swiglu_bwd(dtype_, g, u, dh, dg, du, n, st_, reinterpret_cast<unsigned*>(scale_dg),
               reinterpret_cast<unsigned*>(scale_du));
  k_fp8_amax_end(scale_dg, f, st_);
  k_fp8_amax_end(scale_du, f, st_);
}

void CudaOps::fp8_quantize(const void* x, const float* scale, uint8_t* q, int64_t n, Fp8Format f) {
  require(n >= 0, "fp8_quantize", "negative element count");
  set_device(dev_);
  k_fp8_quantize(dtype_, x, scale, q, n, n, false, f, st_);
}

void CudaOps::fp8_quantize_rows(const void* x, const float* scale, uint8_t* q, int64_t rows, int64_t cols,
                                Fp8Format f) {
  require(rows >= 0 && cols >= 0, "fp8_quantize_rows", "negative dimension");
  set_device(dev_);
  k_fp8_quantize(dtype_, x, scale, q, rows * cols, cols, true, f, st_);
}

void CudaOps::fp8_quantize_transposed(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                      int64_t cols, Fp8Format f) {
  require(rows >= 0 && cols >= 0, "fp8_quantize_transposed", "negative dimension");
  set_device(dev_);
  k_fp8_quantize_transposed(dtype_, x, scale, q, rows, cols, rows, f, st_);
}

void CudaOps::fp8_quantize_transposed_padded(const void* x, const float* scale, uint8_t* q, int64_t rows,
                                             int64_t cols, int64_t ld, Fp8Format f) {
  require(rows >= 0 && cols >= 0 && ld >= rows, "fp8_quantize_transposed_padded",
          "negative dimension or ld < rows");
  set_device(dev_);
  k_fp8_quantize_transposed(dtype_, x, scale, q, rows, cols, ld, f, st_);
}

void CudaOps::fp8_quantize_both(const void* x, const float* scale, uint8_t* q, uint8_t* qt, int64_t rows,
                                int64_t cols, int64_t ld, Fp8Format f) {
  require(rows >= 0 && cols >= 0 && ld >= rows, "fp8_quantize_both", "negative dimension or ld < rows");
  set_device(dev_);
  if (k_fp8_quantize_both(dtype_, x, scale, q, qt, rows, cols, ld, f, st_)) return;
  k_fp8_quantize(dtype_, x, scale, q, rows * cols, cols, false, f, st_);
  k_fp8_quantize_transposed(dtype_, x, scale, qt, rows, cols, ld, f, st_);
}

void CudaOps::fp8_quantize_rows_col_scaled(const void* x, const float* col_scale, uint8_t* q, float* scale,
                                           int64_t rows, int64_t cols, Fp8Format f) {
  require(rows >= 0 && cols >= 0, "fp8_quantize_rows_col_scaled", "negative dimension");
  require(rows * cols == 0 || (x && q && scale), "fp8_quantize_rows_col_scaled",
          "null input, codes or row scales");
  set_device(dev_);
  k_fp8_quantize_rows_col_scaled(dtype_, x, col_scale, q, scale, rows, cols, f, st_);
}

void CudaOps::transpose_bytes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  require(rows >= 0 && cols >= 0, "transpose_bytes", "negative dimension");
  require(rows * cols == 0 || (src && dst), "transpose_bytes", "null source or destination");
  set_device(dev_);
  k_transpose_bytes(src, dst, rows, cols, st_);
}

void CudaOps::set_fp8_attributes(cublasLtMatmulDesc_t op, const Fp8Operands& f) {
  const int8_t fast = f.fast_accum ? 1 : 0;
  RP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  if (f.rows) {  // a vector of M (cuBLASLt's A) and of N (its B) scales; only set when used
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    RP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    RP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  }
  // cuBLASLt's A is our B and its B our A (see the top of this file)
  RP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &f.scale_b,
                                                 sizeof(f.scale_b)));
  RP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &f.scale_a,
                                                 sizeof(f.scale_a)));
}

void CudaOps::gemm_fp8(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b, Fp8Format fb,
                       const float* scale_b, void* d, int64_t M, int64_t K, int64_t N, bool accumulate) {
  gemm_fp8_to(a, fa, scale_a, b, fb, scale_b, d, dtype_, M, K, N, accumulate, "gemm_fp8");
}

void CudaOps::gemm_fp8_residual(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                                Fp8Format fb, const float* scale_b, const void* r, void* d, int64_t M,
                                int64_t K, int64_t N) {
  require(r != d, "gemm_fp8_residual", "r and d are the same tensor");
  require(r != nullptr && aligned16(r), "gemm_fp8_residual", "r must be a 16-byte aligned tensor");
  if (K == 0 && M > 0 && N > 0) return copy(dtype_, d, r, M * N);
  gemm_fp8_to(a, fa, scale_a, b, fb, scale_b, d, dtype_, M, K, N, true, "gemm_fp8_residual", false, r);
}

void CudaOps::gemm_fp8_accumulate_f32(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                                      Fp8Format fb, const float* scale_b, float* d, int64_t M, int64_t K,
                                      int64_t N) {
  gemm_fp8_to(a, fa, scale_a, b, fb, scale_b, d, DType::f32, M, K, N, true, "gemm_fp8_accumulate_f32");
}

// d (d_type: dtype() or f32) (+)= scale_a scale_b A B^T: gemm_fp8's checks and cuBLASLt call.
void CudaOps::gemm_fp8_to(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                          Fp8Format fb, const float* scale_b, void* d, DType d_type, int64_t M, int64_t K,
                          int64_t N, bool accumulate, const char* op, bool rows, const void* c_in) {
  require(M >= 0 && K >= 0 && N >= 0, op, "negative dimension");
  require(!(fa == Fp8Format::e5m2 && fb == Fp8Format::e5m2), op,
          "both operands e5m2 (cuBLASLt has no e5m2 x e5m2 GEMM; quantize one of them to e4m3)");
  set_device(dev_);
  if (compute_capability() < 89)
    throw DeviceError(
        fmt::format("gemm_fp8: GPU {} has compute capability {}.{}; FP8 tensor cores need 8.9 or newer", dev_,
                    compute_capability_ / 10, compute_capability_ % 10));
  if (M == 0 || N == 0) return;
  require(K % 16 == 0 && N % 16 == 0, op,
          fmt::format("K = {} and N = {} must be multiples of 16 (cuBLASLt's FP8 layout)", K, N));
  require(a && b && d && scale_a && scale_b, op, "null operand, scale or output");
  require(aligned16(a) && aligned16(b) && aligned16(d), op, "operands and output must be 16-byte aligned");
  // cuBLASLt answers CUBLAS_STATUS_NOT_SUPPORTED at the launch for a scale pointer that is not
  // 16-byte aligned (measured on an H200 with cuBLASLt 13.1: a scale at +4 bytes was refused)
  require(aligned16(scale_a) && aligned16(scale_b), op, "scale pointers must be 16-byte aligned");
  if (K == 0) {  // cuBLASLt has no k = 0 GEMM: the sum is empty
    if (!accumulate) fill(d_type, d, M * N, 0.f);
    return;
  }
  const Fp8Operands f8{fp8_type(fb), fp8_type(fa), scale_a, scale_b, fp8_fast_accum_, rows};
  const unsigned al = 16;  // checked above; cuBLASLt may assume no more
  // the plan key of gemm_on's fields (TN, m = N, n = M, ...), then the operand types and fast accumulation
  const Key key{1,
                0,
                N,
                M,
                K,
                K,
                K,
                N,
                int64_t(d_type),
                al,
                al,
                al,
                accumulate,
                int64_t(dtype_),
                int64_t(f8.a_type) * 256 + int64_t(f8.b_type),
                (f8.fast_accum ? 1 : 0) + (rows ? 2 : 0)};
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  std::lock_guard lk(mu_);
  Plan& p = plan_for(key, true, false, N, M, K, K, K, N, d_type, al, al, al, &f8);
  set_fp8_attributes(p.op, f8);  // this call's scale pointers
  RP_CUBLAS_CHECK(cublasLtMatmul(lt_, p.op, &alpha, b, p.a, a, p.b, &beta, c_in ? c_in : d, p.c, d, p.c,
                                 &p.algo, ws_, ws_bytes_, st_));
}

int CudaOps::compute_capability() {
  if (compute_capability_ < 0) {
    int major = 0, minor = 0;
    RP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev_));
    RP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev_));
    compute_capability_ = major * 10 + minor;
  }
  return compute_capability_;
}

void CudaOps::gemm_fp8_rows(const uint8_t* a, Fp8Format fa, const float* scale_a, const uint8_t* b,
                            Fp8Format fb, const float* scale_b, void* d, int64_t M, int64_t K, int64_t N,
                            bool accumulate) {
  if (!gemm_fp8_rows_supported())
    throw DeviceError(fmt::format(
        "gemm_fp8_rows: cuBLASLt on GPU {} offers no FP8 GEMM with outer-vector (per-row) scales", dev_));
  gemm_fp8_to(a, fa, scale_a, b, fb, scale_b, d, dtype_, M, K, N, accumulate, "gemm_fp8_rows", true);
}

bool CudaOps::gemm_fp8_rows_supported() {
  if (fp8_rows_ok_ < 0) fp8_rows_ok_ = probe_fp8_rows() ? 1 : 0;
  return fp8_rows_ok_ == 1;
}

// Small outer-vector GEMMs run for real and are checked (64 x 64 x 64, e4m3 codes of 1, row
// scales 2^(i%3-1) and 2^(j%2), so every product is 64 sa_i sb_j, exact in any compute dtype;
// overwriting, then accumulating onto 4): a missing algorithm (plan_for's DeviceError), a
// refused launch (CUBLAS_STATUS_NOT_SUPPORTED) or a wrong number means no: a library that
// accepts the outer-vector scale mode but applies it otherwise (to C as well, or per column)
// falls back instead of training on wrong products. On the H200 with cuBLASLt 13.1 both calls
// pass (CudaFp8Rows.* there).
bool CudaOps::probe_fp8_rows() {
  set_device(dev_);
  if (compute_capability() < 89) return false;
  constexpr int64_t n = 64;
  char* buf = nullptr;  // codes of A and B, 2 x 64 scales, then the output
  const size_t codes = size_t(n * n), out = size_t(n * n) * dtype_size(dtype_);
  RP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf), 2 * codes + 2 * n * sizeof(float) + out));
  std::vector<float> sc(size_t(2 * n));
  for (int64_t i = 0; i < n; ++i)
    sc[size_t(i)] = std::ldexp(1.f, int(i % 3) - 1), sc[size_t(n + i)] = std::ldexp(1.f, int(i % 2));
  bool ok = true;
  try {
    auto* s = reinterpret_cast<float*>(buf + 2 * codes);
    char* d = buf + 2 * codes + 2 * n * sizeof(float);
    RP_CUDA_CHECK(cudaMemsetAsync(buf, fp8::encode(Fp8Format::e4m3, 1.f), 2 * codes, st_));
    RP_CUDA_CHECK(cudaMemcpyAsync(s, sc.data(), sc.size() * sizeof(float), cudaMemcpyHostToDevice, st_));
    std::vector<char> host(out);
    for (bool acc : {false, true}) {
      if (acc) fill(dtype_, d, n * n, 4.f);
      gemm_fp8_to(reinterpret_cast<uint8_t*>(buf), Fp8Format::e4m3, s,
                  reinterpret_cast<uint8_t*>(buf) + codes, Fp8Format::e4m3, s + n, d, dtype_, n, n, n, acc,
                  "gemm_fp8_rows probe", true);
      RP_CUDA_CHECK(cudaMemcpyAsync(host.data(), d, out, cudaMemcpyDeviceToHost, st_));
      RP_CUDA_CHECK(cudaStreamSynchronize(st_));
      for (int64_t i = 0; i < n && ok; ++i)  // row i of d [M = n, N = n]: scale_a[i] scale_b[j]
        for (int64_t j = 0; j < n && ok; ++j)
          ok = element_f32(host.data(), dtype_, i * n + j) ==
               64.f * sc[size_t(i)] * sc[size_t(n + j)] + (acc ? 4.f : 0.f);
    }
  } catch (const DeviceError&) {
    ok = false;
    cudaGetLastError();  // a refused launch leaves no sticky error; clear a non-sticky one
  }
  cudaStreamSynchronize(st_);
  cudaFree(buf);
  return ok;
}

Fp8ConversionCheck CudaOps::check_fp8_conversions(Fp8Format f) {
  set_device(dev_);
  return k_fp8_check_conversions(f, st_);
}

void set_fp8_fast_accum(Ops& ops, bool on) { cuda_ops(ops, "set_fp8_fast_accum").set_fp8_fast_accum(on); }

Fp8ConversionCheck check_fp8_conversions(Ops& ops, Fp8Format f) {
  return cuda_ops(ops, "check_fp8_conversions").check_fp8_conversions(f);
}

}  // namespace rp::cuda
