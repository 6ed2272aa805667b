// Automatic plans and re-planning from measured costs ("before any measurement
// exists, start from an analytic estimate ...; re-plan once the estimates settle, never
// mid-iteration").
//
// Pure functions and data, no threads: the scheduler actor owns one Replanner, feeds its
// Profile with the workers' LayerTimings and calls poll() between passes (when it deals a
// new pass), so a new plan only ever applies to whole passes. The decision is taken once:
// when the plan is automatic and the profile has settled, the partition of the measured
// costs (Profile::apply over the analytic costs) replaces the current plan if the
// simulator predicts it is faster by more than min_gain; either way one log line says what
// happened. Explicit plans (from a spec or SessionOptions::plan) are never changed.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/partition.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/simulator.hpp"

namespace rp {

struct ReplanOptions {
  bool automatic = true;         ///< false: the plan is explicit, poll() never changes it
  double settle_rel_tol = 0.05;  ///< Profile::settled(rel_tol, min_samples)
  int64_t settle_min_samples = 3;
  /// Decide anyway once every needed series has this many kept samples (timings on a busy
  /// host may never vary by less than settle_rel_tol); 0: wait for settle_rel_tol forever.
  int64_t settle_max_samples = 16;
  double min_gain = 0.02;  ///< switch only when the predicted iteration time drops by more than this fraction
};

/// The outcome of the one re-planning decision.
struct ReplanDecision {
  int64_t pass = 0;  ///< first pass that runs new_plan (the pass being dealt)
  IterationPlan old_plan, new_plan;
  double old_seconds = 0;  ///< predicted steady-state seconds per iteration of old_plan (measured costs)
  double new_seconds = 0;  ///< same for new_plan
  bool changed = false;    ///< new_plan replaces old_plan from `pass` on
  std::string error;       ///< non-empty: partitioning the measured costs failed, plan kept
  std::string why;         ///< "profile settled" or "N samples per series"
  /// One log line, e.g. "re-plan at pass 4 (profile settled): F[0-3] T[4-5] B[3-0] (12.1 ms
  /// predicted) -> F[0-1] F[2-3] T[4-5] B[3-2] B[1-0] (9.8 ms predicted)".
  std::string line() const;
};

class Replanner {
 public:
  /// Replaces the partitioner at re-plan time (tests): gets the measured costs, returns a plan,
  /// which is taken whenever it differs from the current one (no min_gain check).
  using Planner = std::function<IterationPlan(const std::vector<LayerCost>& measured)>;

  Replanner() = default;
  /// `profile` starts empty (or loaded); `analytic` are the costs of every layer before any
  /// measurement (estimate_layers), `part` the partitioner's options (gpus, micro-batches,
  /// memory cap, PCIe), `sim` the simulator's (bandwidths, staleness, passes in flight) for
  /// the predicted iteration times. Throws std::invalid_argument when analytic.size() differs
  /// from profile.num_layers().
  Replanner(Profile profile, std::vector<LayerCost> analytic, PartitionOptions part, SimOptions sim,
            ReplanOptions opt);

  Profile& profile() { return profile_; }
  const Profile& profile() const { return profile_; }
  const std::vector<LayerCost>& analytic() const { return analytic_; }
  const ReplanOptions& options() const { return opt_; }
  /// True once poll() took its decision.
  bool decided() const { return decided_; }
  void set_planner(Planner p) { planner_ = std::move(p); }

  /// Between iterations, before dealing pass `pass` with plan `current`: the first time the
  /// plan is automatic and the profile has settled (or reached settle_max_samples), decides
  /// (see file comment) and returns
  /// the decision; nullopt otherwise. Never throws for a failed partition (the decision
  /// carries the error and keeps the plan).
  std::optional<ReplanDecision> poll(const IterationPlan& current, int64_t pass);

  /// Predicted steady-state seconds per iteration of `plan` under `costs` (simulator).
  double predict(const IterationPlan& plan, const std::vector<LayerCost>& costs) const;

 private:
  Profile profile_;
  std::vector<LayerCost> analytic_;
  PartitionOptions part_;
  SimOptions sim_;
  ReplanOptions opt_;
  Planner planner_;
  bool decided_ = false;
};

/// The automatic plan of `costs` before any measurement: partition(costs, opt). When no plan
/// fits with opt.weight_buffers > 1 (weights double-buffered for prefetch), retries with one
/// buffer (the worker skips prefetching what does not fit) and sets opt.weight_buffers to 1.
/// Then moves the switches whose prefetch the cap refuses where that predicts a faster
/// iteration (refine_for_prefetch, scheduler/prefetch_refine.hpp).
/// Throws what partition() throws when neither fits.
PartitionResult automatic_partition(const std::vector<LayerCost>& costs, PartitionOptions& opt);

}  // namespace rp
