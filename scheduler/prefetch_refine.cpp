#include "scheduler/prefetch_refine.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "scheduler/stage_peak.hpp"

namespace rp {

namespace {

// Candidates simulated per round at most: a deep model under a tight cap may refuse many
// switches, and each candidate is one replay of the schedule.
constexpr size_t kMaxCandidatesPerRound = 96;

// Replay work all candidates may take together, in stage tasks x micro-batches simulated: the
// 1.7B's whole search is ~0.1M; 110 stages on 64 GPUs cost 0.46M a replay (0.13 s on a 2-core
// VM), so a deep plan on a large pool tries its first candidates only (about half a second)
// instead of most of a minute, and `roundpipe plan`'s host-memory advice, which plans several
// variants, stays within seconds.
constexpr double kReplayBudget = 2e6;

// Layers moved across one boundary at most per candidate.
constexpr int kMaxMove = 8;

bool movable(const Stage& s) { return s.kind != StageKind::tail; }

// `p` with k layers of stage i given to its neighbour j (adjacent in plan order, same pass), or
// nullopt when i would be left empty.
std::optional<IterationPlan> moved(const IterationPlan& p, size_t i, size_t j, int k) {
  Stage a = p.stages[i], b = p.stages[j];
  if (k >= a.num_layers()) return std::nullopt;
  if (b.first > a.last) {  // b holds the layers above a's
    a.last -= k;
    b.first -= k;
  } else {
    a.first += k;
    b.last += k;
  }
  IterationPlan q = p;
  q.stages[i] = a;
  q.stages[j] = b;
  return q;
}

// `p` with stage i cut into two: its k lowest layers and the rest, in the pass's order.
IterationPlan split(const IterationPlan& p, size_t i, int k) {
  const Stage s = p.stages[i];
  const Stage lower{s.kind, s.first, s.first + k - 1}, upper{s.kind, s.first + k, s.last};
  IterationPlan q = p;
  q.stages[i] = s.kind == StageKind::forward ? lower : upper;
  q.stages.insert(q.stages.begin() + std::ptrdiff_t(i) + 1, s.kind == StageKind::forward ? upper : lower);
  return q;
}

// The plans one move away at the switch into stage t: stage t's predecessor on its GPU gives
// layers away or is split, or stage t does.
void candidates_at(const IterationPlan& p, int t, int gpus, std::vector<IterationPlan>& out) {
  const int S = int(p.stages.size());
  const int prev = ((t - gpus) % S + S) % S;
  for (int x : {prev, t}) {
    const Stage& s = p.stages[size_t(x)];
    if (!movable(s)) continue;
    for (int j : {x - 1, x + 1}) {
      if (j < 0 || j >= S || p.stages[size_t(j)].kind != s.kind) continue;
      for (int k = 1; k <= std::min(kMaxMove, s.num_layers() - 1); ++k)
        if (auto q = moved(p, size_t(x), size_t(j), k)) out.push_back(std::move(*q));
    }
    for (int k = 1; k < s.num_layers(); ++k) out.push_back(split(p, size_t(x), k));
  }
}

struct Scored {
  PartitionResult r;
  double seconds = 0;
};

// The plan's estimates and predicted iteration time, or nullopt when a stage is over the cap.
std::optional<Scored> score(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                            const PartitionOptions& opt, const SimOptions& sim) {
  Scored s;
  try {
    s.r = plan_result(costs, plan, opt, "refine_for_prefetch");
  } catch (const std::invalid_argument&) {
    return std::nullopt;  // a stage's working set over the cap
  }
  for (const StageEstimate& e : s.r.stages)
    if (opt.memory_cap > 0 && e.memory_bytes > opt.memory_cap) return std::nullopt;
  s.seconds = simulate(plan, stage_costs(costs, plan, opt), sim).iteration_seconds;
  return s;
}

}  // namespace

SimOptions refine_sim_options(const PartitionOptions& opt) {
  SimOptions s;
  s.gpus = opt.gpus;
  s.micro_batches = opt.micro_batches;
  s.weight_buffers = opt.weight_buffers;
  s.act_slots = opt.act_slots;
  s.bandwidth = StreamBandwidths::uniform(opt.pcie_bandwidth);
  return s;
}

PartitionResult refine_for_prefetch(const std::vector<LayerCost>& costs, PartitionResult r,
                                    const PartitionOptions& opt, SimOptions sim) {
  if (opt.memory_cap <= 0 || r.stages.empty()) return r;
  sim.gpus = opt.gpus;
  sim.micro_batches = opt.micro_batches;
  std::optional<Scored> cur = score(costs, r.plan, opt, sim);
  if (!cur) return r;  // a plan over the cap is not this function's to mend
  double budget = kReplayBudget;
  auto replay_cost = [&](const IterationPlan& p) {
    const int S = int(p.stages.size());
    return double(S) * double(sim.iterations > 0 ? sim.iterations : default_iterations(S, opt.gpus)) *
           double(opt.micro_batches);
  };
  for (int round = 0; round < kPrefetchRefineRounds && budget > 0; ++round) {
    const std::vector<char> refused = prefetch_refused(cur->r.stages, opt);
    std::vector<IterationPlan> cands;
    for (size_t t = 0; t < refused.size() && cands.size() < kMaxCandidatesPerRound; ++t)
      if (refused[t]) candidates_at(cur->r.plan, int(t), opt.gpus, cands);
    if (cands.size() > kMaxCandidatesPerRound) cands.resize(kMaxCandidatesPerRound);
    std::optional<Scored> best;
    for (const IterationPlan& c : cands) {
      if ((budget -= replay_cost(c)) < 0) break;
      std::optional<Scored> s = score(costs, c, opt, sim);
      if (!s) continue;
      // fastest; among equal times the fewer stages (each switch costs the worker a few
      // milliseconds the simulator leaves out), then the smaller objective
      if (!best || s->seconds < best->seconds * (1 - 1e-9) ||
          (s->seconds <= best->seconds * (1 + 1e-9) &&
           std::pair(s->r.plan.stages.size(), s->r.objective) <
               std::pair(best->r.plan.stages.size(), best->r.objective)))
        best = std::move(s);
    }
    if (!best || best->seconds >= cur->seconds * (1 - kPrefetchRefineMinGain)) break;
    cur = std::move(best);
  }
  cur->r.candidates = r.candidates;
  cur->r.evaluations = r.evaluations;
  return std::move(cur->r);
}

}  // namespace rp
