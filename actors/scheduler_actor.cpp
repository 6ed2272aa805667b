#include "actors/scheduler_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>

#include <fmt/format.h>

#include "actors/message_trace.hpp"
#include "actors/messages.hpp"
#include "model/layout.hpp"
#include "scheduler/group_plan.hpp"
#include "scheduler/step_ledger.hpp"

namespace rp {
namespace {

using Clock = std::chrono::steady_clock;

struct SchedState {
  SchedulerConfig cfg;
  std::unique_ptr<StepLedger> ledger;  ///< steps, passes, evaluations (scheduler/step_ledger.hpp)
  std::vector<WorkerActor> workers;
  std::vector<ShardActor> shards;
  std::deque<SubmitPass> submitted;  ///< the ids and targets of the ledger's queued passes, in its order
  std::map<int64_t, std::vector<caf::typed_response_promise<StepResult>>> step_waiters;
  std::map<int64_t, std::vector<caf::typed_response_promise<EvalResult>>> eval_waiters;
  int64_t deal_pointer = 0;
  std::shared_ptr<const IterationPlan> plan;  ///< the plan the next pass is dealt with
  int64_t replans = 0;
  std::vector<std::string> replan_log;
  // watchdog
  RunProgress own_progress;       ///< used when cfg.progress is null
  uint64_t last_progress = 0;     ///< the progress count when it last moved
  Clock::time_point last_change;  ///< when it last moved (or the run became busy)
  bool gathering = false;         ///< a watchdog report is being collected
  static inline const char* name = "scheduler";
};

using SchedPointer = SchedulerActor::stateful_pointer<SchedState>;

RunProgress& progress(SchedPointer self) {
  return self->state.cfg.progress ? *self->state.cfg.progress : self->state.own_progress;
}

/// The run fails with `what` (the first failure wins): every waiter gets it, now and later.
void fail(SchedPointer self, const std::string& what) {
  auto& st = self->state;
  if (!st.ledger->fail(what)) return;
  for (auto& [id, ws] : st.eval_waiters)
    for (auto& w : ws) w.deliver(*st.ledger->eval_result(id));
  for (auto& [k, ws] : st.step_waiters)
    for (auto& w : ws) w.deliver(*st.ledger->step_result(k));
  st.eval_waiters.clear();
  st.step_waiters.clear();
}

void dispatch(SchedPointer self);

/// Sends what the ledger says, in order.
void carry_out(SchedPointer self, std::vector<LedgerAction>& actions) {
  auto& st = self->state;
  for (auto& a : actions) {
    switch (a.kind) {
      case LedgerAction::Kind::close_step:
        for (size_t k = 0; k < st.shards.size(); ++k) {
          trace_sent(st.cfg.tracer, "scheduler", fmt::format("shard{}", k), "CloseStep",
                     {{"step", a.step}, {"shard", int64_t(k)}});
          self->send(st.shards[k], CloseStep{a.step, a.passes, a.grad_scale, a.lr, a.uploads, a.grads});
        }
        break;
      case LedgerAction::Kind::step_scale:
        for (size_t k = 0; k < st.shards.size(); ++k) {
          trace_sent(st.cfg.tracer, "scheduler", fmt::format("shard{}", k), "StepScale",
                     {{"step", a.step}, {"shard", int64_t(k)}});
          self->send(st.shards[k], StepScale{a.step, a.skip, a.grad_scale});
        }
        break;
      case LedgerAction::Kind::step_done:
        if (auto it = st.step_waiters.find(a.step); it != st.step_waiters.end()) {
          for (auto& w : it->second) w.deliver(a.step_result);
          st.step_waiters.erase(it);
        }
        break;
      case LedgerAction::Kind::eval_done:
        if (auto it = st.eval_waiters.find(a.eval_result.id); it != st.eval_waiters.end()) {
          for (auto& w : it->second) w.deliver(a.eval_result);
          st.eval_waiters.erase(it);
        }
        break;
      case LedgerAction::Kind::deal: dispatch(self); break;
    }
  }
}

/// Between passes: the Replanner may swap the plan (once, automatic plans only).
void plan_for_next_pass(SchedPointer self, int64_t pass) {
  auto& st = self->state;
  if (!st.cfg.replanner) return;
  auto d = st.cfg.replanner->poll(*st.plan, pass);
  if (!d) return;
  const std::string line = d->line();
  st.replan_log.push_back(line);
  if (st.cfg.log) st.cfg.log(line);
  if (d->changed) {
    st.plan = std::make_shared<const IterationPlan>(d->new_plan);
    st.replans++;
  }
}

/// Copies a pass's ids, targets and positions into its slot's host buffers.
void fill_pass_buffers(PassBuffers& pb, const SubmitPass& sp) {
  const size_t T = size_t(pb.shape.tokens());
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

/// Deals pass `d` (the front of `submitted`): its buffers, its stage tasks round-robin to the
/// workers. False when the run failed.
bool deal_pass(SchedPointer self, PassDeal d) {
  auto& st = self->state;
  SubmitPass sp = std::move(st.submitted.front());
  st.submitted.pop_front();
  plan_for_next_pass(self, d.pass);
  const auto plan_ptr =
      sp.eval >= 0 ? std::make_shared<const IterationPlan>(evaluation_plan(*st.plan)) : st.plan;
  const IterationPlan& plan = *plan_ptr;
  auto& pb = st.cfg.pass_slots[size_t(d.slot)];
  try {
    pb->ensure_boundaries(*st.plan, st.cfg.on_new_host_buffer);
  } catch (const std::exception& e) {
    fail(self, std::string("scheduler: host buffers for the new plan: ") + e.what());
    return false;
  }
  fill_pass_buffers(*pb, sp);
  // an evaluation pass's uploads count with the step's (rule 5 waits for them), no gradients
  std::vector<int> up, gr;
  if (st.cfg.layout && sp.eval >= 0) {
    up = evaluation_uploads(*st.cfg.layout, *st.plan);
    gr.assign(up.size(), 0);
  } else if (st.cfg.layout) {
    count_per_pass(*st.cfg.layout, plan, up, gr);
  }
  std::vector<LedgerAction> after;
  st.ledger->dealt(d, int(plan.stages.size()), up, gr, after);
  auto who = deal_round_robin(plan, int(st.workers.size()), st.deal_pointer);
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    RunStage rs;
    rs.pass = d.pass;
    rs.step = d.step;
    rs.stage_index = int(s);
    rs.stage = plan.stages[s];
    rs.chain = rs.stage.kind == StageKind::forward ? -1 : int(s) - plan.num_forward();
    rs.buffers = pb;
    rs.loss_scale = d.loss_scale;
    rs.packed = sp.positions != nullptr;
    rs.eval = d.eval >= 0;
    rs.dropout_pass = d.dropout_pass;
    if (s + 1 < plan.stages.size()) rs.next = st.workers[who[s + 1]];
    trace_sent(st.cfg.tracer, "scheduler", fmt::format("worker{}", who[s]), "RunStage",
               {{"pass", d.pass}, {"stage", int64_t(s)}});
    self->send(st.workers[who[s]], std::move(rs));
  }
  carry_out(self, after);
  return true;
}

/// Deals every pass the ledger allows now.
void dispatch(SchedPointer self) {
  while (auto d = self->state.ledger->next_deal())
    if (!deal_pass(self, *d)) return;
}

/// Asks every worker and shard for its status and calls `done` with the whole line.
void gather_status(SchedPointer self, std::string header, std::function<void(const std::string&)> done) {
  auto& st = self->state;
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
  g->parts.push_back(std::move(header) + st.ledger->describe());
  g->parts.resize(1 + st.workers.size() + st.shards.size());
  g->left = st.workers.size() + st.shards.size();
  g->done = std::move(done);
  if (g->left == 0) return g->done(g->parts[0]);
  const auto timeout = std::chrono::seconds(2);
  for (size_t i = 0; i < st.workers.size(); ++i)
    self->request(st.workers[i], timeout, GetStatus{})
        .then([g, i](StatusReport& r) { g->set(1 + i, std::move(r.text)); },
              [g, i](caf::error& e) {
                g->set(1 + i, fmt::format("worker {}: no answer ({})", i, error_text(e)));
              });
  for (size_t i = 0; i < st.shards.size(); ++i) {
    const size_t k = 1 + st.workers.size() + i;
    self->request(st.shards[i], timeout, GetStatus{})
        .then([g, k](StatusReport& r) { g->set(k, std::move(r.text)); },
              [g, k, i](caf::error& e) {
                g->set(k, fmt::format("optimizer shard {}: no answer ({})", i, error_text(e)));
              });
  }
}

/// One watchdog check; schedules the next one.
void watchdog_tick(SchedPointer self) {
  auto& st = self->state;
  const double period = st.cfg.watchdog_s;
  const auto every = std::chrono::microseconds(int64_t(std::clamp(period / 4, 0.01, 5.0) * 1e6));
  self->delayed_send(self, every, WatchdogTick{});
  const auto now = Clock::now();
  const uint64_t count = progress(self).count();
  if (count != st.last_progress || !st.ledger->busy() || !st.ledger->failed().empty()) {
    st.last_progress = count;
    st.last_change = now;
    return;
  }
  const double idle = std::chrono::duration<double>(now - st.last_change).count();
  if (idle < period || st.gathering) return;
  st.last_change = now;  // the next line after another period without progress
  st.gathering = true;
  gather_status(self, fmt::format("watchdog: no progress for {:.1f} s; waiting for: ", idle),
                [self](const std::string& line) {
                  self->state.gathering = false;
                  if (self->state.cfg.warn) self->state.cfg.warn(line);
                });
}

StepLedger::Options ledger_options(const SchedulerConfig& c) {
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

/// An exception in a handler fails the run (every waiter hears of it) and ends the scheduler;
/// a worker or shard that goes down with an error fails the run.
void watch_failures(SchedPointer self) {
  self->set_exception_handler([self](std::exception_ptr& x) -> caf::error {
    const std::string what = "scheduler: " + exception_text(x);
    fail(self, what);
    return failure_reason(what);
  });
  self->set_down_handler([self](caf::down_msg& d) {
    if (is_shutdown(d.reason)) return;
    auto& st = self->state;
    std::string who = "an actor";
    for (size_t i = 0; i < st.workers.size(); ++i)
      if (d.source == st.workers[i].address()) who = fmt::format("worker {}", i);
    for (size_t i = 0; i < st.shards.size(); ++i)
      if (d.source == st.shards[i].address()) who = fmt::format("optimizer shard {}", i);
    const std::string text = error_text(d.reason);
    fail(self, text.rfind(who, 0) == 0 ? text : fmt::format("{} stopped: {}", who, text));
  });
}

/// Calls `event` with an action list for the ledger to fill, then carries the actions out.
template <class Event>
void on_ledger(SchedPointer self, Event&& event) {
  std::vector<LedgerAction> out;
  event(*self->state.ledger, out);
  carry_out(self, out);
}

void on_stage_done(SchedPointer self, StageDone& d) {
  auto& st = self->state;
  progress(self).tick();
  if (st.cfg.faults.fire_scheduler()) throw std::runtime_error(FaultInjection::what("a StageDone handler"));
  trace_received(st.cfg.tracer, "scheduler", fmt::format("worker{}", d.worker), "StageDone",
                 {{"pass", d.pass}, {"stage", d.stage_index}});
  StageReport r{d.loss_sum, d.loss_count, d.aux_weighted, std::move(d.expert_tokens)};
  on_ledger(self, [&](StepLedger& l, auto& out) { l.stage_done(d.pass, r, out); });
}

void on_submit(SchedPointer self, SubmitPass& sp) {
  double tokens = 0;
  if (sp.eval < 0)
    tokens = double(std::count_if(sp.targets->begin(), sp.targets->end(), [](int32_t t) { return t >= 0; }));
  self->state.ledger->submit_pass(sp.step, sp.eval, tokens);
  self->state.submitted.push_back(std::move(sp));
  dispatch(self);
}

void on_layer_timings(SchedPointer self, LayerTimings& lt) {
  auto& st = self->state;
  if (!st.cfg.replanner) return;
  Profile& p = st.cfg.replanner->profile();
  try {
    for (auto& x : lt.samples) p.record(x.layer, x.kind, x.seconds);
    for (auto& m : lt.memory) p.record_memory(m.layer, m.weight_bytes, m.grad_bytes, m.scratch_bytes);
  } catch (const std::invalid_argument&) {
    // a sample the profile rejects (layer out of range, non-finite time) is dropped
  }
}

/// The answer now (done, or failed), else a promise kept until the ledger says done.
template <class Result>
caf::result<Result> answer(SchedPointer self, std::optional<Result> now,
                           std::map<int64_t, std::vector<caf::typed_response_promise<Result>>>& waiters,
                           int64_t key) {
  if (now) return *now;
  auto rp = self->make_response_promise<Result>();
  waiters[key].push_back(rp);
  return rp;
}

}  // namespace

SchedulerActor::behavior_type scheduler_impl(SchedPointer self, SchedulerConfig cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.ledger = std::make_unique<StepLedger>(ledger_options(st.cfg));
  st.plan = std::make_shared<const IterationPlan>(st.cfg.plan);
  st.last_change = Clock::now();
  if (st.cfg.watchdog_s > 0) self->send(self, WatchdogTick{});
  watch_failures(self);
  return {
      [=](SetPeers& p) {
        self->state.workers = std::move(p.workers);
        self->state.shards = std::move(p.shards);
        for (auto& w : self->state.workers) self->monitor(w);
        for (auto& s : self->state.shards) self->monitor(s);
      },
      [=](SubmitPass& sp) { on_submit(self, sp); },
      [=](CloseStepRequest& c) {
        on_ledger(self, [&](StepLedger& l, auto& out) { l.close_requested(c.step, c.lr, c.tokens, out); });
      },
      [=](StageDone& d) { on_stage_done(self, d); },
      [=](GradSumSq& g) {
        trace_received(self->state.cfg.tracer, "scheduler", "", "GradSumSq",
                       {{"step", g.step}, {"group", g.group}});
        on_ledger(self, [&](StepLedger& l, auto& out) { l.grad_sumsq(g.step, g.group, g.sumsq, out); });
      },
      [=](GroupUpdated& g) {
        progress(self).tick();
        trace_received(self->state.cfg.tracer, "scheduler", "", "GroupUpdated",
                       {{"step", g.step}, {"group", g.group}});
        on_ledger(self, [&](StepLedger& l, auto& out) { l.group_updated(g.step, g.group, g.sumsq, out); });
      },
      [=](LayerTimings& lt) { on_layer_timings(self, lt); },
      [=](GetRuntimeInfo) -> caf::result<RuntimeInfo> {
        auto& st = self->state;
        RuntimeInfo info;
        if (st.cfg.replanner) info.profile = st.cfg.replanner->profile();
        info.plan = *st.plan;
        info.replans = st.replans;
        info.replan_log = st.replan_log;
        return info;
      },
      [=](WaitStep& w) -> caf::result<StepResult> {
        return answer(self, self->state.ledger->step_result(w.step), self->state.step_waiters, w.step);
      },
      [=](WaitEval& w) -> caf::result<EvalResult> {
        return answer(self, self->state.ledger->eval_result(w.id), self->state.eval_waiters, w.id);
      },
      [=](Failure& f) { fail(self, f.what); },
      [=](WatchdogTick) { watchdog_tick(self); },
      [=](GetStatus) -> caf::result<StatusReport> {
        auto rp = self->make_response_promise<StatusReport>();
        gather_status(self, "", [rp](const std::string& line) mutable { rp.deliver(StatusReport{line}); });
        return rp;
      },
      [=](ResumeAt& r) -> caf::result<Ack> {
        if (!self->state.ledger->resume_at(r.step, r.loss_scales))
          return caf::make_error(caf::sec::invalid_argument);
        return Ack{};
      },
      [=](LossScalesFrom& q) -> caf::result<LossScales> {
        return LossScales{self->state.ledger->loss_scales_from(q.step)};
      },
      [=](Shutdown) {
        for (auto& w : self->state.workers) self->send(w, Shutdown{});
        for (auto& s : self->state.shards) self->send(s, Shutdown{});
        self->quit();
      },
  };
}

SchedulerActor spawn_scheduler(caf::actor_system& sys, SchedulerConfig cfg) {
  return sys.spawn(scheduler_impl, std::move(cfg));
}

}  // namespace rp
