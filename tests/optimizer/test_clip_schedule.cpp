// Gradient clipping helpers and learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "optimizer/clip.hpp"
#include "optimizer/lr_schedule.hpp"

namespace {
using nlohmann::json;
using rp::LrSchedule;

TEST(Clip, NormOfShardsEqualsNormOfConcatenation) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<std::vector<float>> shards;
  for (int64_t n : {0, 1, 15, 16, 17, 1000, 65537, 3})
    shards.emplace_back(static_cast<size_t>(n)), [&] {
      for (auto& x : shards.back()) x = nd(rng);
    }();
  std::vector<float> all;
  for (auto& s : shards) all.insert(all.end(), s.begin(), s.end());
  double partial = 0;
  for (auto& s : shards) partial += rp::sum_of_squares(s.data(), int64_t(s.size()));
  long double naive = 0;
  for (float x : all) naive += (long double)x * x;
  EXPECT_NEAR(std::sqrt(partial), std::sqrt(double(naive)), 1e-12 * std::sqrt(double(naive)));
  EXPECT_NEAR(rp::sum_of_squares(all.data(), int64_t(all.size())), double(naive), 1e-12 * double(naive));
  EXPECT_EQ(rp::sum_of_squares(nullptr, 0), 0.0);
  const float tiny[3] = {1e-30f, 3e-30f, 0.f};  // squares underflow fp32, not double
  const double t0 = tiny[0], t1 = tiny[1];
  EXPECT_NEAR(rp::sum_of_squares(tiny, 3), t0 * t0 + t1 * t1, 1e-15 * 1e-59);
  const float big[2] = {3e38f, 3e38f};  // squares overflow fp32, not double
  const double b0 = big[0];
  EXPECT_NEAR(rp::sum_of_squares(big, 2), 2 * b0 * b0, 1e-15 * 2e77);
  const float inf[2] = {1.f, INFINITY};
  EXPECT_TRUE(std::isinf(rp::sum_of_squares(inf, 2)));
  const float nan[2] = {1.f, NAN};
  EXPECT_TRUE(std::isnan(rp::sum_of_squares(nan, 2)));
  EXPECT_THROW(rp::sum_of_squares(nullptr, 2), std::invalid_argument);
}

TEST(Clip, CoefficientMatchesTorch) {
  EXPECT_DOUBLE_EQ(rp::clip_coefficient(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_DOUBLE_EQ(rp::clip_coefficient(10.0, 0.5), 0.5 / (10.0 + 1e-6));
  EXPECT_EQ(rp::clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(rp::clip_coefficient(1.0, 1.0), 1.0 / (1.0 + 1e-6));  // just above: clipped
  EXPECT_EQ(rp::clip_coefficient(0.0, 1.0), 1.0);
  EXPECT_EQ(rp::clip_coefficient(INFINITY, 1.0), 0.0);
  EXPECT_TRUE(std::isnan(rp::clip_coefficient(NAN, 1.0)));
  EXPECT_THROW(rp::clip_coefficient(1.0, 0.0), std::invalid_argument);
  EXPECT_THROW(rp::clip_coefficient(1.0, -1.0), std::invalid_argument);
  EXPECT_THROW(rp::clip_coefficient(1.0, INFINITY), std::invalid_argument);
  EXPECT_THROW(rp::clip_coefficient(-1.0, 1.0), std::invalid_argument);
  // clipped gradients have (almost exactly) max_norm
  std::vector<float> g = {3.f, 4.f};
  const double c = rp::clip_coefficient(std::sqrt(rp::sum_of_squares(g.data(), 2)), 1.0);
  EXPECT_NEAR(std::hypot(3.0 * c, 4.0 * c), 1.0, 1e-6);
}

TEST(Clip, AllFinite) {
  EXPECT_TRUE(rp::all_finite(nullptr, 0));
  for (int64_t n : {1, 7, 255, 256, 257, 600}) {
    std::vector<float> g(static_cast<size_t>(n), 1.f);
    g[0] = std::numeric_limits<float>::max();
    EXPECT_TRUE(rp::all_finite(g.data(), n));
    g[0] = 1.f;
    for (float bad : {INFINITY, -INFINITY, NAN})
      for (int64_t pos : {int64_t(0), n / 2, n - 1}) {
        auto h = g;
        h[size_t(pos)] = bad;
        EXPECT_FALSE(rp::all_finite(h.data(), n)) << n << " " << pos << " " << bad;
        EXPECT_TRUE(rp::all_finite(h.data(), pos)) << "prefix before the bad value";
      }
  }
}

LrSchedule sched(const char* kind, double lr, double min_lr, int64_t w, int64_t t) {
  LrSchedule s;
  s.kind = kind;
  s.lr = lr;
  s.min_lr = min_lr;
  s.warmup_steps = w;
  s.total_steps = t;
  s.validate();
  return s;
}

TEST(LrSchedule, Constant) {
  auto s = sched("constant", 1e-3, 0, 0, 0);
  EXPECT_EQ(s.at(0), 1e-3);
  EXPECT_EQ(s.at(1000000), 1e-3);
  auto w = sched("constant", 1e-3, 0, 10, 0);
  EXPECT_EQ(w.at(0), 0.0);  // HF: first update of a warmup uses lr 0
  EXPECT_DOUBLE_EQ(w.at(3), 3e-4);
  EXPECT_DOUBLE_EQ(w.at(9), 9e-4);
  EXPECT_EQ(w.at(10), 1e-3);
  EXPECT_EQ(w.at(-5), 0.0);
}

TEST(LrSchedule, LinearMatchesHf) {
  // get_linear_schedule_with_warmup(W=10, T=110): t/10, then (110 - t) / 100
  auto s = sched("linear", 1e-3, 0, 10, 110);
  EXPECT_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);  // warmup end = peak
  EXPECT_DOUBLE_EQ(s.at(60), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(85), 2.5e-4);
  EXPECT_EQ(s.at(110), 0.0);
  EXPECT_EQ(s.at(500), 0.0);
  for (int64_t t = 10; t <= 110; ++t) EXPECT_NEAR(s.at(t), 1e-3 * (110 - t) / 100.0, 1e-18);
  auto nw = sched("linear", 2.0, 0, 0, 4);
  EXPECT_EQ(nw.at(0), 2.0);
  EXPECT_DOUBLE_EQ(nw.at(1), 1.5);
}

TEST(LrSchedule, LinearWithFloor) {
  auto s = sched("linear", 1e-3, 1e-4, 10, 110);
  EXPECT_DOUBLE_EQ(s.at(60), 1e-4 + 9e-4 * 0.5);  // midpoint 5.5e-4
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(10000), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(5), 5e-4);  // warmup is not floored (HF ramps from 0)
}

TEST(LrSchedule, CosineMatchesHf) {
  // get_cosine_schedule_with_warmup(W=10, T=110, num_cycles=0.5)
  auto s = sched("cosine", 1e-3, 0, 10, 110);
  EXPECT_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(60), 5e-4);                                 // midpoint: half of peak
  EXPECT_NEAR(s.at(35), 1e-3 * 0.5 * (1 + std::sqrt(0.5)), 1e-18);  // quarter: 8.5355e-4
  EXPECT_NEAR(s.at(110), 0.0, 1e-18);
  EXPECT_NEAR(s.at(1000), 0.0, 1e-18);  // held at the floor (HF would rise again)
  for (int64_t t = 10; t <= 110; ++t)
    EXPECT_NEAR(s.at(t), 1e-3 * 0.5 * (1 + std::cos(std::numbers::pi * (t - 10) / 100.0)), 1e-18);
}

TEST(LrSchedule, CosineWithFloorMatchesHfMinLr) {
  // get_cosine_with_min_lr_schedule_with_warmup(min_lr_rate = 0.1): f * 0.9 + 0.1
  auto s = sched("cosine", 1e-3, 1e-4, 10, 110);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(60), 5.5e-4);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(5000), 1e-4);
  for (int64_t t = 0; t < 2000; ++t) EXPECT_GE(s.at(t), t < 10 ? 0.0 : 1e-4 - 1e-18);
}

TEST(LrSchedule, FromJson) {
  auto s = LrSchedule::from_json(
      json::parse(R"({"kind":"cosine","lr":3e-4,"min_lr":3e-5,"warmup_steps":100,"total_steps":1e4})"),
      "spec.schedule");
  EXPECT_EQ(s.kind, "cosine");
  EXPECT_EQ(s.lr, 3e-4);
  EXPECT_EQ(s.min_lr, 3e-5);
  EXPECT_EQ(s.warmup_steps, 100);
  EXPECT_EQ(s.total_steps, 10000);
  auto c = LrSchedule::from_json(json::parse(R"({"lr":1})"), "x");
  EXPECT_EQ(c.kind, "constant");
  EXPECT_EQ(c.at(7), 1.0);
}

void expect_json_error(const char* text, const std::string& what) {
  try {
    LrSchedule::from_json(json::parse(text), "spec.schedule");
    ADD_FAILURE() << text << " accepted";
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(LrSchedule, FromJsonErrors) {
  expect_json_error(R"({"kind":"exp","lr":1})",
                    "spec.schedule.kind: unknown schedule 'exp' (valid: constant, linear, cosine)");
  expect_json_error(R"({"kind":3,"lr":1})", "spec.schedule.kind: expected a string");
  expect_json_error(R"({"kind":"linear"})", "spec.schedule.lr: missing");
  expect_json_error(R"({"lr":"big"})", "spec.schedule.lr: expected a finite number >= 0");
  expect_json_error(R"({"lr":-1})", "spec.schedule.lr");
  expect_json_error(R"({"lr":1,"warmup_steps":-3})",
                    "spec.schedule.warmup_steps: expected a non-negative integer");
  expect_json_error(R"({"lr":1,"warmup_steps":2.5})", "spec.schedule.warmup_steps");
  expect_json_error(R"({"lr":1,"warmup":5})", "spec.schedule.warmup: unknown key (valid: kind, lr");
  expect_json_error(R"({"kind":"cosine","lr":1})", "spec.schedule.total_steps");
  expect_json_error(R"({"kind":"linear","lr":1,"warmup_steps":50,"total_steps":10})",
                    "spec.schedule.warmup_steps: expected at most total_steps (10), got 50");
  expect_json_error(R"({"lr":1,"min_lr":2})", "spec.schedule.min_lr");
  expect_json_error(R"([1,2])", "spec.schedule: expected an object");
}

}  // namespace
