// CPU ops for LoRA adapters: the accumulating scaled linear and the counter-based dropout
// (kernels/ops.hpp documents both; model/lora_linear.cpp uses them).
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
