#include "actors/scheduler_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "actors/message_trace.hpp"
#include "actors/messages.hpp"
#include "model/layout.hpp"
#include "scheduler/group_plan.hpp"
#include "scheduler/step_ledger.hpp"

namespace rp {

void fill_pass_buffers(PassBuffers& pb, const SubmitPass& sp) {
  const size_t T = size_t(pb.shape.tokens());
  const size_t n = size_t(pb.micro_batches) * T;
  auto check = [&](const std::shared_ptr<const std::vector<int32_t>>& v, const char* what) {
    if (!v || v->size() != n)
      throw std::invalid_argument(fmt::format("pass filler: the pass has {} {}, its slot holds {} x {}",
                                              v ? v->size() : 0, what, pb.micro_batches, T));
  };
  check(sp.ids, "ids");
  check(sp.targets, "targets");
  if (sp.positions) check(sp.positions, "positions");
  for (int64_t m = 0; m < pb.micro_batches; ++m) {
    std::memcpy(pb.ids[m].data(), sp.ids->data() + m * T, T * 4);
    std::memcpy(pb.targets[m].data(), sp.targets->data() + m * T, T * 4);
    if (sp.positions) {
      std::memcpy(pb.positions[m].data(), sp.positions->data() + m * T, T * 4);
      const auto* p0 = sp.positions->data() + m * T;
      pb.rope_length[size_t(m)] = T == 0 ? 0 : int64_t(*std::max_element(p0, p0 + T)) + 1;
    }
    pb.target_tokens[size_t(m)] = float(std::count_if(
        sp.targets->data() + m * T, sp.targets->data() + (m + 1) * T, [](int32_t t) { return t >= 0; }));
  }
  std::fill(pb.moe_stats.begin(), pb.moe_stats.end(), 0.0f);
}

namespace {

using Clock = std::chrono::steady_clock;

/// The pass filler: answers each FillPass once its copies are done (an exception becomes the
/// answer's error, never the filler's end). Its messages go to `tracer`'s "filler" track.
PassFillerActor::behavior_type pass_filler(PassFillerActor::pointer, Tracer* tracer) {
  return {
      [tracer](FillPass& f) -> PassFilled {
        trace_received(tracer, "filler", "scheduler", "FillPass", {{"pass", f.pass}});
        PassFilled out{f.pass, {}};
        try {
          fill_pass_buffers(*f.buffers, f.data);
        } catch (const std::exception& e) {
          out.error = e.what();
        }
        trace_sent(tracer, "filler", "scheduler", "PassFilled", {{"pass", f.pass}});
        return out;
      },
  };
}

/// A pass whose slot and plan are chosen and whose buffers the filler is filling.
struct Filling {
  PassDeal deal;
  std::shared_ptr<const IterationPlan> plan;  ///< the plan it is dealt with
  bool packed = false;
};

class Scheduler : public SchedulerActor::base {
 public:
  Scheduler(caf::actor_config& c, SchedulerConfig cfg) : SchedulerActor::base(c), cfg_(std::move(cfg)) {
    ledger_ = std::make_unique<StepLedger>(ledger_options(cfg_));
    plan_ = std::make_shared<const IterationPlan>(cfg_.plan);
    last_change_ = Clock::now();
  }

  const char* name() const override { return "scheduler"; }

  // Drop every handle on exit: detached shards' threads end only once their last reference
  // is gone. The filler goes with the scheduler.
  void on_exit() override {
    if (filler_) caf::anon_send_exit(filler_, caf::exit_reason::user_shutdown);
    filler_ = nullptr;
    workers_.clear();
    shards_.clear();
    submitted_.clear();
  }

  behavior_type make_behavior() override {
    filler_ = cfg_.detached_filler ? spawn<caf::detached>(pass_filler, cfg_.tracer)
                                   : spawn(pass_filler, cfg_.tracer);
    monitor(filler_);
    if (cfg_.watchdog_s > 0) send(caf::actor_cast<SchedulerActor>(this), WatchdogTick{});
    watch_failures();
    return {
        [this](SetPeers& p) {
          workers_ = std::move(p.workers);
          shards_ = std::move(p.shards);
          for (auto& w : workers_) monitor(w);
          for (auto& s : shards_) monitor(s);
        },
        [this](SubmitPass& sp) { on_submit(sp); },
        [this](CloseStepRequest& c) {
          on_ledger([&](StepLedger& l, auto& out) { l.close_requested(c.step, c.lr, c.tokens, out); });
        },
        [this](StageDone& d) { on_stage_done(d); },
        [this](GradSumSq& g) {
          trace_received(cfg_.tracer, "scheduler", "", "GradSumSq", {{"step", g.step}, {"group", g.group}});
          on_ledger([&](StepLedger& l, auto& out) { l.grad_sumsq(g.step, g.group, g.sumsq, out); });
        },
        [this](GroupUpdated& g) {
          progress().tick();
          trace_received(cfg_.tracer, "scheduler", "", "GroupUpdated",
                         {{"step", g.step}, {"group", g.group}});
          on_ledger([&](StepLedger& l, auto& out) { l.group_updated(g.step, g.group, g.sumsq, out); });
        },
        [this](LayerTimings& lt) { on_layer_timings(lt); },
        [this](GetRuntimeInfo) -> caf::result<RuntimeInfo> { return runtime_info(); },
        [this](WaitStep& w) -> caf::result<StepResult> {
          return answer(ledger_->step_result(w.step), step_waiters_, w.step);
        },
        [this](WaitEval& w) -> caf::result<EvalResult> {
          return answer(ledger_->eval_result(w.id), eval_waiters_, w.id);
        },
        [this](Failure& f) { fail(f.what); },
        [this](WatchdogTick) { watchdog_tick(); },
        [this](GetStatus) -> caf::result<StatusReport> {
          auto rp = make_response_promise<StatusReport>();
          gather_status("", [rp](const std::string& line) mutable { rp.deliver(StatusReport{line}); });
          return rp;
        },
        [this](ResumeAt& r) -> caf::result<Ack> {
          if (!ledger_->resume_at(r.step, r.loss_scales)) return caf::make_error(caf::sec::invalid_argument);
          return Ack{};
        },
        [this](LossScalesFrom& q) -> caf::result<LossScales> {
          return LossScales{ledger_->loss_scales_from(q.step)};
        },
        [this](Shutdown) {
          for (auto& w : workers_) send(w, Shutdown{});
          for (auto& s : shards_) send(s, Shutdown{});
          quit();
        },
    };
  }

 private:
  static StepLedger::Options ledger_options(const SchedulerConfig& c) {
    StepLedger::Options o;
    o.num_groups = c.num_groups;
    o.frozen = c.frozen;
    o.pass_slots = int(c.pass_slots.size());
    o.guard = c.guard;
    o.max_grad_norm = c.max_grad_norm;
    o.loss_scaler = c.loss_scaler;
    o.staleness = c.staleness;
    return o;
  }

  RunProgress& progress() { return cfg_.progress ? *cfg_.progress : own_progress_; }

  /// The run fails with `what` (the first failure wins): every waiter gets it, now and later.
  void fail(const std::string& what) {
    if (!ledger_->fail(what)) return;
    for (auto& [id, ws] : eval_waiters_)
      for (auto& w : ws) w.deliver(*ledger_->eval_result(id));
    for (auto& [k, ws] : step_waiters_)
      for (auto& w : ws) w.deliver(*ledger_->step_result(k));
    eval_waiters_.clear();
    step_waiters_.clear();
  }

  /// An exception in a handler fails the run (every waiter hears of it) and ends the scheduler;
  /// a worker, shard or the filler that goes down with an error fails the run.
  void watch_failures() {
    set_exception_handler([this](std::exception_ptr& x) -> caf::error {
      const std::string what = "scheduler: " + exception_text(x);
      fail(what);
      return failure_reason(what);
    });
    set_down_handler([this](caf::down_msg& d) {
      if (is_shutdown(d.reason)) return;
      std::string who = "an actor";
      for (size_t i = 0; i < workers_.size(); ++i)
        if (d.source == workers_[i].address()) who = fmt::format("worker {}", i);
      for (size_t i = 0; i < shards_.size(); ++i)
        if (d.source == shards_[i].address()) who = fmt::format("optimizer shard {}", i);
      if (filler_ && d.source == filler_.address()) who = "the pass filler";
      const std::string text = error_text(d.reason);
      fail(text.rfind(who, 0) == 0 ? text : fmt::format("{} stopped: {}", who, text));
    });
  }

  /// Sends what the ledger says, in order.
  void carry_out(std::vector<LedgerAction>& actions) {
    for (auto& a : actions) {
      switch (a.kind) {
        case LedgerAction::Kind::close_step:
          for (size_t k = 0; k < shards_.size(); ++k) {
            trace_sent(cfg_.tracer, "scheduler", fmt::format("shard{}", k), "CloseStep",
                       {{"step", a.step}, {"shard", int64_t(k)}});
            send(shards_[k], CloseStep{a.step, a.passes, a.grad_scale, a.lr, a.uploads, a.grads});
          }
          break;
        case LedgerAction::Kind::step_scale:
          for (size_t k = 0; k < shards_.size(); ++k) {
            trace_sent(cfg_.tracer, "scheduler", fmt::format("shard{}", k), "StepScale",
                       {{"step", a.step}, {"shard", int64_t(k)}});
            send(shards_[k], StepScale{a.step, a.skip, a.grad_scale});
          }
          break;
        case LedgerAction::Kind::step_done: deliver(step_waiters_, a.step, a.step_result); break;
        case LedgerAction::Kind::eval_done: deliver(eval_waiters_, a.eval_result.id, a.eval_result); break;
        case LedgerAction::Kind::deal: dispatch(); break;
      }
    }
  }

  template <class Result>
  using Waiters = std::map<int64_t, std::vector<caf::typed_response_promise<Result>>>;

  template <class Result>
  static void deliver(Waiters<Result>& waiters, int64_t key, const Result& r) {
    if (auto it = waiters.find(key); it != waiters.end()) {
      for (auto& w : it->second) w.deliver(r);
      waiters.erase(it);
    }
  }

  /// The answer now (done, or failed), else a promise kept until the ledger says done.
  template <class Result>
  caf::result<Result> answer(std::optional<Result> now, Waiters<Result>& waiters, int64_t key) {
    if (now) return *now;
    auto rp = make_response_promise<Result>();
    waiters[key].push_back(rp);
    return rp;
  }

  /// Calls `event` with an action list for the ledger to fill, then carries the actions out.
  template <class Event>
  void on_ledger(Event&& event) {
    std::vector<LedgerAction> out;
    event(*ledger_, out);
    carry_out(out);
  }

  /// Between passes: the Replanner may swap the plan (once, automatic plans only).
  void plan_for_next_pass(int64_t pass) {
    if (!cfg_.replanner) return;
    auto d = cfg_.replanner->poll(*plan_, pass);
    if (!d) return;
    const std::string line = d->line();
    replan_log_.push_back(line);
    if (cfg_.log) cfg_.log(line);
    if (d->changed) {
      plan_ = std::make_shared<const IterationPlan>(d->new_plan);
      replans_++;
    }
  }

  /// Deals every pass the ledger allows now, one fill at a time.
  void dispatch() {
    while (!filling_)
      if (auto d = ledger_->next_deal()) start_deal(*d);
      else return;
  }

  /// Phase one of dealing pass `d` (the front of `submitted_`): its plan and its slot's
  /// buffers for that plan, then the filler copies its data in.
  void start_deal(const PassDeal& d) {
    SubmitPass sp = std::move(submitted_.front());
    submitted_.pop_front();
    plan_for_next_pass(d.pass);
    Filling f{d, sp.eval >= 0 ? std::make_shared<const IterationPlan>(evaluation_plan(*plan_)) : plan_,
              sp.positions != nullptr};
    auto pb = cfg_.pass_slots[size_t(d.slot)];
    try {
      pb->ensure_boundaries(*plan_, cfg_.on_new_host_buffer);
    } catch (const std::exception& e) {
      return fail(std::string("scheduler: host buffers for the new plan: ") + e.what());
    }
    filling_ = std::move(f);
    trace_sent(cfg_.tracer, "scheduler", "filler", "FillPass", {{"pass", d.pass}});
    request(filler_, caf::infinite, FillPass{d.pass, std::move(sp), pb})
        .then([this](PassFilled& r) { filled(r); },
              [this](caf::error& e) { fail("the pass filler failed: " + error_text(e)); });
  }

  /// Phase two: the pass's buffers are filled; record it and send its stage tasks.
  void filled(const PassFilled& r) {
    trace_received(cfg_.tracer, "scheduler", "filler", "PassFilled", {{"pass", r.pass}});
    if (!filling_ || filling_->deal.pass != r.pass)
      return fail(fmt::format("scheduler: an answer for pass {} it did not fill", r.pass));
    Filling f = std::move(*filling_);
    filling_.reset();
    if (!ledger_->failed().empty()) return;  // failed meanwhile: nothing more is dealt
    if (!r.error.empty()) return fail(fmt::format("scheduler: pass {}: {}", r.pass, r.error));
    const IterationPlan& plan = *f.plan;
    PassDeal& d = f.deal;
    // an evaluation pass's uploads count with the step's (rule 5 waits for them), no gradients
    std::vector<int> up, gr;
    if (cfg_.layout && d.eval >= 0) {
      up = evaluation_uploads(*cfg_.layout, *plan_);
      gr.assign(up.size(), 0);
    } else if (cfg_.layout) {
      count_per_pass(*cfg_.layout, plan, up, gr);
    }
    std::vector<LedgerAction> after;
    ledger_->dealt(d, int(plan.stages.size()), up, gr, after);
    send_stages(d, plan, f.packed);
    carry_out(after);
    dispatch();
  }

  /// The pass's stage tasks, round-robin to the workers from the deal pointer.
  void send_stages(const PassDeal& d, const IterationPlan& plan, bool packed) {
    auto who = deal_round_robin(plan, int(workers_.size()), deal_pointer_);
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      RunStage rs;
      rs.pass = d.pass;
      rs.step = d.step;
      rs.stage_index = int(s);
      rs.stage = plan.stages[s];
      rs.chain = rs.stage.kind == StageKind::forward ? -1 : int(s) - plan.num_forward();
      rs.buffers = cfg_.pass_slots[size_t(d.slot)];
      rs.loss_scale = d.loss_scale;
      rs.packed = packed;
      rs.eval = d.eval >= 0;
      rs.dropout_pass = d.dropout_pass;
      if (s + 1 < plan.stages.size()) rs.next = workers_[who[s + 1]];
      trace_sent(cfg_.tracer, "scheduler", fmt::format("worker{}", who[s]), "RunStage",
                 {{"pass", d.pass}, {"stage", int64_t(s)}});
      send(workers_[who[s]], std::move(rs));
    }
  }

  void on_submit(SubmitPass& sp) {
    if (sp.eval < 0 && !(sp.target_tokens >= 0))
      return fail(
          fmt::format("scheduler: a training pass of step {} without its target token count", sp.step));
    ledger_->submit_pass(sp.step, sp.eval, sp.eval < 0 ? sp.target_tokens : 0.0);
    submitted_.push_back(std::move(sp));
    dispatch();
  }

  void on_stage_done(StageDone& d) {
    progress().tick();
    if (cfg_.faults.fire_scheduler()) throw std::runtime_error(FaultInjection::what("a StageDone handler"));
    trace_received(cfg_.tracer, "scheduler", fmt::format("worker{}", d.worker), "StageDone",
                   {{"pass", d.pass}, {"stage", d.stage_index}});
    StageReport r{d.loss_sum, d.loss_count, d.aux_weighted, std::move(d.expert_tokens)};
    on_ledger([&](StepLedger& l, auto& out) { l.stage_done(d.pass, r, out); });
  }

  void on_layer_timings(LayerTimings& lt) {
    if (!cfg_.replanner) return;
    Profile& p = cfg_.replanner->profile();
    try {
      for (auto& x : lt.samples) p.record(x.layer, x.kind, x.seconds);
      for (auto& m : lt.memory) p.record_memory(m.layer, m.weight_bytes, m.grad_bytes, m.scratch_bytes);
    } catch (const std::invalid_argument&) {
      // a sample the profile rejects (layer out of range, non-finite time) is dropped
    }
  }

  RuntimeInfo runtime_info() const {
    RuntimeInfo info;
    if (cfg_.replanner) info.profile = cfg_.replanner->profile();
    info.plan = *plan_;
    info.replans = replans_;
    info.replan_log = replan_log_;
    return info;
  }

  /// Asks every worker and shard for its status and calls `done` with the whole line.
  void gather_status(std::string header, std::function<void(const std::string&)> done);
  /// One watchdog check; schedules the next one.
  void watchdog_tick();

  SchedulerConfig cfg_;
  std::unique_ptr<StepLedger> ledger_;  ///< steps, passes, evaluations (scheduler/step_ledger.hpp)
  std::vector<WorkerActor> workers_;
  std::vector<ShardActor> shards_;
  PassFillerActor filler_;
  std::optional<Filling> filling_;    ///< the pass being filled (at most one)
  std::deque<SubmitPass> submitted_;  ///< the ids and targets of the ledger's queued passes, in its order
  Waiters<StepResult> step_waiters_;
  Waiters<EvalResult> eval_waiters_;
  int64_t deal_pointer_ = 0;
  std::shared_ptr<const IterationPlan> plan_;  ///< the plan the next pass is dealt with
  int64_t replans_ = 0;
  std::vector<std::string> replan_log_;
  // watchdog
  RunProgress own_progress_;       ///< used when cfg_.progress is null
  uint64_t last_progress_ = 0;     ///< the progress count when it last moved
  Clock::time_point last_change_;  ///< when it last moved (or the run became busy)
  bool gathering_ = false;         ///< a watchdog report is being collected
};

void Scheduler::gather_status(std::string header, std::function<void(const std::string&)> done) {
  struct Gather {
    std::vector<std::string> parts;
    size_t left = 0;
    std::function<void(const std::string&)> done;
    void set(size_t i, std::string s) {
      parts[i] = std::move(s);
      if (--left == 0) done(fmt::format("{}", fmt::join(parts, " | ")));
    }
  };
  auto g = std::make_shared<Gather>();
  std::string own = std::move(header) + ledger_->describe();
  if (filling_) own += fmt::format(" (filling pass {}'s host buffers)", filling_->deal.pass);
  g->parts.push_back(std::move(own));
  g->parts.resize(1 + workers_.size() + shards_.size());
  g->left = workers_.size() + shards_.size();
  g->done = std::move(done);
  if (g->left == 0) return g->done(g->parts[0]);
  const auto timeout = std::chrono::seconds(2);
  for (size_t i = 0; i < workers_.size(); ++i)
    request(workers_[i], timeout, GetStatus{})
        .then([g, i](StatusReport& r) { g->set(1 + i, std::move(r.text)); },
              [g, i](caf::error& e) {
                g->set(1 + i, fmt::format("worker {}: no answer ({})", i, error_text(e)));
              });
  for (size_t i = 0; i < shards_.size(); ++i) {
    const size_t k = 1 + workers_.size() + i;
    request(shards_[i], timeout, GetStatus{})
        .then([g, k](StatusReport& r) { g->set(k, std::move(r.text)); },
              [g, k, i](caf::error& e) {
                g->set(k, fmt::format("optimizer shard {}: no answer ({})", i, error_text(e)));
              });
  }
}

void Scheduler::watchdog_tick() {
  const double period = cfg_.watchdog_s;
  const auto every = std::chrono::microseconds(int64_t(std::clamp(period / 4, 0.01, 5.0) * 1e6));
  delayed_send(caf::actor_cast<SchedulerActor>(this), every, WatchdogTick{});
  const auto now = Clock::now();
  const uint64_t count = progress().count();
  if (count != last_progress_ || !ledger_->busy() || !ledger_->failed().empty()) {
    last_progress_ = count;
    last_change_ = now;
    return;
  }
  const double idle = std::chrono::duration<double>(now - last_change_).count();
  if (idle < period || gathering_) return;
  last_change_ = now;  // the next line after another period without progress
  gathering_ = true;
  gather_status(fmt::format("watchdog: no progress for {:.1f} s; waiting for: ", idle),
                [this](const std::string& line) {
                  gathering_ = false;
                  if (cfg_.warn) cfg_.warn(line);
                });
}

}  // namespace

SchedulerActor spawn_scheduler(caf::actor_system& sys, SchedulerConfig cfg) {
  return sys.spawn<Scheduler>(std::move(cfg));
}

}  // namespace rp
