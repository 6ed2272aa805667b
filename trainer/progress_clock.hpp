// The time figures of a run's progress lines: tokens/s of each step from the step's own wall
// time, and the ETA from the steady step time. Pure arithmetic on the times the Trainer
// measures (no clock of its own), so it is tested with made-up times.
//
// What skewed them before: the first step's time included loading the model and the data
// (an ETA of 09:17 for a run that ended 2:08 later), and an evaluation's passes, queued in the
// pipeline behind a step, were charged to the next step's tokens/s and ETA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>

namespace rp {

class ProgressClock {
 public:
  /// `start`: steps done before this run (a resumed run); `total`: the run ends after this many.
  ProgressClock(int64_t start, int64_t total) : start_(start), total_(total) {}

  /// An evaluation took `seconds` of wall time outside any step's own time (the one before
  /// training, or the wait for the passes queued behind a step): kept to predict the
  /// evaluations still to come.
  void evaluation(double seconds);

  /// Steps up to `step` (1-based) were reported, `nsteps` of them since the previous report,
  /// in `seconds` of their own wall time (evaluations and checkpoints excluded). Returns the
  /// seconds per step of this report (seconds / nsteps).
  double steps(int64_t step, int64_t nsteps, double seconds);

  /// The expected seconds per step: the median of the last kWindow steps after the first of
  /// this run (its time holds the pipeline's filling), the first step's own time until there
  /// is another. 0 before any step.
  double steady_step_seconds() const;

  /// Seconds until the last step after `step` steps, with `evals_left` evaluations still to
  /// run: steady_step_seconds() per remaining step plus the mean measured evaluation time
  /// per evaluation (0 while none was measured).
  double eta(int64_t step, int64_t evals_left) const;

  static constexpr size_t kWindow = 64;

 private:
  int64_t start_, total_;
  double first_ = -1;          ///< seconds per step of the first report of this run
  std::deque<double> recent_;  ///< seconds per step of the later reports (the last kWindow)
  double eval_sum_ = 0;
  int64_t evals_ = 0;
};

}  // namespace rp
