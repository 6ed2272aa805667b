// The RoundPipe actor protocol (CAF 0.17.6), declared once: every message type, the typed
// interface of every actor (typed_actor aliases: scheduler, worker, transfer actor,
// optimizer shard) and the one type-ID block that registers the messages. No other file
// declares a message type; actors are spawned and addressed only through these handles, so
// sending an actor a message outside its interface does not compile.
//
// Large data never travels in a message: only handles (pointers into host memory owned by
// the Session, device pointers owned by a worker). All types are local to one process,
// hence CAF_ALLOW_UNSAFE_MESSAGE_TYPE (no serialisation).
//
// Who sends what (the per-layer protocol as message ordering, docs/protocol.md):
//   session   -> scheduler SetPeers            the workers and shards (once, before any pass)
//   session   -> scheduler SubmitPass          a pass of the current step
//   scheduler -> filler    FillPass            (request) copy a dealt pass's ids, targets and
//                                              positions into its slot's host buffers (the
//                                              filler's own thread); answered with PassFilled
//   session   -> scheduler CloseStepRequest    the step is closed, with its learning rate
//   session   -> scheduler WaitStep            (request) the step's result once it is applied
//   scheduler -> worker    RunStage            a stage task of one pass
//   worker    -> worker    ActReady            micro-batch m of a stage's output is on the host
//   worker    -> transfer  CopyRequest         a copy on that transfer actor's stream, tagged
//   transfer  -> worker    CopyDone            the copy completed; carries the request's tag
//   job       -> worker    CopyDone            (the worker's host job thread) a staged gradient
//                                              contribution was added into its slot (kind gradient)
//   stream    -> transfer  StreamDone          (the actor's own stream callback) a chunk landed
//   arbiter   -> transfer  LinkIdle            a refused bulk actor may issue again
//   stream    -> worker    ComputeDone         (the worker's compute-stream callback) a
//                                              micro-batch's layers ran
//   stream    -> worker    GradsFinal          (the compute-stream callback of a point inside
//                                              a stage's last micro-batch) these groups'
//                                              gradients are final: they may drain at once
//   tier      -> worker    FrozenFetched       (the disk tier's thread) a frozen group is in a
//                                              read buffer, or its read failed
//   spill     -> worker    SpillDone           (the activation spill's thread) a spilled saved
//                                              input was read or written, or that failed
//   worker    -> shard     AcquireWeights      (request) upload of group g for step t may start
//   worker    -> shard     ReleaseWeights      upload of group g for step t completed
//   worker    -> shard     AcquireGradSlot     (request) may write grad of group g for step t
//   worker    -> shard     GradWritten         grad of group g for step t is in the host slot
//   job       -> shard     JobDone             (the shard's job thread) a group's job finished
//   worker    -> scheduler StageDone           a stage task finished (with loss for the tail)
//   worker    -> scheduler LayerTimings        measured layer times of one micro-batch (profiler;
//                                              sent from the compute stream's then() callback)
//   scheduler -> shard     CloseStep           step t has all its passes; scale and LR
//   shard     -> scheduler GradSumSq           (guarded steps) sum of squares of group g's step-t gradient
//   scheduler -> shard     StepScale           (guarded steps) step t: skip, or the grad_scale to apply
//   shard     -> scheduler GroupUpdated        group g's step t update is in the fp32 master
//   any       -> scheduler Failure             a typed error ended a task, a job or an actor
//   scheduler -> itself    WatchdogTick        (periodic) look for a run without progress
//   scheduler -> worker, shard GetStatus       (request) one line: what the actor waits for
//   session   -> scheduler GetStatus           (request) the watchdog's line: the whole run
//   session   -> scheduler, shard  ResumeAt    (request, before any pass) continue at step N
//   session   -> scheduler LossScalesFrom      (request) loss scales decided for steps >= N
//   session   -> scheduler GetRuntimeInfo      (request) the profile and the plan in use
//   session   -> scheduler WaitEval            (request) the loss of an evaluation pass
//   session   -> scheduler -> workers, shards  Shutdown
//
// Actors that die (an exception in a handler, a failed optimizer job) never leave a waiter
// hanging: every actor turns its own exceptions into a Failure to the scheduler, the
// scheduler monitors workers and shards (a worker its transfer actors) and fails the run
// when one goes down, and Session::wait monitors the scheduler.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <caf/all.hpp>
#include <caf/type_id.hpp>

#include "actors/pass_buffers.hpp"
#include "roundpipe/session.hpp"  // StepResult (the answer to WaitStep)
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"

namespace rp {

// ---- the messages, declared first: the interfaces below name them --------------------------
struct RunStage;
struct ActReady;
struct CopyRequest;
struct CopyDone;
struct StreamDone;
struct LinkIdle;
struct ComputeDone;
struct GradsFinal;
struct FrozenFetched;
struct SpillDone;
struct AcquireWeights;
struct WeightsGranted;
struct ReleaseWeights;
struct AcquireGradSlot;
struct GradGrant;
struct GradWritten;
struct JobDone;
struct StageDone;
struct CloseStep;
struct GroupUpdated;
struct GradSumSq;
struct StepScale;
struct LayerTimings;
struct Failure;
struct SubmitPass;
struct FillPass;
struct PassFilled;
struct CloseStepRequest;
struct WaitStep;
struct WaitEval;
struct SetPeers;
struct GetRuntimeInfo;
struct RuntimeInfo;
struct GetStatus;
struct StatusReport;
struct WatchdogTick;
struct Shutdown;
struct ResumeAt;
struct Ack;
struct LossScalesFrom;
struct LossScales;

// ---- the interfaces ------------------------------------------------------------------------
/// A worker (one per device): runs the stage tasks dealt to it (actors/worker.hpp).
using WorkerActor =
    caf::typed_actor<caf::reacts_to<RunStage>, caf::reacts_to<ActReady>, caf::reacts_to<CopyDone>,
                     caf::reacts_to<ComputeDone>, caf::reacts_to<GradsFinal>, caf::reacts_to<FrozenFetched>,
                     caf::reacts_to<SpillDone>, caf::replies_to<GetStatus>::with<StatusReport>,
                     caf::reacts_to<Shutdown>>;

/// A transfer actor (four per worker): one copy stream and its priority queue (actors/transfer.hpp).
using TransferActor =
    caf::typed_actor<caf::reacts_to<CopyRequest>, caf::reacts_to<StreamDone>, caf::reacts_to<LinkIdle>>;

/// An optimizer shard: owns parameter groups and enforces the per-layer protocol for them
/// (actors/optimizer_shard.hpp).
using ShardActor =
    caf::typed_actor<caf::replies_to<AcquireWeights>::with<WeightsGranted>, caf::reacts_to<ReleaseWeights>,
                     caf::replies_to<AcquireGradSlot>::with<GradGrant>, caf::reacts_to<GradWritten>,
                     caf::reacts_to<CloseStep>, caf::reacts_to<StepScale>, caf::reacts_to<JobDone>,
                     caf::replies_to<ResumeAt>::with<Ack>, caf::replies_to<GetStatus>::with<StatusReport>,
                     caf::reacts_to<Shutdown>>;

/// The scheduler: deals passes, closes steps, answers WaitStep, runs the watchdog
/// (actors/scheduler_actor.hpp).
using SchedulerActor =
    caf::typed_actor<caf::reacts_to<SetPeers>, caf::reacts_to<SubmitPass>, caf::reacts_to<CloseStepRequest>,
                     caf::reacts_to<StageDone>, caf::reacts_to<GradSumSq>, caf::reacts_to<LayerTimings>,
                     caf::reacts_to<GroupUpdated>, caf::reacts_to<Failure>, caf::reacts_to<WatchdogTick>,
                     caf::replies_to<WaitStep>::with<StepResult>, caf::replies_to<WaitEval>::with<EvalResult>,
                     caf::replies_to<GetRuntimeInfo>::with<RuntimeInfo>, caf::replies_to<ResumeAt>::with<Ack>,
                     caf::replies_to<LossScalesFrom>::with<LossScales>,
                     caf::replies_to<GetStatus>::with<StatusReport>, caf::reacts_to<Shutdown>>;

/// The scheduler's pass filler: a helper actor of its own (detached in a run) that copies a
/// dealt pass's ids, targets and positions into its slot's host buffers, so that this per-pass
/// host work never runs on the scheduler's thread (actors/scheduler_actor.hpp).
using PassFillerActor = caf::typed_actor<caf::replies_to<FillPass>::with<PassFilled>>;

// ---- scheduler <-> worker ------------------------------------------------------------------
struct RunStage {
  int64_t pass = 0;     ///< global pass number
  int64_t step = 0;     ///< optimizer step the pass contributes to
  int stage_index = 0;  ///< position of the stage in the iteration plan
  Stage stage;
  /// Tail and backward stages: the stage's place in the chain of activation gradients (the tail
  /// 0, the backward stages after it 1, 2, ...; stage_index - the plan's forward stages). It
  /// writes boundary gradient set chain % 2 and reads set (chain - 1) % 2
  /// (PassActivations::dx). -1 for forward stages.
  int chain = -1;
  std::shared_ptr<PassBuffers> buffers;
  WorkerActor next;        ///< worker of stage_index + 1 (null for the last stage)
  float loss_scale = 1.f;  ///< the tail multiplies the loss gradient by this (fp16 loss scaling)
  bool packed = false;     ///< packed sequences: decoders read buffers->positions (LayerArgs::positions)
  /// An evaluation pass (evaluation_plan): the tail stage runs its decoders forward and the
  /// loss only; no gradient is made or written and the step's loss is not touched.
  bool eval = false;
  /// LoRA dropout: the id of this training pass's masks, the same in every stage of the pass and
  /// in every run of the step (step * 2^16 + the pass's index among the step's training passes;
  /// the layers use dropout_pass * micro_batches + micro-batch). -1: an evaluation pass (none).
  int64_t dropout_pass = -1;
};
struct ActReady {
  int64_t pass = 0;
  int stage_index = 0;  ///< the *consumer* stage
  int64_t micro_batch = 0;
};
struct StageDone {
  int64_t pass = 0;
  int stage_index = 0;
  int worker = 0;
  double loss_sum = 0, loss_count = 0;
  double seconds = 0;  ///< wall time of the task
  /// Tail stages of training passes of sparse models: sum over the micro-batches of target
  /// tokens x load-balancing loss (without its coefficient; the coefficient's share is in
  /// loss_sum), and the expert assignments of every sparse layer, per expert.
  double aux_weighted = 0;
  std::vector<double> expert_tokens;
};
/// One measured interval of one layer for one micro-batch (profiler, actors/layer_timer.hpp).
struct LayerSample {
  int layer = 0;
  ProfileKind kind = ProfileKind::forward;
  double seconds = 0;
};
/// Device memory of one layer as a worker allocates it (bytes; -1: not held by that stage).
struct LayerMemory {
  int layer = 0;
  int64_t weight_bytes = -1, grad_bytes = -1, scratch_bytes = -1;
};
struct LayerTimings {
  int worker = 0;
  int64_t pass = 0;
  int64_t micro_batch = 0;
  std::vector<LayerSample> samples;
  std::vector<LayerMemory> memory;  ///< sent with a stage task's first micro-batch only
};
/// The worker's compute stream ran micro-batch `micro_batch` of task `task` (worker-local id),
/// or, with micro_batch -1, the dequantization of one of the task's frozen groups (in issue order).
struct ComputeDone {
  uint64_t task = 0;
  int64_t micro_batch = 0;
  std::string error;  ///< the device op's failure, else empty
};
/// Task `task`'s last micro-batch ran the backward calls that last touch the gradient
/// accumulators of `groups` (trainable groups of its stage): the rest of the micro-batch adds
/// nothing to them, so they may drain to the host before the task retires. Sent only from
/// inside a last micro-batch, never for the micro-batch's final call (ComputeDone follows it);
/// it may arrive after that ComputeDone, after the task retired or once it is gone, and a
/// group may already be draining: the worker drains each group once.
struct GradsFinal {
  uint64_t task = 0;
  std::vector<int> groups;
  std::string error;  ///< a device failure seen by this callback, else empty
};

/// The disk tier (actors/frozen_tier.hpp) read frozen group `group` for task `task`: its bytes are
/// in the tier's buffer of `ticket` (the worker uploads from it and releases it), or the read
/// failed with `error` (one line naming the cache file, the entry and its offset).
struct FrozenFetched {
  uint64_t task = 0;
  int group = -1;
  uint64_t ticket = 0;
  std::string error;
};
/// The activation spill (actors/activation_spill.hpp) served a request of task `task`: the
/// saved input of `layer` for `micro_batch` was written (write) or is in read buffer `ticket`.
struct SpillDone {
  uint64_t task = 0;
  int64_t micro_batch = 0;
  int layer = 0;
  bool write = false;
  uint64_t ticket = 0;
  std::string error;
};

// ---- worker <-> transfer actors ------------------------------------------------------------
enum class CopyDir : uint8_t { h2d, d2h };
/// What a copy moves and for which task: the worker's request names it and the completion
/// echoes it, so the worker knows what completed (no callback per copy).
enum class CopyKind : uint8_t {
  input,     ///< an input of micro-batch `micro_batch` (host to device)
  output,    ///< an output of micro-batch `micro_batch` (device to host)
  weights,   ///< a chunk of parameter group `group`'s weights (host to device)
  gradient,  ///< parameter group `group`'s gradient is in its host slot
  /// a later contribution to group `group`'s gradient in one step (tied embeddings) landed in
  /// the worker's staging buffer (device to host); the worker then adds it into the slot on
  /// its host job thread, which reports CopyKind::gradient when done
  staged_gradient,
  /// a spilled saved input (`group`: its layer) of micro-batch `micro_batch` landed in a spill
  /// write buffer (device to host); the worker then writes it to the spill file
  spill_output,
};
struct CopyTag {
  CopyKind kind = CopyKind::input;
  uint64_t task = 0;         ///< worker-local id of the stage task
  int64_t micro_batch = -1;  ///< input / output
  int group = -1;            ///< weights / gradient
};
/// "input of micro-batch 3 (task 7)", "weights of group 2 (task 7)", ...
std::string describe(const CopyTag& t);
inline bool operator<(const CopyTag& a, const CopyTag& b) {
  return std::tie(a.kind, a.task, a.micro_batch, a.group) < std::tie(b.kind, b.task, b.micro_batch, b.group);
}
struct CopyRequest {
  CopyDir dir = CopyDir::h2d;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  int priority = 0;   ///< lower is more urgent
  int64_t order = 0;  ///< tie-break within a priority (e.g. micro-batch index)
  CopyTag what;       ///< echoed in CopyDone
  WorkerActor reply_to;
};
struct CopyDone {
  CopyTag what;
  std::string error;  ///< the stream's failure or the exception of the host work, else empty
};
/// A chunk (or a whole copy) completed on a transfer actor's stream.
struct StreamDone {
  uint64_t id = 0;
  size_t chunk = 0;
  double t_done = 0;  ///< tracer clock (0 without a tracer)
  std::string error;
};
/// The link arbiter lets a refused bulk actor go on.
struct LinkIdle {};

// ---- worker <-> optimizer shard ------------------------------------------------------------
struct AcquireWeights {
  int group = 0;
  int64_t step = 0;
};
struct WeightsGranted {
  int group = 0;
  int64_t step = 0;
};
struct ReleaseWeights {
  int group = 0;
  int64_t step = 0;
};
struct AcquireGradSlot {
  int group = 0;
  int64_t step = 0;
};
struct GradGrant {
  int group = 0;
  int64_t step = 0;
  bool overwrite = false;
};
struct GradWritten {
  int group = 0;
  int64_t step = 0;
};
/// A shard's job for `group` finished on its job thread (the shard knows which job it was:
/// a group runs one at a time).
struct JobDone {
  int group = 0;
  double sumsq = 0;   ///< a sum-of-squares job's result
  std::string error;  ///< the exception the job threw, else empty
};

// ---- scheduler <-> optimizer shard ---------------------------------------------------------
struct CloseStep {
  int64_t step = 0;
  int64_t passes = 0;
  float grad_scale = 1.f;  ///< 1 / target tokens of the step; 0: no target tokens, the step is skipped
  double lr = 0;
  /// Per parameter group: uploads and gradient contributions the step's passes make in
  /// total (passes may run different plans after a re-plan). Null: passes times the
  /// ShardGroup's per-pass counts.
  std::shared_ptr<const std::vector<int>> uploads, grads;
};
struct GroupUpdated {
  int64_t step = 0;
  int group = 0;
  /// Unguarded steps: the sum of squares of the group's raw gradient of the step, read by the
  /// update job before it updates (the scheduler sums them into StepResult::grad_norm; the
  /// weights do not depend on it). Guarded steps report it earlier, in GradSumSq; 0 here.
  double sumsq = 0;
};
/// Guarded steps (clipping, loss scaling or inf/NaN skipping on): a shard reports the sum of
/// squares of a group's raw gradient as soon as it is complete; the step waits only for these
/// scalars, and the scheduler answers every shard with the step's StepScale.
struct GradSumSq {
  int64_t step = 0;
  int group = 0;
  double sumsq = 0;
};
struct StepScale {
  int64_t step = 0;
  bool skip = false;       ///< inf/NaN in the gradients: weights, moments, step counters untouched
  float grad_scale = 0.f;  ///< replaces CloseStep::grad_scale: 1/tokens / loss scale * clip coefficient
};

// ---- failures and the watchdog -------------------------------------------------------------
/// Ends the run: every waiter (Session::wait) gets `what`.
struct Failure {
  std::string what;
};
/// The scheduler's periodic check for a run without progress (SessionOptions::watchdog_s).
struct WatchdogTick {};
/// Request to a worker or shard: what it is doing and waiting for, in one line.
struct GetStatus {};
struct StatusReport {
  std::string text;
};

// ---- session <-> scheduler -----------------------------------------------------------------
struct SubmitPass {
  int64_t step = 0;
  std::shared_ptr<const std::vector<int32_t>> ids, targets;  ///< [M * n_seq * seq_len]
  std::shared_ptr<const std::vector<int32_t>>
      positions;      ///< packed sequences: the same shape; null: not packed
  int64_t eval = -1;  ///< >= 0: a forward-only evaluation pass with this id (answered by WaitEval), tagged
                      ///< with `step` so its uploads read the weights that step's passes read
  /// The targets >= 0, counted by the sender (the scheduler makes no pass over the data on its
  /// own thread). A training pass with a negative count fails the run.
  double target_tokens = -1;
};
/// Scheduler -> pass filler (request): pass `pass` was dealt into `buffers` (its slot, which
/// no stage reads until the scheduler has the answer); copy `data`'s ids, targets and positions
/// in, per micro-batch, with each micro-batch's target tokens and (packed passes) rope length.
struct FillPass {
  int64_t pass = 0;
  SubmitPass data;
  std::shared_ptr<PassBuffers> buffers;
};
/// Pass filler -> scheduler: the answer to FillPass; `error` non-empty when the copy failed.
struct PassFilled {
  int64_t pass = 0;
  std::string error;
};
/// Close step `step` with its learning rate (passes are counted by the scheduler; the
/// gradient scale is 1 / target tokens of all its passes).
struct CloseStepRequest {
  int64_t step = 0;
  double lr = 0;
  /// The target tokens the step's gradient is divided by (data-parallel replicas: those of
  /// every replica's passes); < 0: the step's own passes' target tokens.
  double tokens = -1;
};
struct WaitStep {
  int64_t step = 0;
};
/// The loss of evaluation pass `id` (SubmitPass::eval), once its tail is done.
struct WaitEval {
  int64_t id = 0;
};
struct SetPeers {
  std::vector<WorkerActor> workers;
  std::vector<ShardActor> shards;
};
/// A snapshot of the profile and the plan in use.
struct GetRuntimeInfo {};
struct RuntimeInfo {
  Profile profile;
  IterationPlan plan;                   ///< the plan the next pass will be dealt with
  int64_t replans = 0;                  ///< times the plan was changed
  std::vector<std::string> replan_log;  ///< the re-planning lines logged so far
};
struct Shutdown {};
/// Session -> scheduler and every shard (request, answered with Ack), before any pass of a
/// resumed run: steps 0..step-1 happened in an earlier run. Shards then hold version step-1
/// in the fp32 master and version step-1-s in the low-precision copy (the Session loaded
/// both), with every upload of iterations < step complete. `loss_scales[i]` is the loss
/// scale of step step+i (i = 0..staleness) for the scheduler; empty without loss scaling.
struct ResumeAt {
  int64_t step = 0;
  std::vector<float> loss_scales;
};
struct Ack {};
/// Session -> scheduler (request): the loss scales already decided for steps step,
/// step+1, ... (at most staleness+1 of them, stopping at the first undecided one).
struct LossScalesFrom {
  int64_t step = 0;
};
struct LossScales {
  std::vector<float> scales;
};

/// The text of an error CAF hands us (an actor's exit reason, a failed request): the string
/// an actor put into it when it has one (make_error(sec::runtime_error, text)), else CAF's
/// own rendering ("request_receiver_down", ...).
std::string error_text(const caf::error& e);
/// The text of an exception an actor caught in its exception handler: what(), or "unknown
/// exception".
std::string exception_text(const std::exception_ptr& x);
/// The exit reason of an actor that ends with the failure `text` (error_text reads it back).
inline caf::error failure_reason(const std::string& text) {
  return caf::make_error(caf::sec::runtime_error, text);
}
/// True for the exit reasons of a deliberate end (quit(), Shutdown, exit on user shutdown).
inline bool is_shutdown(const caf::error& reason) {
  return reason == caf::exit_reason::normal || reason == caf::exit_reason::user_shutdown;
}

/// Registers the protocol's message types (the type-ID block below) with an actor system's
/// configuration, so CAF names them in errors and traces. Call before creating the system.
void register_protocol(caf::actor_system_config& cfg);

}  // namespace rp

// ---- the one type-ID block -----------------------------------------------------------------
// Every message of the protocol gets a CAF type ID here (in this order) and is allowed as an
// unserialisable, process-local message type.
#define RP_MESSAGE_TYPE(T)        \
  CAF_ADD_TYPE_ID(roundpipe, (T)) \
  CAF_ALLOW_UNSAFE_MESSAGE_TYPE(T)

CAF_BEGIN_TYPE_ID_BLOCK(roundpipe, caf::first_custom_type_id)
RP_MESSAGE_TYPE(rp::RunStage)
RP_MESSAGE_TYPE(rp::ActReady)
RP_MESSAGE_TYPE(rp::CopyRequest)
RP_MESSAGE_TYPE(rp::CopyDone)
RP_MESSAGE_TYPE(rp::StreamDone)
RP_MESSAGE_TYPE(rp::LinkIdle)
RP_MESSAGE_TYPE(rp::ComputeDone)
RP_MESSAGE_TYPE(rp::AcquireWeights)
RP_MESSAGE_TYPE(rp::WeightsGranted)
RP_MESSAGE_TYPE(rp::ReleaseWeights)
RP_MESSAGE_TYPE(rp::AcquireGradSlot)
RP_MESSAGE_TYPE(rp::GradGrant)
RP_MESSAGE_TYPE(rp::GradWritten)
RP_MESSAGE_TYPE(rp::JobDone)
RP_MESSAGE_TYPE(rp::StageDone)
RP_MESSAGE_TYPE(rp::CloseStep)
RP_MESSAGE_TYPE(rp::GroupUpdated)
RP_MESSAGE_TYPE(rp::GradSumSq)
RP_MESSAGE_TYPE(rp::StepScale)
RP_MESSAGE_TYPE(rp::LayerTimings)
RP_MESSAGE_TYPE(rp::Failure)
RP_MESSAGE_TYPE(rp::SubmitPass)
RP_MESSAGE_TYPE(rp::CloseStepRequest)
RP_MESSAGE_TYPE(rp::WaitStep)
RP_MESSAGE_TYPE(rp::StepResult)
RP_MESSAGE_TYPE(rp::SetPeers)
RP_MESSAGE_TYPE(rp::GetRuntimeInfo)
RP_MESSAGE_TYPE(rp::RuntimeInfo)
RP_MESSAGE_TYPE(rp::GetStatus)
RP_MESSAGE_TYPE(rp::StatusReport)
RP_MESSAGE_TYPE(rp::WatchdogTick)
RP_MESSAGE_TYPE(rp::Shutdown)
RP_MESSAGE_TYPE(rp::ResumeAt)
RP_MESSAGE_TYPE(rp::Ack)
RP_MESSAGE_TYPE(rp::LossScalesFrom)
RP_MESSAGE_TYPE(rp::LossScales)
RP_MESSAGE_TYPE(rp::WaitEval)
RP_MESSAGE_TYPE(rp::EvalResult)
RP_MESSAGE_TYPE(rp::FillPass)
RP_MESSAGE_TYPE(rp::PassFilled)
RP_MESSAGE_TYPE(rp::FrozenFetched)
RP_MESSAGE_TYPE(rp::SpillDone)
RP_MESSAGE_TYPE(rp::GradsFinal)
CAF_END_TYPE_ID_BLOCK(roundpipe)

#undef RP_MESSAGE_TYPE
