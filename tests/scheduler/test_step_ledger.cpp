// The scheduler's step ledger on its own (scheduler/step_ledger.hpp): events in, the exact
// actions out. The runtime tests (tests/actors) drive it through the scheduler actor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "scheduler/step_ledger.hpp"

namespace rp {
namespace {

using V = std::vector<std::string>;

std::string show(const LedgerAction& a) {
  switch (a.kind) {
    case LedgerAction::Kind::close_step:
      return fmt::format("close step {}: {} passes, grad_scale {:.6g}, lr {}, uploads [{}], grads [{}]",
                         a.step, a.passes, a.grad_scale, a.lr, fmt::join(*a.uploads, " "),
                         fmt::join(*a.grads, " "));
    case LedgerAction::Kind::step_scale:
      return a.skip ? fmt::format("scale step {}: skip", a.step)
                    : fmt::format("scale step {}: {:.6g}", a.step, a.grad_scale);
    case LedgerAction::Kind::step_done:
      return fmt::format("step {} done: loss {}/{}{}", a.step, a.step_result.loss_sum, a.step_result.tokens,
                         a.step_result.skipped ? " skipped" : "");
    case LedgerAction::Kind::eval_done:
      return fmt::format("eval {} done: loss {}/{}", a.eval_result.id, a.eval_result.loss_sum,
                         a.eval_result.tokens);
    case LedgerAction::Kind::deal: return "deal";
  }
  return "?";
}

StepLedger::Options options(int groups, int slots, bool guard = false, LossScaler* scaler = nullptr,
                            int staleness = 1) {
  StepLedger::Options o;
  o.num_groups = groups;
  o.pass_slots = slots;
  o.guard = guard;
  o.loss_scaler = scaler;
  o.staleness = staleness;
  return o;
}

/// A ledger on a fake clock, with the actions of its last call as text.
struct Ledger {
  double t = 0;  ///< the clock, seconds
  StepLedger l;
  explicit Ledger(StepLedger::Options o) : l(with_clock(std::move(o))) {}
  StepLedger::Options with_clock(StepLedger::Options o) {
    o.clock = [this] { return t; };
    return o;
  }
  static V text(const std::vector<LedgerAction>& a) {
    V out;
    for (auto& x : a) out.push_back(show(x));
    return out;
  }
  /// Deals the next pass with `stages` stages and the per-group counts; nullopt when the
  /// ledger gives none. `after`: the actions dealt() appended.
  std::optional<PassDeal> deal(int stages = 3, std::vector<int> up = {}, std::vector<int> gr = {},
                               V* after = nullptr) {
    auto d = l.next_deal();
    if (!d) return d;
    std::vector<LedgerAction> a;
    l.dealt(*d, stages, up, gr, a);
    if (after) *after = text(a);
    return d;
  }
  V report(int64_t pass, double loss_sum = 0, double loss_count = 0) {
    std::vector<LedgerAction> a;
    l.stage_done(pass, StageReport{loss_sum, loss_count, 0, {}}, a);
    return text(a);
  }
  V close(int64_t step, double lr = 0.5, double tokens = -1) {
    std::vector<LedgerAction> a;
    l.close_requested(step, lr, tokens, a);
    return text(a);
  }
  V updated(int64_t step, int group, double sumsq = 0) {
    std::vector<LedgerAction> a;
    l.group_updated(step, group, sumsq, a);
    return text(a);
  }
  V sumsq(int64_t step, int group, double s) {
    std::vector<LedgerAction> a;
    l.grad_sumsq(step, group, s, a);
    return text(a);
  }
};

// An evaluation pass tagged with a step is one of the step's passes (its uploads count, no
// gradient; the step closes and completes only with it), but its loss is its own and it takes
// no dropout index; its result goes out when its own stages are in.
TEST(StepLedger, EvaluationPassesInterleaveWithTrainingPasses) {
  Ledger x(options(2, 2));
  x.l.submit_pass(0, -1, 6);
  x.l.submit_pass(0, 7, 0);
  x.l.submit_pass(0, -1, 4);
  V after;
  auto p0 = x.deal(3, {1, 1}, {1, 1}, &after);
  ASSERT_TRUE(p0);
  EXPECT_EQ(p0->pass, 0);
  EXPECT_EQ(p0->slot, 0);
  EXPECT_EQ(p0->dropout_pass, 0);
  auto p1 = x.deal(2, {1, 0}, {0, 0});
  ASSERT_TRUE(p1);
  EXPECT_EQ(p1->eval, 7);
  EXPECT_EQ(p1->slot, 1);
  EXPECT_EQ(p1->dropout_pass, -1) << "an evaluation pass has no dropout masks";
  EXPECT_FALSE(x.deal()) << "both pass slots are taken";
  EXPECT_EQ(x.close(0, 0.5), V{}) << "the third pass is not dealt: the totals are not final";
  EXPECT_EQ(x.report(1, 2.0, 3), V{});
  EXPECT_EQ(x.report(1, 1.0, 1), (V{"eval 7 done: loss 3/4", "deal"}));
  auto p2 = x.deal(3, {1, 1}, {1, 1}, &after);
  ASSERT_TRUE(p2);
  EXPECT_EQ(p2->slot, 1) << "the slot the evaluation gave back";
  EXPECT_EQ(p2->dropout_pass, 1) << "the step's second training pass";
  EXPECT_EQ(after, (V{"close step 0: 3 passes, grad_scale 0.1, lr 0.5, uploads [3 2], grads [2 2]"}));
  ASSERT_TRUE(x.l.eval_result(7));
  EXPECT_EQ(x.l.eval_result(7)->loss_sum, 3.0);
  for (int s = 0; s < 2; ++s) EXPECT_EQ(x.report(0), V{});
  EXPECT_EQ(x.report(0, 5, 6), V{"deal"});
  EXPECT_EQ(x.updated(0, 0), V{});
  EXPECT_EQ(x.updated(0, 1), V{}) << "pass 2 is still running";
  EXPECT_FALSE(x.l.step_result(0));
  EXPECT_EQ(x.report(2), V{});
  EXPECT_EQ(x.report(2), V{});
  EXPECT_EQ(x.report(2, 4, 4), (V{"step 0 done: loss 9/10", "deal"})) << "the evaluation's loss stays out";
}

// Training passes are numbered within their step for the dropout masks: step * 2^16 + index.
TEST(StepLedger, DropoutMasksAreNumberedPerStep) {
  Ledger x(options(1, 4));
  x.l.submit_pass(3, -1, 1);
  x.l.submit_pass(3, -1, 1);
  x.l.submit_pass(4, -1, 1);
  EXPECT_EQ(x.deal()->dropout_pass, 3 * 65536);
  EXPECT_EQ(x.deal()->dropout_pass, 3 * 65536 + 1);
  EXPECT_EQ(x.deal()->dropout_pass, 4 * 65536);
}

// Step t's backward runs with the scale decided after step t-1-staleness; every pass of the
// step gets that scale, also one dealt after a later step's decision changed the scaler.
TEST(StepLedger, EveryPassOfAStepRunsWithTheStepsLossScale) {
  LossScalerOptions so;
  so.init_scale = 1024.f;
  so.growth_interval = 1;  // every clean step doubles
  LossScaler scaler(so);
  Ledger x(options(1, 5, /*guard=*/true, &scaler, /*staleness=*/1));
  for (int64_t step : {0, 0, 1, 1, 2, 2, 3}) x.l.submit_pass(step, -1, 2);
  for (int64_t pass = 0; pass < 4; ++pass) {
    auto d = x.deal();
    ASSERT_TRUE(d);
    EXPECT_EQ(d->loss_scale, 1024.f) << "steps 0 and 1 run with the initial scale";
  }
  EXPECT_FALSE(x.deal()) << "step 2 waits for step 0's decision (a slot is free)";
  EXPECT_EQ(x.l.loss_scales_from(1), (std::vector<float>{1024.f}));
  EXPECT_EQ(x.close(0), V{"close step 0: 2 passes, grad_scale 0.25, lr 0.5, uploads [], grads []"});
  EXPECT_EQ(x.sumsq(0, 0, 16.0), (V{"scale step 0: 0.000244141", "deal"})) << "1/4 tokens / 1024 loss scale";
  EXPECT_EQ(scaler.scale(), 2048.f);
  auto p4 = x.deal();
  ASSERT_TRUE(p4);
  EXPECT_EQ(p4->step, 2);
  EXPECT_EQ(p4->loss_scale, 2048.f);
  EXPECT_FALSE(x.deal()) << "no slot for step 2's second pass";
  // step 1 overflows: the scale backs off from the one step 1 used (1024 / 2)
  x.close(1);
  EXPECT_EQ(x.sumsq(1, 0, std::numeric_limits<double>::infinity()), (V{"scale step 1: skip", "deal"}));
  EXPECT_EQ(scaler.scale(), 512.f);
  EXPECT_EQ(x.l.loss_scales_from(2), (std::vector<float>{2048.f, 512.f}));
  for (int s = 0; s < 3; ++s) x.report(0);  // pass 0 gives its slot back
  auto p5 = x.deal();
  ASSERT_TRUE(p5);
  EXPECT_EQ(p5->step, 2);
  EXPECT_EQ(p5->loss_scale, 2048.f) << "step 2's scale, not the scaler's current one";
  for (int s = 0; s < 3; ++s) x.report(1);
  auto p6 = x.deal();
  ASSERT_TRUE(p6);
  EXPECT_EQ(p6->step, 3);
  EXPECT_EQ(p6->loss_scale, 512.f);
  // the step's result and decision carry the scale its backward used
  x.updated(0, 0);
  ASSERT_TRUE(x.l.step_result(0));
  EXPECT_EQ(x.l.step_result(0)->loss_scale, 1024.f);
  EXPECT_DOUBLE_EQ(x.l.step_result(0)->grad_norm, 4.0 / 4 / 1024);
}

// Without loss scaling nothing waits for a decision and every scale is 1.
TEST(StepLedger, WithoutLossScalingPassesDoNotWaitForDecisions) {
  Ledger x(options(1, 8));
  for (int64_t step = 0; step < 5; ++step) x.l.submit_pass(step, -1, 1);
  for (int64_t step = 0; step < 5; ++step) {
    auto d = x.deal();
    ASSERT_TRUE(d) << "step " << step;
    EXPECT_EQ(d->loss_scale, 1.f);
  }
}

// A resumed run continues with the scales saved for steps t..t+staleness.
TEST(StepLedger, ResumeSetsTheNextScales) {
  LossScaler scaler;
  Ledger x(options(1, 4, true, &scaler, 1));
  EXPECT_FALSE(x.l.resume_at(10, {8.f})) << "staleness 1 needs two scales";
  EXPECT_TRUE(x.l.resume_at(10, {8.f, 4.f}));
  EXPECT_EQ(x.l.loss_scales_from(10), (std::vector<float>{8.f, 4.f}));
  EXPECT_TRUE(x.l.loss_scales_from(0).empty()) << "the initial scales are gone";
  for (int64_t step : {10, 11, 12}) x.l.submit_pass(step, -1, 1);
  EXPECT_EQ(x.deal()->loss_scale, 8.f);
  EXPECT_EQ(x.deal()->loss_scale, 4.f);
  EXPECT_FALSE(x.deal()) << "step 12 waits for step 10's decision";
  EXPECT_FALSE(x.l.resume_at(20, {1.f, 1.f})) << "passes were submitted";
  Ledger plain(options(1, 1));
  plain.l.step_result(0);
  EXPECT_FALSE(plain.l.resume_at(5, {})) << "a step was entered";
}

// Data-parallel replicas: CloseStepRequest::tokens replaces the step's own target tokens as
// the divisor of the gradient (and of its norm); the loss stays the replica's own.
TEST(StepLedger, TheSessionsTokenCountOverridesTheStepsOwn) {
  {  // unguarded: the norm from the update jobs' sums
    Ledger x(options(2, 1));
    x.l.submit_pass(0, -1, 10);
    x.deal(1);
    EXPECT_EQ(x.close(0, 0.1, 40),
              V{"close step 0: 1 passes, grad_scale 0.025, lr 0.1, uploads [], grads []"});
    x.updated(0, 1, 16.0);
    x.updated(0, 0, 9.0);
    EXPECT_EQ(x.report(0, 20, 10), (V{"step 0 done: loss 20/10", "deal"}));
    EXPECT_DOUBLE_EQ(x.l.step_result(0)->grad_norm, 5.0 / 40);
  }
  {  // guarded: the decision divides by the Session's count
    Ledger x(options(2, 1, true));
    x.l.submit_pass(0, -1, 10);
    x.deal(1);
    x.close(0, 0.1, 40);
    EXPECT_EQ(x.sumsq(0, 1, 16.0), V{});
    EXPECT_EQ(x.sumsq(0, 0, 9.0), V{"scale step 0: 0.025"});
    x.report(0);
    x.updated(0, 0);
    x.updated(0, 1);
    EXPECT_DOUBLE_EQ(x.l.step_result(0)->grad_norm, 5.0 / 40);
  }
  {  // a count < 0 keeps the step's own; 0 skips a step that has tokens here
    Ledger x(options(1, 2));
    x.l.submit_pass(0, -1, 10);
    x.l.submit_pass(1, -1, 10);
    x.deal(1);
    x.deal(1);
    EXPECT_EQ(x.close(0, 0.1, -1), V{"close step 0: 1 passes, grad_scale 0.1, lr 0.1, uploads [], grads []"});
    EXPECT_EQ(x.close(1, 0.1, 0), V{"close step 1: 1 passes, grad_scale 0, lr 0.1, uploads [], grads []"});
    x.report(1, 3, 10);
    EXPECT_EQ(x.updated(1, 0), V{"step 1 done: loss 3/10 skipped"});
  }
}

// A step without target tokens has no gradient: it is closed with grad_scale 0, a guarded
// step's scale says skip although its sum of squares is finite, and it reports no norm.
TEST(StepLedger, StepsWithoutTargetTokensAreSkipped) {
  {
    Ledger x(options(1, 1));
    x.l.submit_pass(0, -1, 0);
    x.deal(1);
    EXPECT_EQ(x.close(0), V{"close step 0: 1 passes, grad_scale 0, lr 0.5, uploads [], grads []"});
    x.report(0);
    EXPECT_EQ(x.updated(0, 0, 4.0), V{"step 0 done: loss 0/0 skipped"});
    EXPECT_EQ(x.l.step_result(0)->grad_norm, 0.0);
  }
  {
    LossScaler scaler;
    Ledger x(options(1, 1, true, &scaler));
    x.l.submit_pass(0, -1, 0);
    x.deal(1);
    x.close(0);
    EXPECT_EQ(x.sumsq(0, 0, 0.0), (V{"scale step 0: skip", "deal"}));
  }
  {  // a step closed with no pass at all closes at once, skipped
    Ledger x(options(1, 1));
    EXPECT_EQ(x.close(5), V{"close step 5: 0 passes, grad_scale 0, lr 0.5, uploads [], grads []"});
    EXPECT_EQ(x.updated(5, 0), V{"step 5 done: loss 0/0 skipped"});
  }
}

// CloseStep waits for the last pass of the step to be dealt (its plan's counts), whether the
// Session closes the step before or after that.
TEST(StepLedger, CloseGoesOutWhenTheLastPassIsDealt) {
  {  // before: the second pass waits for the only slot
    Ledger x(options(1, 1));
    x.l.submit_pass(0, -1, 3);
    x.l.submit_pass(0, -1, 5);
    x.deal(2, {1}, {1});
    EXPECT_EQ(x.close(0, 0.25), V{});
    EXPECT_NE(x.l.describe().find("1 pass(es) waiting"), std::string::npos) << x.l.describe();
    x.report(0);
    EXPECT_EQ(x.report(0), V{"deal"});
    V after;
    ASSERT_TRUE(x.deal(4, {2}, {3}, &after));
    EXPECT_EQ(after, V{"close step 0: 2 passes, grad_scale 0.125, lr 0.25, uploads [3], grads [4]"})
        << "the second pass ran another plan";
  }
  {  // after: at once
    Ledger x(options(1, 2));
    x.l.submit_pass(0, -1, 3);
    x.l.submit_pass(0, -1, 5);
    V after;
    x.deal(2, {1}, {1}, &after);
    x.deal(2, {1}, {1}, &after);
    EXPECT_EQ(after, V{}) << "not requested yet";
    EXPECT_EQ(x.close(0, 0.25),
              V{"close step 0: 2 passes, grad_scale 0.125, lr 0.25, uploads [2], grads [2]"});
    EXPECT_EQ(x.close(0, 0.25), V{}) << "once";
  }
}

// One step of a training pass (3 stages) and an evaluation pass (2 stages), two groups: the
// stage reports, the group updates and the Session's close in every order. The evaluation is
// done with its second report, the step with the last event of all, each exactly once.
TEST(StepLedger, ReportsInEveryOrderCompleteTheStepOnce) {
  // 0: a training stage, 1: an evaluation stage, 2: group 0 updated, 3: group 1, 4: close,
  // 5: a report of a pass not in flight
  std::vector<int> events{0, 0, 0, 1, 1, 2, 3, 4, 5};
  int orders = 0;
  do {
    Ledger x(options(2, 2));
    x.l.submit_pass(0, -1, 8);
    x.l.submit_pass(0, 3, 0);
    x.deal(3, {1, 1}, {1, 1});
    x.deal(2, {1, 0}, {0, 0});
    int training = 0, evals = 0, completions = 0;
    size_t last = 0;  // the last event that is not the stray report
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i] != 5) last = i;
    const std::string order = fmt::format("{}", fmt::join(events, ""));
    std::vector<std::string> seen;
    for (size_t i = 0; i < events.size(); ++i) {
      V out;
      switch (events[i]) {
        case 0: out = x.report(0, 1.5, ++training == 3 ? 8 : 0); break;
        case 1: out = x.report(1, 2.0, ++evals == 2 ? 6 : 0); break;
        case 2: out = x.updated(0, 0, 1); break;
        case 3: out = x.updated(0, 1, 1); break;
        case 4: out = x.close(0); break;
        case 5: out = x.report(99, 100, 100); break;
      }
      for (auto& a : out) {
        if (a.rfind("step", 0) == 0) {
          EXPECT_EQ(i, last) << "the step completes with its last event: " << order;
          ++completions;
        }
        if (a.rfind("eval", 0) == 0) {
          EXPECT_EQ(evals, 2) << order;
        }
        seen.push_back(a);
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), "step 0 done: loss 4.5/8"), 1)
        << order << " -> " << fmt::format("{}", fmt::join(seen, "; "));
    EXPECT_EQ(std::count(seen.begin(), seen.end(), "eval 3 done: loss 4/6"), 1);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), "deal"), 2);
    EXPECT_EQ(completions, 1) << order;
    EXPECT_EQ(x.updated(0, 1, 1), V{}) << "a step is done once";
    EXPECT_FALSE(x.l.busy());
    ++orders;
  } while (std::next_permutation(events.begin(), events.end()));
  EXPECT_EQ(orders, 362880 / (6 * 2));  // 9! / (3! 2!)
}

// Frozen groups send no reports: the step waits for the trainable ones only, whose sums of
// squares are numbered among the trainable groups.
TEST(StepLedger, FrozenGroupsAreNotWaitedFor) {
  StepLedger::Options o = options(3, 1, true);
  o.frozen = {0, 1, 0};
  Ledger x(o);
  EXPECT_EQ(x.l.trainable_groups(), 2);
  x.l.submit_pass(0, -1, 1);
  x.deal(1);
  x.close(0);
  EXPECT_EQ(x.sumsq(0, 2, 9.0), V{});
  EXPECT_THROW(x.sumsq(0, 1, 1.0), std::invalid_argument) << "a frozen group has no gradient";
  EXPECT_EQ(x.sumsq(0, 0, 16.0), V{"scale step 0: 1"});
  EXPECT_FALSE(x.l.step_result(0)) << "not done yet";
  x.report(0);
  x.updated(0, 0);
  EXPECT_EQ(x.updated(0, 2), V{"step 0 done: loss 0/0"});
  EXPECT_DOUBLE_EQ(x.l.step_result(0)->grad_norm, 5.0);
}

// A freed slot is the next one taken (before one never used); the step's time runs from its
// first submission to its completion; sparse models' statistics add up over the step.
TEST(StepLedger, SlotsTimesAndExpertStatistics) {
  Ledger x(options(1, 3));
  x.t = 10;
  x.l.submit_pass(0, -1, 4);
  x.t = 11;
  for (int i = 0; i < 3; ++i) x.l.submit_pass(0, -1, 4);
  EXPECT_EQ(x.deal(1)->slot, 0);
  EXPECT_EQ(x.deal(1)->slot, 1);
  std::vector<LedgerAction> out;
  x.l.stage_done(1, StageReport{1, 4, 0.5, {1, 2}}, out);
  EXPECT_EQ(x.deal(1)->slot, 1) << "slot 2 was never used";
  EXPECT_EQ(x.deal(1)->slot, 2);
  x.l.stage_done(0, StageReport{1, 4, 1.5, {3, 0, 1}}, out);
  x.report(2, 1, 4);
  x.close(0);
  x.t = 12.5;
  EXPECT_EQ(x.updated(0, 0), V{});
  x.t = 14;
  EXPECT_EQ(x.report(3, 1, 4), (V{"step 0 done: loss 4/16", "deal"}));
  auto r = x.l.step_result(0);
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->seconds, 4.0);
  EXPECT_DOUBLE_EQ(r->moe_aux_loss, 2.0 / 16);
  EXPECT_EQ(r->expert_tokens, (std::vector<double>{4, 2, 1}));
}

// After a failure nothing more is dealt and every result carries the first failure.
TEST(StepLedger, AFailureStopsDealingAndAnswersEveryone) {
  Ledger x(options(1, 1));
  x.l.submit_pass(0, -1, 1);
  x.l.submit_pass(0, 4, 0);
  x.deal(1);
  EXPECT_FALSE(x.l.step_result(0));
  EXPECT_TRUE(x.l.fail("worker 1: out of memory"));
  EXPECT_FALSE(x.l.fail("worker 0 stopped")) << "the first failure wins";
  EXPECT_EQ(x.report(0), V{"deal"});
  EXPECT_FALSE(x.deal()) << "a slot is free, the queue holds a pass, but the run failed";
  EXPECT_EQ(x.l.step_result(0)->error, "worker 1: out of memory");
  EXPECT_EQ(x.l.eval_result(4)->error, "worker 1: out of memory");
  EXPECT_NE(x.l.describe().find("failed: worker 1: out of memory"), std::string::npos);
}

// The watchdog's view: what is in flight, and whether anything is.
TEST(StepLedger, DescribesWhatIsInFlight) {
  Ledger x(options(2, 1));
  EXPECT_EQ(x.l.describe(), "nothing in flight");
  EXPECT_FALSE(x.l.busy());
  x.l.submit_pass(0, -1, 1);
  x.l.submit_pass(0, -1, 1);
  EXPECT_TRUE(x.l.busy()) << "passes queued";
  x.deal(3);
  x.report(0);
  EXPECT_EQ(x.l.describe(),
            "step 0 (open): pass 0 1/3 stages done, 1 pass(es) waiting for a pass slot or the step's loss "
            "scale (not closed towards the shards yet), 0 of 2 groups updated");
  x.report(0);
  x.report(0);
  x.deal(1);
  x.report(1);
  EXPECT_FALSE(x.l.busy()) << "every pass done, the step not closed by the Session";
  x.close(0);
  x.updated(0, 1);
  EXPECT_TRUE(x.l.busy()) << "closed, a group not updated";
  EXPECT_EQ(x.l.describe(), "step 0: all passes done, 1 of 2 groups updated");
  x.updated(0, 0);
  EXPECT_EQ(x.l.describe(), "nothing in flight");
}

TEST(StepLedger, RefusesImpossibleOptions) {
  EXPECT_THROW(StepLedger{options(1, 0)}, std::invalid_argument);
  EXPECT_THROW(StepLedger{options(1, 1, false, nullptr, -1)}, std::invalid_argument);
}

}  // namespace
}  // namespace rp
