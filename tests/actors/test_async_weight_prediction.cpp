// Weight prediction of the staleness-1 optimizer (SessionOptions::async_weight_prediction,
// optimizer/weight_prediction.hpp) in the runtime: on the tiny model at learning rates where
// plain async ends well above sync (a memorisation run over 4 batches), the predicted run ends
// closer to sync, and with sync it changes nothing. RP_ASYNC_SWEEP=1 prints the grid of
// docs/fidelity.md ("Narrowing the gap").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kM = 2, kNSeq = 2, kSeqLen = 16, kBatches = 4;
constexpr int kSteps = 120;

struct TrainedRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
};

/// `steps` steps at constant lr over kBatches batches in turn (memorisation).
TrainedRun train(bool async, bool predict, double lr, int steps) {
  ModelLayout m = make_layout(tiny_config(false, false, 2));
  TestSessionOptions o;
  o.workers = 2;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.async = async;
  o.async_weight_prediction = predict;
  o.adam.beta1 = 0.9;
  o.adam.beta2 = 0.95;
  o.adam.eps = 1e-8;
  o.shards = 2;
  TestSession s(m, random_weights(m, 11), o);
  std::vector<std::vector<int32_t>> ids(kBatches), tg(kBatches);
  for (int b = 0; b < kBatches; ++b)
    random_tokens(m.config.vocab_size, kM * kNSeq * kSeqLen, 500 + b, ids[b], tg[b]);
  TrainedRun r;
  auto take = [&](int64_t t) {
    const StepResult x = s.wait(t);
    r.losses.push_back(x.loss_sum / x.tokens);
  };
  for (int t = 0; t < steps; ++t) {
    s.forward_backward(ids[size_t(t % kBatches)], tg[size_t(t % kBatches)]);
    s.step(lr);
    if (t >= 1) take(t - 1);  // at most two steps in flight
  }
  take(steps - 1);
  s.synchronize();
  r.weights = s.master_weights();
  return r;
}

double tail_mean(const std::vector<double>& l, size_t n = 20) {
  double s = 0;
  for (size_t i = l.size() - n; i < l.size(); ++i) s += l[i];
  return s / double(n);
}

TEST(AsyncWeightPrediction, EndsCloserToSyncThanPlainAsyncAtHighLr) {
  for (double lr : {1e-3, 3e-3}) {
    const double sync = tail_mean(train(false, false, lr, kSteps).losses);
    const double plain = tail_mean(train(true, false, lr, kSteps).losses);
    const double pred = tail_mean(train(true, true, lr, kSteps).losses);
    std::printf(
        "[async] lr %g: final-20 loss sync %.4f, async %.4f (%+.1f%%), async + prediction %.4f (%+.1f%%)\n",
        lr, sync, plain, (plain / sync - 1) * 100, pred, (pred / sync - 1) * 100);
    EXPECT_GT(plain / sync - 1, 0.05)
        << "lr " << lr << ": plain async must show the gap for the test to mean anything";
    EXPECT_LT(std::fabs(pred / sync - 1), 0.5 * std::fabs(plain / sync - 1)) << "lr " << lr;
  }
}

TEST(AsyncWeightPrediction, ChangesNothingWithTheSynchronousOptimizer) {
  const TrainedRun a = train(false, false, 3e-3, 6), b = train(false, true, 3e-3, 6);
  EXPECT_EQ(a.losses, b.losses);
  for (size_t g = 0; g < a.weights.size(); ++g)
    EXPECT_EQ(std::memcmp(a.weights[g].data(), b.weights[g].data(), a.weights[g].size() * 4), 0) << g;
}

TEST(AsyncWeightPrediction, SweepPrintsFinalLosses) {
  if (!std::getenv("RP_ASYNC_SWEEP")) GTEST_SKIP() << "set RP_ASYNC_SWEEP=1 to print the lr grid";
  for (double lr : {3e-4, 1e-3, 3e-3, 1e-2, 3e-2}) {
    const double sync = tail_mean(train(false, false, lr, kSteps).losses);
    const double plain = tail_mean(train(true, false, lr, kSteps).losses);
    const double pred = tail_mean(train(true, true, lr, kSteps).losses);
    std::printf("[async] | %g | %.4f | %.4f (%+.1f%%) | %.4f (%+.1f%%) |\n", lr, sync, plain,
                (plain / sync - 1) * 100, pred, (pred / sync - 1) * 100);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace rp::test
