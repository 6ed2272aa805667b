// CudaOps for LoRA adapters: the accumulating scaled linear (cuBLASLt with beta = 1) and
// the counter-based dropout (cuda_dropout.cu).
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

void CudaOps::dropout(const void* x, void* y, int64_t rows, int64_t cols, float p, uint64_t seed,
                      int64_t row0) {
  require(rows >= 0 && cols >= 0 && row0 >= 0, "dropout", "negative dimension or first row");
  require(p >= 0.f && p < 1.f, "dropout", "probability must lie in [0, 1)");
  set_device(dev_);
  k_dropout(dtype_, x, y, rows, cols, p, seed, row0, st_);
}

}  // namespace rp::cuda
