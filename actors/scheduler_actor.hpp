// The scheduler actor: turns submitted passes into stage tasks dealt round-robin to
// the workers (the deal pointer carries into the next pass, so passes follow each other
// with no flush), hands a pass a free set of host activation buffers, closes steps
// towards the optimizer shards, and answers WaitStep once every parameter group's
// update for that step is in the fp32 master. It is not on the per-micro-batch path:
// workers and shards signal each other point to point. The bookkeeping of steps, passes and
// evaluations (what to deal next, when a step closes or is done, its gradient divisor and
// loss scale) is the plain class StepLedger (scheduler/step_ledger.hpp); the actor feeds it
// the messages and sends what it returns.
//
// Dealing a pass takes two phases, so that no per-pass host work runs on the scheduler's
// thread: the scheduler picks the pass's slot and plan, asks its pass filler (a helper actor,
// detached in a run) to copy the pass's ids, targets and positions into the slot's host
// buffers (FillPass), and only when the filler answers (PassFilled) records the pass with the
// ledger and sends its RunStage messages. One pass is filled at a time, so the workers receive
// their stage tasks in pass order; a failure or a Shutdown that arrives meanwhile drops the
// fill's answer (nothing of that pass is dealt). The Session counts each pass's target tokens
// on its own thread (SubmitPass::target_tokens).
//
// Profiler and re-planning (scheduler/replan.hpp): the scheduler owns the Profile, fed by
// the workers' LayerTimings messages. Each pass is dealt with the plan current when it
// starts (when it gets a pass slot); between passes the Replanner may swap the plan once the
// profile settled (automatic plans only), so a pass never mixes plans. Passes of one step
// may run different plans: CloseStep carries the step's per-group upload and gradient
// counts and is sent once every pass of the step has been dealt.
//
// Failures: the scheduler monitors every worker and shard; a Failure message, an actor that
// goes down with an error, or an exception in its own handlers fails the run: every waiter
// (WaitStep) gets the error at once, later ones too, and no pass is dealt any more.
//
// Watchdog (SchedulerConfig::watchdog_s): while passes or steps are in flight and the run's
// progress count (actors/run_progress.hpp) has not moved for that long, it asks every worker
// and shard what it waits for (GetStatus) and logs one line (`warn`): the steps and passes in
// flight, each worker's stage task, micro-batches and outstanding copies, each shard's busy
// and waiting groups; again after every further period without progress. GetStatus sent to
// the scheduler answers the same line.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/fault_injection.hpp"
#include "actors/messages.hpp"
#include "actors/pass_buffers.hpp"
#include "actors/run_progress.hpp"
#include "optimizer/loss_scale.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/replan.hpp"

namespace rp {

class Tracer;

struct SchedulerConfig {
  IterationPlan plan;
  int num_groups = 0;
  /// Per group: 1 for a frozen group (no shard owns it: it sends no GroupUpdated and no
  /// GradSumSq, and a step is done when every trainable group is updated). Empty: none.
  std::vector<char> frozen;
  std::vector<std::shared_ptr<PassBuffers>> pass_slots;  ///< host buffers, reused round-robin
  /// Guarded steps (the shards must have ShardOptions::guard too): collect every group's
  /// GradSumSq, decide (optimizer/loss_scale.hpp: decide_step) and send StepScale to the shards.
  bool guard = false;
  double max_grad_norm = 0;              ///< > 0: clip the global gradient norm to this
  LossScaler* loss_scaler = nullptr;     ///< fp16 loss scaling (owned by the Session), or null
  const ModelLayout* layout = nullptr;   ///< parameter groups of each layer (counts per plan)
  std::shared_ptr<Replanner> replanner;  ///< owns the profile; null: no profile, no re-planning
  /// Called for host buffers allocated after the start (dx buffers of a re-planned
  /// plan's stage boundaries), e.g. to pin them; may be empty.
  std::function<void(HostBytes&)> on_new_host_buffer;
  /// Receives the one-line re-planning message; may be empty.
  std::function<void(const std::string&)> log;
  /// Optimizer staleness (1 async, 0 sync). With loss scaling, step t's backward uses the
  /// scale decided after step t-1-staleness (the step whose weights it computes with), so
  /// the scale of every step is a function of the step outcomes alone, never of timing:
  /// passes of step t are dispatched only once that scale is known (the weights they need
  /// wait for the same decision anyway).
  int staleness = 1;
  /// Seconds without progress (while work is in flight) before the watchdog logs what the
  /// run waits for; 0: no watchdog.
  double watchdog_s = 0;
  /// Receives the watchdog's line; may be empty (then nothing is logged).
  std::function<void(const std::string&)> warn;
  /// The run's progress count, bumped by the workers and shards (and the scheduler); may be
  /// null (then only the scheduler's own events count).
  RunProgress* progress = nullptr;
  FaultInjection faults;     ///< testing only (fault_injection.hpp)
  Tracer* tracer = nullptr;  ///< records the protocol messages when its messages() is on
  /// Spawn the pass filler on its own thread (production). Tests that drive the scheduler with
  /// CAF's deterministic test coordinator set false, so the coordinator also orders the fills.
  bool detached_filler = true;
};

/// The pass filler's work (FillPass): copies a pass's ids, targets and positions into its
/// slot's host buffers, sets each micro-batch's target tokens and (packed passes) rope length
/// (largest position + 1), and zeroes the slot's MoE statistics. Throws std::invalid_argument
/// when the pass's data is not micro_batches x the slot's tokens long.
void fill_pass_buffers(PassBuffers& pb, const SubmitPass& sp);

/// Spawns the scheduler. Wire workers and shards with SetPeers before submitting.
SchedulerActor spawn_scheduler(caf::actor_system& sys, SchedulerConfig cfg);

}  // namespace rp
