#include "actors/worker.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "actors/host_jobs.hpp"
#include "actors/layer_timer.hpp"
#include "actors/message_trace.hpp"
#include "actors/messages.hpp"
#include "actors/spill_port.hpp"
#include "actors/stage_copies.hpp"
#include "actors/stage_task.hpp"
#include "actors/transfer.hpp"
#include "actors/worker_status.hpp"
#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"
#include "scheduler/upload_windows.hpp"
#include "trace/tracer.hpp"

namespace rp {
namespace {

constexpr int kPrioActivation = 0;  // critical path: first
constexpr int kPrioParam = 1;
constexpr int kPrioGrad = 1;

using FaultSite = FaultInjection::Site;

class Worker : public WorkerActor::base {
 public:
  Worker(caf::actor_config& cfg, WorkerContext ctx)
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
  void on_exit() override {
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

  behavior_type make_behavior() override {
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

 private:
  using Key = std::tuple<int64_t, int, int64_t>;

  /// "worker 1 (forward stage 2 of pass 5, layers 3-4)".
  std::string where() const {
    return task_ ? fmt::format("worker {} ({} stage {} of pass {}, layers {}-{})", ctx_.index,
                               stage_kind_name(task_->rs.stage.kind), task_->rs.stage_index, task_->rs.pass,
                               task_->rs.stage.first, task_->rs.stage.last)
                 : fmt::format("worker {}", ctx_.index);
  }

  void fail(const std::string& what) {
    if (failed_) return;
    failed_ = true;
    queue_.clear();
    send(ctx_.scheduler, Failure{where() + ": " + what});
  }

  /// Issues a copy on `via`'s stream; its CopyDone (tagged `what`) comes back to on_copy_done.
  void copy(const TransferActor& via, CopyDir dir, void* dst, const void* src, size_t bytes, int prio,
            int64_t order, const CopyTag& what) {
    outstanding_[what]++;
    send(via, CopyRequest{dir, dst, src, bytes, prio, order, what, WorkerActor{this}});
  }

  /// A copy completed: what it completed is in its tag.
  void on_copy_done(const CopyDone& d) {
    if (ctx_.progress) ctx_.progress->tick();
    auto it = outstanding_.find(d.what);
    if (it == outstanding_.end()) return;  // not ours (cannot happen)
    if (--it->second == 0) outstanding_.erase(it);
    if (!d.error.empty()) return fail(d.error);
    const CopyTag& t = d.what;
    switch (t.kind) {
      case CopyKind::input: return input_landed(t.task, t.micro_batch);
      case CopyKind::output: return output_landed(t.task, t.micro_batch);
      case CopyKind::weights: return weights_landed(t.task, t.group);
      case CopyKind::gradient: return gradient_landed(t.task, t.group);
      case CopyKind::staged_gradient: return gradient_staged(t.task, t.group);
      case CopyKind::spill_output: return spill_.output_landed(live(t.task), t, WorkerActor{this});
    }
  }

  /// The live task with id `id` (current, prefetching or draining its gradients), or null.
  Task* live(uint64_t id) {
    if (task_ && task_->id == id) return task_.get();
    if (next_ && next_->id == id) return next_.get();
    if (after_ && after_->id == id) return after_.get();
    auto it = draining_.find(id);
    return it == draining_.end() ? nullptr : it->second.get();
  }

  void start_next() {
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
        fail(e.what());
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
  void begin_current() {
    try {
      if (!task_->work_ready) allocate_work(ctx_, *task_);  // else allocated ahead (prefetch_behind)
    } catch (const DeviceOutOfMemory& e) {
      task_->dgrad.clear();
      task_->scratch.reset();
      task_->dfp8.clear();
      for (auto& b : task_->tmp) b.reset();
      if (wait_for_memory()) return;
      fail(e.what());
      return;
    } catch (const std::exception& e) {
      fail(e.what());
      return;
    }
    task_->work_ready = true;
    pump();
  }

  bool wait_for_memory() {
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
  void early_start() {
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
  void maybe_prefetch() {
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
  void prefetch_behind() {
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
  std::unique_ptr<Task> prepare(RunStage rs, int windows = 1) {
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

  /// The activation spill wrote an output (it counts as downloaded now, and its buffer takes a
  /// waiting one) or read an input of a task (which may upload it now).
  void spill_done(const SpillDone& d) {
    if (ctx_.progress) ctx_.progress->tick();
    if (!d.error.empty()) return fail(d.error);
    if (!d.write) {
      if (spill_.read_done(failed_ ? nullptr : live(d.task), d)) pump();
      return;
    }
    output_landed(d.task, d.micro_batch);
    issue_spill_downloads();
  }

  void issue_spill_downloads() {
    spill_.issue([this](uint64_t id) { return live(id); },
                 [this](void* dst, const void* src, size_t bytes, const CopyTag& tag) {
                   copy(act_down_, CopyDir::d2h, dst, src, bytes, kPrioActivation, tag.micro_batch, tag);
                 });
  }

  /// The disk tier read frozen group f.group of task f.task: upload it from the read buffer
  /// (held by the task until its last chunk landed). A task gone by now, or a failed worker,
  /// gives the buffer back at once; a failed read fails the run with the reader's line.
  void frozen_fetched(const FrozenFetched& f) {
    if (ctx_.progress) ctx_.progress->tick();
    if (!f.error.empty()) return fail("reading frozen weights from the disk tier: " + f.error);
    FrozenLease lease(ctx_.frozen_tier, f.ticket);
    Task* tk = live(f.task);
    if (!tk || failed_) return;  // the lease goes here
    tk->frozen_leases.emplace(f.group, std::move(lease));
    send_pieces(*tk, tk->uploads->grant(f.group));
  }

  /// Uploads chunks of t's weights; a group is released (and counted in) after its last one.
  /// A chunk of a frozen group's storage goes to the weights up to its direct prefix and to
  /// the staging buffer after it; one that spans both is two copies (Task::extra_copies).
  void send_pieces(Task& t, const std::vector<UploadWindows::Piece>& pieces) {
    for (const auto& p : pieces)
      for (const HostCopy& c : weight_copies(ctx_, t, p))
        copy(param_up_, CopyDir::h2d, c.dst, c.src, c.bytes, kPrioParam, param_order_++,
             CopyTag{CopyKind::weights, t.id, -1, p.group});
  }

  /// A chunk of group g's weights landed; the group is released (and counted in) after its last.
  void weights_landed(uint64_t id, int g) {
    Task* tk = live(id);
    if (!tk) return;
    if (auto it = tk->extra_copies.find(g); it != tk->extra_copies.end() && it->second > 0) {
      it->second--;  // one of a chunk's two copies
      return;
    }
    if (!tk->uploads->piece_done(g)) return;
    tk->frozen_leases.erase(g);  // every chunk is on the device: the read buffer goes back
    if (tk->dstage.count(g)) {
      launch_dequantize(ctx_, *tk, g, WorkerActor{this});
    } else if (!ctx_.layout->groups[g].frozen) {
      trace_sent(ctx_.tracer, me_, "", "ReleaseWeights", {{"group", g}, {"step", tk->rs.step}});
      send(ctx_.shard_of_group[g], ReleaseWeights{g, tk->rs.step});
    }
    tk->params_pending--;
    pump();
  }

  /// The compute stream finished the oldest dequantization of task c.task: free its staging.
  void dequantized(const ComputeDone& c) {
    if (!c.error.empty()) return fail("dequantizing frozen weights: " + c.error);
    Task* tk = live(c.task);
    if (!tk || tk->dequant_order.empty()) return;  // a task already gone freed everything
    tk->dstage.erase(tk->dequant_order.front());
    tk->dequant_order.pop_front();
    pump();
  }

  /// A micro-batch of t has its inputs on the device. For the current task that opens the
  /// next window of the prefetching task's weights (early-started uploads of the next task
  /// open none).
  void mark_uploaded(Task& t) {
    if (&t == task_.get() && next_) send_pieces(*next_, next_->uploads->open_next());
  }

  /// One input copy of micro-batch m of task `id` landed.
  void input_landed(uint64_t id, int64_t m) {
    Task* tk = live(id);
    if (!tk || !tk->progress.upload_copy_done(m)) return;
    tk->spill_reads.release(m);  // every input of m is on the device
    mark_uploaded(*tk);
    pump();
  }

  bool input_ready(const Task& t, int64_t m) const {
    return (t.rs.stage_index == 0 || ready_.count(Key{t.rs.pass, t.rs.stage_index, m})) &&
           t.spill_reads.ready(m);
  }

  /// Whether next_upload() of t may be issued now (the task's StageProgress decides).
  bool may_upload(const Task& t) const {
    const int64_t m = t.progress.next_upload();
    return t.progress.upload_wait(m < t.M && input_ready(t, m)) == StageProgress::Wait::none;
  }

  void pump() {
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

  /// Issues the input copies of t's next micro-batch (the copies are counted by t.progress).
  void issue_uploads(Task& t) {
    const int64_t m = t.progress.next_upload();
    const std::vector<HostCopy> copies = input_copies(t, m, spill_);
    t.progress.upload_issued(int(copies.size()));
    for (const HostCopy& c : copies)
      copy(act_up_, CopyDir::h2d, c.dst, c.src, c.bytes, kPrioActivation, m,
           CopyTag{CopyKind::input, t.id, m, -1});
    if (copies.empty()) mark_uploaded(t);
  }

  void on_computed(int64_t m) {
    Task& t = *task_;
    int spilled = 0;  // outputs going to the activation spill: each counts as a download, done once written
    const std::vector<HostCopy> copies = output_copies(t, m, spill_, spilled);
    t.progress.computed(m, int(copies.size()) + spilled);
    for (const HostCopy& c : copies)
      copy(act_down_, CopyDir::d2h, c.dst, c.src, c.bytes, kPrioActivation, m,
           CopyTag{CopyKind::output, t.id, m, -1});
    if (spilled > 0) issue_spill_downloads();
    if (copies.empty() && spilled == 0) on_downloaded(t, m);
    pump();
  }

  /// One output copy of micro-batch m of task `id` (current, or retired and draining) landed.
  void output_landed(uint64_t id, int64_t m) {
    Task* tk = live(id);
    if (tk && tk->progress.download_copy_done(m)) on_downloaded(*tk, m);
  }

  /// Micro-batch m's outputs are on the host: the next stage may read them. A retired task
  /// (computed, already replaced by the next one) gives its slot back once the slot's last
  /// micro-batch is down, and finishes with its last output and gradient.
  void on_downloaded(Task& t, int64_t m) {
    if (t.rs.next) {
      trace_sent(ctx_.tracer, me_, "", "ActReady",
                 {{"pass", t.rs.pass}, {"stage", t.rs.stage_index + 1}, {"mb", m}});
      send(t.rs.next, ActReady{t.rs.pass, t.rs.stage_index + 1, m});
    }
    if (&t != task_.get()) {
      const int j = t.progress.slot_of(m);
      if (t.progress.last_in_slot(j) == m) {
        t.slot[j] = Slot{};
        t.progress.drop_slot(j);
        retry_memory_wait();
      }
      finish(t.id);  // a no-op while outputs or gradients are still in flight
    }
    pump();
  }

  /// Once every micro-batch is computed the task retires: the next task starts at once
  /// while the last outputs download (their slots are given back as they land) and the
  /// gradients drain to the host (rule 3 through the shards); the task reports StageDone
  /// when its last output and gradient are written.
  void maybe_finish() {
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
    t.grads_pending = int(t.grad_groups.size());
    draining_[id] = std::move(task_);
    Task& d = *draining_[id];
    const int64_t step = d.rs.step;
    for (int g : d.grad_groups) {
      trace_sent(ctx_.tracer, me_, "", "AcquireGradSlot", {{"group", g}, {"step", step}});
      request(ctx_.shard_of_group[g], caf::infinite, AcquireGradSlot{g, step})
          .then(
              [this, g, id, step](GradGrant& gr) {
                trace_received(ctx_.tracer, me_, "", "GradGrant", {{"group", g}, {"step", step}});
                write_grad(id, g, gr.overwrite);
              },
              [this](caf::error& e) { fail("gradient slot request failed: " + error_text(e)); });
    }
    finish(id);
    start_next();
  }

  void write_grad(uint64_t id, int g, bool overwrite) {
    Task* tp = live(id);
    if (!tp) return;
    Task& t = *tp;
    auto& buf = t.dgrad.at(g);
    float* slot = ctx_.store->grad[g].as<float>();
    const CopyTag what{CopyKind::gradient, id, -1, g};
    if (overwrite) {
      copy(grad_down_, CopyDir::d2h, slot, buf.get(), buf.bytes(), kPrioGrad, g, what);
    } else {  // a later contribution of the same step (tied embeddings): stage, then add
      copy(grad_down_, CopyDir::d2h, staging_.buffer(g, buf.bytes()), buf.get(), buf.bytes(), kPrioGrad, g,
           CopyTag{CopyKind::staged_gradient, id, -1, g});
    }
  }

  /// A later contribution to group g's gradient landed in the staging buffer: the device buffer
  /// goes back at once (a start waiting for memory may go on), and the host job thread adds the
  /// contribution into the slot, then reports the gradient written (CopyKind::gradient). The
  /// shard grants the group's next writer only after that report, so the staging buffer is
  /// not overwritten while the addition reads it.
  void gradient_staged(uint64_t id, int g) {
    Task* tk = live(id);
    if (!tk) return;
    tk->dgrad.erase(g);
    retry_memory_wait();
    const CopyTag done{CopyKind::gradient, id, -1, g};
    outstanding_[done]++;
    staging_.add_into(g, ctx_.store->grad[g].as<float>(), ctx_.store->numel[g],
                      [me = WorkerActor{this}, done](std::string err) {
                        caf::anon_send(me, CopyDone{done, std::move(err)});
                      });
  }

  /// Group g's gradient of task `id` is in the host slot.
  void gradient_landed(uint64_t id, int g) {
    Task* tk = live(id);
    if (!tk) return;
    trace_sent(ctx_.tracer, me_, "", "GradWritten", {{"group", g}, {"step", tk->rs.step}});
    send(ctx_.shard_of_group[g], GradWritten{g, tk->rs.step});
    tk->dgrad.erase(g);
    --tk->grads_pending;
    finish(id);
  }

  /// Reports a retired task done once its outputs and gradients are all on the host.
  void finish(uint64_t id) {
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
  void retry_memory_wait() {
    if (!alloc_wait_ || failed_) return;
    alloc_wait_ = false;
    if (!task_) start_next();
    else if (!task_->work_ready)  // never a task already running: that would zero its gradients
      begin_current();
  }

  /// One line for the watchdog (actors/worker_status.hpp).
  std::string status() const {
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

  WorkerContext ctx_;
  const std::string me_ = fmt::format("worker{}", ctx_.index);  ///< this actor in traced messages
  TransferActor act_up_, act_down_, param_up_, grad_down_;
  std::shared_ptr<CopyGate> gate_;
  SpillPort spill_;  ///< the activation spill's side of this worker (inert without ctx_.spill)
  std::deque<RunStage> queue_;
  std::unique_ptr<Task> task_;                          ///< computing now
  std::unique_ptr<Task> next_;                          ///< prefetching its weights
  std::unique_ptr<Task> after_;                         ///< prefetching behind a weightless next_
  std::map<uint64_t, std::unique_ptr<Task>> draining_;  ///< writing back gradients
  uint64_t next_task_id_ = 1;
  /// later gradient contributions of a step (tied embeddings) and their additions on the host
  GradientStaging staging_{ctx_.device};
  std::set<Key> ready_;
  std::map<CopyTag, int> outstanding_;  ///< copies issued and not completed, by tag
  int64_t param_order_ = 0;             ///< parameter chunks leave in the order they are sent
  bool failed_ = false;
  bool alloc_wait_ = false;  ///< the next start waits for a draining task to free memory
};

}  // namespace

WorkerActor spawn_worker(caf::actor_system& sys, WorkerContext ctx) {
  return sys.spawn<Worker>(std::move(ctx));
}

}  // namespace rp
