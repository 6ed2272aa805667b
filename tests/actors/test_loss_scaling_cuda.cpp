// fp16 dynamic loss scaling end to end on the CUDA backend (compute_dtype f16): a loss scale of
// 2^40 makes the f16 gradients of the tiny model overflow for real (|dlogit| * 2^40 is far past
// f16's 65504), so the overflowing steps are skipped (weights, AdamW moments and step counters
// untouched), the scale backs off, and training then goes on like a run that never saw those
// steps. The CPU twin (f32, forced) is tests/actors/test_loss_scaling.cpp. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kM = 2, kNSeq = 2, kSeqLen = 16;

struct F16Run {
  std::vector<StepResult> results;
  std::vector<std::vector<float>> weights;
  std::vector<AdamWState> states;
  LossScaler scaler{LossScalerOptions{}};
};

LossScalerOptions scaler(float init, float backoff) {
  LossScalerOptions o;
  o.init_scale = init;
  o.backoff_factor = backoff;
  o.growth_interval = 1000;
  o.min_scale = 1.f;
  return o;
}

/// Trains one step per entry of `batches` (the data seed of the step) in f16 on the GPU.
F16Run train_f16(bool async, const LossScalerOptions& ls, const std::vector<int>& batches) {
  ModelLayout m = make_layout(tiny_config(false, true, 2));
  SessionOptions o;
  o.backend = "cuda";
  o.workers = 2;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.async = async;
  o.adam = adam_opts();
  o.device.dtype = DType::f16;
  o.loss_scaling = ls;
  TestSession s(m, random_weights(m, 7), o);
  for (int b : batches) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, kM * kNSeq * kSeqLen, 100 + b, ids, tg);
    s.forward_backward(ids, tg);
    s.step(1e-3);
  }
  F16Run r;
  for (size_t t = 0; t < batches.size(); ++t) r.results.push_back(s.wait(int64_t(t)));
  s.synchronize();
  r.weights = s.master_weights();
  r.states = s.optimizer_states();
  r.scaler = *s.loss_scaler();
  return r;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t g = 0; g < a.size(); ++g)
    if (a[g].size() != b[g].size() || std::memcmp(a[g].data(), b[g].data(), a[g].size() * 4) != 0)
      return false;
  return true;
}

const float kHuge = std::ldexp(1.f, 40), kBackedOff = std::ldexp(1.f, 10);

TEST(LossScalingCuda, F16OverflowSkipsTheStepAndLeavesEverythingUntouched) {
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device visible: fp16 loss scaling needs the CUDA backend";
  const auto w0 = random_weights(make_layout(tiny_config(false, true, 2)), 7);
  for (bool async : {false, true}) {
    const std::string what = async ? "async" : "sync";
    // async: steps 0 and 1 both run with the initial scale; sync: only step 0
    const int skipped = async ? 2 : 1;
    std::vector<int> steps;
    for (int t = 0; t < skipped; ++t) steps.push_back(t);
    const F16Run r = train_f16(async, scaler(kHuge, std::ldexp(1.f, -30)), steps);
    for (int t = 0; t < skipped; ++t) {
      const StepResult& s = r.results[size_t(t)];
      EXPECT_TRUE(s.skipped) << what << " step " << t;
      EXPECT_EQ(s.loss_scale, kHuge) << what << " step " << t;
      EXPECT_FALSE(std::isfinite(s.grad_norm))
          << what << " step " << t << ": the f16 gradients must overflow";
      EXPECT_TRUE(std::isfinite(s.loss_sum) && s.loss_sum > 0) << what << ": the loss itself is not scaled";
    }
    EXPECT_TRUE(same_bits(r.weights, w0)) << what << ": a skipped step changed the weights";
    for (size_t g = 0; g < r.states.size(); ++g) {
      EXPECT_EQ(r.states[g].step, 0) << what << " group " << g;
      EXPECT_TRUE(r.states[g].m.empty() && r.states[g].v.empty()) << what << " group " << g;
    }
    EXPECT_EQ(r.scaler.scale(), kBackedOff) << what << ": 2^40 backed off by 2^-30";
    EXPECT_EQ(r.scaler.steps_skipped(), skipped) << what;
    EXPECT_EQ(r.scaler.steps_applied(), 0) << what;
  }
}

TEST(LossScalingCuda, F16TrainingGoesOnAfterTheOverflowLikeARunWithoutThoseSteps) {
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device visible: fp16 loss scaling needs the CUDA backend";
  for (bool async : {false, true}) {
    const std::string what = async ? "async" : "sync";
    const int skipped = async ? 2 : 1, n = skipped + 4;
    std::vector<int> steps;
    for (int t = 0; t < n; ++t) steps.push_back(t);
    const F16Run r = train_f16(async, scaler(kHuge, std::ldexp(1.f, -30)), steps);
    for (int t = 0; t < n; ++t) {
      EXPECT_EQ(r.results[size_t(t)].skipped, t < skipped) << what << " step " << t;
      EXPECT_EQ(r.results[size_t(t)].loss_scale, t < skipped ? kHuge : kBackedOff) << what << " step " << t;
      if (t >= skipped) {
        EXPECT_TRUE(std::isfinite(r.results[size_t(t)].grad_norm)) << what << " step " << t;
      }
    }
    EXPECT_EQ(r.scaler.steps_skipped(), skipped) << what;
    EXPECT_EQ(r.scaler.steps_applied(), n - skipped) << what;
    // the same batches without the skipped ones, at the backed-off scale from the start
    const std::vector<int> applied(steps.begin() + skipped, steps.end());
    const F16Run ref = train_f16(async, scaler(kBackedOff, 0.5f), applied);
    for (size_t i = 0; i < applied.size(); ++i) {
      EXPECT_FALSE(ref.results[i].skipped) << what;
      EXPECT_NEAR(r.results[size_t(skipped) + i].loss_sum, ref.results[i].loss_sum,
                  1e-3 * ref.results[i].loss_sum)
          << what << " applied step " << i;
    }
    for (size_t g = 0; g < ref.weights.size(); ++g) {
      EXPECT_LT(rel_err(r.weights[g], ref.weights[g]), 1e-3) << what << " group " << g;
      EXPECT_EQ(r.states[g].step, n - skipped) << what << " group " << g;
    }
    EXPECT_GT(rel_err(r.weights[1], random_weights(make_layout(tiny_config(false, true, 2)), 7)[1]), 1e-4)
        << what << ": training must have moved the weights";
  }
}

}  // namespace
}  // namespace rp::test
