// CudaOps for LoRA adapters: the accumulating scaled linear (cuBLASLt with beta = 1), the
// linears with a column-block operand (the block's row stride as the leading dimension) and the
// counter-based dropout (cuda_dropout.cu).
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"

namespace rp::cuda {
namespace {
void require(bool cond, const char* op, const char* what) {
  if (!cond) throw std::invalid_argument(std::string(op) + ": " + what);
}
}  // namespace

// row-major y = x W^T is column-major y^T = W x^T (as linear_fwd), with beta = 1
void CudaOps::linear_fwd_add(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                             float alpha) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_fwd_add", "negative dimension");
  if (M == 0 || N == 0 || K == 0) return;
  gemm(true, false, N, M, K, w, K, x, K, y, dtype_, N, 1.f, alpha, f16_accum_);
}

// The column-block linears (kernels/ops.hpp): the contiguous linears' GEMMs with the block's
// row stride as its leading dimension (row-major rows are column-major columns).
void CudaOps::linear_fwd_ld(const void* x, int64_t ldx, const void* w, void* y, int64_t M, int64_t K,
                            int64_t N) {
  check_linear_ld(M, K, N, ldx, "linear_fwd_ld");
  if (M == 0 || N == 0) return;
  if (K == 0) return fill(dtype_, y, M * N, 0.f);
  gemm(true, false, N, M, K, w, K, x, ldx, y, dtype_, N, 0.f, 1.f, f16_accum_);
}

void CudaOps::linear_bwd_input_ld(const void* dy, const void* w, void* dx, int64_t lddx, int64_t M, int64_t K,
                                  int64_t N, float alpha) {
  check_linear_ld(M, K, N, lddx, "linear_bwd_input_ld");
  if (M == 0 || K == 0) return;
  if (N == 0) {  // the block's rows zeroed (0 has the same bits in every dtype)
    set_device(dev_);
    const size_t es = dtype_size(dtype_);
    RP_CUDA_CHECK(cudaMemset2DAsync(dx, size_t(lddx) * es, 0, size_t(K) * es, size_t(M), st_));
    return;
  }
  gemm(false, false, K, M, N, w, K, dy, N, dx, dtype_, lddx, 0.f, alpha, f16_accum_);
}

void CudaOps::linear_bwd_weight_ld(const void* dy, const void* x, int64_t ldx, void* dw, int64_t M, int64_t K,
                                   int64_t N) {
  check_linear_ld(M, K, N, ldx, "linear_bwd_weight_ld");
  if (M == 0 || N == 0 || K == 0) return;
  gemm(false, true, K, N, M, x, ldx, dy, N, dw, DType::f32, K, 1.f);
}

void CudaOps::dropout(const void* x, void* y, int64_t rows, int64_t cols, float p, uint64_t seed,
                      int64_t row0) {
  require(rows >= 0 && cols >= 0 && row0 >= 0, "dropout", "negative dimension or first row");
  require(p >= 0.f && p < 1.f, "dropout", "probability must lie in [0, 1)");
  set_device(dev_);
  k_dropout(dtype_, x, y, rows, cols, p, seed, row0, st_);
}

}  // namespace rp::cuda
