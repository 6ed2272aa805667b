#include "actors/scheduler_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>

#include <fmt/format.h>

#include "actors/message_trace.hpp"
#include "actors/messages.hpp"
#include "model/layout.hpp"
#include "scheduler/group_plan.hpp"

namespace rp {
namespace {

using Clock = std::chrono::steady_clock;

struct StepInfo {
  int64_t passes_submitted = 0;
  int64_t passes_dealt = 0;
  int64_t train_passes_dealt = 0;  ///< of them, training passes (LoRA dropout masks are numbered by them)
  int64_t passes_done = 0;         ///< passes whose every stage reported StageDone
  bool close_requested = false;    ///< the Session closed the step (CloseStep waits for its last pass)
  double lr = 0;
  std::vector<int> uploads, grads;  ///< per group, over the passes dealt (their plans may differ)
  double tokens = 0;
  double scale_tokens =
      -1;  ///< CloseStepRequest::tokens: divide the gradient by this (replicas), < 0: tokens
  double norm_tokens() const { return scale_tokens >= 0 ? scale_tokens : tokens; }
  double loss_sum = 0, loss_count = 0;
  double aux_weighted = 0;            ///< sparse models: sum of (target tokens x load-balancing loss)
  std::vector<double> expert_tokens;  ///< sparse models: assignments per expert over the step
  int groups_updated = 0;
  bool closed = false, done = false;
  float loss_scale = 1.f;  ///< the scale every pass of the step runs its backward with
  StepDecision decision;   ///< guarded steps
  Clock::time_point t_first;
  double seconds = 0;
  std::vector<caf::typed_response_promise<StepResult>> waiters;
};

struct PassInfo {
  int64_t step = 0;
  int64_t eval = -1;  ///< >= 0: an evaluation pass
  int slot = 0;
  int stages_done = 0;
  int stages = 0;  ///< of the plan the pass was dealt with
};

struct EvalState {
  double loss_sum = 0, loss_count = 0;
  bool done = false;
  std::vector<caf::typed_response_promise<EvalResult>> waiters;
};

struct SchedState {
  std::map<int64_t, EvalState> evals;  ///< evaluation passes by id
  SchedulerConfig cfg;
  std::vector<WorkerActor> workers;
  std::vector<ShardActor> shards;
  std::vector<int> free_slots;
  std::deque<SubmitPass> pending;
  std::map<int64_t, PassInfo> passes;
  std::map<int64_t, StepInfo> steps;
  int64_t next_pass = 0;
  int64_t deal_pointer = 0;
  std::string failed;
  std::unique_ptr<StepNormReducer> norms;     ///< guarded steps: GradSumSq; unguarded: GroupUpdated's sums
  int trainable = 0;                          ///< groups a shard owns (not frozen)
  std::vector<int> norm_index;                ///< per group: its index among the trainable ones, -1 frozen
  std::shared_ptr<const IterationPlan> plan;  ///< the plan the next pass is dealt with
  int64_t replans = 0;
  std::vector<std::string> replan_log;
  /// Loss scaling: the scale of step t, known once step t-1-staleness is decided.
  std::map<int64_t, float> scale_for_step;
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

StepResult result_of(int64_t step, const StepInfo& s, const std::string& err) {
  StepResult r{step, s.loss_sum, s.loss_count, s.seconds, err};
  r.grad_norm = s.decision.grad_norm;
  r.skipped = s.decision.skip;
  r.loss_scale = s.loss_scale;
  r.moe_aux_loss = s.loss_count > 0 ? s.aux_weighted / s.loss_count : 0.0;
  r.expert_tokens = s.expert_tokens;
  return r;
}

/// The run fails with `what` (the first failure wins): every waiter gets it, now and later.
void fail(SchedPointer self, const std::string& what) {
  auto& st = self->state;
  if (!st.failed.empty()) return;
  st.failed = what;
  for (auto& [id, ev] : st.evals) {
    for (auto& w : ev.waiters) w.deliver(EvalResult{id, ev.loss_sum, ev.loss_count, st.failed});
    ev.waiters.clear();
  }
  for (auto& [k, si] : st.steps) {
    for (auto& w : si.waiters) w.deliver(result_of(k, si, st.failed));
    si.waiters.clear();
  }
}

/// Work in flight: passes submitted and not done, or steps closed and not applied.
bool busy(SchedPointer self) {
  auto& st = self->state;
  if (!st.pending.empty() || !st.passes.empty()) return true;
  for (auto& [k, si] : st.steps)
    if (si.close_requested && !si.done) return true;
  return false;
}

/// The scheduler's part of a status line: steps not applied, passes in flight or queued.
std::string describe_steps(SchedPointer self) {
  auto& st = self->state;
  std::vector<std::string> out;
  for (auto& [k, si] : st.steps) {
    if (si.done) continue;
    std::vector<std::string> passes;
    for (auto& [p, pi] : st.passes)
      if (pi.step == k)
        passes.push_back(fmt::format("pass {} {}/{} stages done", p, pi.stages_done, pi.stages));
    const int64_t queued = si.passes_submitted - si.passes_dealt;
    if (queued > 0)
      passes.push_back(fmt::format("{} pass(es) waiting for a pass slot or the step's loss scale", queued));
    out.push_back(fmt::format(
        "step {}{}: {}{}, {} of {} groups updated", k, si.close_requested ? "" : " (open)",
        passes.empty() ? std::string("all passes done") : fmt::format("{}", fmt::join(passes, ", ")),
        si.closed ? std::string() : std::string(" (not closed towards the shards yet)"), si.groups_updated,
        st.trainable));
  }
  if (!st.failed.empty()) out.push_back("failed: " + st.failed);
  return out.empty() ? "nothing in flight" : fmt::format("{}", fmt::join(out, "; "));
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
  g->parts.push_back(std::move(header) + describe_steps(self));
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
  if (count != st.last_progress || !busy(self) || !st.failed.empty()) {
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

}  // namespace

SchedulerActor::behavior_type scheduler_impl(SchedPointer self, SchedulerConfig cfg) {
  self->state.cfg = std::move(cfg);
  for (int g = 0; g < self->state.cfg.num_groups; ++g) {
    const bool frozen = size_t(g) < self->state.cfg.frozen.size() && self->state.cfg.frozen[size_t(g)];
    self->state.norm_index.push_back(frozen ? -1 : self->state.trainable++);
  }
  if (self->state.trainable > 0) self->state.norms = std::make_unique<StepNormReducer>(self->state.trainable);
  for (int i = int(self->state.cfg.pass_slots.size()) - 1; i >= 0; --i) self->state.free_slots.push_back(i);
  self->state.plan = std::make_shared<const IterationPlan>(self->state.cfg.plan);
  if (auto* ls = self->state.cfg.loss_scaler)
    for (int64_t t = 0; t <= self->state.cfg.staleness; ++t) self->state.scale_for_step[t] = ls->scale();
  self->state.last_change = Clock::now();
  if (self->state.cfg.watchdog_s > 0) self->send(self, WatchdogTick{});

  // An exception in a handler fails the run (every waiter hears of it) and ends the scheduler.
  self->set_exception_handler([self](std::exception_ptr& x) -> caf::error {
    const std::string what = "scheduler: " + exception_text(x);
    fail(self, what);
    return failure_reason(what);
  });
  // A worker or shard that goes down with an error fails the run.
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

  auto finish_step_if_done = [self](int64_t step) {
    auto& st = self->state;
    auto& si = st.steps[step];
    // every group updated, and every pass's StageDone in (the tail's carries the loss; its
    // StageDone may arrive after the last GroupUpdated it caused)
    if (si.done || !si.closed || si.groups_updated < st.trainable || si.passes_done < si.passes_submitted)
      return;
    si.done = true;
    si.seconds = std::chrono::duration<double>(Clock::now() - si.t_first).count();
    for (auto& w : si.waiters) w.deliver(result_of(step, si, ""));
    si.waiters.clear();
  };

  // CloseStep goes out once the Session closed the step and all its passes are dealt, so the
  // per-group counts (which depend on each pass's plan) are final.
  auto close_if_ready = [self, finish_step_if_done](int64_t step) {
    auto& st = self->state;
    auto& si = st.steps[step];
    if (si.closed || !si.close_requested || si.passes_dealt < si.passes_submitted) return;
    si.closed = true;
    // A step without target tokens has no gradient: it is skipped like an inf/NaN step (an
    // AdamW call with a zero gradient would still move the weights by momentum and decay).
    // grad_scale 0 tells the shards.
    const double tokens = si.norm_tokens();
    if (tokens <= 0) si.decision.skip = true;
    float scale = tokens > 0 ? float(1.0 / tokens) : 0.f;
    auto up = std::make_shared<const std::vector<int>>(si.uploads);
    auto gr = std::make_shared<const std::vector<int>>(si.grads);
    for (size_t k = 0; k < st.shards.size(); ++k) {
      trace_sent(st.cfg.tracer, "scheduler", fmt::format("shard{}", k), "CloseStep",
                 {{"step", step}, {"shard", int64_t(k)}});
      self->send(st.shards[k], CloseStep{step, si.passes_submitted, scale, si.lr, up, gr});
    }
    finish_step_if_done(step);
  };

  // Between passes: the Replanner may swap the plan (once, automatic plans only).
  auto plan_for_next_pass = [self] {
    auto& st = self->state;
    if (!st.cfg.replanner) return;
    auto d = st.cfg.replanner->poll(*st.plan, st.next_pass);
    if (!d) return;
    const std::string line = d->line();
    st.replan_log.push_back(line);
    if (st.cfg.log) st.cfg.log(line);
    if (d->changed) {
      st.plan = std::make_shared<const IterationPlan>(d->new_plan);
      st.replans++;
    }
  };

  auto dispatch = [self, close_if_ready, plan_for_next_pass] {
    auto& st = self->state;
    while (!st.pending.empty() && !st.free_slots.empty() && st.failed.empty()) {
      float loss_scale = 1.f;
      if (st.cfg.loss_scaler) {
        // the step's scale is decided with the outcome of step t-1-staleness
        auto sc = st.scale_for_step.find(st.pending.front().step);
        if (sc == st.scale_for_step.end()) break;
        loss_scale = sc->second;
      }
      SubmitPass sp = std::move(st.pending.front());
      st.pending.pop_front();
      int slot = st.free_slots.back();
      st.free_slots.pop_back();
      plan_for_next_pass();
      const auto plan_ptr =
          sp.eval >= 0 ? std::make_shared<const IterationPlan>(evaluation_plan(*st.plan)) : st.plan;
      const IterationPlan& plan = *plan_ptr;
      auto& pb = st.cfg.pass_slots[slot];
      try {
        pb->ensure_boundaries(*st.plan, st.cfg.on_new_host_buffer);
      } catch (const std::exception& e) {
        fail(self, std::string("scheduler: host buffers for the new plan: ") + e.what());
        return;
      }
      const size_t T = size_t(pb->shape.tokens());
      for (int64_t m = 0; m < pb->micro_batches; ++m) {
        std::memcpy(pb->ids[m].data(), sp.ids->data() + m * T, T * 4);
        std::memcpy(pb->targets[m].data(), sp.targets->data() + m * T, T * 4);
        if (sp.positions) std::memcpy(pb->positions[m].data(), sp.positions->data() + m * T, T * 4);
        pb->target_tokens[size_t(m)] = float(std::count_if(
            sp.targets->data() + m * T, sp.targets->data() + (m + 1) * T, [](int32_t t) { return t >= 0; }));
      }
      std::fill(pb->moe_stats.begin(), pb->moe_stats.end(), 0.0f);
      const int64_t pass = st.next_pass++;
      st.passes[pass] = PassInfo{sp.step, sp.eval, slot, 0, int(plan.stages.size())};
      auto& si = st.steps[sp.step];
      if (st.cfg.layout) {
        // an evaluation pass's uploads count with the step's (rule 5 waits for them), no gradients
        std::vector<int> up, gr;
        if (sp.eval >= 0) {
          up = evaluation_uploads(*st.cfg.layout, *st.plan);
          gr.assign(up.size(), 0);
        } else {
          count_per_pass(*st.cfg.layout, plan, up, gr);
        }
        si.uploads.resize(up.size(), 0);
        si.grads.resize(gr.size(), 0);
        for (size_t g = 0; g < up.size(); ++g) si.uploads[g] += up[g], si.grads[g] += gr[g];
      }
      si.passes_dealt++;
      const int64_t dropout_pass = sp.eval >= 0 ? -1 : (sp.step << 16) + si.train_passes_dealt++;
      si.loss_scale = loss_scale;
      auto who = deal_round_robin(plan, int(st.workers.size()), st.deal_pointer);
      for (size_t s = 0; s < plan.stages.size(); ++s) {
        RunStage rs;
        rs.pass = pass;
        rs.step = sp.step;
        rs.stage_index = int(s);
        rs.stage = plan.stages[s];
        rs.chain = rs.stage.kind == StageKind::forward ? -1 : int(s) - plan.num_forward();
        rs.buffers = pb;
        rs.loss_scale = si.loss_scale;
        rs.packed = sp.positions != nullptr;
        rs.eval = sp.eval >= 0;
        rs.dropout_pass = dropout_pass;
        if (s + 1 < plan.stages.size()) rs.next = st.workers[who[s + 1]];
        trace_sent(st.cfg.tracer, "scheduler", fmt::format("worker{}", who[s]), "RunStage",
                   {{"pass", pass}, {"stage", int64_t(s)}});
        self->send(st.workers[who[s]], std::move(rs));
      }
      close_if_ready(sp.step);
    }
  };

  return {
      [=](SetPeers& p) {
        auto& st = self->state;
        st.workers = std::move(p.workers);
        st.shards = std::move(p.shards);
        for (auto& w : st.workers) self->monitor(w);
        for (auto& s : st.shards) self->monitor(s);
      },
      [=](SubmitPass& sp) {
        auto& st = self->state;
        auto& si = st.steps[sp.step];
        if (si.passes_submitted == 0) si.t_first = Clock::now();
        si.passes_submitted++;
        if (sp.eval < 0)
          for (int32_t t : *sp.targets) si.tokens += t >= 0;
        else st.evals[sp.eval];
        st.pending.push_back(std::move(sp));
        dispatch();
      },
      [=](CloseStepRequest& c) {
        auto& si = self->state.steps[c.step];
        si.close_requested = true;
        si.lr = c.lr;
        si.scale_tokens = c.tokens;
        close_if_ready(c.step);
      },
      [=](StageDone& d) {
        auto& st = self->state;
        progress(self).tick();
        if (st.cfg.faults.fire_scheduler())
          throw std::runtime_error(FaultInjection::what("a StageDone handler"));
        trace_received(st.cfg.tracer, "scheduler", fmt::format("worker{}", d.worker), "StageDone",
                       {{"pass", d.pass}, {"stage", d.stage_index}});
        auto it = st.passes.find(d.pass);
        if (it == st.passes.end()) return;
        auto& si = st.steps[it->second.step];
        const int64_t eval = it->second.eval;
        if (eval >= 0) {
          st.evals[eval].loss_sum += d.loss_sum;
          st.evals[eval].loss_count += d.loss_count;
        } else {
          si.loss_sum += d.loss_sum;
          si.loss_count += d.loss_count;
          si.aux_weighted += d.aux_weighted;
          if (si.expert_tokens.size() < d.expert_tokens.size())
            si.expert_tokens.resize(d.expert_tokens.size(), 0.0);
          for (size_t e = 0; e < d.expert_tokens.size(); ++e) si.expert_tokens[e] += d.expert_tokens[e];
        }
        if (++it->second.stages_done == it->second.stages) {
          const int64_t step = it->second.step;
          if (eval >= 0) {
            auto& ev = st.evals[eval];
            ev.done = true;
            for (auto& w : ev.waiters) w.deliver(EvalResult{eval, ev.loss_sum, ev.loss_count, ""});
            ev.waiters.clear();
          }
          st.free_slots.push_back(it->second.slot);
          st.passes.erase(it);
          si.passes_done++;
          finish_step_if_done(step);
          dispatch();
        }
      },
      [=](GradSumSq& g) {
        auto& st = self->state;
        trace_received(st.cfg.tracer, "scheduler", "", "GradSumSq", {{"step", g.step}, {"group", g.group}});
        // summed in group order over the trainable groups (frozen ones send none)
        const int k =
            g.group >= 0 && size_t(g.group) < st.norm_index.size() ? st.norm_index[size_t(g.group)] : -1;
        if (!st.norms || !st.norms->add(g.step, k, g.sumsq)) return;
        // every group reported (only after CloseStep, so the token count is final)
        auto& si = st.steps[g.step];
        const double total = st.norms->take(g.step);
        const double tokens = si.norm_tokens();
        const double base = tokens > 0 ? 1.0 / tokens : 1.0;
        si.decision = decide_step(total, base, st.cfg.max_grad_norm, st.cfg.loss_scaler, si.loss_scale);
        if (tokens <= 0) si.decision.skip = true, si.decision.grad_scale = 0.f;
        for (size_t k = 0; k < st.shards.size(); ++k) {
          trace_sent(st.cfg.tracer, "scheduler", fmt::format("shard{}", k), "StepScale",
                     {{"step", g.step}, {"shard", int64_t(k)}});
          self->send(st.shards[k], StepScale{g.step, si.decision.skip, si.decision.grad_scale});
        }
        if (st.cfg.loss_scaler) {
          // decisions arrive in step order (a group's step t+1 sum follows its step t update)
          st.scale_for_step[g.step + 1 + st.cfg.staleness] = st.cfg.loss_scaler->scale();
          st.scale_for_step.erase(st.scale_for_step.begin(), st.scale_for_step.lower_bound(g.step));
          dispatch();
        }
      },
      [=](LayerTimings& lt) {
        auto& st = self->state;
        if (!st.cfg.replanner) return;
        Profile& p = st.cfg.replanner->profile();
        try {
          for (auto& x : lt.samples) p.record(x.layer, x.kind, x.seconds);
          for (auto& m : lt.memory) p.record_memory(m.layer, m.weight_bytes, m.grad_bytes, m.scratch_bytes);
        } catch (const std::invalid_argument&) {
          // a sample the profile rejects (layer out of range, non-finite time) is dropped
        }
      },
      [=](GetRuntimeInfo) -> caf::result<RuntimeInfo> {
        auto& st = self->state;
        RuntimeInfo info;
        if (st.cfg.replanner) info.profile = st.cfg.replanner->profile();
        info.plan = *st.plan;
        info.replans = st.replans;
        info.replan_log = st.replan_log;
        return info;
      },
      [=](GroupUpdated& g) {
        auto& st = self->state;
        progress(self).tick();
        trace_received(st.cfg.tracer, "scheduler", "", "GroupUpdated",
                       {{"step", g.step}, {"group", g.group}});
        auto& si = st.steps[g.step];
        si.groups_updated++;
        // unguarded steps: the global norm from the update jobs' sums, in group order (the
        // last group's update completes the step, so it is known before the step is done)
        const int k =
            g.group >= 0 && size_t(g.group) < st.norm_index.size() ? st.norm_index[size_t(g.group)] : -1;
        if (!st.cfg.guard && k >= 0 && st.norms && st.norms->add(g.step, k, g.sumsq)) {
          const double total = st.norms->take(g.step), tokens = si.norm_tokens();
          si.decision.grad_norm = std::sqrt(total) * (tokens > 0 ? 1.0 / tokens : 0.0);
        }
        finish_step_if_done(g.step);
      },
      [=](WaitStep& w) -> caf::result<StepResult> {
        auto& st = self->state;
        auto& si = st.steps[w.step];
        if (!st.failed.empty()) return result_of(w.step, si, st.failed);
        if (si.done) return result_of(w.step, si, "");
        auto rp = self->make_response_promise<StepResult>();
        si.waiters.push_back(rp);
        return rp;
      },
      [=](WaitEval& w) -> caf::result<EvalResult> {
        auto& st = self->state;
        auto& ev = st.evals[w.id];
        if (!st.failed.empty()) return EvalResult{w.id, ev.loss_sum, ev.loss_count, st.failed};
        if (ev.done) return EvalResult{w.id, ev.loss_sum, ev.loss_count, ""};
        auto rp = self->make_response_promise<EvalResult>();
        ev.waiters.push_back(rp);
        return rp;
      },
      [=](Failure& f) { fail(self, f.what); },
      [=](WatchdogTick) { watchdog_tick(self); },
      [=](GetStatus) -> caf::result<StatusReport> {
        auto rp = self->make_response_promise<StatusReport>();
        gather_status(self, "", [rp](const std::string& line) mutable { rp.deliver(StatusReport{line}); });
        return rp;
      },
      [=](ResumeAt& r) -> caf::result<Ack> {
        auto& st = self->state;
        if (!st.steps.empty() || st.next_pass != 0) return caf::make_error(caf::sec::invalid_argument);
        if (st.cfg.loss_scaler) {
          if (r.loss_scales.size() != size_t(st.cfg.staleness + 1))
            return caf::make_error(caf::sec::invalid_argument);
          st.scale_for_step.clear();
          for (size_t i = 0; i < r.loss_scales.size(); ++i)
            st.scale_for_step[r.step + int64_t(i)] = r.loss_scales[i];
        }
        return Ack{};
      },
      [=](LossScalesFrom& q) -> caf::result<LossScales> {
        LossScales out;
        auto& m = self->state.scale_for_step;
        for (int64_t t = q.step; t <= q.step + self->state.cfg.staleness; ++t) {
          auto it = m.find(t);
          if (it == m.end()) break;
          out.scales.push_back(it->second);
        }
        return out;
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
