// The rule engine of an optimizer shard: per parameter group, the state machine that enforces
// rules 1, 3, 4 and 5 of the per-layer protocol (docs/protocol.md; rule 2's host half, one
// gradient writer at a time, too). A plain class: no CAF, no threads, no buffers. The shard
// actor (optimizer_shard.cpp) feeds it the protocol's events and carries out the actions it
// returns, in order: grants (answering a request by its ticket), jobs (a deferred cast, a sum
// of squares, an AdamW update: run inline or on the shard's job thread, then reported back
// with job_done) and reports to the scheduler.
//
//  iteration t computes with weights version v(t) = max(t - 1 - s, -1), s = staleness
//  (1 async, 0 sync); version k = the weights after step k, -1 = the initial weights.
//  1. An upload of g for iteration t is granted only once version v(t) of g is published.
//  3. A gradient slot of g for step t is granted only after step t-1 consumed it, and to
//     one writer at a time (the first of a step overwrites, later ones accumulate); the
//     earliest step waiting goes first.
//  4. g's update for step t runs when all its gradient contributions of step t are written
//     (no writer in flight), in the order they complete (no global barrier); guarded steps
//     (clipping, loss scaling, skipping) first report g's sum of squares and wait for the
//     step's scale. With data-parallel replicas, the gradient is first summed over the
//     replicas (a `reduce` job; every replica's shards then hold the same sum and decide alike).
//  5. The low-precision copy of version k is written only after every upload of every
//     iteration <= k + s finished; until then the update waits in the fp32 master and a
//     cast job publishes it when allowed. One outstanding step per group.
// While a group's job runs the group is busy: no transition and no gradient slot until job_done;
// uploads of a published version are still granted unless the job writes the low-precision
// copy (a cast, an update that publishes), since an upload reads nothing else.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rp {

/// What CloseStep told the shard about a step.
struct ClosedStep {
  int64_t passes = 0;
  float grad_scale = 1.f;  ///< 1 / target tokens of the step; 0: no target tokens, the step is skipped
  double lr = 0;
  /// Per group: the step's uploads and gradient contributions in total; null: passes times
  /// the group's per-pass counts.
  std::shared_ptr<const std::vector<int>> uploads, grads;
};

/// A job the shard runs for one group.
struct ShardJob {
  enum class Kind : uint8_t {
    cast,    ///< write the low-precision copy of the fp32 master (publishes version `step`)
    sumsq,   ///< sum of squares of the gradient of step `step` (guarded steps)
    update,  ///< AdamW update of step `step` with grad_scale and lr
    reduce,  ///< sum the gradient of step `step` over the data-parallel replicas (in place)
  };
  Kind kind = Kind::update;
  int group = 0;
  int64_t step = 0;
  float grad_scale = 1.f;  ///< update
  double lr = 0;           ///< update
  bool publish = false;    ///< update: also write the low-precision copy (rule 5 allows it now)
};
/// Whether job j writes the group's low-precision copy (a cast; an update that publishes).
inline bool writes_low_precision(const ShardJob& j) {
  return j.kind == ShardJob::Kind::cast || (j.kind == ShardJob::Kind::update && j.publish);
}
/// "AdamW update of step 3", "cast of version 2", "sum of squares of step 3".
std::string describe(const ShardJob& j);

/// One thing the shard must do.
struct ShardAction {
  enum class Kind : uint8_t {
    grant_weights,    ///< answer the upload request `ticket` (group, step)
    grant_grad_slot,  ///< answer the gradient slot request `ticket` (group, step, overwrite)
    run_job,          ///< run `job`, then call job_done(group, ...)
    report_sumsq,     ///< send GradSumSq(step, group, sumsq) to the scheduler
    group_updated,    ///< send GroupUpdated(step, group) to the scheduler
  };
  Kind kind = Kind::run_job;
  int group = 0;
  int64_t step = 0;
  uint64_t ticket = 0;     ///< grants
  bool overwrite = false;  ///< grant_grad_slot: first contribution of the step
  double sumsq = 0;        ///< report_sumsq; group_updated: the update job's sum of squares (unguarded steps)
  ShardJob job;            ///< run_job
};

class ShardRules {
 public:
  /// A group the shard owns, with the stages of one pass that upload it and that produce its
  /// gradient (used when a step's ClosedStep carries no per-group totals).
  struct Group {
    int group = 0;
    int uploads_per_pass = 0;
    int grads_per_pass = 0;
  };
  /// `staleness` 0 or 1; `guard`: wait for the step's scale (scale_arrived) before an
  /// update; `disable_rule` 1..5 switches off that rule's guard (2: the one-writer guard;
  /// testing only, tests/actors/test_protocol_guards.cpp), 0 = all on. `reduce`: data-parallel
  /// replicas: once a group's gradient of a step is complete, a reduce job sums it over the
  /// replicas before the sum of squares and the update.
  ShardRules(const std::vector<Group>& groups, int staleness, bool guard, int disable_rule = 0,
             bool reduce = false);

  // ---- events; each throws std::logic_error for a group the shard does not own ------------
  void request_weights(int g, int64_t step, uint64_t ticket);
  void weights_released(int g, int64_t step);
  void request_grad_slot(int g, int64_t step, uint64_t ticket);
  void grad_written(int g, int64_t step);
  /// Step `step` is closed; pump every group (groups()) afterwards.
  void close_step(int64_t step, ClosedStep info);
  /// Guarded steps: the scheduler decided step `step` (skip it, or update with grad_scale).
  /// Returns the order to pump the groups in: async, the order their gradients of the step
  /// completed (then the rest); sync, ascending. Call forget_scales(step) after the pumps.
  std::vector<int> scale_arrived(int64_t step, bool skip, float grad_scale);
  /// Drops the scales every group has used (after the pumps of scale_arrived).
  void forget_scales(int64_t step);
  /// A resumed run continues at step `step` (version step-1 in the master, step-1-s
  /// published, uploads before it complete). False when a group already moved.
  bool resume_at(int64_t step);

  // ---- transitions -----------------------------------------------------------------------
  /// Applies every transition group g's state allows and appends the actions. When a job is
  /// needed, run_job is the last action appended and g stays busy until job_done(g).
  void pump(int g, std::vector<ShardAction>& out);
  /// g's job finished (`sumsq`: a sum-of-squares job's result): applies its effect and
  /// appends the actions that follow (the reports, then pump(g)'s).
  void job_done(int g, double sumsq, std::vector<ShardAction>& out);

  // ---- inspection --------------------------------------------------------------------------
  std::vector<int> groups() const;  ///< ascending
  int64_t published(int g) const;   ///< version in the low-precision copy
  int64_t updated(int g) const;     ///< version in the fp32 master
  bool busy(int g) const;
  /// The job g runs (run_job announced it, job_done not called yet), or null.
  const ShardJob* running_job(int g) const;
  /// The replica sum g runs (its running job when that is a reduce), or null: a request of g
  /// that this call does not grant waits for that sum (the shard's ReduceWaitMeter counts it).
  const ShardJob* running_replica_sum(int g) const;
  /// Whether a weights upload or a gradient slot of g waits (was requested, not granted).
  bool has_waiters(int g) const;
  /// What the groups wait for, for a watchdog line ("group 3: AdamW update of step 2
  /// running; group 4: step 2 has 1 of 2 gradient contributions"); "idle" when nothing.
  std::string describe() const;

 private:
  struct Waiter {
    int64_t step;
    uint64_t ticket;
  };
  struct State {
    Group g;
    int64_t published = -1;  ///< version in the low-precision copy
    int64_t updated = -1;    ///< version in the fp32 master (= last step consumed)
    int64_t uploads_complete_through = -1;
    std::map<int64_t, int> uploads_done;  ///< per iteration
    std::map<int64_t, int> grads_done;    ///< per step
    bool writer_active = false;
    bool busy = false;
    ShardJob job;             ///< the job running while busy
    int64_t sumsq_sent = -1;  ///< last step whose sum of squares was reported
    int64_t reduced = -1;     ///< last step whose gradient was summed over the replicas
    std::deque<Waiter> weight_waiters, grad_waiters;
  };
  struct Scale {
    bool skip = false;
    float grad_scale = 0.f;
  };

  State& state(int g);
  const State& state(int g) const;
  int64_t version_for(int64_t t) const { return t - 1 - s_ > -1 ? t - 1 - s_ : -1; }
  int64_t expected(const ClosedStep& c, bool uploads, const State& st) const;
  /// One pass over rule 5 and rule 4; returns false when a job was started.
  bool advance(State& st, bool& progress, std::vector<ShardAction>& out);
  void start_job(State& st, const ShardJob& j, std::vector<ShardAction>& out);
  void grant(State& st, std::vector<ShardAction>& out);
  void grant_weights(State& st, std::vector<ShardAction>& out);  // rule 1 only

  std::map<int, State> groups_;
  std::map<int64_t, ClosedStep> closed_;
  std::map<int64_t, Scale> scales_;
  /// Guarded steps: per step, the groups in the order their sums of squares were reported.
  std::map<int64_t, std::vector<int>> completed_;
  int s_;
  bool guard_;
  int off_;  ///< the rule whose guard is switched off (testing), or 0
  bool reduce_;
};

}  // namespace rp
