// The ops LoRA adds: linear_fwd_add (y += alpha x W^T) and the counter-based dropout. CPU
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
