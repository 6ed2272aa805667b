// Watches a run's reported steps for the ones it cannot go on after: a non-finite loss or
// gradient norm, too many skipped steps in a row, a loss scale at its floor. Pure logic, no
// session: the Trainer feeds it every StepReport in order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "roundpipe/spec.hpp"
#include "roundpipe/trainer.hpp"

namespace rp {

class StepWatch {
 public:
  /// Reads spec.nonfinite, spec.max_skipped_steps and spec.loss_scaling.
  explicit StepWatch(const TrainSpec& spec);

  /// Checks step `r` (reports arrive in step order). Returns the warning lines to log for it
  /// (a skipped step, a step without target tokens), or throws TrainingDiverged with one line
  /// naming the step and what happened; `kept` names the checkpoint that stays the last good
  /// one ("" when this run has none) and is quoted in the message.
  std::vector<std::string> check(const StepReport& r, const std::string& kept);

  int64_t skipped_total() const { return skipped_total_; }
  int64_t skipped_in_a_row() const { return in_a_row_; }

 private:
  bool skip_mode_;
  int64_t max_in_a_row_;
  std::optional<LossScalerOptions> scaling_;
  int64_t skipped_total_ = 0, in_a_row_ = 0;
};

/// Index of the first parameter group holding an inf or NaN value, or -1 when all are finite.
int64_t first_nonfinite_group(const std::vector<std::vector<float>>& groups);

}  // namespace rp
