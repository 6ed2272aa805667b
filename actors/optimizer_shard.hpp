// Optimizer shard actors: each owns a disjoint set of parameter groups (their fp32
// master weights and AdamW moments) and enforces the per-layer protocol for them
// (rules 1, 3, 4 and 5 of docs/protocol.md; rule 2 is the workers' one-copy-per-direction):
// the rules themselves are a plain state machine, ShardRules (actors/shard_rules.hpp), which
// this actor feeds with the protocol's messages; it carries out the grants, jobs and reports
// the rules return.
//
// Shards are detached actors (own thread); each owns a persistent ThreadPool (`threads`
// workers, pinned to `cpus`) that runs AdamW, the gradient's sum of squares and deferred
// casts. A detached shard submits each job to a job thread of its own and goes on answering
// requests for its other groups; the group stays busy (no grant, no transition) until the
// job reports back (JobDone), so the rules hold per group. Guarded steps (ShardOptions::guard:
// global-norm clipping, loss scaling, inf/NaN skipping): once group g's gradient of step t
// is complete the shard sends GradSumSq{t, g} to the scheduler and updates g only when
// StepScale{t} arrived (skip: no update at all, the version still advances so the protocol
// moves on).
//
// Failures: a job that throws (or any exception in a handler) sends Failure naming the shard,
// the group, the job and the step to the scheduler and ends the shard with that error: its
// groups may be half-updated, so nothing of it is used again (the scheduler fails the run).
#pragma once
#include <atomic>
#include <vector>

#include "actors/fault_injection.hpp"
#include "actors/messages.hpp"
#include "actors/pass_buffers.hpp"
#include "actors/reduce_wait.hpp"
#include "actors/run_progress.hpp"
#include "model/layout.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/weight_prediction.hpp"
#include "roundpipe/replicas.hpp"

namespace rp {

class Tracer;

struct ShardGroup {
  int group = 0;
  std::vector<float>* master = nullptr;  ///< fp32 optimizer copy (owned by the Session)
  AdamWState* state = nullptr;           ///< moments and step counter (owned by the Session)
  int uploads_per_pass = 0;              ///< stages of one pass that upload this group (used when
                                         ///< CloseStep carries no per-group totals)
  int grads_per_pass = 0;                ///< stages of one pass that produce its gradient (same)
};

struct ShardOptions {
  int staleness = 1;
  AdamWOptions adam;
  /// Weight prediction (optimizer/weight_prediction.hpp): with staleness 1 the low-precision
  /// copy of version k is w_k + (w_k - w_{k-1}); each group keeps its last update (4 bytes per
  /// parameter). Ignored with staleness 0.
  bool predict_weights = false;
  int threads = 1;        ///< host threads per AdamW update and low-precision cast (a persistent pool)
  std::vector<int> cpus;  ///< pin those threads to these cores (empty: not pinned)
  bool guard = false;     ///< wait for StepScale per step (see above)
  /// Spawn the shard on its own thread (production). Tests that drive the protocol with
  /// CAF's deterministic test coordinator set false: a detached actor runs on a private
  /// thread that the coordinator does not schedule.
  bool detached = true;
  /// Testing only (tests/actors/test_protocol_guards.cpp): 1..5 switches off the guard of
  /// that rule (numbering of actors/shard_rules.hpp; 2 = the shard's half of rule 2, one
  /// gradient writer at a time), so the protocol tests can show they catch its absence.
  /// 0 = every guard on. Never set outside tests.
  int disable_rule = 0;
  int index = 0;                    ///< names the shard in failures and status lines
  RunProgress* progress = nullptr;  ///< optional: counts finished jobs (the scheduler's watchdog)
  FaultInjection faults;            ///< testing only (fault_injection.hpp)
  Tracer* tracer = nullptr;         ///< records the protocol messages when its messages() is on
  /// Data-parallel replicas (size > 1): each group's complete gradient of a step is summed over
  /// them (Replicas::sum_async, on its communication thread; the group stays busy meanwhile)
  /// before its sum of squares and update. Null or size 1: a single process.
  std::shared_ptr<Replicas> replicas;
  /// Optional, with replicas: records how long requests of the pipeline waited for the sums
  /// (actors/reduce_wait.hpp). Outlives the shard.
  ReduceWaitMeter* reduce_wait = nullptr;
  /// Optional, with replicas: sums issued and not yet reported done (incremented before
  /// Replicas::sum_async, decremented in its callback), so that the session's teardown knows
  /// whether the communication thread may still use the gradient slots.
  std::shared_ptr<std::atomic<int64_t>> sums_in_flight;
};

/// Spawns an optimizer shard owning `groups` (detached unless opt.detached is false);
/// reports GroupUpdated, GradSumSq and Failure to `scheduler`.
ShardActor spawn_optimizer_shard(caf::actor_system& sys, std::vector<ShardGroup> groups, ParamStore* store,
                                 ShardOptions opt, SchedulerActor scheduler);

}  // namespace rp
