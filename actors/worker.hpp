// Worker actors: one per GPU (or virtual GPU). A worker runs the stage tasks the
// scheduler deals it, in the order dealt, each over all M micro-batches of a pass:
//  - asks the owning optimizer shards for each parameter group (rule 1) and uploads it
//    through its parameter-upload transfer actor, releasing it when the copy is done;
//  - uploads micro-batch m's inputs one micro-batch ahead (double-buffered slots)
//    through its activation-upload actor, once the predecessor stage announced m;
//  - runs the stage's layers on the compute stream (completion comes back as a
//    message, no actor thread waits on the device);
//  - downloads outputs (and every layer input, which backward recomputes from) through
//    its activation-download actor and tells the successor stage's worker (ActReady);
//  - once the last micro-batch is computed the task retires and the next one starts while
//    the last outputs still download; each parameter group's gradient goes down through
//    the gradient-download actor into the host slot the shard grants (rule 3), then
//    GradWritten goes to the shard, and StageDone to the scheduler once every output and
//    gradient is on the host;
//  - prefetches the next task's weights while the current one computes, and behind a
//    next task that uploads no weight (the embedding's backward) also the one after it;
//  - with the session's disk tier (ctx.frozen_tier), asks it for each streamed frozen group when
//    a task is prepared, uploads the group from the tier's read buffer once FrozenFetched comes
//    and gives the buffer back when the group's last chunk landed (actors/frozen_tier.hpp);
//  - with the session's activation spill (ctx.spill), downloads the spilled layers' saved inputs
//    into its write buffers and counts them down once written, and reads them back for the tasks
//    that upload them from when the task is prepared (actors/spill_port.hpp);
//  - with ctx.profile, times each layer call on the compute stream and reports the times
//    (and the layers' device memory) to the scheduler, read after completion.
// Per micro-batch, what may be uploaded, computed and handed to the next task, and when a
// task retires, is decided by the task's StageProgress (scheduler/stage_progress.hpp), the
// same rules the bubble simulator replays. Copies are tagged (CopyTag): a completion names
// what it completed.
//
// Failures: a failed device op or copy, a refused allocation with nothing to wait for, a
// failed shard request, or an exception in one of its handlers sends Failure (naming the
// worker, the stage task and what failed) to the scheduler; the worker then takes no more
// work. It monitors its transfer actors: one that goes down fails the worker the same way.
// GetStatus answers what the worker is doing and waiting for (the watchdog's line).
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "actors/fault_injection.hpp"
#include "actors/messages.hpp"
#include "actors/pass_buffers.hpp"
#include "actors/run_progress.hpp"
#include "actors/transfer.hpp"
#include "kernels/device.hpp"
#include "model/layer.hpp"

namespace rp {

class Tracer;
class FrozenTier;
class ActivationSpill;

/// Device-memory pressure, counted by all workers of a session (Session::memory_events).
struct MemoryEventCounters {
  std::atomic<int64_t> start_waits{0};        ///< stage starts refused by the cap that waited for a drain
  std::atomic<int64_t> prefetch_refusals{0};  ///< prefetch attempts refused by the cap
};

struct WorkerContext {
  int index = 0;
  Device* device = nullptr;
  const ModelLayout* layout = nullptr;
  const std::vector<std::unique_ptr<Layer>>* layers = nullptr;
  ParamStore* store = nullptr;
  std::vector<ShardActor> shard_of_group;  ///< shard owning each parameter group
  SchedulerActor scheduler;
  Tracer* tracer = nullptr;
  /// Time every layer call and send LayerTimings to the scheduler (actors/layer_timer.hpp).
  bool profile = false;
  TransferSettings transfer;  ///< cross-stream priorities, chunk size
  /// Decoders keep their forward's attention output and log-sum-exp (LayerOptions::
  /// save_attention): forward stages download them, backward stages upload them.
  bool saved_attention = false;
  /// In a training stage's last micro-batch, drain each layer's gradients to the host as soon
  /// as its backward call ran (GradsFinal), not when the whole stage retired: the next stage's
  /// start waits less for the memory cap (SessionOptions::early_gradients).
  bool early_gradients = true;
  /// What set the device's memory cap (SessionOptions::capacity_origin): named when a stage
  /// fails for it. Empty: not named.
  std::string capacity_origin;
  bool late_grads_final = false;                 ///< testing: GradsFinal after ComputeDone (SessionInternals)
  MemoryEventCounters* memory_events = nullptr;  ///< optional: counts refused starts and prefetches
  RunProgress* progress = nullptr;  ///< optional: counts completed copies and micro-batches (watchdog)
  FaultInjection faults;            ///< testing only (fault_injection.hpp)
  /// The session's disk tier (null: frozen groups upload from ParamStore::lowp): its tiered
  /// groups are read into one of its buffers when a task is prepared and uploaded from there.
  FrozenTier* frozen_tier = nullptr;
  /// The session's activation spill (null: every saved input is in host memory): the layers it
  /// holds are written there by forward stages (ActReady follows the write) and read back into
  /// its staging buffers for the tasks that upload them (actors/spill_port.hpp).
  ActivationSpill* spill = nullptr;
};

/// Spawns worker `ctx.index` and its four transfer actors (activation up, activation
/// down, parameter up, gradient down) on ctx.device's copy streams. With
/// ctx.transfer.priorities a prefetched task's weights are cut into chunks and packed into
/// the windows between the computing task's activation uploads (scheduler/upload_windows.hpp).
WorkerActor spawn_worker(caf::actor_system& sys, WorkerContext ctx);

}  // namespace rp
