// The ops LoRA adds: linear_fwd_add (y += alpha x W^T), the linears with a column-block operand
// (linear_*_ld) and the counter-based dropout. CPU
// backend against a double-precision reference and the mask's properties; the CUDA backend
// against its CPU twin on the same bf16-rounded inputs (the mask bit for bit). The CUDA tests
// skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/dropout_hash.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"
#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp {
namespace {

using ref::VecD;
using ref::VecF;

TEST(LoraOps, LinearFwdAddAccumulatesScaledProduct) {
  auto ops = make_cpu_ops(2);
  for (auto [M, K, N] : {std::array<int64_t, 3>{37, 19, 5}, {5, 64, 70}, {1, 4, 1}}) {
    VecF x = ref::randn(size_t(M * K), 1), w = ref::randn(size_t(N * K), 2),
         y0 = ref::randn(size_t(M * N), 3);
    const float alpha = -1.75f;
    VecF y = y0;
    ops->linear_fwd_add(x.data(), w.data(), y.data(), M, K, N, alpha);
    VecD ref = ref::linear(ref::to_d(x), ref::to_d(w), M, K, N);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = y0[i] + alpha * ref[i];
    EXPECT_LT(ref::rel_err(y, ref), 1e-6) << M << "x" << K << "x" << N;
  }
  VecF y{1.f, 2.f};
  ops->linear_fwd_add(nullptr, nullptr, y.data(), 1, 0, 2, 3.f);  // K = 0 adds nothing
  EXPECT_EQ(y, (VecF{1.f, 2.f}));
  EXPECT_THROW(ops->linear_fwd_add(nullptr, nullptr, y.data(), -1, 1, 1, 1.f), std::invalid_argument);
}

// A [rows, width] block at column `col` of a [rows, ld] tensor filled with `fill`, and back.
VecF embed(const VecF& block, int64_t rows, int64_t width, int64_t ld, int64_t col, float fill) {
  VecF t(size_t(rows * ld), fill);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < width; ++j) t[size_t(i * ld + col + j)] = block[size_t(i * width + j)];
  return t;
}

TEST(LoraOps, ColumnBlockLinearsEqualTheContiguousOnesBitForBit) {
  auto ops = make_cpu_ops(2);
  for (auto [M, K, N] : {std::array<int64_t, 3>{37, 8, 5}, {5, 16, 70}, {64, 32, 48}}) {
    const int64_t ld = 3 * K, col = K;  // the middle block of three
    VecF x = ref::randn(size_t(M * K), 1), w = ref::randn(size_t(N * K), 2),
         dy = ref::randn(size_t(M * N), 3);
    const VecF xs = embed(x, M, K, ld, col, 7.f);
    // y = x W^T
    VecF y = ref::nan_vec(size_t(M * N)), yl = ref::nan_vec(size_t(M * N));
    ops->linear_fwd(x.data(), w.data(), y.data(), M, K, N);
    ops->linear_fwd_ld(xs.data() + col, ld, w.data(), yl.data(), M, K, N);
    EXPECT_EQ(yl, y) << M << "x" << K << "x" << N;
    // dx = alpha dy W into the block; the other columns untouched
    for (float alpha : {1.f, -0.375f}) {
      VecF dx = ref::nan_vec(size_t(M * K));
      ops->linear_bwd_input(dy.data(), w.data(), dx.data(), M, K, N, false, alpha);
      VecF dxl(size_t(M * ld), 5.f);
      ops->linear_bwd_input_ld(dy.data(), w.data(), dxl.data() + col, ld, M, K, N, alpha);
      EXPECT_EQ(dxl, embed(dx, M, K, ld, col, 5.f)) << "alpha " << alpha;
    }
    // dw += dy^T x
    VecF dw = ref::randn(size_t(N * K), 4), dwl = dw;
    ops->linear_bwd_weight(dy.data(), x.data(), dw.data(), M, K, N);
    ops->linear_bwd_weight_ld(dy.data(), xs.data() + col, ld, dwl.data(), M, K, N);
    EXPECT_EQ(dwl, dw);
    // and against a double-precision reference
    EXPECT_LT(ref::rel_err(yl, ref::linear(ref::to_d(x), ref::to_d(w), M, K, N)), 1e-6);
  }
  VecF b(64, 1.f);
  EXPECT_THROW(ops->linear_fwd_ld(b.data(), 3, b.data(), b.data(), 2, 4, 2), std::invalid_argument);
  EXPECT_THROW(ops->linear_bwd_input_ld(b.data(), b.data(), b.data(), 3, 2, 4, 2, 1.f),
               std::invalid_argument);
  EXPECT_THROW(ops->linear_bwd_weight_ld(b.data(), b.data(), 3, b.data(), 2, 4, 2), std::invalid_argument);
  EXPECT_THROW(ops->linear_fwd_ld(b.data(), 4, b.data(), b.data(), -1, 4, 2), std::invalid_argument);
}

TEST(LoraOps, DropoutUniformIsUniformAndSpreadOverRowsColumnsSeeds) {
  // mean and variance of U[0,1) over a grid, per row and per column
  const int R = 300, C = 300;
  double s = 0, s2 = 0, row_dev = 0;
  for (int r = 0; r < R; ++r) {
    double rs = 0;
    for (int c = 0; c < C; ++c) {
      const double u = dropout_uniform(7, uint64_t(r), uint64_t(c));
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      s += u;
      s2 += u * u;
      rs += u;
    }
    row_dev = std::max(row_dev, std::abs(rs / C - 0.5));
  }
  const double n = double(R) * C, mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(var, 1.0 / 12, 0.002);
  EXPECT_LT(row_dev, 0.08);  // 300 samples per row: sd 0.017, so 0.08 is > 4.5 sd
  // other seeds, rows or columns give other numbers
  int same = 0;
  for (int i = 0; i < 1000; ++i) {
    same += dropout_uniform(7, 3, uint64_t(i)) == dropout_uniform(8, 3, uint64_t(i));
    same += dropout_uniform(7, 3, uint64_t(i)) == dropout_uniform(7, 4, uint64_t(i));
    same += dropout_uniform(7, uint64_t(i), 3) == dropout_uniform(7, uint64_t(i), 4);
  }
  EXPECT_LT(same, 5);
}

TEST(LoraOps, DropoutMaskIsDeterministicScaledAndIndexedByGlobalRow) {
  auto ops = make_cpu_ops();
  const int64_t R = 64, C = 45;
  const float p = 0.3f;
  VecF x = ref::randn(size_t(R * C), 4), y = ref::nan_vec(x.size()), y2 = ref::nan_vec(x.size());
  ops->dropout(x.data(), y.data(), R, C, p, 99, 0);
  ops->dropout(x.data(), y2.data(), R, C, p, 99, 0);
  EXPECT_EQ(y, y2);  // the same call draws the same mask
  int64_t dropped = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.f) ++dropped;
    else EXPECT_EQ(y[i], x[i] * (1.0f / (1.0f - p))) << i;
  }
  EXPECT_NEAR(double(dropped) / double(x.size()), p, 0.04);
  // rows [20, 64) on their own with row0 = 20 draw the same mask rows
  VecF part = ref::nan_vec(size_t((R - 20) * C));
  ops->dropout(x.data() + 20 * C, part.data(), R - 20, C, p, 99, 20);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), y.begin() + 20 * C));
  // another seed, another mask; in place equals out of place; p = 0 keeps everything
  ops->dropout(x.data(), y2.data(), R, C, p, 100, 0);
  EXPECT_NE(y, y2);
  VecF z = x;
  ops->dropout(z.data(), z.data(), R, C, p, 99, 0);
  EXPECT_EQ(z, y);
  ops->dropout(x.data(), y2.data(), R, C, 0.f, 99, 0);
  EXPECT_EQ(y2, x);
  EXPECT_THROW(ops->dropout(x.data(), y2.data(), R, C, 1.f, 99, 0), std::invalid_argument);
  EXPECT_THROW(ops->dropout(x.data(), y2.data(), R, C, -0.1f, 99, 0), std::invalid_argument);
}

// ---- CUDA vs CPU ---------------------------------------------------------------------

using cudatest::CudaOpsTest;

TEST_F(CudaOpsTest, LoraLinearFwdAddMatchesCpu) {
  for (auto [M, K, N] : {std::array<int64_t, 3>{300, 64, 8}, {300, 8, 96}, {7, 5, 3}}) {
    VecF x = ref::randn(size_t(M * K), 11), w = ref::randn(size_t(N * K), 12),
         y = ref::randn(size_t(M * N), 13);
    cudatest::DT xd = upload(x, DType::bf16), wd = upload(w, DType::bf16), yd = upload(y, DType::bf16);
    run([&](Ops& o) { o.linear_fwd_add(xd.get(), wd.get(), yd.get(), M, K, N, 0.625f); });
    cpu_->linear_fwd_add(x.data(), w.data(), y.data(), M, K, N, 0.625f);
    EXPECT_TRUE(cudatest::close(download(yd), y, 1e-2, "linear_fwd_add"));
  }
}

TEST_F(CudaOpsTest, ColumnBlockLinearsMatchCpu) {
  // r = 32 and 8 (16- and 64-byte aligned blocks), an odd width, and N = 0 (the block zeroed)
  for (auto [M, K, N] : {std::array<int64_t, 3>{300, 32, 96}, {77, 8, 40}, {33, 5, 7}, {9, 8, 0}}) {
    const int64_t ld = 3 * K, col = 2 * K;  // the last block of three
    const std::string what = std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
    VecF xs = embed(ref::randn(size_t(M * K), 21), M, K, ld, col, 3.f),
         w = ref::randn(size_t(std::max<int64_t>(N, 1) * K), 22),
         dy = ref::randn(size_t(std::max<int64_t>(M * N, 1)), 23);
    // upload() leaves the host vectors holding the bf16-rounded values the CPU twin then reads
    cudatest::DT xsd = upload(xs, DType::bf16), wd = upload(w, DType::bf16), dyd = upload(dy, DType::bf16);
    void* xblock = static_cast<char*>(xsd.get()) + col * 2;
    if (N > 0) {
      cudatest::DT yd = poisoned(M * N, DType::bf16);
      run([&](Ops& o) { o.linear_fwd_ld(xblock, ld, wd.get(), yd.get(), M, K, N); });
      VecF y(size_t(M * N));
      cpu_->linear_fwd_ld(xs.data() + col, ld, w.data(), y.data(), M, K, N);
      EXPECT_TRUE(cudatest::close(download(yd), y, 1e-2, ("linear_fwd_ld " + what).c_str()));
      VecF dw = ref::randn(size_t(N * K), 24);
      cudatest::DT dwd = upload(dw, DType::f32);
      run([&](Ops& o) { o.linear_bwd_weight_ld(dyd.get(), xblock, ld, dwd.get(), M, K, N); });
      cpu_->linear_bwd_weight_ld(dy.data(), xs.data() + col, ld, dw.data(), M, K, N);
      EXPECT_TRUE(cudatest::close(download(dwd), dw, 1e-2, ("linear_bwd_weight_ld " + what).c_str()));
    }
    VecF dx(size_t(M * ld), 5.f);
    cudatest::DT dxd = upload(dx, DType::bf16);
    void* dxblock = static_cast<char*>(dxd.get()) + col * 2;
    run([&](Ops& o) { o.linear_bwd_input_ld(dyd.get(), wd.get(), dxblock, ld, M, K, N, -0.5f); });
    cpu_->linear_bwd_input_ld(dy.data(), w.data(), dx.data() + col, ld, M, K, N, -0.5f);
    const VecF got = download(dxd);
    EXPECT_TRUE(cudatest::close(got, dx, 1e-2, ("linear_bwd_input_ld " + what).c_str()));
    for (int64_t i = 0; i < M; ++i)  // the columns outside the block keep their values
      for (int64_t j = 0; j < col; ++j) ASSERT_EQ(got[size_t(i * ld + j)], 5.f) << what;
  }
}

TEST_F(CudaOpsTest, LoraDropoutMaskEqualsCpu) {
  const int64_t R = 333, C = 77;  // odd sizes
  const float p = 0.25f;
  VecF x = ref::randn(size_t(R * C), 14);
  cudatest::DT xd = upload(x, DType::bf16), yd = poisoned(R * C, DType::bf16);
  run([&](Ops& o) {
    o.dropout(xd.get(), yd.get(), R, C, p, 1234, 50);
    o.dropout(xd.get(), xd.get(), R, C, p, 1234, 50);  // in place
  });
  VecF want(x.size());
  cpu_->dropout(x.data(), want.data(), R, C, p, 1234, 50);
  VecF got = download(yd), got_in_place = download(xd);
  EXPECT_EQ(got, got_in_place);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i] == 0.f, want[i] == 0.f) << "mask differs at " << i;
    EXPECT_EQ(got[i], cudatest::round_to(DType::bf16, want[i])) << i;
  }
}

}  // namespace
}  // namespace rp
