// Typed messages of the RoundPipe actor protocol (CAF 0.17.6).
//
// Large data never travels in a message: only handles (pointers into host memory
// owned by the Session, device pointers owned by a worker). All types are local to
// one process, hence CAF_ALLOW_UNSAFE_MESSAGE_TYPE (no serialisation).
//
// Who sends what (the per-layer protocol as message ordering, docs/protocol.md):
//   scheduler -> worker    RunStage            a stage task of one pass
//   worker    -> worker    ActReady            micro-batch m of a stage's output is on the host
//   worker    -> transfer  CopyRequest         a copy on that transfer actor's stream
//   transfer  -> worker    CopyDone            the copy completed
//   worker    -> shard     AcquireWeights      (request) upload of group g for step t may start
//   worker    -> shard     ReleaseWeights      upload of group g for step t completed
//   worker    -> shard     AcquireGradSlot     (request) may write grad of group g for step t
//   worker    -> shard     GradWritten         grad of group g for step t is in the host slot
//   worker    -> scheduler StageDone           a stage task finished (with loss for the tail)
//   worker    -> scheduler LayerTimings        measured layer times of one micro-batch (profiler;
//                                              sent from the compute stream's then() callback)
//   scheduler -> shard     CloseStep           step t has all its passes; scale and LR
//   shard     -> scheduler GradSumSq           (guarded steps) sum of squares of group g's step-t gradient
//   scheduler -> shard     StepScale           (guarded steps) step t: skip, or the grad_scale to apply
//   shard     -> scheduler GroupUpdated        group g's step t update is in the fp32 master
//   any       -> scheduler Failure             a typed error ended a task
//   session   -> scheduler, shard  ResumeAt    (request, before any pass) continue at step N
//   session   -> scheduler LossScalesFrom      (request) loss scales decided for steps >= N
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/pass_buffers.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/profile.hpp"
#include "roundpipe/session.hpp"  // StepResult (the answer to WaitStep)

namespace rp {

struct RunStage {
  int64_t pass = 0;             ///< global pass number
  int64_t step = 0;             ///< optimizer step the pass contributes to
  int stage_index = 0;          ///< position of the stage in the iteration plan
  Stage stage;
  std::shared_ptr<PassBuffers> buffers;
  caf::actor next;              ///< worker of stage_index + 1 (null for the last stage)
  float loss_scale = 1.f;       ///< the tail multiplies the loss gradient by this (fp16 loss scaling)
};
struct ActReady {
  int64_t pass = 0;
  int stage_index = 0;  ///< the *consumer* stage
  int64_t micro_batch = 0;
};
enum class CopyDir : uint8_t { h2d, d2h };
struct CopyRequest {
  CopyDir dir = CopyDir::h2d;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  int priority = 0;              ///< lower is more urgent
  int64_t order = 0;             ///< tie-break within a priority (e.g. micro-batch index)
  uint64_t token = 0;            ///< echoed in CopyDone
  std::function<void()> after;   ///< optional host work after the copy (e.g. accumulate)
  caf::actor reply_to;
};
struct CopyDone {
  uint64_t token = 0;
  std::string error;
};
struct AcquireWeights { int group; int64_t step; };
struct WeightsGranted { int group; int64_t step; };
struct ReleaseWeights { int group; int64_t step; };
struct AcquireGradSlot { int group; int64_t step; };
struct GradGrant { int group; int64_t step; bool overwrite; };
struct GradWritten { int group; int64_t step; };
struct StageDone {
  int64_t pass = 0;
  int stage_index = 0;
  int worker = 0;
  double loss_sum = 0, loss_count = 0;
  double seconds = 0;  ///< wall time of the task
};
struct CloseStep {
  int64_t step = 0;
  int64_t passes = 0;
  float grad_scale = 1.f;  ///< 1 / target tokens of the step
  double lr = 0;
  /// Per parameter group: uploads and gradient contributions the step's passes make in
  /// total (passes may run different plans after a re-plan). Null: passes times the
  /// ShardGroup's per-pass counts.
  std::shared_ptr<const std::vector<int>> uploads, grads;
};
struct GroupUpdated { int64_t step; int group; };
/// Guarded steps (clipping, loss scaling or inf/NaN skipping on): a shard reports the sum of
/// squares of a group's raw gradient as soon as it is complete; the step waits only for these
/// scalars, and the scheduler answers every shard with the step's StepScale.
struct GradSumSq { int64_t step; int group; double sumsq; };
struct StepScale {
  int64_t step = 0;
  bool skip = false;       ///< inf/NaN in the gradients: weights, moments, step counters untouched
  float grad_scale = 0.f;  ///< replaces CloseStep::grad_scale: 1/tokens / loss scale * clip coefficient
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
struct Failure { std::string what; };
struct SubmitPass {
  int64_t step = 0;
  std::shared_ptr<const std::vector<int32_t>> ids, targets;  ///< [M * n_seq * seq_len]
};
struct WaitStep { int64_t step; };
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

}  // namespace rp

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::RunStage)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::ActReady)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::CopyRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::CopyDone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::AcquireWeights)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::WeightsGranted)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::ReleaseWeights)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::AcquireGradSlot)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::GradGrant)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::GradWritten)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::StageDone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::CloseStep)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::GroupUpdated)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::GradSumSq)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::StepScale)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::LayerTimings)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::Failure)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::SubmitPass)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::WaitStep)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::StepResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::Shutdown)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::ResumeAt)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::Ack)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::LossScalesFrom)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::LossScales)
