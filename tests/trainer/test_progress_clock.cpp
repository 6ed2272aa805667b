// trainer/progress_clock.hpp with made-up times: the ETA comes from the steady step time, not
// from the startup or the evaluations, and a report's seconds per step are its own.
#include <gtest/gtest.h>

#include "trainer/progress_clock.hpp"

namespace {

// A run whose steps take 2 s each after a slower first one (the pipeline fills), with 3
// evaluations of 5 s measured: the ETA is the remaining steps at 2 s plus the remaining
// evaluations at 5 s, whatever the first step or an outlier took.
TEST(ProgressClock, EtaIsTheSteadyStepTimePlusTheEvaluationsLeft) {
  rp::ProgressClock c(0, 20);
  EXPECT_EQ(c.eta(0, 0), 0) << "nothing measured yet";
  EXPECT_DOUBLE_EQ(c.steps(1, 1, 7.0), 7.0);
  EXPECT_DOUBLE_EQ(c.eta(1, 0), 19 * 7.0) << "only the first step is known";
  for (int64_t s = 2; s <= 10; ++s) c.steps(s, 1, s == 6 ? 30.0 : 2.0);  // one hiccup
  EXPECT_DOUBLE_EQ(c.steady_step_seconds(), 2.0) << "the median ignores the first step and an outlier";
  EXPECT_DOUBLE_EQ(c.eta(10, 2), 10 * 2.0) << "no evaluation measured: it adds nothing";
  c.evaluation(4.0);
  c.evaluation(6.0);
  EXPECT_DOUBLE_EQ(c.eta(10, 2), 10 * 2.0 + 2 * 5.0);
  EXPECT_DOUBLE_EQ(c.eta(20, 0), 0);
}

// A report covering two steps gives each the half of its time; a resumed run's first report
// is its first step (the pipeline fills again), not a steady one.
TEST(ProgressClock, ReportsOfSeveralStepsAndResumedRuns) {
  rp::ProgressClock c(100, 110);
  EXPECT_DOUBLE_EQ(c.steps(101, 1, 9.0), 9.0);
  EXPECT_DOUBLE_EQ(c.steps(103, 2, 6.0), 3.0);
  EXPECT_DOUBLE_EQ(c.steps(104, 1, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(c.steady_step_seconds(), 2.0) << "median of 3 and 1";
  EXPECT_DOUBLE_EQ(c.eta(104, 0), 6 * 2.0);
}

// Only the last kWindow steps count: a run that speeds up (a re-plan) is predicted at its new pace.
TEST(ProgressClock, TheWindowFollowsAChangeOfPace) {
  rp::ProgressClock c(0, 1000);
  c.steps(1, 1, 10.0);
  for (int64_t s = 2; s <= 200; ++s) c.steps(s, 1, s < 100 ? 4.0 : 1.0);
  EXPECT_DOUBLE_EQ(c.steady_step_seconds(), 1.0);
}

}  // namespace
