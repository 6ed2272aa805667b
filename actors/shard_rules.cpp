#include "actors/shard_rules.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

std::string describe(const ShardJob& j) {
  switch (j.kind) {
    case ShardJob::Kind::cast: return fmt::format("cast of version {}", j.step);
    case ShardJob::Kind::sumsq: return fmt::format("sum of squares of step {}", j.step);
    case ShardJob::Kind::update: return fmt::format("AdamW update of step {}", j.step);
    case ShardJob::Kind::reduce: return fmt::format("sum over the replicas of step {}", j.step);
  }
  return "?";
}

ShardRules::ShardRules(const std::vector<Group>& groups, int staleness, bool guard, int disable_rule,
                       bool reduce)
    : s_(staleness), guard_(guard), off_(disable_rule), reduce_(reduce) {
  for (const Group& g : groups) groups_[g.group].g = g;
}

ShardRules::State& ShardRules::state(int g) {
  auto it = groups_.find(g);
  if (it == groups_.end()) throw std::logic_error(fmt::format("optimizer shard does not own group {}", g));
  return it->second;
}
const ShardRules::State& ShardRules::state(int g) const { return const_cast<ShardRules*>(this)->state(g); }

int64_t ShardRules::expected(const ClosedStep& c, bool uploads, const State& st) const {
  const auto& totals = uploads ? c.uploads : c.grads;
  const size_t g = size_t(st.g.group);
  if (totals && g < totals->size()) return (*totals)[g];
  return c.passes * (uploads ? st.g.uploads_per_pass : st.g.grads_per_pass);
}

void ShardRules::request_weights(int g, int64_t step, uint64_t ticket) {
  state(g).weight_waiters.push_back({step, ticket});
}
void ShardRules::weights_released(int g, int64_t step) { state(g).uploads_done[step] += 1; }
void ShardRules::request_grad_slot(int g, int64_t step, uint64_t ticket) {
  state(g).grad_waiters.push_back({step, ticket});
}
void ShardRules::grad_written(int g, int64_t step) {
  State& st = state(g);
  st.writer_active = false;
  st.grads_done[step] += 1;
}
void ShardRules::close_step(int64_t step, ClosedStep info) { closed_[step] = std::move(info); }

std::vector<int> ShardRules::scale_arrived(int64_t step, bool skip, float grad_scale) {
  scales_[step] = Scale{skip, grad_scale};
  std::vector<int> order;
  if (s_ > 0) order = std::move(completed_[step]);
  completed_.erase(completed_.begin(), completed_.upper_bound(step));
  for (auto& [g, st] : groups_)
    if (std::find(order.begin(), order.end(), g) == order.end()) order.push_back(g);
  return order;
}

void ShardRules::forget_scales(int64_t step) {
  int64_t oldest = step;
  for (auto& [g, st] : groups_) oldest = std::min(oldest, st.updated + 1);
  scales_.erase(scales_.begin(), scales_.lower_bound(oldest));
}

bool ShardRules::resume_at(int64_t step) {
  for (auto& [g, st] : groups_)
    if (st.updated != -1 || !st.uploads_done.empty() || !st.grads_done.empty() ||
        !st.weight_waiters.empty() || !st.grad_waiters.empty())
      return false;
  for (auto& [g, st] : groups_) {
    st.updated = step - 1;
    st.published = std::max<int64_t>(step - 1 - s_, -1);
    st.uploads_complete_through = step - 1;
    st.sumsq_sent = step - 1;
    st.reduced = step - 1;
  }
  return true;
}

void ShardRules::start_job(State& st, const ShardJob& j, std::vector<ShardAction>& out) {
  st.busy = true;
  st.job = j;
  ShardAction a;
  a.kind = ShardAction::Kind::run_job;
  a.group = st.g.group;
  a.step = j.step;
  a.job = j;
  out.push_back(a);
}

bool ShardRules::advance(State& st, bool& progress, std::vector<ShardAction>& out) {
  const int g = st.g.group;
  // uploads of iterations complete, in order
  for (;;) {
    const int64_t i = st.uploads_complete_through + 1;
    auto c = closed_.find(i);
    if (c == closed_.end() || st.uploads_done[i] < expected(c->second, true, st)) break;
    st.uploads_done.erase(i);
    st.uploads_complete_through = i;
    progress = true;
  }
  // rule 5: publish a waiting version
  if (st.published < st.updated && (off_ == 5 || st.uploads_complete_through >= st.updated + s_)) {
    start_job(st, ShardJob{ShardJob::Kind::cast, g, st.updated}, out);
    return false;
  }
  // rule 4: update when all gradient contributions of the next step are written
  const int64_t k = st.updated + 1;
  auto c = closed_.find(k);
  if (c == closed_.end() || st.published != st.updated) return true;
  if (off_ != 4 && (st.writer_active || st.grads_done[k] < expected(c->second, false, st))) return true;
  if (reduce_ && st.reduced < k) {
    // replicas: the gradient becomes the sum over every replica's passes first (all of
    // them run this job for step k, so the skip, the norm and the update agree)
    start_job(st, ShardJob{ShardJob::Kind::reduce, g, k}, out);
    return false;
  }
  float scale = c->second.grad_scale;
  bool skip = scale == 0.f;  // a step without target tokens: no gradient, nothing to update
  if (guard_) {
    // report this group's partial sum of squares once, then wait for the step's scalar
    if (st.sumsq_sent < k) {
      start_job(st, ShardJob{ShardJob::Kind::sumsq, g, k}, out);
      return false;
    }
    auto sc = scales_.find(k);
    if (sc == scales_.end()) return true;
    skip = sc->second.skip;
    scale = sc->second.grad_scale;
  }
  const bool may_publish = off_ == 5 || st.uploads_complete_through >= k + s_;
  if (skip) {
    // nothing changes: version k equals version k-1, which the copy already holds
    st.published = k;
    st.grads_done.erase(k);
    st.updated = k;
    out.push_back(ShardAction{ShardAction::Kind::group_updated, g, k});
    progress = true;
    return true;
  }
  ShardJob j{ShardJob::Kind::update, g, k, scale, c->second.lr, may_publish};
  start_job(st, j, out);
  return false;
}

void ShardRules::grant_weights(State& st, std::vector<ShardAction>& out) {
  const int g = st.g.group;
  // rule 1: grant every upload whose version is published (any arrival order)
  for (auto it = st.weight_waiters.begin(); it != st.weight_waiters.end();) {
    if (off_ == 1 || version_for(it->step) <= st.published) {
      out.push_back(ShardAction{ShardAction::Kind::grant_weights, g, it->step, it->ticket});
      it = st.weight_waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void ShardRules::grant(State& st, std::vector<ShardAction>& out) {
  const int g = st.g.group;
  grant_weights(st, out);
  // rule 3: one gradient writer at a time (the host half of rule 2), after the previous
  // step consumed the slot; the earliest step goes first whatever order the requests
  // arrived in. (The loop grants once: granting sets writer_active.)
  while (off_ == 2 || !st.writer_active) {
    auto best = st.grad_waiters.end();
    for (auto it = st.grad_waiters.begin(); it != st.grad_waiters.end(); ++it)
      if ((off_ == 3 || it->step - 1 <= st.updated) &&
          (best == st.grad_waiters.end() || it->step < best->step))
        best = it;
    if (best == st.grad_waiters.end()) break;
    const Waiter w = *best;
    st.grad_waiters.erase(best);
    st.writer_active = true;
    ShardAction a{ShardAction::Kind::grant_grad_slot, g, w.step, w.ticket};
    a.overwrite = st.grads_done[w.step] == 0;
    out.push_back(a);
  }
}

void ShardRules::pump(int g, std::vector<ShardAction>& out) {
  State& st = state(g);
  if (st.busy) {  // its job runs; job_done pumps it again
    // an upload reads only the low-precision copy: a job that leaves it alone (an update that
    // does not publish, a sum of squares, a replica sum) need not hold back a published version
    if (!writes_low_precision(st.job)) grant_weights(st, out);
    return;
  }
  bool progress = true;
  while (progress) {
    progress = false;
    if (!advance(st, progress, out)) return;
  }
  grant(st, out);
}

void ShardRules::job_done(int g, double sumsq, std::vector<ShardAction>& out) {
  State& st = state(g);
  if (!st.busy)
    throw std::logic_error(fmt::format("optimizer shard: group {} reported a job it did not run", g));
  st.busy = false;
  const ShardJob& j = st.job;
  switch (j.kind) {
    case ShardJob::Kind::cast: st.published = j.step; break;
    case ShardJob::Kind::sumsq: {
      ShardAction a{ShardAction::Kind::report_sumsq, g, j.step};
      a.sumsq = sumsq;
      out.push_back(a);
      st.sumsq_sent = j.step;
      completed_[j.step].push_back(g);  // the order the jobs finish in
      break;
    }
    case ShardJob::Kind::reduce: st.reduced = j.step; break;
    case ShardJob::Kind::update:
      if (j.publish) st.published = j.step;
      st.grads_done.erase(j.step);
      st.updated = j.step;
      out.push_back(ShardAction{ShardAction::Kind::group_updated, g, j.step});
      out.back().sumsq = sumsq;  // unguarded steps: the job's sum of squares of the gradient
      break;
  }
  pump(g, out);
}

std::vector<int> ShardRules::groups() const {
  std::vector<int> out;
  for (auto& [g, st] : groups_) out.push_back(g);
  return out;
}
int64_t ShardRules::published(int g) const { return state(g).published; }
int64_t ShardRules::updated(int g) const { return state(g).updated; }
bool ShardRules::busy(int g) const { return state(g).busy; }
bool ShardRules::has_waiters(int g) const {
  const State& st = state(g);
  return !st.weight_waiters.empty() || !st.grad_waiters.empty();
}

const ShardJob* ShardRules::running_job(int g) const {
  const State& st = state(g);
  return st.busy ? &st.job : nullptr;
}

const ShardJob* ShardRules::running_replica_sum(int g) const {
  const ShardJob* j = running_job(g);
  return j && j->kind == ShardJob::Kind::reduce ? j : nullptr;
}

std::string ShardRules::describe() const {
  std::vector<std::string> parts;
  for (auto& [g, st] : groups_) {
    std::vector<std::string> p;
    if (st.busy) p.push_back(rp::describe(st.job) + " running");
    const int64_t k = st.updated + 1;
    auto c = closed_.find(k);
    if (!st.busy && c != closed_.end()) {
      auto it = st.grads_done.find(k);
      const int64_t have = it == st.grads_done.end() ? 0 : it->second;
      const int64_t want = expected(c->second, false, st);
      if (st.published < st.updated)
        p.push_back(fmt::format("version {} waits for the uploads of iteration {}", st.updated,
                                st.uploads_complete_through + 1));
      else if (have < want || st.writer_active)
        p.push_back(fmt::format("step {} has {} of {} gradient contributions{}", k, have, want,
                                st.writer_active ? " (one being written)" : ""));
      else if (guard_ && !scales_.count(k))
        p.push_back(fmt::format("step {} waits for the scheduler's step scale", k));
    }
    for (const Waiter& w : st.weight_waiters)
      p.push_back(fmt::format("upload for iteration {} waits for version {} (published {})", w.step,
                              version_for(w.step), st.published));
    for (const Waiter& w : st.grad_waiters)
      p.push_back(
          fmt::format("gradient slot for step {} waits ({})", w.step,
                      st.writer_active ? "another writer" : fmt::format("step {} not applied", w.step - 1)));
    if (!p.empty()) parts.push_back(fmt::format("group {}: {}", g, fmt::join(p, ", ")));
  }
  return parts.empty() ? "idle" : fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace rp
