// fp16 accumulation of the dense linears (Ops::set_f16_accumulation): the CPU twin's error
// against an exact (double) product on activations of a model's scale at K = 2048 is bounded
// and larger than fp32 accumulation's (so the emulation does round), a partial sum past 65504
// turns the output non-finite even when the exact result is small, and on a GPU cuBLASLt's
// CUBLAS_COMPUTE_16F matches the CPU twin within the same bound.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"
#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp {
namespace {

using ref::randn;
using VecF = std::vector<float>;

float to_f16(float v) { return f16_to_f32(f32_to_f16(v)); }
VecF rounded16(VecF v) {
  for (float& x : v) x = to_f16(x);
  return v;
}

// y[M,N] = x[M,K] w[N,K]^T in double
std::vector<double> exact_fwd(const VecF& x, const VecF& w, int64_t M, int64_t K, int64_t N) {
  std::vector<double> y(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[m * K + k]) * double(w[n * K + k]);
      y[m * N + n] = s;
    }
  return y;
}

struct Err {
  double rms = 0;  // RMS error / RMS of the exact values
  double max = 0;  // largest error / RMS of the exact values
};
Err error(const VecF& got, const std::vector<double>& ref) {
  double se = 0, sr = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::abs(double(got[i]) - ref[i]);
    se += e * e;
    sr += ref[i] * ref[i];
    mx = std::max(mx, e);
  }
  const double rms = std::sqrt(sr / double(ref.size()));
  return {std::sqrt(se / double(ref.size())) / rms, mx / rms};
}

// Inputs of a decoder's linears: RMS-normalised activations (unit variance) and weights of
// std 0.02, both stored in fp16; K = 2048 (a 1-3B model's hidden size).
constexpr int64_t kM = 48, kK = 2048, kN = 64;
// fp16 has 11 significant bits: at outputs of RMS ~0.9 each of the 128 roundings of the
// accumulator along K = 2048 errs by ~2^-11 / sqrt(12) = 1.4e-4 (RMS), which add up to
// sqrt(128) * 1.4e-4 = 1.6e-3 of the outputs' RMS (measured 1.7e-3; fp32 accumulation 2e-4).
// The bounds leave ~2x (RMS) and ~6 sigma (largest error) of room.
constexpr double kRmsBound = 3e-3, kMaxBound = 2e-2;

TEST(F16Accumulation, CpuTwinErrorIsBoundedAndAboveFp32Accumulation) {
  const VecF x = rounded16(randn(size_t(kM * kK), 21)), w = rounded16(randn(size_t(kN * kK), 22, 0.02f));
  const auto exact = exact_fwd(x, w, kM, kK, kN);
  auto ops = make_cpu_ops(2);
  VecF y32(size_t(kM * kN)), y16(size_t(kM * kN));
  ops->linear_fwd(x.data(), w.data(), y32.data(), kM, kK, kN);
  ops->set_f16_accumulation(true);
  EXPECT_TRUE(ops->f16_accumulation());
  ops->linear_fwd(x.data(), w.data(), y16.data(), kM, kK, kN);
  const Err e32 = error(rounded16(y32), exact), e16 = error(y16, exact);  // both stored as fp16
  EXPECT_LT(e16.rms, kRmsBound);
  EXPECT_LT(e16.max, kMaxBound);
  EXPECT_GT(e16.rms, e32.rms * 1.5) << "fp16 accumulation should round more than fp32 accumulation";
  for (float v : y16) ASSERT_EQ(v, to_f16(v)) << "every output is an fp16 value";
  std::printf("[ info ] K=%lld: RMS error / RMS output fp16 acc %.2e (max %.2e), fp32 acc %.2e\n",
              (long long)kK, e16.rms, e16.max, e32.rms);
}

TEST(F16Accumulation, CpuTwinCoversTheInputGradientAndTheScaledAdd) {
  // dx[M,K] = dy[M,N] w[N,K]: the inner dimension is N, here 2048
  const int64_t M = 32, K = 48, N = 2048;
  const VecF dy = rounded16(randn(size_t(M * N), 23)), w = rounded16(randn(size_t(N * K), 24, 0.02f));
  VecF wt(size_t(K * N));  // w^T [K,N], so exact_fwd gives dy w
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wt[k * N + n] = w[n * K + k];
  const auto exact = exact_fwd(dy, wt, M, N, K);
  auto ops = make_cpu_ops(1);
  ops->set_f16_accumulation(true);
  VecF dx(size_t(M * K), 0.f);
  ops->linear_bwd_input(dy.data(), w.data(), dx.data(), M, K, N, false);
  const Err e = error(dx, exact);
  EXPECT_LT(e.rms, kRmsBound);
  EXPECT_GT(e.rms, 0.0);
  // y += alpha x w^T onto y = 0.5: the same products, scaled by 0.25, plus the offset
  VecF y(size_t(M * K), 0.5f);
  ops->linear_fwd_add(dy.data(), wt.data(), y.data(), M, N, K, 0.25f);
  std::vector<double> shifted(exact.size());
  for (size_t i = 0; i < exact.size(); ++i) shifted[i] = 0.5 + 0.25 * exact[i];
  EXPECT_LT(error(y, shifted).rms, kRmsBound);
}

// The hazard: partial sums past 65504 overflow although the exact result is small (the
// first half of the products sums to +70,000, the second half to -70,000).
TEST(F16Accumulation, APartialSumPast65504OverflowsWhereFp32AccumulationDoesNot) {
  const int64_t M = 1, K = 256, N = 1;
  VecF x(size_t(K), 0.f), w(size_t(K), 1.f);
  for (int64_t k = 0; k < K; ++k) x[k] = k < K / 2 ? 546.875f : -546.875f;  // 128 * 546.875 = 70,000
  auto ops = make_cpu_ops(1);
  float y32 = -1, y16 = -1;
  ops->linear_fwd(x.data(), w.data(), &y32, M, K, N);
  EXPECT_EQ(y32, 0.f);
  ops->set_f16_accumulation(true);
  ops->linear_fwd(x.data(), w.data(), &y16, M, K, N);
  EXPECT_FALSE(std::isfinite(y16)) << y16;
}

// ---- CUDA: cuBLASLt with CUBLAS_COMPUTE_16F against the CPU twin -------------------------

class CudaF16Accumulation : public cudatest::CudaOpsTest {
 protected:
  DType dtype() const override { return DType::f16; }
};

TEST_F(CudaF16Accumulation, MatchesTheCpuTwinWithinTheBound) {
  VecF x = rounded16(randn(size_t(kM * kK), 21)), w = rounded16(randn(size_t(kN * kK), 22, 0.02f));
  const auto exact = exact_fwd(x, w, kM, kK, kN);
  ops().set_f16_accumulation(true);
  cpu_->set_f16_accumulation(true);
  cudatest::DT xd = upload(x, DType::f16), wd = upload(w, DType::f16);
  cudatest::DT y = poisoned(kM * kN, DType::f16);
  run([&](Ops& o) { o.linear_fwd(xd.get(), wd.get(), y.get(), kM, kK, kN); });
  VecF twin(size_t(kM * kN));
  cpu_->linear_fwd(x.data(), w.data(), twin.data(), kM, kK, kN);
  const VecF got = download(y);
  const Err eg = error(got, exact), et = error(twin, exact);
  EXPECT_LT(eg.rms, kRmsBound);
  EXPECT_LT(eg.max, kMaxBound);
  std::printf("[ info ] K=%lld: RMS error / RMS output, cuBLASLt fp16 acc %.2e, CPU twin %.2e\n",
              (long long)kK, eg.rms, et.rms);
  // the overflow case overflows on the GPU too
  const int64_t K = 256;
  VecF xo(static_cast<size_t>(K)), wo(static_cast<size_t>(8 * K), 1.f);
  for (int64_t k = 0; k < K; ++k) xo[k] = k < K / 2 ? 546.875f : -546.875f;
  cudatest::DT xod = upload(xo, DType::f16), wod = upload(wo, DType::f16), yo = poisoned(8, DType::f16);
  run([&](Ops& o) { o.linear_fwd(xod.get(), wod.get(), yo.get(), 1, K, 8); });
  EXPECT_FALSE(std::isfinite(download(yo)[0])) << "a partial sum past 65504 must not come back finite";
}

TEST(CudaF16AccumulationRefusal, Bf16DevicesRefuseIt) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  DeviceOptions o;
  o.capacity_bytes = size_t(1) << 30;
  auto dev = make_cuda_device(0, o);
  EXPECT_THROW(dev->ops().set_f16_accumulation(true), std::invalid_argument);
  EXPECT_NO_THROW(dev->ops().set_f16_accumulation(false));
}

}  // namespace
}  // namespace rp
