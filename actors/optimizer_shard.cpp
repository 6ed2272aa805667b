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

class OptimizerShard : public ShardActor::base {
 public:
  /// Sets up the groups, their rules, the thread pool and (detached) the job thread.
  OptimizerShard(caf::actor_config& cfg, const std::vector<ShardGroup>& groups, ParamStore* store,
                 ShardOptions opt, SchedulerActor scheduler)
      : ShardActor::base(cfg), store_(store), opt_(std::move(opt)), scheduler_(std::move(scheduler)) {
    std::vector<ShardRules::Group> rg;
    for (const ShardGroup& g : groups) {
      groups_[g.group] = g;
      if (opt_.predict_weights && opt_.staleness == 1) last_update_[g.group];
      rg.push_back({g.group, g.uploads_per_pass, g.grads_per_pass});
    }
    const bool replicated = opt_.replicas && opt_.replicas->size() > 1;
    rules_.emplace(rg, opt_.staleness, opt_.guard, opt_.disable_rule, replicated);
    pool_ = std::make_shared<ThreadPool>(
        ThreadPool::Options{std::max(1, opt_.threads), opt_.cpus, 50, "rp-shard"});
    who_ = fmt::format("optimizer shard {}", opt_.index);
    me_ = fmt::format("shard{}", opt_.index);
  }

  const char* name() const override { return "optimizer_shard"; }

  // The job thread ends with the shard (the job in progress finishes first); the scheduler's
  // handle is dropped, so no reference cycle keeps a detached thread alive.
  void on_exit() override {
    runner_.reset();
    pool_.reset();
    weight_requests_.clear();
    grad_requests_.clear();
    scheduler_ = nullptr;
  }

  behavior_type make_behavior() override {
    // A detached shard runs its long jobs on a JobRunner; one under the deterministic test
    // coordinator runs them inline (a job finishing on another thread would race the tests).
    if (opt_.detached) runner_ = std::make_unique<JobRunner>(address());
    // Any exception in a handler (a job that failed, a message about a group it does not own)
    // tells the scheduler, then ends the shard with the error.
    set_exception_handler([this](std::exception_ptr& x) -> caf::error {
      std::string what = exception_text(x);
      if (what.rfind(who_, 0) != 0) what = who_ + ": " + what;
      send(scheduler_, Failure{what});
      return failure_reason(what);
    });
    // every message of a group is traced as received, then fed to the rules, then g is pumped
    return {
        [this](JobDone& d) { on_job_done(d); },
        [this](AcquireWeights& a) -> caf::result<WeightsGranted> {
          received("AcquireWeights", a.group, a.step);
          return on_request(weight_requests_, &ShardRules::request_weights, a.group, a.step);
        },
        [this](ReleaseWeights& r) {
          received("ReleaseWeights", r.group, r.step);
          rules_->weights_released(r.group, r.step);
          pump(r.group);
        },
        [this](AcquireGradSlot& a) -> caf::result<GradGrant> {
          received("AcquireGradSlot", a.group, a.step);
          return on_request(grad_requests_, &ShardRules::request_grad_slot, a.group, a.step);
        },
        [this](GradWritten& w) {
          received("GradWritten", w.group, w.step);
          rules_->grad_written(w.group, w.step);
          pump(w.group);
        },
        [this](CloseStep& c) {
          from_scheduler("CloseStep", c.step);
          rules_->close_step(c.step, ClosedStep{c.passes, c.grad_scale, c.lr, c.uploads, c.grads});
          for (int g : rules_->groups()) pump(g);
        },
        [this](StepScale& sc) {
          from_scheduler("StepScale", sc.step);
          on_step_scale(sc);
        },
        [this](ResumeAt& r) -> caf::result<Ack> {
          // a resumed run: version r.step-1 is in the fp32 master, version r.step-1-s in the
          // low-precision copy (loaded by the Session), every upload before r.step done
          if (!rules_->resume_at(r.step)) return caf::make_error(caf::sec::invalid_argument);
          return Ack{};
        },
        [this](GetStatus) -> caf::result<StatusReport> { return StatusReport{status_line()}; },
        [this](Shutdown) { quit(); },
    };
  }

 private:
  template <class Grant>
  using Requests = std::map<uint64_t, caf::typed_response_promise<Grant>>;  ///< by ticket

  void received(const char* type, int g, int64_t step) {
    trace_received(opt_.tracer, me_, "", type, {{"group", g}, {"step", step}});
  }
  void from_scheduler(const char* type, int64_t step) {
    trace_received(opt_.tracer, me_, "scheduler", type, {{"step", step}, {"shard", opt_.index}});
  }

  /// The work of job `j` (runs on the job thread, or inline); returns a sum of squares' result.
  std::function<double()> job_work(const ShardJob& j) {
    const ShardGroup& sg = groups_.at(j.group);
    ParamStore* store = store_;
    std::vector<float>* master = sg.master;
    AdamWState* adam_state = sg.state;
    const int64_t n = int64_t(master->size());
    const float* grad = store->grad[size_t(j.group)].as<float>();
    void* lowp = store->lowp[size_t(j.group)].data();
    auto pool = pool_;
    switch (j.kind) {
      case ShardJob::Kind::cast:  // deferred publish: vectorised RNE cast, the same bits as the fused copy
        if (last_update_.count(j.group)) {
          const LastUpdate* lu = &last_update_.at(j.group);
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
      case ShardJob::Kind::reduce:
        throw std::logic_error("a replica sum is not a job of the shard's threads");
    }
    // tensors under 32K elements run on one thread, larger ones split over the pool
    const bool inject = opt_.faults.fire_update(j.group, j.step);
    LastUpdate* last = nullptr;
    if (auto it = last_update_.find(j.group); it != last_update_.end()) last = &it->second;
    // unguarded steps: the gradient's sum of squares for the reported norm, read before the
    // update (which only reads the gradient too); guarded steps had a sumsq job for it
    const bool measure = !opt_.guard;
    return [=, adam = opt_.adam] {
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

  /// g's job finished with `sumsq`: the rules' next actions.
  void job_finished(int g, double sumsq) {
    std::vector<ShardAction> more;
    rules_->job_done(g, sumsq, more);
    carry_out(more);
  }

  /// A reduce job: the communication thread sums group g's gradient over the replicas and
  /// reports back with JobDone, like a job thread.
  void start_replica_sum(const ShardAction& a) {
    const auto now = std::chrono::steady_clock::now();
    job_start_[a.group] = now;
    if (opt_.reduce_wait) {
      opt_.reduce_wait->started(a.group, a.step, now);
      // a request already waiting for this group now waits for the sum
      if (rules_->has_waiters(a.group)) opt_.reduce_wait->blocked(a.group, a.step, now);
    }
    const std::vector<float>* master = groups_.at(a.group).master;
    if (opt_.sums_in_flight) ++*opt_.sums_in_flight;
    opt_.replicas->sum_async(
        a.group, store_->grad[size_t(a.group)].as<float>(), int64_t(master->size()),
        fmt::format("the gradient of group {} of step {}", a.group, a.step),
        [addr = address(), g = a.group, n = opt_.sums_in_flight](const std::string& err) {
          if (n) --*n;
          if (auto s = caf::actor_cast<ShardActor>(addr)) caf::anon_send(s, JobDone{g, 0.0, err});
        });
  }

  /// Runs a job: a replica sum on the communication thread, any other on the job thread of a
  /// detached shard, or inline (then its result goes to the rules at once).
  void run_job(const ShardAction& a) {
    if (a.job.kind == ShardJob::Kind::reduce) return start_replica_sum(a);
    auto work = job_work(a.job);
    if (runner_) {
      job_start_[a.group] = std::chrono::steady_clock::now();
      runner_->submit(a.group, std::move(work));
      return;
    }
    const double r = work();
    if (opt_.progress) opt_.progress->tick();
    job_finished(a.group, r);
  }

  /// Answers the request `ticket` waiting in `requests` with `grant`.
  template <class Grant>
  static void deliver(Requests<Grant>& requests, uint64_t ticket, Grant grant) {
    auto it = requests.find(ticket);
    it->second.deliver(std::move(grant));
    requests.erase(it);
  }

  /// Carries out the rules' actions in order.
  void carry_out(std::vector<ShardAction>& acts) {
    Tracer* tr = opt_.tracer;
    for (const ShardAction& a : acts) {
      switch (a.kind) {
        case ShardAction::Kind::grant_weights:
          trace_sent(tr, me_, "", "WeightsGranted", {{"group", a.group}, {"step", a.step}});
          deliver(weight_requests_, a.ticket, WeightsGranted{a.group, a.step});
          break;
        case ShardAction::Kind::grant_grad_slot:
          trace_sent(tr, me_, "", "GradGrant", {{"group", a.group}, {"step", a.step}});
          deliver(grad_requests_, a.ticket, GradGrant{a.group, a.step, a.overwrite});
          break;
        case ShardAction::Kind::report_sumsq:
          trace_sent(tr, me_, "scheduler", "GradSumSq", {{"step", a.step}, {"group", a.group}});
          send(scheduler_, GradSumSq{a.step, a.group, a.sumsq});
          break;
        case ShardAction::Kind::group_updated:
          trace_sent(tr, me_, "scheduler", "GroupUpdated", {{"step", a.step}, {"group", a.group}});
          send(scheduler_, GroupUpdated{a.step, a.group, a.sumsq});
          break;
        case ShardAction::Kind::run_job: run_job(a); break;
      }
    }
  }

  /// Applies every transition group g allows now and carries out the actions.
  void pump(int g) {
    std::vector<ShardAction> acts;
    rules_->pump(g, acts);
    carry_out(acts);
  }

  /// A job thread (or the communication thread) reports g's job done, or failed.
  void on_job_done(const JobDone& d) {
    if (opt_.progress) opt_.progress->tick();
    job_start_.erase(d.group);
    if (const ShardJob* j = rules_->running_replica_sum(d.group); j && opt_.reduce_wait)
      opt_.reduce_wait->done(d.group, j->step, std::chrono::steady_clock::now());
    if (!d.error.empty()) {
      const ShardJob* j = rules_->running_job(d.group);
      throw std::runtime_error(fmt::format("{}: {} of group {} failed: {}", who_,
                                           j ? describe(*j) : std::string("a job"), d.group, d.error));
    }
    job_finished(d.group, d.sumsq);
  }

  /// An upload or gradient slot request of group g for `step`: granted now or when the rules
  /// allow. One not granted at once while g's replica sum runs waits for that sum.
  template <class Grant>
  caf::result<Grant> on_request(Requests<Grant>& requests,
                                void (ShardRules::*request)(int, int64_t, uint64_t), int g, int64_t step) {
    auto rp = make_response_promise<Grant>();
    const uint64_t ticket = next_ticket_++;
    ((*rules_).*request)(g, step, ticket);
    requests.emplace(ticket, rp);
    pump(g);
    if (requests.count(ticket) && opt_.reduce_wait)
      if (const ShardJob* j = rules_->running_replica_sum(g))
        opt_.reduce_wait->blocked(g, j->step, std::chrono::steady_clock::now());
    return rp;
  }

  /// The scheduler decided guarded step `step`: pump its groups in the order the rules give.
  void on_step_scale(const StepScale& sc) {
    // Every group of the step was waiting for this scalar; the order they now update in
    // decides which deadline is met first (docs/architecture.md, "Guarded steps"):
    //  - async: the next iteration writes its gradients in backward order, and rule 3 makes
    //    each write wait for this update, so update in the order the gradients completed
    //    (what rule 4 does without clipping); the next uploads of these weights are an
    //    iteration later;
    //  - sync: the next iteration's forward needs the weights first: ascending groups.
    for (int g : rules_->scale_arrived(sc.step, sc.skip, sc.grad_scale)) pump(g);
    rules_->forget_scales(sc.step);
  }

  /// "optimizer shard 0: <the rules' line> (group 3's job running for 1.2 s)".
  std::string status_line() const {
    std::string text = who_ + ": " + rules_->describe();
    const auto now = std::chrono::steady_clock::now();
    for (auto& [g, t0] : job_start_)
      text += fmt::format(" (group {}'s job running for {:.1f} s)", g,
                          std::chrono::duration<double>(now - t0).count());
    return text;
  }

  // fixed at spawn
  ParamStore* store_ = nullptr;
  ShardOptions opt_;
  SchedulerActor scheduler_;
  std::string who_;  ///< "optimizer shard 2": failures and status lines
  std::string me_;   ///< "shard2": this actor in traced messages
  // the protocol
  std::optional<ShardRules> rules_;
  std::map<int, ShardGroup> groups_;
  Requests<WeightsGranted> weight_requests_;
  Requests<GradGrant> grad_requests_;
  uint64_t next_ticket_ = 1;
  // the jobs
  std::shared_ptr<ThreadPool> pool_;   ///< the shard's optimizer threads (persistent)
  std::unique_ptr<JobRunner> runner_;  ///< detached shards: long jobs off the actor's thread
  std::map<int, std::chrono::steady_clock::time_point> job_start_;  ///< per busy group (status)
  /// Per group, its last update (weight prediction only; entries made at spawn, so the job
  /// threads never see the map change).
  std::map<int, LastUpdate> last_update_;
};

}  // namespace

ShardActor spawn_optimizer_shard(caf::actor_system& sys, std::vector<ShardGroup> groups, ParamStore* store,
                                 ShardOptions opt, SchedulerActor scheduler) {
  if (!opt.detached) return sys.spawn<OptimizerShard>(std::move(groups), store, opt, std::move(scheduler));
  return sys.spawn<OptimizerShard, caf::detached>(std::move(groups), store, opt, std::move(scheduler));
}

}  // namespace rp
