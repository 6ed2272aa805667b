#include "actors/optimizer_shard.hpp"
#include "actors/message_trace.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "actors/shard_rules.hpp"
#include "optimizer/clip.hpp"
#include "optimizer/thread_pool.hpp"

namespace rp {
namespace {

/// Runs a detached shard's long jobs (AdamW updates, deferred casts, sums of squares: tens to
/// hundreds of milliseconds for a large group) on a thread of its own, one at a time in
/// submission order, and sends JobDone to the shard after each, also when the job threw.
/// Meanwhile the shard answers requests for its other groups.
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
  void submit(int group, std::function<double()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.emplace_back(group, std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::pair<int, std::function<double()>> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      JobDone d{job.first, 0.0, {}};
      try {
        d.sumsq = job.second();
      } catch (const std::exception& e) {
        d.error = e.what();
      } catch (...) {
        d.error = "unknown exception";
      }
      if (auto a = caf::actor_cast<ShardActor>(shard_)) caf::anon_send(a, std::move(d));
    }
  }

  caf::actor_addr shard_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::function<double()>>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: started after the members it reads
};

struct ShardState {
  std::optional<ShardRules> rules;
  std::map<int, ShardGroup> groups;
  std::map<uint64_t, caf::typed_response_promise<WeightsGranted>> weight_requests;  ///< by ticket
  std::map<uint64_t, caf::typed_response_promise<GradGrant>> grad_requests;         ///< by ticket
  uint64_t next_ticket = 1;
  std::shared_ptr<ThreadPool> pool;   ///< the shard's optimizer threads (persistent)
  std::unique_ptr<JobRunner> runner;  ///< detached shards: long jobs off the actor's thread
  std::map<int, std::chrono::steady_clock::time_point> job_start;  ///< per busy group (status)
  /// Per group, its last update (weight prediction only; entries made at spawn, so the job
  /// threads never see the map change).
  std::map<int, LastUpdate> last_update;
  static inline const char* name = "optimizer_shard";
};

using ShardPointer = ShardActor::stateful_pointer<ShardState>;

/// The work of job `j` (runs on the job thread, or inline); returns a sum of squares' result.
std::function<double()> job_work(ShardPointer self, const ShardJob& j, ParamStore* store,
                                 const ShardOptions& opt) {
  const ShardGroup& sg = self->state.groups.at(j.group);
  std::vector<float>* master = sg.master;
  AdamWState* adam_state = sg.state;
  const int64_t n = int64_t(master->size());
  const float* grad = store->grad[size_t(j.group)].as<float>();
  void* lowp = store->lowp[size_t(j.group)].data();
  auto pool = self->state.pool;
  switch (j.kind) {
    case ShardJob::Kind::cast:  // deferred publish: vectorised RNE cast, the same bits as the fused copy
      if (self->state.last_update.count(j.group)) {
        const LastUpdate* lu = &self->state.last_update.at(j.group);
        return [=, version = j.step] {
          write_predicted_copy(master->data(), *lu, version, lowp, n, store->dtype, pool.get());
          return 0.0;
        };
      }
      return [=] {
        write_lowp_copy(master->data(), lowp, n, store->dtype, pool.get());
        return 0.0;
      };
    case ShardJob::Kind::sumsq: return [=] { return sum_of_squares(grad, n, *pool); };
    case ShardJob::Kind::update: break;
    case ShardJob::Kind::reduce: throw std::logic_error("a replica sum is not a job of the shard's threads");
  }
  // tensors under 32K elements run on one thread, larger ones split over the pool
  const bool inject = opt.faults.fire_update(j.group, j.step);
  LastUpdate* last = nullptr;
  if (auto it = self->state.last_update.find(j.group); it != self->state.last_update.end())
    last = &it->second;
  // unguarded steps: the gradient's sum of squares for the reported norm, read before the
  // update (which only reads the gradient too); guarded steps had a sumsq job for it
  const bool measure = !opt.guard;
  return [=, adam = opt.adam] {
    if (inject) throw std::runtime_error(FaultInjection::what("the AdamW kernel"));
    const double sumsq = measure ? sum_of_squares(grad, n, *pool) : 0.0;
    if (last) begin_update(master->data(), *last, n, pool.get());
    // with prediction the published copy is written below, from the new weights and their update
    adamw_update(master->data(), *adam_state, grad, n, j.grad_scale, adam, j.lr,
                 j.publish && !last ? lowp : nullptr, store->dtype, *pool);
    if (last) {
      end_update(master->data(), *last, n, j.step, pool.get());
      if (j.publish) write_predicted_copy(master->data(), *last, j.step, lowp, n, store->dtype, pool.get());
    }
    return sumsq;
  };
}

}  // namespace

ShardActor::behavior_type shard_impl(ShardPointer self, std::vector<ShardGroup> groups, ParamStore* store,
                                     ShardOptions opt, SchedulerActor scheduler) {
  std::vector<ShardRules::Group> rg;
  for (auto& g : groups) {
    self->state.groups[g.group] = g;
    if (opt.predict_weights && opt.staleness == 1) self->state.last_update[g.group];
    rg.push_back({g.group, g.uploads_per_pass, g.grads_per_pass});
  }
  const bool replicated = opt.replicas && opt.replicas->size() > 1;
  self->state.rules.emplace(rg, opt.staleness, opt.guard, opt.disable_rule, replicated);
  self->state.pool =
      std::make_shared<ThreadPool>(ThreadPool::Options{std::max(1, opt.threads), opt.cpus, 50, "rp-shard"});
  // A detached shard runs its long jobs on a JobRunner; one under the deterministic test
  // coordinator runs them inline (a job finishing on another thread would race the tests).
  if (opt.detached) self->state.runner = std::make_unique<JobRunner>(self->address());
  const std::string name = fmt::format("optimizer shard {}", opt.index);
  const std::string me = fmt::format("shard{}", opt.index);  // this actor in traced messages

  // Any exception (a job that failed, a message about a group it does not own): tell the
  // scheduler, then end with the error.
  self->set_exception_handler([self, scheduler, name](std::exception_ptr& x) -> caf::error {
    std::string what = exception_text(x);
    if (what.rfind(name, 0) != 0) what = name + ": " + what;
    self->send(scheduler, Failure{what});
    return failure_reason(what);
  });

  // Carries out the rules' actions in order; an inline job reports back at once.
  auto execute = std::make_shared<std::function<void(std::vector<ShardAction>&)>>();
  *execute = [self, store, opt, scheduler, me,
              execute_weak = std::weak_ptr(execute)](std::vector<ShardAction>& acts) {
    auto& st = self->state;
    for (const ShardAction& a : acts) {
      switch (a.kind) {
        case ShardAction::Kind::grant_weights: {
          auto it = st.weight_requests.find(a.ticket);
          trace_sent(opt.tracer, me, "", "WeightsGranted", {{"group", a.group}, {"step", a.step}});
          it->second.deliver(WeightsGranted{a.group, a.step});
          st.weight_requests.erase(it);
          break;
        }
        case ShardAction::Kind::grant_grad_slot: {
          auto it = st.grad_requests.find(a.ticket);
          trace_sent(opt.tracer, me, "", "GradGrant", {{"group", a.group}, {"step", a.step}});
          it->second.deliver(GradGrant{a.group, a.step, a.overwrite});
          st.grad_requests.erase(it);
          break;
        }
        case ShardAction::Kind::report_sumsq:
          trace_sent(opt.tracer, me, "scheduler", "GradSumSq", {{"step", a.step}, {"group", a.group}});
          self->send(scheduler, GradSumSq{a.step, a.group, a.sumsq});
          break;
        case ShardAction::Kind::group_updated:
          trace_sent(opt.tracer, me, "scheduler", "GroupUpdated", {{"step", a.step}, {"group", a.group}});
          self->send(scheduler, GroupUpdated{a.step, a.group, a.sumsq});
          break;
        case ShardAction::Kind::run_job: {
          if (a.job.kind == ShardJob::Kind::reduce) {
            // the communication thread sums it and reports back like a job thread
            st.job_start[a.group] = std::chrono::steady_clock::now();
            if (opt.reduce_wait) {
              opt.reduce_wait->started(a.group, a.step, st.job_start[a.group]);
              // a request already waiting for this group now waits for the sum
              if (st.rules->has_waiters(a.group))
                opt.reduce_wait->blocked(a.group, a.step, st.job_start[a.group]);
            }
            std::vector<float>* master = st.groups.at(a.group).master;
            if (opt.sums_in_flight) ++*opt.sums_in_flight;
            opt.replicas->sum_async(
                a.group, store->grad[size_t(a.group)].as<float>(), int64_t(master->size()),
                fmt::format("the gradient of group {} of step {}", a.group, a.step),
                [addr = self->address(), g = a.group, n = opt.sums_in_flight](const std::string& err) {
                  if (n) --*n;
                  if (auto s = caf::actor_cast<ShardActor>(addr)) caf::anon_send(s, JobDone{g, 0.0, err});
                });
            break;
          }
          auto work = job_work(self, a.job, store, opt);
          if (st.runner) {
            st.job_start[a.group] = std::chrono::steady_clock::now();
            st.runner->submit(a.group, std::move(work));
          } else {
            const double r = work();
            if (opt.progress) opt.progress->tick();
            std::vector<ShardAction> more;
            st.rules->job_done(a.group, r, more);
            (*execute_weak.lock())(more);
          }
          break;
        }
      }
    }
  };
  auto drive = [self, execute](int g) {
    std::vector<ShardAction> acts;
    self->state.rules->pump(g, acts);
    (*execute)(acts);
  };
  // A request of group g that was not granted at once while g's sum runs waits for that sum.
  auto note_if_waiting_for_sum = [self, opt](int g, bool waiting) {
    if (!opt.reduce_wait || !waiting) return;
    const ShardJob* j = self->state.rules->running_job(g);
    if (j && j->kind == ShardJob::Kind::reduce)
      opt.reduce_wait->blocked(g, j->step, std::chrono::steady_clock::now());
  };
  auto drive_all = [self, drive] {
    for (int g : self->state.rules->groups()) drive(g);
  };

  return {
      [=](JobDone& d) {
        auto& st = self->state;
        if (opt.progress) opt.progress->tick();
        st.job_start.erase(d.group);
        if (const ShardJob* j = st.rules->running_job(d.group);
            opt.reduce_wait && j && j->kind == ShardJob::Kind::reduce)
          opt.reduce_wait->done(d.group, j->step, std::chrono::steady_clock::now());
        if (!d.error.empty()) {
          const ShardJob* j = st.rules->running_job(d.group);
          throw std::runtime_error(fmt::format("{}: {} of group {} failed: {}", name,
                                               j ? describe(*j) : std::string("a job"), d.group, d.error));
        }
        std::vector<ShardAction> acts;
        st.rules->job_done(d.group, d.sumsq, acts);
        (*execute)(acts);
      },
      [=](AcquireWeights& a) -> caf::result<WeightsGranted> {
        trace_received(opt.tracer, me, "", "AcquireWeights", {{"group", a.group}, {"step", a.step}});
        auto rp = self->make_response_promise<WeightsGranted>();
        const uint64_t ticket = self->state.next_ticket++;
        self->state.rules->request_weights(a.group, a.step, ticket);
        self->state.weight_requests.emplace(ticket, rp);
        drive(a.group);
        note_if_waiting_for_sum(a.group, self->state.weight_requests.count(ticket) > 0);
        return rp;
      },
      [=](ReleaseWeights& r) {
        trace_received(opt.tracer, me, "", "ReleaseWeights", {{"group", r.group}, {"step", r.step}});
        self->state.rules->weights_released(r.group, r.step);
        drive(r.group);
      },
      [=](AcquireGradSlot& a) -> caf::result<GradGrant> {
        trace_received(opt.tracer, me, "", "AcquireGradSlot", {{"group", a.group}, {"step", a.step}});
        auto rp = self->make_response_promise<GradGrant>();
        const uint64_t ticket = self->state.next_ticket++;
        self->state.rules->request_grad_slot(a.group, a.step, ticket);
        self->state.grad_requests.emplace(ticket, rp);
        drive(a.group);
        note_if_waiting_for_sum(a.group, self->state.grad_requests.count(ticket) > 0);
        return rp;
      },
      [=](GradWritten& w) {
        trace_received(opt.tracer, me, "", "GradWritten", {{"group", w.group}, {"step", w.step}});
        self->state.rules->grad_written(w.group, w.step);
        drive(w.group);
      },
      [=](CloseStep& c) {
        trace_received(opt.tracer, me, "scheduler", "CloseStep", {{"step", c.step}, {"shard", opt.index}});
        self->state.rules->close_step(c.step, ClosedStep{c.passes, c.grad_scale, c.lr, c.uploads, c.grads});
        drive_all();
      },
      [=](StepScale& sc) {
        trace_received(opt.tracer, me, "scheduler", "StepScale", {{"step", sc.step}, {"shard", opt.index}});
        // Every group of the step was waiting for this scalar; the order they now update in
        // decides which deadline is met first (docs/architecture.md, "Guarded steps"):
        //  - async: the next iteration writes its gradients in backward order, and rule 3 makes
        //    each write wait for this update, so update in the order the gradients completed
        //    (what rule 4 does without clipping); the next uploads of these weights are an
        //    iteration later;
        //  - sync: the next iteration's forward needs the weights first: ascending groups.
        for (int g : self->state.rules->scale_arrived(sc.step, sc.skip, sc.grad_scale)) drive(g);
        self->state.rules->forget_scales(sc.step);
      },
      [=](ResumeAt& r) -> caf::result<Ack> {
        // a resumed run: version r.step-1 is in the fp32 master, version r.step-1-s in the
        // low-precision copy (loaded by the Session), every upload before r.step done
        if (!self->state.rules->resume_at(r.step)) return caf::make_error(caf::sec::invalid_argument);
        return Ack{};
      },
      [=](GetStatus) -> caf::result<StatusReport> {
        auto& st = self->state;
        std::string text = name + ": " + st.rules->describe();
        const auto now = std::chrono::steady_clock::now();
        for (auto& [g, t0] : st.job_start)
          text += fmt::format(" (group {}'s job running for {:.1f} s)", g,
                              std::chrono::duration<double>(now - t0).count());
        return StatusReport{text};
      },
      [=](Shutdown) { self->quit(); },
  };
}

ShardActor spawn_optimizer_shard(caf::actor_system& sys, std::vector<ShardGroup> groups, ParamStore* store,
                                 ShardOptions opt, SchedulerActor scheduler) {
  if (!opt.detached) return sys.spawn(shard_impl, std::move(groups), store, opt, std::move(scheduler));
  return sys.spawn<caf::detached>(shard_impl, std::move(groups), store, opt, std::move(scheduler));
}

}  // namespace rp
