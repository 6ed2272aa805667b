// The worker's copies (actors/worker_impl.hpp): weights, inputs, outputs and gradients issued
// to its transfer actors (and the activation spill, the disk tier), and what each completion
// does: a weight group released, a micro-batch uploaded, computed or handed to the next stage,
// a gradient written into its host slot. Tagged (CopyTag), so a completion names what it completed.
#include <fmt/format.h>

#include "actors/message_trace.hpp"
#include "actors/stage_copies.hpp"
#include "actors/worker_impl.hpp"

namespace rp {

namespace {

constexpr int kPrioActivation = 0;  // critical path: first
constexpr int kPrioParam = 1;
constexpr int kPrioGrad = 1;

}  // namespace

/// Issues a copy on `via`'s stream; its CopyDone (tagged `what`) comes back to on_copy_done.
void Worker::copy(const TransferActor& via, CopyDir dir, void* dst, const void* src, size_t bytes, int prio,
                  int64_t order, const CopyTag& what) {
  outstanding_[what]++;
  send(via, CopyRequest{dir, dst, src, bytes, prio, order, what, WorkerActor{this}});
}

/// A copy completed: what it completed is in its tag.
void Worker::on_copy_done(const CopyDone& d) {
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

/// The activation spill wrote an output (it counts as downloaded now, and its buffer takes a
/// waiting one) or read an input of a task (which may upload it now).
void Worker::spill_done(const SpillDone& d) {
  if (ctx_.progress) ctx_.progress->tick();
  if (!d.error.empty()) return fail(d.error);
  if (!d.write) {
    if (spill_.read_done(failed_ ? nullptr : live(d.task), d)) pump();
    return;
  }
  output_landed(d.task, d.micro_batch);
  issue_spill_downloads();
}

void Worker::issue_spill_downloads() {
  spill_.issue([this](uint64_t id) { return live(id); },
               [this](void* dst, const void* src, size_t bytes, const CopyTag& tag) {
                 copy(act_down_, CopyDir::d2h, dst, src, bytes, kPrioActivation, tag.micro_batch, tag);
               });
}

/// The disk tier read frozen group f.group of task f.task: upload it from the read buffer
/// (held by the task until its last chunk landed). A task gone by now, or a failed worker,
/// gives the buffer back at once; a failed read fails the run with the reader's line.
void Worker::frozen_fetched(const FrozenFetched& f) {
  if (ctx_.progress) ctx_.progress->tick();
  if (!f.error.empty()) {
    // the read may be a later stage's (the weights of the next tasks are read ahead): name it
    const Task* whose = live(f.task);
    return fail(
        !whose ? "reading frozen weights from the disk tier: " + f.error
        : whose == task_.get()
            ? "reading this stage's frozen weights from the disk tier: " + f.error
            : fmt::format("reading frozen weights from the disk tier while prefetching those of {}: {}",
                          stage_text(*whose), f.error));
  }
  FrozenLease lease(ctx_.frozen_tier, f.ticket);
  Task* tk = live(f.task);
  if (!tk || failed_) return;  // the lease goes here
  tk->frozen_leases.emplace(f.group, std::move(lease));
  send_pieces(*tk, tk->uploads->grant(f.group));
}

/// Uploads chunks of t's weights; a group is released (and counted in) after its last one.
/// A chunk of a frozen group's storage goes to the weights up to its direct prefix and to
/// the staging buffer after it; one that spans both is two copies (Task::extra_copies).
void Worker::send_pieces(Task& t, const std::vector<UploadWindows::Piece>& pieces) {
  for (const auto& p : pieces)
    for (const HostCopy& c : weight_copies(ctx_, t, p))
      copy(param_up_, CopyDir::h2d, c.dst, c.src, c.bytes, kPrioParam, param_order_++,
           CopyTag{CopyKind::weights, t.id, -1, p.group});
}

/// A chunk of group g's weights landed; the group is released (and counted in) after its last.
void Worker::weights_landed(uint64_t id, int g) {
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
void Worker::dequantized(const ComputeDone& c) {
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
void Worker::mark_uploaded(Task& t) {
  if (&t == task_.get() && next_) send_pieces(*next_, next_->uploads->open_next());
}

/// One input copy of micro-batch m of task `id` landed.
void Worker::input_landed(uint64_t id, int64_t m) {
  Task* tk = live(id);
  if (!tk || !tk->progress.upload_copy_done(m)) return;
  tk->spill_reads.release(m);  // every input of m is on the device
  mark_uploaded(*tk);
  pump();
}

bool Worker::input_ready(const Task& t, int64_t m) const {
  return (t.rs.stage_index == 0 || ready_.count(Key{t.rs.pass, t.rs.stage_index, m})) &&
         t.spill_reads.ready(m);
}

/// Whether next_upload() of t may be issued now (the task's StageProgress decides).
bool Worker::may_upload(const Task& t) const {
  const int64_t m = t.progress.next_upload();
  return t.progress.upload_wait(m < t.M && input_ready(t, m)) == StageProgress::Wait::none;
}

/// Issues the input copies of t's next micro-batch (the copies are counted by t.progress).
void Worker::issue_uploads(Task& t) {
  const int64_t m = t.progress.next_upload();
  const std::vector<HostCopy> copies = input_copies(t, m, spill_);
  t.progress.upload_issued(int(copies.size()));
  for (const HostCopy& c : copies)
    copy(act_up_, CopyDir::h2d, c.dst, c.src, c.bytes, kPrioActivation, m,
         CopyTag{CopyKind::input, t.id, m, -1});
  if (copies.empty()) mark_uploaded(t);
}

void Worker::on_computed(int64_t m) {
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
void Worker::output_landed(uint64_t id, int64_t m) {
  Task* tk = live(id);
  if (tk && tk->progress.download_copy_done(m)) on_downloaded(*tk, m);
}

/// Micro-batch m's outputs are on the host: the next stage may read them. A retired task
/// (computed, already replaced by the next one) gives its slot back once the slot's last
/// micro-batch is down, and finishes with its last output and gradient.
void Worker::on_downloaded(Task& t, int64_t m) {
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

void Worker::write_grad(uint64_t id, int g, bool overwrite) {
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
void Worker::gradient_staged(uint64_t id, int g) {
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
void Worker::gradient_landed(uint64_t id, int g) {
  Task* tk = live(id);
  if (!tk) return;
  trace_sent(ctx_.tracer, me_, "", "GradWritten", {{"group", g}, {"step", tk->rs.step}});
  send(ctx_.shard_of_group[g], GradWritten{g, tk->rs.step});
  tk->dgrad.erase(g);
  --tk->grads_pending;
  finish(id);
  retry_memory_wait();  // each group's accumulator given back may be what a waiting start needs
}

}  // namespace rp
