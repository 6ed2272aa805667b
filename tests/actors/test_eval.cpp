// Evaluation passes through the real runtime (CPU backend): forward stages and the tail's
// loss only, interleaved with training in any Session call order. They change nothing (the
// training losses and weights equal a run without them, bit for bit), read the weights of
// their step (two evaluations of one step agree bit for bit; at step 0 an evaluation gives
// the loss the first training pass reports for the same batch), and work with packing.
#include <gtest/gtest.h>

#include <random>

#include "roundpipe/session.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp {
namespace {
using namespace rp::test;

struct Batch {
  std::vector<int32_t> ids, targets;
};
Batch batch(int64_t n, uint64_t seed) {
  Batch b;
  random_tokens(67, n, seed, b.ids, b.targets);
  return b;
}

// Runs 3 steps; `evals[t]` evaluation passes of batch E go before (negative count: after)
// step t's training pass. Returns the step results, the evaluations' losses and the weights.
struct Trace {
  std::vector<StepResult> steps;
  std::vector<std::vector<double>> evals;  ///< per step
  std::vector<std::vector<float>> weights;
};
Trace run(const ModelLayout& m, int workers, bool async, const std::vector<int>& evals) {
  SessionOptions o;
  o.workers = workers;
  o.micro_batches = 2;
  o.micro = {2, 8};
  o.async = async;
  o.adam = adam_opts();
  Session s(m, random_weights(m, 9), o);
  const int64_t n = 2 * 2 * 8;
  const Batch e = batch(n, 100);
  Trace tr;
  std::vector<std::vector<int64_t>> ids(3);
  for (int t = 0; t < 3; ++t) {
    const Batch b = batch(n, uint64_t(t));
    const int k = evals.empty() ? 0 : evals[size_t(t)];
    for (int i = 0; i < k; ++i) ids[size_t(t)].push_back(s.evaluate(e.ids, e.targets));
    s.forward_backward(b.ids, b.targets);
    for (int i = 0; i < -k; ++i) ids[size_t(t)].push_back(s.evaluate(e.ids, e.targets));
    s.step(lr_at(t));
  }
  for (int t = 0; t < 3; ++t) tr.steps.push_back(s.wait(t));
  for (auto& v : ids) {
    tr.evals.emplace_back();
    for (int64_t id : v) {
      const EvalResult r = s.wait_eval(id);
      EXPECT_GT(r.tokens, 0);
      tr.evals.back().push_back(r.loss_sum);
    }
  }
  tr.weights = s.master_weights();
  return tr;
}
}  // namespace

TEST(Evaluation, InterleavedEvaluationsChangeNothingAndAgreeWithinAStep) {
  const ModelLayout m = make_layout(tiny_config(false, true));
  for (int workers : {1, 2, 3})
    for (bool async : {false, true}) {
      const Trace plain = run(m, workers, async, {});
      const Trace with = run(m, workers, async, {2, -2, 1});  // E E T | T E E | E T
      for (int t = 0; t < 3; ++t) {
        EXPECT_EQ(with.steps[size_t(t)].loss_sum, plain.steps[size_t(t)].loss_sum) << workers << async << t;
        EXPECT_EQ(with.steps[size_t(t)].tokens, plain.steps[size_t(t)].tokens);
      }
      EXPECT_EQ(with.weights, plain.weights) << "workers " << workers << (async ? " async" : " sync");
      for (const auto& e : with.evals)
        for (double x : e) EXPECT_EQ(x, e.front()) << "two evaluations of one step differ";
      // the weights move between steps: step 2 evaluates other weights than step 0
      EXPECT_NE(with.evals[0].front(), with.evals[2].front());
    }
}

TEST(Evaluation, AtStepZeroItIsTheLossOfTheFirstTrainingPass) {
  const ModelLayout m = make_layout(tiny_config(true, false));
  SessionOptions o;
  o.workers = 2;
  o.micro_batches = 2;
  o.micro = {1, 16};
  Session s(m, random_weights(m, 4), o);
  const Batch b = batch(32, 7);
  const int64_t id = s.evaluate(b.ids, b.targets);
  s.forward_backward(b.ids, b.targets);
  s.step(1e-3);
  const StepResult r = s.wait(0);
  const EvalResult e = s.wait_eval(id);
  EXPECT_EQ(e.tokens, r.tokens);
  EXPECT_NEAR(e.loss_sum, r.loss_sum, 1e-6 * r.loss_sum);
  EXPECT_THROW(s.wait_eval(5), std::invalid_argument);
  // packed evaluation: positions restarting mid-sequence change the loss
  std::vector<int32_t> pos(32);
  for (int i = 0; i < 32; ++i) pos[size_t(i)] = i % 16 < 5 ? i % 16 : i % 16 - 5;
  const int64_t a = s.evaluate(b.ids, b.targets, pos), c = s.evaluate(b.ids, b.targets, pos);
  EXPECT_EQ(s.wait_eval(a).loss_sum, s.wait_eval(c).loss_sum);
}

}  // namespace rp
