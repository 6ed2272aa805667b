#include "actors/worker.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "actors/layer_timer.hpp"
#include "actors/messages.hpp"
#include "trace/tracer.hpp"
#include "actors/transfer.hpp"
#include "actors/stage_task.hpp"
#include "scheduler/upload_windows.hpp"
#include "kernels/ops.hpp"

namespace rp {
namespace {
struct ComputeDone {
  uint64_t task;
  int64_t micro_batch;
  std::string error;
};
}  // namespace
}  // namespace rp
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::ComputeDone)

namespace rp {
namespace {

constexpr int kPrioActivation = 0;  // critical path: first
constexpr int kPrioParam = 1;
constexpr int kPrioGrad = 1;

class Worker : public caf::event_based_actor {
 public:
  Worker(caf::actor_config& cfg, WorkerContext ctx) : caf::event_based_actor(cfg), ctx_(std::move(ctx)) {
    WorkerTransfers w = spawn_worker_transfers(system(), *ctx_.device, ctx_.index, ctx_.transfer, ctx_.tracer);
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
    if (ctx_.device)
      for (int k = 0; k < kNumStreams; ++k) ctx_.device->stream(StreamKind(k)).synchronize();
    queue_.clear();
    task_.reset();
    next_.reset();
    after_.reset();
    draining_.clear();
    on_copy_.clear();
    if (ctx_.device)
      for (auto& [g, b] : staging_) ctx_.device->unpin_host(b.data());
    staging_.clear();
    ctx_.shard_of_group.clear();
    ctx_.scheduler = nullptr;
    act_up_ = act_down_ = param_up_ = grad_down_ = nullptr;
  }

  caf::behavior make_behavior() override {
    return {
        [this](RunStage& rs) {
          queue_.push_back(std::move(rs));
          // a start waiting for memory is retried when a drain finishes (finish()), not here
          if (!task_ && !alloc_wait_) start_next();
        },
        [this](ActReady& a) {
          ready_.insert({a.pass, a.stage_index, a.micro_batch});
          pump();
        },
        [this](CopyDone& d) {
          auto it = on_copy_.find(d.token);
          if (it == on_copy_.end()) return;
          auto fn = std::move(it->second);
          on_copy_.erase(it);
          if (!d.error.empty()) return fail(d.error);
          fn();
        },
        [this](ComputeDone& c) {
          if (!task_ || task_->id != c.task) return;
          if (!c.error.empty()) return fail(fmt::format("micro-batch {}: {}", c.micro_batch, c.error));
          on_computed(c.micro_batch);
        },
        [this](Shutdown) {
          for (auto& a : {act_up_, act_down_, param_up_, grad_down_}) send_exit(a, caf::exit_reason::user_shutdown);
          quit();
        },
    };
  }

 private:
  using Key = std::tuple<int64_t, int, int64_t>;

  void fail(const std::string& what) {
    if (failed_) return;
    failed_ = true;
    queue_.clear();
    std::string where = task_ ? fmt::format("worker {} ({} stage {} of pass {}, layers {}-{})", ctx_.index,
                                            stage_kind_name(task_->rs.stage.kind), task_->rs.stage_index,
                                            task_->rs.pass, task_->rs.stage.first, task_->rs.stage.last)
                              : fmt::format("worker {}", ctx_.index);
    send(ctx_.scheduler, Failure{where + ": " + what});
  }

  void copy(const caf::actor& via, CopyDir dir, void* dst, const void* src, size_t bytes, int prio,
            int64_t order, std::function<void()> on_done, std::function<void()> after = {}) {
    uint64_t tok = next_token_++;
    on_copy_[tok] = std::move(on_done);
    send(via, CopyRequest{dir, dst, src, bytes, prio, order, tok, std::move(after),
                          caf::actor_cast<caf::actor>(this)});
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
    if (t.next_up < t.M) return;  // the current task still uploads into its slots
    for (int j = 0; j < 2 && j < n.M; ++j) {
      if (n.slot_ready[j]) continue;
      const int64_t last = last_in_slot(t, j);
      if (last >= 0 && !t.downloaded[last]) continue;
      t.slot[j] = Slot{};
      t.slot_ready[j] = false;
      try {
        allocate_slot(ctx_, n, j);
      } catch (const DeviceOutOfMemory&) {
        n.slot[j] = Slot{};  // no room now: the slot is allocated when the task starts
      }
    }
    while (n.next_up < n.M && n.next_up < 2 && n.slot_ready[n.next_up] && input_ready(n, n.next_up)) {
      issue_uploads(n, n.next_up);
      ++n.next_up;
    }
  }

  /// Prefetch (parameter uploads fill the gaps): once the current task's weights are on the device,
  /// allocate the next task and start its parameter uploads while this one computes.
  /// Skipped (and retried later) when both do not fit in the device's memory cap.
  void maybe_prefetch() {
    if (queue_.empty() || failed_ || !task_ || task_->params_pending > 0) return;
    if (next_) return prefetch_behind();
    try {
      // its chunks go into the windows between the current task's remaining activation uploads
      const int64_t done = std::count(task_->uploaded.begin(), task_->uploaded.end(), 1);
      next_ = prepare(queue_.front(), int(task_->M - done) + 1);
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
        for (auto& b : n.tmp) b.reset();
      }
      if (ctx_.memory_events) ctx_.memory_events->prefetch_refusals++;
    } catch (const std::exception& e) {
      queue_.pop_front();
      fail(e.what());
    }
  }

  /// `windows`: prefetch windows for the weights' chunks (1: upload everything at once).
  std::unique_ptr<Task> prepare(RunStage rs, int windows = 1) {
    auto& d = *ctx_.device;
    const auto& m = *ctx_.layout;
    auto tp = std::make_unique<Task>();
    Task& t = *tp;
    t.id = next_task_id_++;
    t.rs = std::move(rs);
    t.layers = t.rs.stage.layers();
    t.M = t.rs.buffers->micro_batches;
    t.up_pending.assign(t.M, 0);
    t.down_pending.assign(t.M, 0);
    t.uploaded.assign(t.M, 0);
    t.computed.assign(t.M, 0);
    t.downloaded.assign(t.M, 0);
    t.wall_start = std::chrono::steady_clock::now();
    t.t_start = ctx_.tracer ? ctx_.tracer->now() : 0;
    const StageKind kind = t.rs.stage.kind;
    t.groups = m.groups_uploaded(t.layers, kind == StageKind::backward);
    if (kind != StageKind::forward) t.grad_groups = m.groups_of(t.layers);
    const size_t esz = dtype_size(d.compute_dtype());
    for (int g : t.groups) t.dparam.emplace(g, DeviceBuffer(d, size_t(m.groups[g].numel) * esz));
    // Parameters: ask the owning shard (rule 1), then upload (in chunks, window by window),
    // then release.
    std::vector<std::pair<int, size_t>> sizes;
    for (int g : t.groups) sizes.emplace_back(g, t.dparam.at(g).bytes());
    const auto& tc = ctx_.transfer;
    t.uploads = std::make_shared<UploadWindows>(sizes, tc.priorities ? tc.chunk_bytes : 0, tc.priorities ? windows : 1);
    t.params_pending = int(t.groups.size());
    const int64_t step = t.rs.step;
    const uint64_t id = t.id;
    for (int g : t.groups) {
      request(ctx_.shard_of_group[g], caf::infinite, AcquireWeights{g, step})
          .then(
              [this, g, id](WeightsGranted&) {
                if (Task* tk = live(id)) send_pieces(*tk, tk->uploads->grant(g));
              },
              [this](caf::error& e) { fail("weights request failed: " + to_string(e)); });
    }
    return tp;
  }

  /// Uploads chunks of t's weights; a group is released (and counted in) after its last one.
  void send_pieces(Task& t, const std::vector<UploadWindows::Piece>& pieces) {
    const int64_t step = t.rs.step;
    const uint64_t id = t.id;
    for (const auto& p : pieces) {
      const int g = p.group;
      char* dst = t.dparam.at(g).as<char>() + p.chunk.offset;
      const char* src = static_cast<const char*>(ctx_.store->lowp[g].data()) + p.chunk.offset;
      copy(param_up_, CopyDir::h2d, dst, src, p.chunk.bytes, kPrioParam, param_order_++,
           [this, g, step, id, up = t.uploads] {
             if (!up->piece_done(g)) return;
             send(ctx_.shard_of_group[g], ReleaseWeights{g, step});
             Task* tk = live(id);
             if (!tk) return;
             tk->params_pending--;
             pump();
           });
    }
  }

  /// Micro-batch m of t has its inputs on the device. For the current task that opens the
  /// next window of the prefetching task's weights (early-started uploads of the next task
  /// open none).
  void mark_uploaded(Task& t, int64_t m) {
    t.uploaded[m] = 1;
    if (&t == task_.get() && next_) send_pieces(*next_, next_->uploads->open_next());
  }

  bool input_ready(const Task& t, int64_t m) const {
    return t.rs.stage_index == 0 || ready_.count(Key{t.rs.pass, t.rs.stage_index, m});
  }

  void pump() {
    if (!task_ || failed_ || !task_->work_ready) return;
    Task& t = *task_;
    maybe_prefetch();
    // Uploads: one micro-batch ahead, once the slot's previous user has computed.
    while (t.next_up < t.M && (t.next_up < 2 || t.computed[t.next_up - 2]) && input_ready(t, t.next_up)) {
      issue_uploads(t, t.next_up);
      ++t.next_up;
    }
    // Compute: in order, once inputs and parameters are in and the output slot is free.
    while (t.next_comp < t.M && t.uploaded[t.next_comp] && t.params_pending == 0 &&
           (t.next_comp < 2 || t.downloaded[t.next_comp - 2])) {
      launch_compute(t.next_comp);
      ++t.next_comp;
    }
    early_start();
    maybe_finish();
  }

  void issue_uploads(Task& t, int64_t m) {
    auto& pb = *t.rs.buffers;
    Slot& s = t.slot[m % 2];
    const StageKind kind = t.rs.stage.kind;
    const uint64_t id = t.id;
    auto up = [&](void* dst, const void* src, size_t bytes) {
      t.up_pending[m]++;
      copy(act_up_, CopyDir::h2d, dst, src, bytes, kPrioActivation, m, [this, id, m] {
        Task* tk = live(id);
        if (!tk) return;
        if (--tk->up_pending[m] == 0) {
          mark_uploaded(*tk, m);
          pump();
        }
      });
    };
    const size_t idb = pb.ids[m].size();
    if (t.rs.stage.first == 0) up(s.ids.get(), pb.ids[m].data(), idb);
    if (kind == StageKind::forward) {
      if (t.rs.stage.first > 0) up(s.in.get(), pb.x[t.rs.stage.first][m].data(), pb.act_bytes);
    } else if (kind == StageKind::tail) {
      up(s.xs[0].get(), pb.x[t.rs.stage.first][m].data(), pb.act_bytes);
      up(s.targets.get(), pb.targets[m].data(), idb);
    } else {
      up(s.in.get(), pb.dx[t.rs.stage.last + 1][m].data(), pb.act_bytes);
      for (size_t i = 0; i < t.layers.size(); ++i) {
        const int l = t.layers[i];
        if (l > 0) up(s.xs[i].get(), pb.x[l][m].data(), pb.act_bytes);
        if (s.attn_o[i].get()) {  // the forward's attention output and log-sum-exp
          up(s.attn_o[i].get(), pb.activations->attn_o[l][m].data(), s.attn_o[i].bytes());
          up(s.attn_lse[i].get(), pb.activations->attn_lse[l][m].data(), s.attn_lse[i].bytes());
        }
      }
    }
    if (t.up_pending[m] == 0) mark_uploaded(t, m);
  }

  void launch_compute(int64_t m) {
    Task& t = *task_;
    const auto& layers = *ctx_.layers;
    const StageKind kind = t.rs.stage.kind;
    // Build every call's arguments here; the device runs them in stream order.
    LayerCalls fwd, bwd;
    build_layer_calls(ctx_, t, m, fwd, bwd);
    auto& stream = ctx_.device->stream(StreamKind::compute);
    Tracer* tr = ctx_.tracer;
    std::string track = fmt::format("worker{}.compute", ctx_.index);
    std::string label = fmt::format("{}{} L{}-{} mb{} (pass {})",
                                    kind == StageKind::forward ? "F" : kind == StageKind::tail ? "T" : "B",
                                    t.rs.stage_index, t.rs.stage.first, t.rs.stage.last, m, t.rs.pass);
    auto t0 = std::make_shared<double>(0);
    auto timer = ctx_.profile ? std::make_shared<LayerTimer>(stream, kind) : nullptr;
    stream.launch([&layers, fwd = std::move(fwd), bwd = std::move(bwd), tr, t0, timer] {
      if (tr) *t0 = tr->now();
      if (timer) timer->run(layers, fwd, bwd);
      else run_layer_calls(layers, fwd, bwd);
    });
    auto me = caf::actor_cast<caf::actor>(this);
    const uint64_t id = t.id;
    LayerTimings lt{ctx_.index, t.rs.pass, m, {}, {}};
    if (timer && m == 0)
      lt.memory = stage_memory(*ctx_.layout, layers, t.rs.stage, t.rs.buffers->shape, ctx_.device->compute_dtype(),
                               ctx_.device->ops().grad_dtype());
    stream.then([me, id, m, tr, t0, track, label, timer, lt = std::move(lt), sched = ctx_.scheduler](
                    const std::string& err) mutable {
      if (tr) tr->interval(track, label, *t0, tr->now());
      if (timer && err.empty()) send_layer_timings(sched, std::move(lt), *timer);
      caf::anon_send(me, ComputeDone{id, m, err});
    });
  }

  void on_computed(int64_t m) {
    Task& t = *task_;
    t.computed[m] = 1;
    auto& pb = *t.rs.buffers;
    Slot& s = t.slot[m % 2];
    const StageKind kind = t.rs.stage.kind;
    const uint64_t id = t.id;
    auto down = [&](void* dst, const void* src, size_t bytes) {
      t.down_pending[m]++;
      copy(act_down_, CopyDir::d2h, dst, src, bytes, kPrioActivation, m, [this, id, m] {
        Task* tk = live(id);  // current, or retired (computed, draining) since
        if (!tk) return;
        if (--tk->down_pending[m] == 0) on_downloaded(*tk, m);
      });
    };
    if (kind == StageKind::forward) {
      const int k = int(t.layers.size());
      for (int i = 0; i < k; ++i) {
        const int l = t.layers[i];
        down(pb.x[l + 1][m].data(), s.xs[i].get(), pb.act_bytes);
        if (s.attn_o[i].get()) {  // kept for the backward stage, which then skips the attention
          down(pb.activations->attn_o[l][m].data(), s.attn_o[i].get(), s.attn_o[i].bytes());
          down(pb.activations->attn_lse[l][m].data(), s.attn_lse[i].get(), s.attn_lse[i].bytes());
        }
      }
    } else {
      if (t.rs.stage.first > 0) down(pb.dx[t.rs.stage.first][m].data(), s.out.get(), pb.act_bytes);
      if (kind == StageKind::tail) down(&pb.loss[2 * m], s.loss.get(), 2 * sizeof(float));
    }
    if (t.down_pending[m] == 0) on_downloaded(t, m);
    pump();
  }

  /// Micro-batch m's outputs are on the host: the next stage may read them. A retired task
  /// (computed, already replaced by the next one) gives its slot back once the slot's last
  /// micro-batch is down, and finishes with its last output and gradient.
  void on_downloaded(Task& t, int64_t m) {
    t.downloaded[m] = 1;
    t.n_downloaded++;
    if (t.rs.next) send(t.rs.next, ActReady{t.rs.pass, t.rs.stage_index + 1, m});
    if (&t != task_.get()) {
      const int j = int(m % 2);
      if (last_in_slot(t, j) == m) {
        t.slot[j] = Slot{};
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
    if (!std::all_of(t.computed.begin(), t.computed.end(), [](char c) { return c != 0; })) return;
    for (int64_t m = 0; m < t.M; ++m) ready_.erase(Key{t.rs.pass, t.rs.stage_index, m});
    // Only the gradient accumulators and undelivered outputs are still needed: give the
    // rest back now.
    t.dparam.clear();
    t.scratch.reset();
    for (auto& b : t.tmp) b.reset();
    for (int j = 0; j < 2; ++j) {
      const int64_t last = last_in_slot(t, j);
      if (last < 0 || t.downloaded[last]) t.slot[j] = Slot{};
    }
    const uint64_t id = t.id;
    t.grads_pending = int(t.grad_groups.size());
    draining_[id] = std::move(task_);
    Task& d = *draining_[id];
    const int64_t step = d.rs.step;
    for (int g : d.grad_groups) {
      request(ctx_.shard_of_group[g], caf::infinite, AcquireGradSlot{g, step})
          .then([this, g, id](GradGrant& gr) { write_grad(id, g, gr.overwrite); },
                [this](caf::error& e) { fail("gradient slot request failed: " + to_string(e)); });
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
    const int64_t n = ctx_.store->numel[g];
    const int64_t step = t.rs.step;
    auto done = [this, g, step, id] {
      send(ctx_.shard_of_group[g], GradWritten{g, step});
      Task* tk = live(id);
      if (!tk) return;
      tk->dgrad.erase(g);
      --tk->grads_pending;
      finish(id);
    };
    if (overwrite) {
      copy(grad_down_, CopyDir::d2h, slot, buf.get(), buf.bytes(), kPrioGrad, g, done);
    } else {  // a later contribution of the same step (tied embeddings): accumulate
      auto [it, fresh] = staging_.try_emplace(g, buf.bytes());
      if (fresh) ctx_.device->pin_host(it->second.data(), it->second.size());
      float* sp = it->second.as<float>();
      copy(grad_down_, CopyDir::d2h, sp, buf.get(), buf.bytes(), kPrioGrad, g, done,
           [slot, sp, n] { parallel_add(slot, sp, n); });
    }
  }

  /// slot[i] += src[i] over a few host threads (the tied embedding's slot is ~1 GiB).
  static void parallel_add(float* slot, const float* src, int64_t n) {
    const int nt = int(std::clamp<int64_t>(n >> 22, 1, std::max(1u, std::thread::hardware_concurrency() / 2)));
    auto work = [=](int i) {
      const int64_t a = n * i / nt, b = n * (i + 1) / nt;
      for (int64_t j = a; j < b; ++j) slot[j] += src[j];
    };
    std::vector<std::thread> ts;
    for (int i = 1; i < nt; ++i) ts.emplace_back(work, i);
    work(0);
    for (auto& th : ts) th.join();
  }

  /// Reports a retired task done once its outputs and gradients are all on the host.
  void finish(uint64_t id) {
    auto it = draining_.find(id);
    if (it == draining_.end()) return;
    Task& t = *it->second;
    if (t.grads_pending > 0 || t.n_downloaded < t.M) return;
    StageDone sd;
    sd.pass = t.rs.pass;
    sd.stage_index = t.rs.stage_index;
    sd.worker = ctx_.index;
    sd.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t.wall_start).count();
    if (t.rs.stage.kind == StageKind::tail)
      for (int64_t m = 0; m < t.M; ++m) {
        sd.loss_sum += t.rs.buffers->loss[2 * m];
        sd.loss_count += t.rs.buffers->loss[2 * m + 1];
      }
    if (ctx_.tracer)
      ctx_.tracer->interval(fmt::format("worker{}.tasks", ctx_.index),
                            fmt::format("{} stage {} (pass {})", stage_kind_name(t.rs.stage.kind),
                                        t.rs.stage_index, t.rs.pass),
                            t.t_start, ctx_.tracer->now());
    draining_.erase(it);  // releases the gradient buffers
    retry_memory_wait();
    send(ctx_.scheduler, sd);
  }

  /// A start refused for memory is retried whenever a retired task gives some back.
  void retry_memory_wait() {
    if (!alloc_wait_ || failed_) return;
    alloc_wait_ = false;
    if (!task_)
      start_next();
    else if (!task_->work_ready)  // never a task already running: that would zero its gradients
      begin_current();
  }

  WorkerContext ctx_;
  caf::actor act_up_, act_down_, param_up_, grad_down_;
  std::shared_ptr<CopyGate> gate_;
  std::deque<RunStage> queue_;
  std::unique_ptr<Task> task_;                        ///< computing now
  std::unique_ptr<Task> next_;                        ///< prefetching its weights
  std::unique_ptr<Task> after_;                       ///< prefetching behind a weightless next_
  std::map<uint64_t, std::unique_ptr<Task>> draining_;  ///< writing back gradients
  uint64_t next_task_id_ = 1;
  /// Pinned host staging per parameter group for accumulated gradient contributions
  /// (tied embeddings); one writer per group at a time (rule 3) makes reuse safe.
  std::map<int, HostBytes> staging_;
  std::set<Key> ready_;
  std::map<uint64_t, std::function<void()>> on_copy_;
  uint64_t next_token_ = 1;
  int64_t param_order_ = 0;  ///< parameter chunks leave in the order they are sent
  bool failed_ = false;
  bool alloc_wait_ = false;  ///< the next start waits for a draining task to free memory
};

}  // namespace

caf::actor spawn_worker(caf::actor_system& sys, WorkerContext ctx) {
  return sys.spawn<Worker>(std::move(ctx));
}

}  // namespace rp
