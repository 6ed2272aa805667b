#include "actors/optimizer_shard.hpp"

#include <deque>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "actors/messages.hpp"

namespace rp {
namespace {

struct GroupState {
  ShardGroup g;
  int64_t published = -1;  ///< version in the low-precision copy
  int64_t updated = -1;    ///< version in the fp32 master (= last step consumed)
  int64_t uploads_complete_through = -1;
  std::map<int64_t, int> uploads_done;  ///< per iteration
  std::map<int64_t, int> grads_done;    ///< per step
  bool writer_active = false;
  std::deque<std::pair<int64_t, caf::response_promise>> weight_waiters;
  std::deque<std::pair<int64_t, caf::response_promise>> grad_waiters;
};

struct StepInfo {
  int64_t passes = 0;
  float grad_scale = 1.f;
  double lr = 0;
};

struct ShardState {
  std::map<int, GroupState> groups;
  std::map<int64_t, StepInfo> closed;
  static inline const char* name = "optimizer_shard";
};

}  // namespace

caf::behavior shard_impl(caf::stateful_actor<ShardState>* self, std::vector<ShardGroup> groups,
                         ParamStore* store, ShardOptions opt, caf::actor scheduler) {
  for (auto& g : groups) self->state.groups[g.group].g = g;
  const int s = opt.staleness;
  const int off = opt.disable_rule;  // testing only: the rule whose guard is switched off
  auto version_for = [s](int64_t t) { return std::max<int64_t>(t - 1 - s, -1); };

  const int threads = std::max(1, opt.threads);
  auto cast_lowp = [store, threads](GroupState& gs) {
    const int64_t n = gs.g.master->size();
    const float* src = gs.g.master->data();
    char* dst = static_cast<char*>(store->lowp[gs.g.group].data());
    const size_t es = dtype_size(store->dtype);
    const int nt = int(std::min<int64_t>(threads, std::max<int64_t>(1, n >> 20)));
    auto part = [&](int i) {
      const int64_t a = n * i / nt, b = n * (i + 1) / nt;
      cast_f32_to(src + a, dst + a * es, b - a, store->dtype);
    };
    std::vector<std::thread> ts;
    for (int i = 1; i < nt; ++i) ts.emplace_back(part, i);
    part(0);
    for (auto& t : ts) t.join();
  };

  // Applies every transition of group `gs` that its state allows (see header).
  std::function<void(GroupState&)> pump = [=](GroupState& gs) {
    auto& closed = self->state.closed;
    bool progress = true;
    while (progress) {
      progress = false;
      // uploads of iterations complete, in order
      for (;;) {
        int64_t i = gs.uploads_complete_through + 1;
        auto c = closed.find(i);
        if (c == closed.end()) break;
        if (gs.uploads_done[i] < c->second.passes * gs.g.uploads_per_pass) break;
        gs.uploads_done.erase(i);
        gs.uploads_complete_through = i;
        progress = true;
      }
      // rule 5: publish a waiting version
      if (gs.published < gs.updated && (off == 5 || gs.uploads_complete_through >= gs.updated + s)) {
        cast_lowp(gs);
        gs.published = gs.updated;
        progress = true;
      }
      // rule 4: update when all gradient contributions of the next step are written
      int64_t k = gs.updated + 1;
      auto c = closed.find(k);
      if (c != closed.end() && gs.published == gs.updated &&
          (off == 4 || (!gs.writer_active && gs.grads_done[k] >= c->second.passes * gs.g.grads_per_pass))) {
        bool may_publish = gs.published == gs.updated && (off == 5 || gs.uploads_complete_through >= k + s);
        const int64_t n = gs.g.master->size();
        void* lowp = may_publish ? store->lowp[gs.g.group].data() : nullptr;
        adamw_update(gs.g.master->data(), *gs.g.state, store->grad[gs.g.group].as<float>(), n,
                     c->second.grad_scale, opt.adam, c->second.lr, lowp, store->dtype,
                     n >= (int64_t(1) << 20) ? threads : 1);
        gs.grads_done.erase(k);
        gs.updated = k;
        if (may_publish) gs.published = k;
        self->send(scheduler, GroupUpdated{k, gs.g.group});
        progress = true;
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

  auto group = [self](int g) -> GroupState& {
    auto it = self->state.groups.find(g);
    if (it == self->state.groups.end())
      throw std::logic_error(fmt::format("optimizer shard does not own group {}", g));
    return it->second;
  };

  return {
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
        self->state.closed[c.step] = StepInfo{c.passes, c.grad_scale, c.lr};
        for (auto& [g, gs] : self->state.groups) pump(gs);
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
