// Weight prediction (optimizer/weight_prediction.hpp) against its formula written out by hand:
// the published copy of version k is w_k + (w_k - w_{k-1}), rounded like write_lowp_copy; a
// plain copy when the last update is not the one that made version k.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/dtype.hpp"
#include "optimizer/weight_prediction.hpp"

namespace {

using rp::LastUpdate;

TEST(WeightPrediction, PublishesTheWeightsExtrapolatedByTheirLastUpdate) {
  const std::vector<float> w_prev = {0.5f, -1.25f, 2.f, 0.f};    // version k-1
  const std::vector<float> w_now = {0.75f, -1.5f, 2.f, 0.125f};  // version k (after step k)
  LastUpdate last;
  std::vector<float> w(w_prev);
  rp::begin_update(w.data(), last, 4);
  w = w_now;  // what the update did
  rp::end_update(w.data(), last, 4, 7);
  EXPECT_EQ(last.step, 7);
  std::vector<float> f32(4);
  rp::write_predicted_copy(w.data(), last, 7, f32.data(), 4, rp::DType::f32);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(f32[i], 2 * w_now[i] - w_prev[i]) << i;  // exact for these values
  EXPECT_EQ(f32[0], 1.0f);
  EXPECT_EQ(f32[2], 2.0f);  // no update there: the weight itself
  // bf16: the rounding of the plain copy, applied to the predicted value
  std::vector<uint16_t> bf(4);
  rp::write_predicted_copy(w.data(), last, 7, bf.data(), 4, rp::DType::bf16);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(bf[i], rp::f32_to_bf16(w_now[i] + (w_now[i] - w_prev[i]))) << i;
  // another version (a step was skipped since, or none applied yet): the plain copy
  rp::write_predicted_copy(w.data(), last, 8, f32.data(), 4, rp::DType::f32);
  EXPECT_EQ(f32, w_now);
  LastUpdate none;
  rp::write_predicted_copy(w.data(), none, -1, f32.data(), 4, rp::DType::f32);
  EXPECT_EQ(f32, w_now);
}

TEST(WeightPrediction, PoolSplitsGiveTheSameBits) {
  const int64_t n = 300000;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) a[size_t(i)] = nd(rng), b[size_t(i)] = a[size_t(i)] + 1e-3f * nd(rng);
  rp::ThreadPool pool(rp::ThreadPool::Options{3, {}, 50, "test"});
  auto run = [&](rp::ThreadPool* p) {
    LastUpdate last;
    rp::begin_update(a.data(), last, n, p);
    rp::end_update(b.data(), last, n, 0, p);
    std::vector<uint16_t> out(static_cast<size_t>(n));
    rp::write_predicted_copy(b.data(), last, 0, out.data(), n, rp::DType::bf16, p);
    return out;
  };
  const auto x = run(nullptr), y = run(&pool);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 2), 0);
  size_t moved = 0;
  for (int64_t i = 0; i < n; ++i) moved += x[size_t(i)] != rp::f32_to_bf16(b[size_t(i)]);
  EXPECT_GT(moved, size_t(n / 10)) << "the prediction must differ from the plain copy";
}

TEST(WeightPrediction, BadArgumentsWriteNothing) {
  std::vector<float> w = {1.f};
  LastUpdate last;
  EXPECT_THROW(rp::begin_update(nullptr, last, 1), std::invalid_argument);
  EXPECT_THROW(rp::begin_update(w.data(), last, -1), std::invalid_argument);
  EXPECT_TRUE(last.delta.empty());
  EXPECT_THROW(rp::end_update(w.data(), last, 1, 0), std::invalid_argument);  // no begin_update
  last.delta = {1.f, 2.f};
  EXPECT_THROW(rp::begin_update(w.data(), last, 1), std::invalid_argument);
  EXPECT_EQ(last.delta[0], 1.f);
}

}  // namespace
