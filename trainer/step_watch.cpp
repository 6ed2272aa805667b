#include "trainer/step_watch.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/counted.hpp"
#include "optimizer/clip.hpp"
#include "roundpipe/errors.hpp"

namespace rp {
namespace {

std::string kept_text(const std::string& kept) {
  return kept.empty() ? std::string("no checkpoint was written") : fmt::format("{} is kept", kept);
}

}  // namespace

StepWatch::StepWatch(const TrainSpec& spec)
    : skip_mode_(spec.nonfinite == "skip"),
      max_in_a_row_(spec.max_skipped_steps),
      scaling_(spec.loss_scaling) {}

std::vector<std::string> StepWatch::check(const StepReport& r, const std::string& kept) {
  std::vector<std::string> warnings;
  const bool finite_loss = std::isfinite(r.loss);
  const bool finite_norm = std::isfinite(r.grad_norm);
  if (!r.skipped) {
    in_a_row_ = 0;
    // an applied step with a non-finite loss moved the weights with non-finite gradients
    if (!finite_loss || !finite_norm)
      throw TrainingDiverged(fmt::format(
          "step {}: {} is {}: the run diverged and the weights are no longer finite; stopped without saving "
          "({}). "
          "Lower optimizer.lr, set optimizer.max_grad_norm, check the model's weights, or set \"nonfinite\": "
          "\"skip\" to skip such steps",
          r.step, finite_loss ? "the gradient norm" : "the loss", finite_loss ? r.grad_norm : r.loss,
          kept_text(kept)));
    return warnings;
  }
  ++skipped_total_;
  ++in_a_row_;
  if (r.target_tokens == 0) {
    warnings.push_back(
        fmt::format("step {}: no target tokens in the step's batches: skipped (weights unchanged)", r.step));
  } else if (scaling_) {
    const double next =
        std::max(r.loss_scale * double(scaling_->backoff_factor), double(scaling_->min_scale));
    if (r.loss_scale <= scaling_->min_scale)
      throw TrainingDiverged(fmt::format(
          "step {}: the gradients overflow even at the loss scale's floor {:g} (loss_scaling.min_scale); "
          "stopped "
          "({}). The model or the learning rate produces inf/NaN: lower optimizer.lr or train in bf16",
          r.step, scaling_->min_scale, kept_text(kept)));
    warnings.push_back(fmt::format("step {}: gradients overflowed at loss scale {:g}: skipped, scale -> {:g}",
                                   r.step, r.loss_scale, next));
  } else if (!skip_mode_) {
    // clipping skips non-finite steps itself; the spec asked to stop on them
    throw TrainingDiverged(fmt::format(
        "step {}: the {} is {} (non-finite); stopped without saving ({}). Lower optimizer.lr, check the "
        "model's "
        "weights, or set \"nonfinite\": \"skip\" to skip such steps",
        r.step, finite_norm ? "loss" : "gradient norm", finite_norm ? r.loss : r.grad_norm, kept_text(kept)));
  } else {
    warnings.push_back(
        fmt::format("step {}: non-finite {} ({}): skipped, weights unchanged ({} skipped so far)", r.step,
                    finite_norm ? "loss" : "gradients", finite_norm ? r.loss : r.grad_norm, skipped_total_));
  }
  if (in_a_row_ >= max_in_a_row_)
    throw TrainingDiverged(
        fmt::format("step {}: {} in a row {} skipped ({}; max_skipped_steps is {}); stopped ({})", r.step,
                    counted(in_a_row_, "step"), in_a_row_ == 1 ? "was" : "were",
                    r.target_tokens == 0 ? "no target tokens"
                    : scaling_           ? fmt::format("overflowing gradients, loss scale {:g}", r.loss_scale)
                                         : std::string("non-finite loss or gradients"),
                    max_in_a_row_, kept_text(kept)));
  return warnings;
}

int64_t first_nonfinite_group(const std::vector<std::vector<float>>& groups) {
  for (size_t g = 0; g < groups.size(); ++g)
    if (!all_finite(groups[g].data(), int64_t(groups[g].size()))) return int64_t(g);
  return -1;
}

}  // namespace rp
