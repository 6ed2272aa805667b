#include "actors/optimizer_shard.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "actors/messages.hpp"
#include "optimizer/clip.hpp"
#include "optimizer/thread_pool.hpp"

namespace rp {
namespace {
/// A job of JobRunner finished (error: the exception text it threw, else empty).
struct JobDone {
  uint64_t token;
  std::string error;
};
}  // namespace
}  // namespace rp
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::JobDone)

namespace rp {
namespace {

/// Runs a detached shard's long jobs (AdamW updates, deferred casts: tens to hundreds of
/// milliseconds for a large group) on a thread of its own, one at a time in submission
/// order, and sends JobDone to the shard after each. Meanwhile the shard answers requests
/// for its other groups: a blocking update used to hold up every weight grant of its shard.
class JobRunner {
 public:
  explicit JobRunner(caf::actor_addr shard) : shard_(std::move(shard)), thread_([this] { loop(); }) {}
  ~JobRunner() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();  // the job in progress finishes; queued ones are dropped
  }
  void submit(uint64_t token, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.emplace_back(token, std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::pair<uint64_t, std::function<void()>> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::string err;
      try {
        job.second();
      } catch (const std::exception& e) {
        err = e.what();
      }
      if (auto a = caf::actor_cast<caf::actor>(shard_)) caf::anon_send(a, JobDone{job.first, std::move(err)});
    }
  }

  caf::actor_addr shard_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::function<void()>>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: started after the members it reads
};

struct GroupState {
  ShardGroup g;
  int64_t published = -1;  ///< version in the low-precision copy
  int64_t updated = -1;    ///< version in the fp32 master (= last step consumed)
  int64_t uploads_complete_through = -1;
  std::map<int64_t, int> uploads_done;  ///< per iteration
  std::map<int64_t, int> grads_done;    ///< per step
  bool writer_active = false;
  bool busy = false;        ///< an update or cast of this group runs on the JobRunner
  int64_t sumsq_sent = -1;  ///< last step whose GradSumSq was sent (guarded steps)
  std::deque<std::pair<int64_t, caf::response_promise>> weight_waiters;
  std::deque<std::pair<int64_t, caf::response_promise>> grad_waiters;
};

struct StepInfo {
  int64_t passes = 0;
  float grad_scale = 1.f;
  double lr = 0;
  std::shared_ptr<const std::vector<int>> uploads, grads;  ///< per group totals (CloseStep), or null
};

/// Uploads (or gradient contributions) of group `g` that step `c` expects in total.
int64_t expected(const StepInfo& c, const std::shared_ptr<const std::vector<int>>& totals, int g, int per_pass) {
  if (totals && size_t(g) < totals->size()) return (*totals)[size_t(g)];
  return c.passes * per_pass;
}

struct ShardState {
  std::map<int, GroupState> groups;
  std::map<int64_t, StepInfo> closed;
  std::map<int64_t, StepScale> scales;  ///< guarded steps: the scheduler's decision
  /// Guarded steps: the groups in the order their step-t gradients completed (GradSumSq sent),
  /// which is the order their updates run in once StepScale{t} arrives (async mode).
  std::map<int64_t, std::vector<int>> completed;
  std::shared_ptr<ThreadPool> pool;     ///< the shard's optimizer threads (persistent)
  std::map<uint64_t, std::function<void()>> on_job_done;  ///< by JobDone token
  uint64_t next_job = 1;
  std::unique_ptr<JobRunner> runner;    ///< detached shards: long jobs off the actor's thread
  std::function<void(GroupState&)> pump;  ///< shard_impl's transition function
  static inline const char* name = "optimizer_shard";
};

}  // namespace

caf::behavior shard_impl(caf::stateful_actor<ShardState>* self, std::vector<ShardGroup> groups,
                         ParamStore* store, ShardOptions opt, caf::actor scheduler) {
  for (auto& g : groups) self->state.groups[g.group].g = g;
  self->state.pool = std::make_shared<ThreadPool>(
      ThreadPool::Options{std::max(1, opt.threads), opt.cpus, 50, "rp-shard"});
  // A detached shard runs its long jobs on a JobRunner; one under the deterministic test
  // coordinator runs them inline (a job finishing on another thread would race the tests).
  if (opt.detached) self->state.runner = std::make_unique<JobRunner>(self->address());
  const int s = opt.staleness;
  const int off = opt.disable_rule;  // testing only: the rule whose guard is switched off
  auto version_for = [s](int64_t t) { return std::max<int64_t>(t - 1 - s, -1); };

  // deferred publish (rule 5): vectorised RNE cast on the pool, the same bits as the fused copy
  auto cast_lowp = [self, store](GroupState& gs) {
    const int64_t n = gs.g.master->size();
    write_lowp_copy(gs.g.master->data(), store->lowp[gs.g.group].data(), n, store->dtype,
                    self->state.pool.get());
  };

  // Runs `work` for group gs, then `done`: inline (returns true), or on the JobRunner
  // (returns false; gs is busy, and JobDone runs `done` and pumps gs again).
  auto run_job = [self](GroupState& gs, std::function<void()> work, std::function<void()> done) {
    auto& st = self->state;
    if (!st.runner) {
      work();
      done();
      return true;
    }
    const uint64_t token = st.next_job++;
    gs.busy = true;
    GroupState* g = &gs;  // std::map nodes do not move
    st.on_job_done[token] = [self, g, done = std::move(done)] {
      g->busy = false;
      done();
      self->state.pump(*g);
    };
    st.runner->submit(token, std::move(work));
    return false;
  };

  // Applies every transition of group `gs` that its state allows (see header).
  self->state.pump = [=](GroupState& gs) {
    if (gs.busy) return;  // its update or cast is running; JobDone pumps it again
    auto& closed = self->state.closed;
    bool progress = true;
    while (progress) {
      progress = false;
      // uploads of iterations complete, in order
      for (;;) {
        int64_t i = gs.uploads_complete_through + 1;
        auto c = closed.find(i);
        if (c == closed.end()) break;
        if (gs.uploads_done[i] < expected(c->second, c->second.uploads, gs.g.group, gs.g.uploads_per_pass)) break;
        gs.uploads_done.erase(i);
        gs.uploads_complete_through = i;
        progress = true;
      }
      // rule 5: publish a waiting version
      if (gs.published < gs.updated && (off == 5 || gs.uploads_complete_through >= gs.updated + s)) {
        const int64_t v = gs.updated;
        GroupState* g = &gs;
        if (!run_job(gs, [g, cast_lowp] { cast_lowp(*g); }, [g, v] { g->published = v; })) return;
        progress = true;
      }
      // rule 4: update when all gradient contributions of the next step are written
      int64_t k = gs.updated + 1;
      auto c = closed.find(k);
      if (c != closed.end() && gs.published == gs.updated &&
          (off == 4 || (!gs.writer_active &&
                        gs.grads_done[k] >= expected(c->second, c->second.grads, gs.g.group, gs.g.grads_per_pass)))) {
        const int64_t n = gs.g.master->size();
        const float* grad = store->grad[gs.g.group].as<float>();
        float scale = c->second.grad_scale;
        bool skip = false, ready = true;
        if (opt.guard) {
          // report this group's partial sum of squares once, then wait for the step's scalar
          if (gs.sumsq_sent < k) {
            // a job like the update: the pool may be busy with another group's update
            GroupState* g = &gs;
            auto sq = std::make_shared<double>(0.0);
            auto work = [sq, grad, n, pp = self->state.pool] { *sq = sum_of_squares(grad, n, *pp); };
            auto sent = [self, g, k, sq, scheduler] {
              self->send(scheduler, GradSumSq{k, g->g.group, *sq});
              g->sumsq_sent = k;
              self->state.completed[k].push_back(g->g.group);  // the order the jobs finish in
            };
            if (!run_job(gs, work, sent)) return;
          }
          auto sc = self->state.scales.find(k);
          if (sc == self->state.scales.end()) {
            ready = false;
          } else {
            skip = sc->second.skip;
            scale = sc->second.grad_scale;
          }
        }
        if (ready) {
          bool may_publish = gs.published == gs.updated && (off == 5 || gs.uploads_complete_through >= k + s);
          GroupState* g = &gs;
          auto done = [self, g, k, scheduler](bool published) {
            if (published) g->published = k;
            g->grads_done.erase(k);
            g->updated = k;
            self->send(scheduler, GroupUpdated{k, g->g.group});
          };
          if (skip) {
            // nothing changes: version k equals version k-1, which the copy already holds
            done(true);
          } else {
            // tensors under 32K elements run on one thread, larger ones split over the pool
            void* lowp = may_publish ? store->lowp[gs.g.group].data() : nullptr;
            const double lr = c->second.lr;
            auto work = [g, grad, n, scale, lr, lowp, store, pp = self->state.pool, adam = opt.adam] {
              adamw_update(g->g.master->data(), *g->g.state, grad, n, scale, adam, lr, lowp, store->dtype, *pp);
            };
            if (!run_job(gs, work, [done, may_publish] { done(may_publish); })) return;
          }
          progress = true;
        }
      }
    }
    // rule 1: grant every upload whose version is published (any arrival order)
    for (auto it = gs.weight_waiters.begin(); it != gs.weight_waiters.end();) {
      if (off == 1 || version_for(it->first) <= gs.published) {
        it->second.deliver(WeightsGranted{gs.g.group, it->first});
        it = gs.weight_waiters.erase(it);
      } else {
        ++it;
      }
    }
    // rule 3: one gradient writer at a time (the host half of rule 2), after the previous
    // step consumed the slot; the earliest step goes first whatever order the requests
    // arrived in. (The loop grants once: granting sets writer_active.)
    while (off == 2 || !gs.writer_active) {
      auto best = gs.grad_waiters.end();
      for (auto it = gs.grad_waiters.begin(); it != gs.grad_waiters.end(); ++it)
        if ((off == 3 || it->first - 1 <= gs.updated) &&
            (best == gs.grad_waiters.end() || it->first < best->first))
          best = it;
      if (best == gs.grad_waiters.end()) break;
      int64_t t = best->first;
      auto rp = best->second;
      gs.grad_waiters.erase(best);
      gs.writer_active = true;
      rp.deliver(GradGrant{gs.g.group, t, gs.grads_done[t] == 0});
    }
  };

  auto pump = [self](GroupState& gs) { self->state.pump(gs); };

  auto group = [self](int g) -> GroupState& {
    auto it = self->state.groups.find(g);
    if (it == self->state.groups.end())
      throw std::logic_error(fmt::format("optimizer shard does not own group {}", g));
    return it->second;
  };

  return {
      [=](JobDone& d) {
        auto& st = self->state;
        auto it = st.on_job_done.find(d.token);
        if (it == st.on_job_done.end()) return;
        auto fn = std::move(it->second);
        st.on_job_done.erase(it);
        if (!d.error.empty()) throw std::runtime_error("optimizer shard: " + d.error);
        fn();
      },
      [=](AcquireWeights& a) {
        auto& gs = group(a.group);
        auto rp = self->make_response_promise();
        gs.weight_waiters.emplace_back(a.step, rp);
        pump(gs);
        return rp;
      },
      [=](ReleaseWeights& r) {
        auto& gs = group(r.group);
        gs.uploads_done[r.step] += 1;
        pump(gs);
      },
      [=](AcquireGradSlot& a) {
        auto& gs = group(a.group);
        auto rp = self->make_response_promise();
        gs.grad_waiters.emplace_back(a.step, rp);
        pump(gs);
        return rp;
      },
      [=](GradWritten& w) {
        auto& gs = group(w.group);
        gs.writer_active = false;
        gs.grads_done[w.step] += 1;
        pump(gs);
      },
      [=](CloseStep& c) {
        self->state.closed[c.step] = StepInfo{c.passes, c.grad_scale, c.lr, c.uploads, c.grads};
        for (auto& [g, gs] : self->state.groups) pump(gs);
      },
      [=](StepScale& sc) {
        // Every group of the step was waiting for this scalar; the order they now update in
        // decides which deadline is met first (docs/architecture.md, "Guarded steps"):
        //  - async: the next iteration writes its gradients in backward order, and rule 3 makes
        //    each write wait for this update, so update in the order the gradients completed
        //    (what rule 4 does without clipping); the next uploads of these weights are an
        //    iteration later;
        //  - sync: the next iteration's forward needs the weights first: ascending groups.
        auto& st = self->state;
        st.scales[sc.step] = sc;
        std::vector<int> order;
        if (s > 0) order = std::move(st.completed[sc.step]);
        st.completed.erase(st.completed.begin(), st.completed.upper_bound(sc.step));
        for (auto& [g, gs] : st.groups)
          if (std::find(order.begin(), order.end(), g) == order.end()) order.push_back(g);
        int64_t oldest = sc.step;
        for (int g : order) {
          auto& gs = st.groups.at(g);
          pump(gs);
          oldest = std::min(oldest, gs.updated + 1);
        }
        st.scales.erase(st.scales.begin(), st.scales.lower_bound(oldest));
      },
      [=](ResumeAt& r) -> caf::result<Ack> {
        // a resumed run: version r.step-1 is in the fp32 master, version r.step-1-s in the
        // low-precision copy (loaded by the Session), every upload before r.step done
        for (auto& [g, gs] : self->state.groups) {
          if (gs.updated != -1 || !gs.uploads_done.empty() || !gs.grads_done.empty() || !gs.weight_waiters.empty() ||
              !gs.grad_waiters.empty())
            return caf::make_error(caf::sec::invalid_argument);
          gs.updated = r.step - 1;
          gs.published = std::max<int64_t>(r.step - 1 - s, -1);
          gs.uploads_complete_through = r.step - 1;
          gs.sumsq_sent = r.step - 1;
        }
        return Ack{};
      },
      [=](Shutdown) { self->quit(); },
  };
}

caf::actor spawn_optimizer_shard(caf::actor_system& sys, std::vector<ShardGroup> groups, ParamStore* store,
                                 ShardOptions opt, caf::actor scheduler) {
  if (!opt.detached) return sys.spawn(shard_impl, std::move(groups), store, opt, std::move(scheduler));
  return sys.spawn<caf::detached>(shard_impl, std::move(groups), store, opt, std::move(scheduler));
}

}  // namespace rp
