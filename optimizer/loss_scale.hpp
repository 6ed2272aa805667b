// Dynamic loss scaling (fp16 training) and the per-step decision that combines it with
// global-norm clipping and inf/NaN detection.
//
// How the runtime uses these (see actors/optimizer_shard.cpp):
//  1. every step's backward multiplies the loss by LossScaler::scale() (recorded per step:
//     in async mode step t+1's backward may start before step t's outcome is known);
//  2. when a parameter group's gradient of step t is complete, its shard computes
//     sum_of_squares of the raw gradient (one pass; inf/NaN show up as a non-finite sum) and
//     reports it; StepNormReducer adds the partial sums in group order;
//  3. decide_step turns the total into: skip (inf/NaN), the global norm of the true
//     gradients, the clip coefficient and the grad_scale every shard passes to adamw_update,
//     and updates the scaler;
//  4. a skipped step calls no adamw_update at all: weights, moments and AdamW step counters
//     stay exactly as they were.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <vector>

#include "roundpipe/optimizer.hpp"  // LossScalerOptions

namespace rp {

/// The scale state machine of torch's GradScaler (_amp_update_scale_):
///  - overflow (inf/NaN in the step's gradients): scale *= backoff_factor, but never below
///    min_scale (at_floor() then), tracker = 0, the step is skipped;
///  - clean step: tracker += 1; when it reaches growth_interval, scale *= growth_factor
///    (only if the result is finite) and tracker = 0.
/// Async extension: update() takes the scale the step's backward actually used. An
/// overflow sets scale = min(scale, scale_used * backoff) (a step that started before an
/// earlier backoff does not halve twice); a clean step counts towards growth only if it
/// used the current scale. With scale_used == scale() (synchronous mode) this is exactly
/// torch's rule. All arithmetic in fp32, as torch.
class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions o = {});

  float scale() const { return scale_; }
  /// The scale is at its floor (LossScalerOptions::min_scale): backoffs change nothing more.
  bool at_floor() const { return scale_ <= opt_.min_scale; }
  int64_t growth_tracker() const { return tracker_; }
  int64_t steps_skipped() const { return skipped_; }
  int64_t steps_applied() const { return applied_; }
  const LossScalerOptions& options() const { return opt_; }

  /// Records the outcome of a step whose backward used `scale_used`; returns !found_inf
  /// (true: apply the step).
  bool update(bool found_inf, float scale_used);
  bool update(bool found_inf) { return update(found_inf, scale_); }

  /// Little-endian binary: magic "RPLSCAL2", scale, growth_factor, backoff_factor (f32),
  /// growth_interval, tracker, skipped, applied (i64), XXH3-64 checksum (u64). Throws
  /// std::runtime_error when the stream fails.
  void save(std::ostream& os) const;
  /// Bytes save() writes (magic, record, checksum): the same for every scaler.
  static size_t saved_bytes();
  /// Replaces *this with a saved scaler; throws std::runtime_error (one line) on a bad
  /// magic, truncation, checksum mismatch or out-of-range values, leaving *this unchanged.
  void load(std::istream& is);

  bool operator==(const LossScaler& o) const;

 private:
  LossScalerOptions opt_;
  float scale_;
  int64_t tracker_ = 0, skipped_ = 0, applied_ = 0;
};

/// What one optimizer step does, decided once all partial sums of squares are in.
struct StepDecision {
  bool skip = false;     ///< inf/NaN in the gradients: no group is updated
  double grad_norm = 0;  ///< L2 norm of the true (unscaled) gradients; non-finite if skip
  double clip_coef = 1;  ///< min(1, max_norm / (grad_norm + 1e-6)); 1 without clipping
  float grad_scale = 0;  ///< multiplies the raw gradients in adamw_update (0 if skip)
  float loss_scale = 1;  ///< the loss scale the step's backward used
};

/// total_sumsq: sum of sum_of_squares over every raw gradient of the step (as written by
/// backward: loss-scaled, not yet divided by the token count). base_scale: what turns a
/// raw, unscaled gradient into the true one (1 / target tokens), > 0. max_norm: clip the
/// global norm to this (torch clip_grad_norm_), <= 0 for no clipping. scaler: null without
/// loss scaling (then scale_used must be 1); otherwise it is updated (see LossScaler).
/// grad_scale = base_scale / scale_used * clip_coef, computed in double, rounded once.
/// Throws std::invalid_argument for base_scale <= 0 / non-finite, or scale_used <= 0.
StepDecision decide_step(double total_sumsq, double base_scale, double max_norm, LossScaler* scaler,
                         float scale_used);

/// Collects the per-group partial sums of squares of each step and adds them in group
/// order, so the total (and every grad_scale derived from it) does not depend on the order
/// in which shards report. Not thread-safe (owned by one actor).
class StepNormReducer {
 public:
  explicit StepNormReducer(int num_groups);
  /// Group `group`'s partial for `step`; true when the step now has every group's.
  /// Throws std::invalid_argument for a group out of range or reported twice.
  bool add(int64_t step, int group, double sumsq);
  /// The total of a complete step (groups added 0, 1, ...); forgets the step. Throws
  /// std::logic_error when the step is incomplete.
  double take(int64_t step);
  int num_groups() const { return n_; }

 private:
  struct Partial {
    std::vector<double> v;
    std::vector<char> have;
    int count = 0;
  };
  int n_;
  std::map<int64_t, Partial> steps_;
};

}  // namespace rp
