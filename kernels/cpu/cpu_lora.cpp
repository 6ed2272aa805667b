// CPU ops for LoRA adapters: the accumulating scaled linear, the linears with a column-block
// operand and the counter-based dropout (kernels/ops.hpp documents them; model/lora_linear.cpp
// uses them).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/dropout_hash.hpp"

// GCC 12 reports false -Wmaybe-uninitialized inside Eigen's AVX-512 packet code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>

namespace rp::cpu {
namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using CMat = Eigen::Map<const RowMat>;
using MMat = Eigen::Map<RowMat>;
const float* F(const void* p) { return static_cast<const float*>(p); }
float* F(void* p) { return static_cast<float*>(p); }
}  // namespace

void CpuOps::linear_fwd_add(const void* x, const void* w, void* y, int64_t M, int64_t K, int64_t N,
                            float alpha) {
  require(M >= 0 && K >= 0 && N >= 0, "linear_fwd_add", "negative dimension");
  if (M == 0 || N == 0 || K == 0) return;
  if (f16_accum_) return gemm_f16_accumulate(threads_, M, N, K, F(x), K, F(w), K, true, F(y), N, alpha, true);
  // rows split over the threads; each part computes its rows' product in fp32 and adds it
  parallel_for(threads_, M, 32, [&](int64_t m0, int64_t m1) {
    CMat xs(F(x) + m0 * K, m1 - m0, K), ws(F(w), N, K);
    MMat ys(F(y) + m0 * N, m1 - m0, N);
    ys.noalias() += alpha * (xs * ws.transpose());
  });
}

// The column-block linears: the contiguous linears' code paths with the block's row stride.
void CpuOps::linear_fwd_ld(const void* x, int64_t ldx, const void* w, void* y, int64_t M, int64_t K,
                           int64_t N) {
  check_linear_ld(M, K, N, ldx, "linear_fwd_ld");
  if (M == 0 || N == 0) return;
  if (K == 0) return fill(DType::f32, y, M * N, 0.f);
  if (f16_accum_)
    return gemm_f16_accumulate(threads_, M, N, K, F(x), ldx, F(w), K, true, F(y), N, 1.f, false);
  gemm_nt(threads_, M, N, K, F(x), ldx, F(w), K, F(y), N, false);
}

void CpuOps::linear_bwd_input_ld(const void* dy, const void* w, void* dx, int64_t lddx, int64_t M, int64_t K,
                                 int64_t N, float alpha) {
  check_linear_ld(M, K, N, lddx, "linear_bwd_input_ld");
  if (M == 0 || K == 0) return;
  float* d = F(dx);
  if (N == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(d + i * lddx, d + i * lddx + K, 0.f);
    return;
  }
  if (f16_accum_)
    return gemm_f16_accumulate(threads_, M, K, N, F(dy), N, F(w), K, false, d, lddx, alpha, false);
  gemm_nn(threads_, M, K, N, F(dy), N, F(w), K, d, lddx, false);
  if (alpha == 1.0f) return;
  for (int64_t i = 0; i < M; ++i)  // the fp32 sum scaled once, as linear_bwd_input does
    for (int64_t k = 0; k < K; ++k) d[i * lddx + k] *= alpha;
}

void CpuOps::linear_bwd_weight_ld(const void* dy, const void* x, int64_t ldx, void* dw, int64_t M, int64_t K,
                                  int64_t N) {
  check_linear_ld(M, K, N, ldx, "linear_bwd_weight_ld");
  if (M == 0 || N == 0 || K == 0) return;
  gemm_tn(threads_, N, K, M, F(dy), N, F(x), ldx, F(dw), K, true);
}

void CpuOps::dropout(const void* x, void* y, int64_t rows, int64_t cols, float p, uint64_t seed,
                     int64_t row0) {
  require(rows >= 0 && cols >= 0 && row0 >= 0, "dropout", "negative dimension or first row");
  require(p >= 0.f && p < 1.f, "dropout", "probability must lie in [0, 1)");
  const float inv = 1.0f / (1.0f - p);
  const float* xs = F(x);
  float* ys = F(y);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const bool keep = dropout_uniform(seed, uint64_t(row0 + r), uint64_t(c)) >= p;
      ys[i] = keep ? xs[i] * inv : 0.0f;
    }
}

}  // namespace rp::cpu
