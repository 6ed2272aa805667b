// The learning rates at which the staleness-1 asynchronous optimizer ("async": true, the
// default) trains like the synchronous one. Iteration t computes its gradient with the
// weights of step t-2 while the CPU applies step t-1; at a high peak learning rate that
// one-step-old gradient costs loss (docs/fidelity.md, "The async optimizer's learning-rate
// range"). A run whose peak lr lies above the measured range gets one warning line at start.
#pragma once
#include <optional>
#include <string>

#include "roundpipe/spec.hpp"

namespace rp {

/// Highest peak learning rate (lr_schedule.lr, i.e. optimizer.lr unless the schedule names
/// its own) at which async's held-out eval loss ended within kAsyncLossGap of sync's on the
/// example jobs (20 steps, with and without warmup, on an H200), per kind of run. The one place
/// these numbers live: bench/async_lr_sweep.sh measures them, docs/fidelity.md shows where each
/// came from and why the held-out loss is the measure.
struct AsyncLrRange {
  const char* run_kind;  ///< "full fine-tuning" or "LoRA"
  double max_peak_lr;    ///< async within kAsyncLossGap of sync at peak lr <= this
  const char* measured;  ///< where the number comes from (printed in the warning)
};

/// The relative gap of the held-out eval loss, async vs sync, that "matches" means.
inline constexpr double kAsyncLossGap = 0.02;

inline constexpr AsyncLrRange kAsyncLrFullFineTuning{
    "full fine-tuning", 2e-4,
    "default job, SmolLM2-135M, 20 steps, H200: eval loss +0.4% at 2e-4, +4.5% at 3e-4"};
inline constexpr AsyncLrRange kAsyncLrLora{
    "LoRA", 1e-3, "LoRA job, r16 all linears, 20 steps, H200: eval loss +1.4% at 1e-3, +2.3% at 2e-3"};

/// The range that applies to `spec` (LoRA when it trains adapters).
const AsyncLrRange& async_lr_range(const TrainSpec& spec);

/// One warning line when spec.async is on and the peak lr exceeds the range of its kind:
/// names the lr, the range and how to switch ("async": false, or "async_compensation":
/// "predict"). nullopt otherwise (sync runs, or a peak lr inside the range). The range was
/// measured without compensation, so a run with it is warned about the same way.
std::optional<std::string> async_lr_warning(const TrainSpec& spec);

}  // namespace rp
