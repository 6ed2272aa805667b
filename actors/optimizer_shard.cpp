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
  // fixed at spawn
  ParamStore* store = nullptr;
  ShardOptions opt;
  SchedulerActor scheduler;
  std::string who;  ///< "optimizer shard 2": failures and status lines
  std::string me;   ///< "shard2": this actor in traced messages
  // the protocol
  std::optional<ShardRules> rules;
  std::map<int, ShardGroup> groups;
  std::map<uint64_t, caf::typed_response_promise<WeightsGranted>> weight_requests;  ///< by ticket
  std::map<uint64_t, caf::typed_response_promise<GradGrant>> grad_requests;         ///< by ticket
  uint64_t next_ticket = 1;
  // the jobs
  std::shared_ptr<ThreadPool> pool;   ///< the shard's optimizer threads (persistent)
  std::unique_ptr<JobRunner> runner;  ///< detached shards: long jobs off the actor's thread
  std::map<int, std::chrono::steady_clock::time_point> job_start;  ///< per busy group (status)
  /// Per group, its last update (weight prediction only; entries made at spawn, so the job
  /// threads never see the map change).
  std::map<int, LastUpdate> last_update;
  static inline const char* name = "optimizer_shard";  // the actor's name in CAF
};

using ShardPointer = ShardActor::stateful_pointer<ShardState>;

/// The work of job `j` (runs on the job thread, or inline); returns a sum of squares' result.
std::function<double()> job_work(ShardPointer self, const ShardJob& j) {
  ShardState& st = self->state;
  const ShardGroup& sg = st.groups.at(j.group);
  ParamStore* store = st.store;
  std::vector<float>* master = sg.master;
  AdamWState* adam_state = sg.state;
  const int64_t n = int64_t(master->size());
  const float* grad = store->grad[size_t(j.group)].as<float>();
  void* lowp = store->lowp[size_t(j.group)].data();
  auto pool = st.pool;
  switch (j.kind) {
    case ShardJob::Kind::cast:  // deferred publish: vectorised RNE cast, the same bits as the fused copy
      if (st.last_update.count(j.group)) {
        const LastUpdate* lu = &st.last_update.at(j.group);
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
  const bool inject = st.opt.faults.fire_update(j.group, j.step);
  LastUpdate* last = nullptr;
  if (auto it = st.last_update.find(j.group); it != st.last_update.end()) last = &it->second;
  // unguarded steps: the gradient's sum of squares for the reported norm, read before the
  // update (which only reads the gradient too); guarded steps had a sumsq job for it
  const bool measure = !st.opt.guard;
  return [=, adam = st.opt.adam] {
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

void carry_out(ShardPointer self, std::vector<ShardAction>& acts);

/// g's job finished with `sumsq`: the rules' next actions.
void job_finished(ShardPointer self, int g, double sumsq) {
  std::vector<ShardAction> more;
  self->state.rules->job_done(g, sumsq, more);
  carry_out(self, more);
}

/// A reduce job: the communication thread sums group g's gradient over the replicas and
/// reports back with JobDone, like a job thread.
void start_replica_sum(ShardPointer self, const ShardAction& a) {
  auto& st = self->state;
  const auto now = std::chrono::steady_clock::now();
  st.job_start[a.group] = now;
  if (st.opt.reduce_wait) {
    st.opt.reduce_wait->started(a.group, a.step, now);
    // a request already waiting for this group now waits for the sum
    if (st.rules->has_waiters(a.group)) st.opt.reduce_wait->blocked(a.group, a.step, now);
  }
  const std::vector<float>* master = st.groups.at(a.group).master;
  if (st.opt.sums_in_flight) ++*st.opt.sums_in_flight;
  st.opt.replicas->sum_async(
      a.group, st.store->grad[size_t(a.group)].as<float>(), int64_t(master->size()),
      fmt::format("the gradient of group {} of step {}", a.group, a.step),
      [addr = self->address(), g = a.group, n = st.opt.sums_in_flight](const std::string& err) {
        if (n) --*n;
        if (auto s = caf::actor_cast<ShardActor>(addr)) caf::anon_send(s, JobDone{g, 0.0, err});
      });
}

/// Runs a job: a replica sum on the communication thread, any other on the job thread of a
/// detached shard, or inline (then its result goes to the rules at once).
void run_job(ShardPointer self, const ShardAction& a) {
  auto& st = self->state;
  if (a.job.kind == ShardJob::Kind::reduce) return start_replica_sum(self, a);
  auto work = job_work(self, a.job);
  if (st.runner) {
    st.job_start[a.group] = std::chrono::steady_clock::now();
    st.runner->submit(a.group, std::move(work));
    return;
  }
  const double r = work();
  if (st.opt.progress) st.opt.progress->tick();
  job_finished(self, a.group, r);
}

/// Answers the request `ticket` waiting in `requests` with `grant`.
template <class Grant>
void deliver(std::map<uint64_t, caf::typed_response_promise<Grant>>& requests, uint64_t ticket, Grant grant) {
  auto it = requests.find(ticket);
  it->second.deliver(std::move(grant));
  requests.erase(it);
}

/// Carries out the rules' actions in order.
void carry_out(ShardPointer self, std::vector<ShardAction>& acts) {
  auto& st = self->state;
  Tracer* tr = st.opt.tracer;
  for (const ShardAction& a : acts) {
    switch (a.kind) {
      case ShardAction::Kind::grant_weights:
        trace_sent(tr, st.me, "", "WeightsGranted", {{"group", a.group}, {"step", a.step}});
        deliver(st.weight_requests, a.ticket, WeightsGranted{a.group, a.step});
        break;
      case ShardAction::Kind::grant_grad_slot:
        trace_sent(tr, st.me, "", "GradGrant", {{"group", a.group}, {"step", a.step}});
        deliver(st.grad_requests, a.ticket, GradGrant{a.group, a.step, a.overwrite});
        break;
      case ShardAction::Kind::report_sumsq:
        trace_sent(tr, st.me, "scheduler", "GradSumSq", {{"step", a.step}, {"group", a.group}});
        self->send(st.scheduler, GradSumSq{a.step, a.group, a.sumsq});
        break;
      case ShardAction::Kind::group_updated:
        trace_sent(tr, st.me, "scheduler", "GroupUpdated", {{"step", a.step}, {"group", a.group}});
        self->send(st.scheduler, GroupUpdated{a.step, a.group, a.sumsq});
        break;
      case ShardAction::Kind::run_job: run_job(self, a); break;
    }
  }
}

/// Applies every transition group g allows now and carries out the actions.
void pump(ShardPointer self, int g) {
  std::vector<ShardAction> acts;
  self->state.rules->pump(g, acts);
  carry_out(self, acts);
}

/// A job thread (or the communication thread) reports g's job done, or failed.
void on_job_done(ShardPointer self, const JobDone& d) {
  auto& st = self->state;
  if (st.opt.progress) st.opt.progress->tick();
  st.job_start.erase(d.group);
  if (const ShardJob* j = st.rules->running_replica_sum(d.group); j && st.opt.reduce_wait)
    st.opt.reduce_wait->done(d.group, j->step, std::chrono::steady_clock::now());
  if (!d.error.empty()) {
    const ShardJob* j = st.rules->running_job(d.group);
    throw std::runtime_error(fmt::format("{}: {} of group {} failed: {}", st.who,
                                         j ? describe(*j) : std::string("a job"), d.group, d.error));
  }
  job_finished(self, d.group, d.sumsq);
}

/// An upload or gradient slot request of group g for `step`: granted now or when the rules
/// allow. One not granted at once while g's replica sum runs waits for that sum.
template <class Grant>
caf::result<Grant> on_request(ShardPointer self,
                              std::map<uint64_t, caf::typed_response_promise<Grant>>& requests,
                              void (ShardRules::*request)(int, int64_t, uint64_t), int g, int64_t step) {
  auto& st = self->state;
  auto rp = self->make_response_promise<Grant>();
  const uint64_t ticket = st.next_ticket++;
  ((*st.rules).*request)(g, step, ticket);
  requests.emplace(ticket, rp);
  pump(self, g);
  if (requests.count(ticket) && st.opt.reduce_wait)
    if (const ShardJob* j = st.rules->running_replica_sum(g))
      st.opt.reduce_wait->blocked(g, j->step, std::chrono::steady_clock::now());
  return rp;
}

/// The scheduler decided guarded step `step`: pump its groups in the order the rules give.
void on_step_scale(ShardPointer self, const StepScale& sc) {
  // Every group of the step was waiting for this scalar; the order they now update in
  // decides which deadline is met first (docs/architecture.md, "Guarded steps"):
  //  - async: the next iteration writes its gradients in backward order, and rule 3 makes
  //    each write wait for this update, so update in the order the gradients completed
  //    (what rule 4 does without clipping); the next uploads of these weights are an
  //    iteration later;
  //  - sync: the next iteration's forward needs the weights first: ascending groups.
  for (int g : self->state.rules->scale_arrived(sc.step, sc.skip, sc.grad_scale)) pump(self, g);
  self->state.rules->forget_scales(sc.step);
}

/// "optimizer shard 0: <the rules' line> (group 3's job running for 1.2 s)".
std::string status_line(ShardPointer self) {
  auto& st = self->state;
  std::string text = st.who + ": " + st.rules->describe();
  const auto now = std::chrono::steady_clock::now();
  for (auto& [g, t0] : st.job_start)
    text += fmt::format(" (group {}'s job running for {:.1f} s)", g,
                        std::chrono::duration<double>(now - t0).count());
  return text;
}

/// Sets up the state: the groups, their rules, the thread pool and (detached) the job thread.
/// Any exception in a handler (a job that failed, a message about a group it does not own)
/// tells the scheduler, then ends the shard with the error.
void start(ShardPointer self, const std::vector<ShardGroup>& groups, ParamStore* store, ShardOptions opt,
           SchedulerActor scheduler) {
  auto& st = self->state;
  std::vector<ShardRules::Group> rg;
  for (const ShardGroup& g : groups) {
    st.groups[g.group] = g;
    if (opt.predict_weights && opt.staleness == 1) st.last_update[g.group];
    rg.push_back({g.group, g.uploads_per_pass, g.grads_per_pass});
  }
  const bool replicated = opt.replicas && opt.replicas->size() > 1;
  st.rules.emplace(rg, opt.staleness, opt.guard, opt.disable_rule, replicated);
  st.pool =
      std::make_shared<ThreadPool>(ThreadPool::Options{std::max(1, opt.threads), opt.cpus, 50, "rp-shard"});
  // A detached shard runs its long jobs on a JobRunner; one under the deterministic test
  // coordinator runs them inline (a job finishing on another thread would race the tests).
  if (opt.detached) st.runner = std::make_unique<JobRunner>(self->address());
  st.who = fmt::format("optimizer shard {}", opt.index);
  st.me = fmt::format("shard{}", opt.index);
  st.store = store;
  st.opt = std::move(opt);
  st.scheduler = std::move(scheduler);
  self->set_exception_handler([self](std::exception_ptr& x) -> caf::error {
    std::string what = exception_text(x);
    if (what.rfind(self->state.who, 0) != 0) what = self->state.who + ": " + what;
    self->send(self->state.scheduler, Failure{what});
    return failure_reason(what);
  });
}

}  // namespace

ShardActor::behavior_type shard_impl(ShardPointer self, std::vector<ShardGroup> groups, ParamStore* store,
                                     ShardOptions opt, SchedulerActor scheduler) {
  start(self, groups, store, std::move(opt), std::move(scheduler));
  // every message of a group is traced as received, then fed to the rules, then g is pumped
  auto received = [self](const char* type, int g, int64_t step) {
    trace_received(self->state.opt.tracer, self->state.me, "", type, {{"group", g}, {"step", step}});
  };
  auto from_scheduler = [self](const char* type, int64_t step) {
    trace_received(self->state.opt.tracer, self->state.me, "scheduler", type,
                   {{"step", step}, {"shard", self->state.opt.index}});
  };
  return {
      [=](JobDone& d) { on_job_done(self, d); },
      [=](AcquireWeights& a) -> caf::result<WeightsGranted> {
        received("AcquireWeights", a.group, a.step);
        return on_request(self, self->state.weight_requests, &ShardRules::request_weights, a.group, a.step);
      },
      [=](ReleaseWeights& r) {
        received("ReleaseWeights", r.group, r.step);
        self->state.rules->weights_released(r.group, r.step);
        pump(self, r.group);
      },
      [=](AcquireGradSlot& a) -> caf::result<GradGrant> {
        received("AcquireGradSlot", a.group, a.step);
        return on_request(self, self->state.grad_requests, &ShardRules::request_grad_slot, a.group, a.step);
      },
      [=](GradWritten& w) {
        received("GradWritten", w.group, w.step);
        self->state.rules->grad_written(w.group, w.step);
        pump(self, w.group);
      },
      [=](CloseStep& c) {
        from_scheduler("CloseStep", c.step);
        self->state.rules->close_step(c.step, ClosedStep{c.passes, c.grad_scale, c.lr, c.uploads, c.grads});
        for (int g : self->state.rules->groups()) pump(self, g);
      },
      [=](StepScale& sc) {
        from_scheduler("StepScale", sc.step);
        on_step_scale(self, sc);
      },
      [=](ResumeAt& r) -> caf::result<Ack> {
        // a resumed run: version r.step-1 is in the fp32 master, version r.step-1-s in the
        // low-precision copy (loaded by the Session), every upload before r.step done
        if (!self->state.rules->resume_at(r.step)) return caf::make_error(caf::sec::invalid_argument);
        return Ack{};
      },
      [=](GetStatus) -> caf::result<StatusReport> { return StatusReport{status_line(self)}; },
      [=](Shutdown) { self->quit(); },
  };
}

ShardActor spawn_optimizer_shard(caf::actor_system& sys, std::vector<ShardGroup> groups, ParamStore* store,
                                 ShardOptions opt, SchedulerActor scheduler) {
  if (!opt.detached) return sys.spawn(shard_impl, std::move(groups), store, opt, std::move(scheduler));
  return sys.spawn<caf::detached>(shard_impl, std::move(groups), store, opt, std::move(scheduler));
}

}  // namespace rp
