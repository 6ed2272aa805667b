// Dynamic loss scaling wired end to end on the CPU backend (f32; SessionInternals::
// allow_loss_scaling_any_dtype stands in for the f16 GPU path): the tail multiplies the loss
// gradient by the scale, the shards divide it out before clipping and AdamW, an overflow skips
// exactly the step whose gradients overflowed and backs the scale off, and the scale grows after
// growth_interval clean steps. References are runs of the same runtime without loss scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kM = 2, kNSeq = 2, kSeqLen = 5;

struct TrainRun {
  std::vector<StepResult> results;
  std::vector<std::vector<float>> weights;
  std::vector<AdamWState> states;
  std::optional<LossScaler> scaler;
};

/// Trains one step per entry of `batches` (the data seed of the step and the index of its
/// learning rate); loss scaling forced on the f32 CPU backend when `ls` is given.
TrainRun train(bool async, std::optional<LossScalerOptions> ls, const std::vector<int>& batches,
               double max_norm = 0) {
  ModelLayout m = make_layout(tiny_config(false, true));
  TestSessionOptions o;
  o.workers = 2;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.async = async;
  o.adam = adam_opts();
  o.shards = 2;
  o.max_grad_norm = max_norm;
  o.loss_scaling = ls;
  o.allow_loss_scaling_any_dtype = true;
  TestSession s(m, random_weights(m, 7), o);
  for (int b : batches) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, kM * kNSeq * kSeqLen, 100 + b, ids, tg);
    s.forward_backward(ids, tg);
    s.step(lr_at(b));
  }
  TrainRun r;
  for (size_t t = 0; t < batches.size(); ++t) r.results.push_back(s.wait(int64_t(t)));
  s.synchronize();
  r.weights = s.master_weights();
  r.states = s.optimizer_states();
  if (s.loss_scaler()) r.scaler = *s.loss_scaler();
  return r;
}

bool bitwise_equal(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t g = 0; g < a.size(); ++g)
    if (a[g].size() != b[g].size() || std::memcmp(a[g].data(), b[g].data(), a[g].size() * 4) != 0)
      return false;
  return true;
}

LossScalerOptions scaler(float init, float growth = 2.f, float backoff = 0.5f, int64_t interval = 1000) {
  LossScalerOptions o;
  o.init_scale = init;
  o.growth_factor = growth;
  o.backoff_factor = backoff;
  o.growth_interval = interval;
  return o;
}

TEST(LossScaling, IsRefusedForF32UnlessForcedForTesting) {
  ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.micro = {kNSeq, kSeqLen};
  o.loss_scaling = LossScalerOptions{};
  try {
    Session s(m, random_weights(m, 7), o);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
  }
}

// With a power-of-two scale every backward op is exact under the scaling (no overflow, no
// subnormals here) and the unscale 1/(tokens * S) is folded into AdamW's gradient factor, so
// the result is bit-identical to the unscaled run; with clipping on, the clip coefficient
// depends on the unscaled norm, so a missing unscale changes the weights.
TEST(LossScaling, ScaledBackwardGivesTheUnscaledResult) {
  const std::vector<int> steps{0, 1, 2, 3};
  for (bool async : {false, true}) {
    const std::string what = async ? "async" : "sync";
    const TrainRun plain = train(async, std::nullopt, steps, 1e30);  // guarded (reports norms), never clips
    ASSERT_GT(plain.results[0].grad_norm, 0) << what;
    const double max_norm = 0.5 * plain.results[0].grad_norm;
    const TrainRun ref = train(async, std::nullopt, steps, max_norm);
    EXPECT_GT(rel_err(ref.weights[1], plain.weights[1]), 1e-4) << what << ": clipping must be active";

    const TrainRun p2 = train(async, scaler(1024.f), steps, max_norm);
    for (size_t t = 0; t < steps.size(); ++t) {
      EXPECT_EQ(p2.results[t].loss_scale, 1024.f) << what << " step " << t;
      EXPECT_FALSE(p2.results[t].skipped) << what << " step " << t;
      EXPECT_EQ(p2.results[t].grad_norm, ref.results[t].grad_norm) << what << " step " << t;  // unscaled norm
      EXPECT_EQ(p2.results[t].loss_sum, ref.results[t].loss_sum) << what << " step " << t;    // loss unscaled
    }
    EXPECT_TRUE(bitwise_equal(p2.weights, ref.weights)) << what;

    // any other scale: equal within fp32 rounding
    const TrainRun other = train(async, scaler(1000.f), steps, max_norm);
    for (size_t g = 0; g < ref.weights.size(); ++g)
      EXPECT_LT(rel_err(other.weights[g], ref.weights[g]), 2e-6) << what << " group " << g;
    for (size_t t = 0; t < steps.size(); ++t)
      EXPECT_NEAR(other.results[t].grad_norm, ref.results[t].grad_norm, 1e-5 * ref.results[t].grad_norm);
  }
}

// A scale of 2^127 overflows fp32 in the LM-head gradient (|dlogit| ~ 2^127 times |h| > 2):
// the step is skipped, nothing changes (weights, moments, step counters), and the scale backs
// off (backoff 2^-100: to 2^27); after growth_interval = 2 clean steps it doubles.
LossScalerOptions overflow_then_clean() {
  return scaler(std::ldexp(1.f, 127), 2.f, std::ldexp(1.f, -100), 2);
}

TEST(LossScaling, OverflowSkipsOnlyThatStepAndLeavesEverythingUntouched) {
  ModelLayout m = make_layout(tiny_config(false, true));
  const auto w0 = random_weights(m, 7);
  for (bool async : {false, true}) {
    const std::string what = async ? "async" : "sync";
    // async: steps 0 and 1 both run with the initial scale (step 1's scale is decided after
    // step -1), both overflow; sync: only step 0.
    const int skipped = async ? 2 : 1;
    std::vector<int> steps;
    for (int t = 0; t < skipped; ++t) steps.push_back(t);
    const TrainRun r = train(async, overflow_then_clean(), steps);
    for (int t = 0; t < skipped; ++t) {
      EXPECT_TRUE(r.results[size_t(t)].skipped) << what << " step " << t;
      EXPECT_EQ(r.results[size_t(t)].loss_scale, std::ldexp(1.f, 127)) << what << " step " << t;
      EXPECT_FALSE(std::isfinite(r.results[size_t(t)].grad_norm)) << what;
      EXPECT_GT(r.results[size_t(t)].loss_sum, 0) << what << ": the loss itself is not scaled";
    }
    EXPECT_TRUE(bitwise_equal(r.weights, w0)) << what << ": a skipped step changed the weights";
    for (size_t g = 0; g < r.states.size(); ++g) {
      EXPECT_EQ(r.states[g].step, 0) << what << " group " << g;
      EXPECT_TRUE(r.states[g].m.empty() && r.states[g].v.empty()) << what << " group " << g;
    }
    ASSERT_TRUE(r.scaler);
    EXPECT_EQ(r.scaler->scale(), std::ldexp(1.f, 27)) << what;
    EXPECT_EQ(r.scaler->steps_skipped(), skipped) << what;
    EXPECT_EQ(r.scaler->steps_applied(), 0) << what;
  }
}

TEST(LossScaling, TrainingContinuesAfterAnOverflowLikeAnUnscaledRunWithoutThatStep) {
  for (bool async : {false, true}) {
    const std::string what = async ? "async" : "sync";
    const int n = async ? 6 : 4;
    std::vector<int> steps;
    for (int t = 0; t < n; ++t) steps.push_back(t);
    const TrainRun r = train(async, overflow_then_clean(), steps);
    // the scale each step's backward used, and which steps were skipped (see the scaler rules)
    const float S27 = std::ldexp(1.f, 27), S28 = std::ldexp(1.f, 28), S127 = std::ldexp(1.f, 127);
    const std::vector<float> want_scale =
        async ? std::vector<float>{S127, S127, S27, S27, S27, S28} : std::vector<float>{S127, S27, S27, S28};
    const int skipped = async ? 2 : 1;
    for (int t = 0; t < n; ++t) {
      EXPECT_EQ(r.results[size_t(t)].loss_scale, want_scale[size_t(t)]) << what << " step " << t;
      EXPECT_EQ(r.results[size_t(t)].skipped, t < skipped) << what << " step " << t;
    }
    ASSERT_TRUE(r.scaler);
    EXPECT_EQ(r.scaler->scale(), S28) << what;
    EXPECT_EQ(r.scaler->steps_skipped(), skipped) << what;
    EXPECT_EQ(r.scaler->steps_applied(), n - skipped) << what;
    // async: step 4 used 2^27 while the scale was already 2^28, so it does not count towards
    // the next growth; step 5 does (tracker 1). sync: step 3 is the first at 2^28.
    EXPECT_EQ(r.scaler->growth_tracker(), 1) << what;

    // The skipped steps are as if they never happened: an unscaled run over the batches of
    // the applied steps only (same learning rates) gives the same weights and moments. In
    // async mode step t computes with the weights of step t-2, which for the first applied
    // steps are the initial weights: exactly the staleness-1 start of the reference.
    std::vector<int> applied(steps.begin() + skipped, steps.end());
    const TrainRun ref = train(async, std::nullopt, applied);
    for (size_t i = 0; i < applied.size(); ++i)
      EXPECT_EQ(r.results[size_t(skipped) + i].loss_sum, ref.results[i].loss_sum)
          << what << " applied step " << i;
    for (size_t g = 0; g < ref.weights.size(); ++g) {
      EXPECT_LT(rel_err(r.weights[g], ref.weights[g]), 1e-6) << what << " group " << g;
      EXPECT_EQ(r.states[g].step, ref.states[g].step) << what << " group " << g;
    }
    EXPECT_GT(rel_err(r.weights[1], random_weights(make_layout(tiny_config(false, true)), 7)[1]), 1e-4)
        << what << ": training must have moved the weights";
  }
}

}  // namespace
}  // namespace rp::test
