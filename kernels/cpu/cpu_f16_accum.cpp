// CPU twin of fp16-accumulating GEMMs (Ops::set_f16_accumulation; docs/gpu.md, "fp16
// accumulation"): the accumulator is an fp16 value; each k-chunk of Ops::kF16AccumChunk
// products is summed in fp32 (as one m16n8k16 tensor-core step does) and added to it, the sum
// rounded to fp16 (round-to-nearest-even; past 65504 it becomes inf, as on the GPU).
#include <algorithm>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/dtype.hpp"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>

namespace rp::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Strided = Eigen::OuterStride<>;
using CMap = Eigen::Map<const RowMat, 0, Strided>;
using MMap = Eigen::Map<RowMat, 0, Strided>;

float round_f16(float v) { return f16_to_f32(f32_to_f16(v)); }

}  // namespace

void gemm_f16_accumulate(int threads, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                         const float* B, int64_t ldb, bool b_transposed, float* C, int64_t ldc, float alpha,
                         bool accumulate) {
  const auto round = [](float v) { return round_f16(v); };
  parallel_for(threads, M, 16, [&](int64_t m0, int64_t m1) {
    const int64_t rows = m1 - m0;
    CMap a(A + m0 * lda, rows, K, Strided(lda));
    RowMat acc = RowMat::Zero(rows, N);
    for (int64_t k0 = 0; k0 < K; k0 += Ops::kF16AccumChunk) {
      const int64_t c = std::min(Ops::kF16AccumChunk, K - k0);
      if (b_transposed) {
        CMap b(B, N, K, Strided(ldb));  // [N,K]
        acc = (acc + a.middleCols(k0, c) * b.middleCols(k0, c).transpose()).unaryExpr(round);
      } else {
        CMap b(B, K, N, Strided(ldb));  // [K,N]
        acc = (acc + a.middleCols(k0, c) * b.middleRows(k0, c)).unaryExpr(round);
      }
    }
    MMap out(C + m0 * ldc, rows, N, Strided(ldc));
    // cuBLAS with an fp16 scale type: D = alpha * acc + beta * C, each step in fp16
    if (alpha != 1.0f) acc = (acc * round_f16(alpha)).unaryExpr(round);
    if (accumulate) out = (out.unaryExpr(round) + acc).unaryExpr(round);
    else out = acc;
  });
}

}  // namespace rp::cpu
