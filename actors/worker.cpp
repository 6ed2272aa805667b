// The worker actor (actors/worker.hpp; its class: actors/worker_impl.hpp): its behaviour, and
// the stage tasks it runs in dealt order: prepared (weights asked for), prefetched, started
// once their buffers fit, pumped micro-batch by micro-batch, retired and reported done. The
// copies it issues and what their completions do: actors/worker_copies.cpp.
#include <chrono>

#include <fmt/format.h>

#include "actors/layer_timer.hpp"
#include "actors/message_trace.hpp"
#include "actors/stage_copies.hpp"
#include "actors/worker_impl.hpp"
#include "actors/worker_status.hpp"
#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"
#include "trace/tracer.hpp"

namespace rp {

namespace {

using FaultSite = FaultInjection::Site;

}  // namespace

Worker::Worker(caf::actor_config& cfg, WorkerContext ctx)
    : WorkerActor::base(cfg), ctx_(std::move(ctx)), spill_(ctx_.spill, ctx_.index) {
  WorkerTransfers w =
      spawn_worker_transfers(system(), *ctx_.device, ctx_.index, ctx_.transfer, ctx_.tracer, ctx_.faults);
  act_up_ = w.act_up;
  act_down_ = w.act_down;
  param_up_ = w.param_up;
  grad_down_ = w.grad_down;
  gate_ = w.gate;
}

// Drop every actor handle on exit: queued tasks name other workers and ctx_ names the
// shards, and such reference cycles would keep detached shards' threads alive forever.
void Worker::on_exit() {
  // Device work may still reference the tasks' buffers: stop the transfer actors from
  // issuing more copies, then let what was issued drain before freeing anything.
  if (gate_) gate_->close();
  // the transfer actors go with the worker, also when it died of an exception
  for (auto& a : {act_up_, act_down_, param_up_, grad_down_})
    if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  if (ctx_.device)
    for (int k = 0; k < kNumStreams; ++k) ctx_.device->stream(StreamKind(k)).synchronize();
  queue_.clear();
  task_.reset();
  next_.reset();
  after_.reset();
  draining_.clear();
  outstanding_.clear();
  staging_.clear();  // after its additions ran
  spill_.clear();
  ctx_.shard_of_group.clear();
  ctx_.scheduler = nullptr;
  act_up_ = act_down_ = param_up_ = grad_down_ = nullptr;
}

Worker::behavior_type Worker::make_behavior() {
  for (auto& a : {act_up_, act_down_, param_up_, grad_down_}) monitor(a);
  // a transfer actor that goes down with an error fails the worker's work
  set_down_handler([this](caf::down_msg& d) {
    if (!is_shutdown(d.reason)) fail("transfer actor stopped: " + error_text(d.reason));
  });
  // an exception in a handler: report it, then end with it (the scheduler also sees us go)
  set_exception_handler([this](std::exception_ptr& x) -> caf::error {
    const std::string what = exception_text(x);
    fail(what);
    return failure_reason(where() + ": " + what);
  });
  return {
      [this](RunStage& rs) {
        trace_received(ctx_.tracer, me_, "scheduler", "RunStage",
                       {{"pass", rs.pass}, {"stage", rs.stage_index}});
        queue_.push_back(std::move(rs));
        // a start waiting for memory is retried when a drain finishes (finish()), not here
        if (!task_ && !alloc_wait_) start_next();
      },
      [this](ActReady& a) {
        trace_received(ctx_.tracer, me_, "", "ActReady",
                       {{"pass", a.pass}, {"stage", a.stage_index}, {"mb", a.micro_batch}});
        ready_.insert({a.pass, a.stage_index, a.micro_batch});
        pump();
      },
      [this](CopyDone& d) { on_copy_done(d); },
      [this](ComputeDone& c) {
        if (ctx_.progress) ctx_.progress->tick();
        if (c.micro_batch == kDequantized) return dequantized(c);
        if (!task_ || task_->id != c.task) return;
        if (!c.error.empty()) return fail(fmt::format("micro-batch {}: {}", c.micro_batch, c.error));
        if (ctx_.faults.fire_compute(FaultSite::worker_handler, ctx_.index, task_->rs.stage_index,
                                     c.micro_batch))
          throw std::runtime_error(
              FaultInjection::what(fmt::format("the completion of micro-batch {}", c.micro_batch)));
        on_computed(c.micro_batch);
      },
      [this](GradsFinal& f) { grads_final(f); },
      [this](FrozenFetched& f) { frozen_fetched(f); },
      [this](SpillDone& d) { spill_done(d); },
      [this](GetStatus) -> caf::result<StatusReport> { return StatusReport{status()}; },
      [this](Shutdown) {
        for (auto& a : {act_up_, act_down_, param_up_, grad_down_})
          send_exit(a, caf::exit_reason::user_shutdown);
        quit();
      },
  };
}

namespace {
/// A stage's allocation that the device's memory cap refused, as the run fails with it: the
/// device's words and, when known, the setting that set the cap, to raise.
std::string out_of_memory_text(const DeviceOutOfMemory& e, const std::string& capacity_origin) {
  if (capacity_origin.empty()) return e.what();
  return fmt::format("{}; {} sets that capacity: raise it", e.what(), capacity_origin);
}
}  // namespace

/// "forward stage 2 of pass 5, layers 3-4".
std::string stage_text(const Task& t) {
  return fmt::format("{} stage {} of pass {}, layers {}-{}", stage_kind_name(t.rs.stage.kind),
                     t.rs.stage_index, t.rs.pass, t.rs.stage.first, t.rs.stage.last);
}

/// "worker 1 (forward stage 2 of pass 5, layers 3-4)".
std::string Worker::where() const {
  return task_ ? fmt::format("worker {} ({})", ctx_.index, stage_text(*task_))
               : fmt::format("worker {}", ctx_.index);
}

void Worker::fail(const std::string& what) {
  if (failed_) return;
  failed_ = true;
  queue_.clear();
  send(ctx_.scheduler, Failure{where() + ": " + what});
}

/// The live task with id `id` (current, prefetching or draining its gradients), or null.
Task* Worker::live(uint64_t id) {
  if (task_ && task_->id == id) return task_.get();
  if (next_ && next_->id == id) return next_.get();
  if (after_ && after_->id == id) return after_.get();
  auto it = draining_.find(id);
  return it == draining_.end() ? nullptr : it->second.get();
}

void Worker::start_next() {
  task_.reset();
  if (failed_) return;
  if (next_) {
    task_ = std::move(next_);
    next_ = std::move(after_);
    send_pieces(*task_, task_->uploads->open_all());  // the prefetch windows are over
  } else {
    if (queue_.empty()) return;
    try {
      task_ = prepare(queue_.front());
      queue_.pop_front();
    } catch (const DeviceOutOfMemory& e) {
      if (wait_for_memory()) return;
      queue_.pop_front();
      fail(out_of_memory_text(e, ctx_.capacity_origin));
      return;
    } catch (const std::exception& e) {
      queue_.pop_front();
      fail(e.what());
      return;
    }
  }
  task_->wall_start = std::chrono::steady_clock::now();
  task_->t_start = ctx_.tracer ? ctx_.tracer->now() : 0;
  begin_current();
}

/// Allocates the current task's work buffers and starts it. When the memory cap (or
/// fragmentation) refuses them while finished tasks still drain gradients, the task waits
/// for those to finish (finish() retries) instead of failing the run.
void Worker::begin_current() {
  try {
    if (!task_->work_ready) allocate_work(ctx_, *task_);  // else allocated ahead (prefetch_behind)
  } catch (const DeviceOutOfMemory& e) {
    task_->dgrad.clear();
    task_->scratch.reset();
    task_->dfp8.clear();
    for (auto& b : task_->tmp) b.reset();
    if (wait_for_memory()) return;
    fail(out_of_memory_text(e, ctx_.capacity_origin));
    return;
  } catch (const std::exception& e) {
    fail(e.what());
    return;
  }
  task_->work_ready = true;
  pump();
}

bool Worker::wait_for_memory() {
  if (draining_.empty()) return false;
  alloc_wait_ = true;
  if (ctx_.memory_events) ctx_.memory_events->start_waits++;
  return true;
}

/// Early start across the stage boundary: once the current task will no longer touch
/// slot j (its last micro-batch there is computed and downloaded), the slot's memory
/// goes to the prefetched next task, whose micro-batch j inputs upload at once, so the
/// compute stream does not idle for the first upload of every stage. Memory-neutral
/// when both stages move activations of the same size.
void Worker::early_start() {
  if (!next_ || !task_ || failed_) return;
  Task& t = *task_;
  Task& n = *next_;
  for (int j = 0; j < 2 && j < n.M; ++j) {
    if (n.progress.holds_slot(j) || !t.progress.may_hand_over(j)) continue;
    t.slot[j] = Slot{};
    t.progress.drop_slot(j);
    try {
      allocate_slot(ctx_, n, j);
    } catch (const DeviceOutOfMemory&) {
      n.slot[j] = Slot{};  // no room now: the slot is allocated when the task starts
    }
  }
  while (may_upload(n)) issue_uploads(n);
}

/// Prefetch (parameter uploads fill the gaps): once the current task's weights are on the device,
/// allocate the next task and start its parameter uploads while this one computes.
/// Skipped (and retried later) when both do not fit in the device's memory cap.
void Worker::maybe_prefetch() {
  if (queue_.empty() || failed_ || !task_ || task_->params_pending > 0) return;
  if (next_) return prefetch_behind();
  try {
    // its chunks go into the windows between the current task's remaining activation uploads
    next_ = prepare(queue_.front(), int(task_->M - task_->progress.uploads_done()) + 1);
    queue_.pop_front();
  } catch (const DeviceOutOfMemory&) {
    // not enough room for two stages: the next one starts when this one ends
    if (ctx_.memory_events) ctx_.memory_events->prefetch_refusals++;
  } catch (const std::exception& e) {
    queue_.pop_front();
    fail(e.what());
  }
}

/// A next task that uploads no weights (the embedding's backward stage) would leave the
/// link idle for weights until it becomes current, and then the stage after it (the next
/// pass's first forward stage, the largest weights of a pass) would wait for all of its
/// own. So its work buffers are allocated now, which reserves its memory, and the stage
/// after it prefetches behind it. Either allocation refused by the cap: retried later,
/// and the stage after it prefetches when the weightless one becomes current, as before.
void Worker::prefetch_behind() {
  if (!next_ || after_ || !next_->groups.empty() || queue_.empty() || failed_) return;
  Task& n = *next_;
  try {
    if (!n.work_ready) {
      allocate_work(ctx_, n);
      n.work_ready = true;
    }
    after_ = prepare(queue_.front());
    queue_.pop_front();
  } catch (const DeviceOutOfMemory&) {
    if (!n.work_ready) {
      n.dgrad.clear();
      n.scratch.reset();
      n.dfp8.clear();
      for (auto& b : n.tmp) b.reset();
    }
    if (ctx_.memory_events) ctx_.memory_events->prefetch_refusals++;
  } catch (const std::exception& e) {
    queue_.pop_front();
    fail(e.what());
  }
}

/// A new task for `rs` (stage_copies.hpp: new_task) whose weights are asked for: frozen groups
/// upload at once (or are read from the disk tier first), trainable ones once their shard grants
/// them (rule 1); `windows`: prefetch windows for the weights' chunks (1: upload everything at once).
std::unique_ptr<Task> Worker::prepare(RunStage rs, int windows) {
  auto tp = new_task(ctx_, std::move(rs), next_task_id_++, windows);
  Task& t = *tp;
  const auto& m = *ctx_.layout;
  FrozenTier* tier = ctx_.frozen_tier;
  const int64_t step = t.rs.step;
  const uint64_t id = t.id;
  for (int g : t.groups) {
    if (tier && tier->tiered(g)) {
      tier->fetch(g, [me = WorkerActor{this}, id, g](uint64_t ticket, const std::string& err) {
        caf::anon_send(me, FrozenFetched{id, g, ticket, err});
      });
      continue;
    }
    if (m.groups[g].frozen) {
      send_pieces(t, t.uploads->grant(g));
      continue;
    }
    trace_sent(ctx_.tracer, me_, "", "AcquireWeights", {{"group", g}, {"step", step}});
    request(ctx_.shard_of_group[g], caf::infinite, AcquireWeights{g, step})
        .then(
            [this, g, id, step](WeightsGranted&) {
              trace_received(ctx_.tracer, me_, "", "WeightsGranted", {{"group", g}, {"step", step}});
              if (Task* tk = live(id)) send_pieces(*tk, tk->uploads->grant(g));
            },
            [this](caf::error& e) { fail("weights request failed: " + error_text(e)); });
  }
  spill_.request_reads(t, WorkerActor{this});
  return tp;
}

void Worker::pump() {
  if (!task_ || failed_ || !task_->work_ready) return;
  Task& t = *task_;
  maybe_prefetch();
  // Uploads: in order, one micro-batch ahead, once the slot's previous user has computed.
  while (may_upload(t)) issue_uploads(t);
  // Compute: in order, once inputs and parameters are in and the output slot is free.
  while (t.progress.compute_wait(true, t.params_pending == 0) == StageProgress::Wait::none)
    launch_compute(ctx_, t, t.progress.compute_issued(), WorkerActor{this});
  early_start();
  maybe_finish();
}

/// Once every micro-batch is computed the task retires: the next task starts at once
/// while the last outputs download (their slots are given back as they land) and the
/// gradients drain to the host (rule 3 through the shards); the task reports StageDone
/// when its last output and gradient are written.
void Worker::maybe_finish() {
  Task& t = *task_;
  if (!t.progress.retired()) return;
  for (int64_t m = 0; m < t.M; ++m) ready_.erase(Key{t.rs.pass, t.rs.stage_index, m});
  // Only the gradient accumulators and undelivered outputs are still needed: give the
  // rest back now.
  t.dparam.clear();
  t.dstage.clear();
  t.dequant_order.clear();
  t.scratch.reset();
  t.dfp8.clear();
  for (auto& b : t.tmp) b.reset();
  for (int j = 0; j < 2; ++j)
    if (t.progress.slot_finished(j)) {
      t.slot[j] = Slot{};
      t.progress.drop_slot(j);
    } else if (t.progress.holds_slot(j)) {
      release_retired_inputs(t, j);  // the next task starts now: only the outputs in flight stay
    }
  const uint64_t id = t.id;
  draining_[id] = std::move(task_);
  Task& d = *draining_[id];
  for (int g : d.grad_groups) drain_grad(d, g);  // those GradsFinal did not drain already
  finish(id);
  start_next();
}

/// Groups of task f.task whose gradients are final before the task retires (GradsFinal):
/// they drain now, beside the rest of the last micro-batch, so the task retires holding
/// less and the next task's start waits less for the cap. Late (after retirement, which
/// drained every group) or for a task that is gone: nothing to do.
void Worker::grads_final(const GradsFinal& f) {
  trace_received(ctx_.tracer, me_, "", "GradsFinal", {{"groups", int64_t(f.groups.size())}});
  if (!f.error.empty()) return fail(fmt::format("the last micro-batch's backward: {}", f.error));
  Task* t = live(f.task);
  if (!t) return;
  for (int g : f.groups) drain_grad(*t, g);
}

/// Asks group g's shard for task t's gradient slot (rule 3) and writes the gradient once
/// granted; once per task and group.
void Worker::drain_grad(Task& t, int g) {
  if (!t.grads_draining.insert(g).second) return;
  const uint64_t id = t.id;
  const int64_t step = t.rs.step;
  trace_sent(ctx_.tracer, me_, "", "AcquireGradSlot", {{"group", g}, {"step", step}});
  request(ctx_.shard_of_group[g], caf::infinite, AcquireGradSlot{g, step})
      .then(
          [this, g, id, step](GradGrant& gr) {
            trace_received(ctx_.tracer, me_, "", "GradGrant", {{"group", g}, {"step", step}});
            write_grad(id, g, gr.overwrite);
          },
          [this](caf::error& e) { fail("gradient slot request failed: " + error_text(e)); });
}

/// Reports a retired task done once its outputs and gradients are all on the host.
void Worker::finish(uint64_t id) {
  auto it = draining_.find(id);
  if (it == draining_.end()) return;
  Task& t = *it->second;
  if (t.grads_pending > 0 || !t.progress.outputs_done()) return;
  StageDone sd;
  sd.pass = t.rs.pass;
  sd.stage_index = t.rs.stage_index;
  sd.worker = ctx_.index;
  sd.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t.wall_start).count();
  if (t.rs.stage.kind == StageKind::tail) {
    for (int64_t m = 0; m < t.M; ++m) {
      sd.loss_sum += t.rs.buffers->loss[2 * m];
      sd.loss_count += t.rs.buffers->loss[2 * m + 1];
    }
    if (!t.rs.eval) add_router_statistics(*ctx_.layout, *t.rs.buffers, sd);
  }
  if (ctx_.tracer)
    ctx_.tracer->interval(
        fmt::format("worker{}.tasks", ctx_.index),
        fmt::format("{} stage {} (pass {})", stage_kind_name(t.rs.stage.kind), t.rs.stage_index, t.rs.pass),
        t.t_start, ctx_.tracer->now());
  draining_.erase(it);  // releases the gradient buffers
  retry_memory_wait();
  trace_sent(ctx_.tracer, me_, "scheduler", "StageDone", {{"pass", sd.pass}, {"stage", sd.stage_index}});
  send(ctx_.scheduler, sd);
}

/// A start refused for memory is retried whenever a retired task gives some back.
void Worker::retry_memory_wait() {
  if (!alloc_wait_ || failed_) return;
  alloc_wait_ = false;
  if (!task_) start_next();
  else if (!task_->work_ready)  // never a task already running: that would zero its gradients
    begin_current();
}

/// One line for the watchdog (actors/worker_status.hpp).
std::string Worker::status() const {
  WorkerSnapshot w;
  w.index = ctx_.index;
  w.failed = failed_;
  w.alloc_wait = alloc_wait_;
  w.current = task_.get();
  for (const Task* t : {next_.get(), after_.get()})
    if (t) w.prefetching.push_back(t);
  for (auto& [id, t] : draining_) w.draining.push_back(t.get());
  w.queued = queue_.size();
  w.outstanding = &outstanding_;
  w.input_ready = [this](const Task& t, int64_t m) { return input_ready(t, m); };
  return describe(w);
}

WorkerActor spawn_worker(caf::actor_system& sys, WorkerContext ctx) {
  return sys.spawn<Worker>(std::move(ctx));
}

}  // namespace rp
