#include "scheduler/partition.hpp"

#include "kernels/device.hpp"
#include "scheduler/stage_memory.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

std::string format_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, unit[u]);
}

namespace {

constexpr int kInf = std::numeric_limits<int>::max() / 4;

// Sums over the layers of one stage (bytes as the device pool charges them: pool_bytes);
// everything else follows from the stage kind and `first`.
struct Sums {
  double compute = 0;
  int64_t w = 0, g = 0, act = 0, scratch = 0;
  int64_t up = 0;                  // weight bytes uploaded (frozen groups: their storage form)
  int64_t attn = 0, attn_raw = 0;  // saved attention outputs: as charged, and their bytes
  bool sparse = false;             // runs a sparse decoder: router statistics per slot
  int64_t fp8 = 0;                 // the layers' FP8 weight caches (forward or backward form), as charged
  int64_t disk = 0;                // frozen bytes read from the disk tier (LayerCost::disk_bytes)
};

// Constants of one problem.
struct Ctx {
  const PartitionOptions& opt;
  int n = 0;            // compute layers
  int64_t A = 0;        // boundary activation (max act_bytes over layers)
  int64_t ids = 0;      // token ids per micro-batch (layer 0's io_bytes)
  int64_t targets = 0;  // targets per micro-batch (last layer's io_bytes)
  int64_t act0 = 0;     // layer 0's activation (a backward stage uploads ids instead)
  int64_t w0 = 0;       // layer 0's weights as charged (a backward stage uploads none of them)
  int64_t up0 = 0;      // layer 0's weight bytes uploaded
  int64_t disk0 = 0;    // layer 0's disk reads (a backward stage reads none of them)
  int64_t stats = 0;  // a sparse decoder's router statistics per micro-batch (LayerCost::router_stats_bytes)
  // a layer's saved attention output and log-sum-exp buffers, as charged
  int64_t saved(const LayerCost& l) const {
    return l.attn_o_bytes > 0 ? P(l.attn_o_bytes) + P(l.attn_lse_bytes) : 0;
  }
  // a layer's weights on the device, as charged: its compute-dtype copy and, for frozen
  // groups, the staging buffer their storage form is uploaded into
  int64_t weights(const LayerCost& l) const {
    return P(l.weight_bytes) + (l.staging_bytes > 0 ? P(l.staging_bytes) : 0);
  }
  // bytes uploaded: the trainable weights (as charged, as the planner always counted them)
  // and the frozen groups' storage form
  int64_t uploaded(const LayerCost& l) const {
    const int64_t trainable = l.weight_bytes - l.frozen_weight_bytes;
    return (trainable > 0 ? P(trainable) : 0) + l.staging_bytes;
  }
  // gradient accumulators as charged: none for a layer of frozen groups only
  int64_t grads(const LayerCost& l) const { return l.grad_bytes > 0 ? P(l.grad_bytes) : 0; }
  // a layer's FP8 weight cache in a call of kind k, as charged (none without FP8 linears)
  int64_t fp8(const LayerCost& l, StageKind k) const {
    const int64_t b = k == StageKind::forward ? l.fp8_fwd_bytes : l.fp8_bwd_bytes;
    return b > 0 ? P(b) : 0;
  }
  int64_t P(int64_t bytes) const {
    return opt.alloc_granule <= 1 ? bytes
                                  : int64_t(pool_allocation_bytes(size_t(bytes), size_t(opt.alloc_granule)));
  }
};

// The buffers a worker allocates for a stage task (actors/stage_task.cpp: prepare, allocate_work,
// allocate_slot), each charged as the device pool charges it.
StageEstimate assemble(const Ctx& c, StageKind kind, int first, int last, const Sums& s) {
  const PartitionOptions& o = c.opt;
  const int64_t M = o.micro_batches;
  const int k = last - first + 1;
  StageEstimate e;
  e.stage = {kind, first, last};
  // the embedding's backward reads no weight (ModelLayout::groups_uploaded)
  e.weight_bytes = kind == StageKind::backward && first == 0 ? s.w - c.w0 : s.w;
  e.weight_upload_bytes = kind == StageKind::backward && first == 0 ? s.up - c.up0 : s.up;
  e.grad_bytes = kind == StageKind::forward ? 0 : s.g;
  e.disk_read_bytes = kind == StageKind::backward && first == 0 ? s.disk - c.disk0 : s.disk;
  int64_t slot_bytes = 0, kept = 0;  // kept: the slot's outputs a retired task still downloads
  if (first == 0) slot_bytes += c.P(c.ids);
  // a saved attention: forward stages write and download it, backward stages upload it, the
  // tail stage keeps its decoders' on the device
  slot_bytes += s.attn;
  if (s.sparse) slot_bytes += 2 * c.P(c.stats);  // router statistics: the uploaded copy and the summed one
  if (s.sparse && kind != StageKind::backward)
    kept += c.P(c.stats);  // the summed copy: forward and tail download it
  switch (kind) {
    case StageKind::forward:
      e.act_up_bytes = first == 0 ? c.ids : c.A;
      e.act_down_bytes = s.act + s.attn_raw;
      slot_bytes += s.act + (first > 0 ? c.P(c.A) : 0);  // outputs + the uploaded input
      kept += s.act + s.attn;                            // every output and saved attention
      break;
    case StageKind::backward:
      // dy, every saved input except the embedding's (which reads the ids), dx
      e.act_up_bytes = c.A + (first == 0 ? s.act - c.act0 + c.ids : s.act) + s.attn_raw;
      e.act_down_bytes = first == 0 ? 0 : c.A;
      slot_bytes += c.P(c.A) + s.act - (first == 0 ? c.P(c.act0) : 0) + (first > 0 ? c.P(c.A) : 0);
      kept = first > 0 ? c.P(c.A) : 0;  // dx
      break;
    case StageKind::tail:
      e.act_up_bytes = c.A + c.targets;
      e.act_down_bytes = c.A + 8;
      slot_bytes += s.act + c.P(c.targets) + c.P(8) + (first > 0 ? c.P(c.A) : 0);
      kept += c.P(8) + (first > 0 ? c.P(c.A) : 0);  // loss and dx
      break;
  }
  const int64_t slots = std::min<int64_t>(std::min<int64_t>(M, 2), o.act_slots);
  const int64_t tmp = stage_temporaries(kind, k) * c.P(c.A);
  e.work_bytes =
      e.weight_bytes + e.grad_bytes + slots * slot_bytes + tmp + (s.scratch > 0 ? c.P(s.scratch) : 0) + s.fp8;
  e.memory_bytes = e.work_bytes + (o.weight_buffers - 1) * e.weight_bytes;
  e.slot_bytes = slots > 0 ? slot_bytes : 0;
  e.retained_bytes = e.grad_bytes + (slots > 0 ? kept : 0);
  e.compute_seconds = double(M) * s.compute;
  if (o.pcie_bandwidth > 0) {
    e.upload_seconds =
        (double(e.weight_upload_bytes) + double(M) * double(e.act_up_bytes)) / o.pcie_bandwidth;
    e.download_seconds = (double(e.grad_bytes) + double(M) * double(e.act_down_bytes)) / o.pcie_bandwidth;
  }
  if (o.disk_bandwidth > 0) e.disk_seconds = double(e.disk_read_bytes) / o.disk_bandwidth;
  e.seconds = std::max({e.compute_seconds, e.upload_seconds, e.download_seconds, e.disk_seconds});
  return e;
}

double cost_of(const LayerCost& l, StageKind k) {
  return k == StageKind::forward ? l.fwd : k == StageKind::backward ? l.bwd : l.tail;
}

void check_inputs(const std::vector<LayerCost>& costs, const PartitionOptions& o) {
  if (costs.size() < 3)
    throw std::invalid_argument(
        fmt::format("partition: a model needs at least 3 compute layers, got {}", costs.size()));
  if (o.gpus < 1) throw std::invalid_argument(fmt::format("partition: gpus must be >= 1, got {}", o.gpus));
  if (o.micro_batches < 1)
    throw std::invalid_argument(
        fmt::format("partition: micro_batches must be >= 1, got {}", o.micro_batches));
  if (o.memory_cap < 0 || !(o.pcie_bandwidth >= 0) || !(o.disk_bandwidth >= 0) || o.weight_buffers < 1 ||
      o.act_slots < 1)
    throw std::invalid_argument(
        "partition: memory_cap, pcie_bandwidth and disk_bandwidth must be >= 0, weight_buffers and "
        "act_slots >= 1");
  for (size_t i = 0; i < costs.size(); ++i) {
    const LayerCost& l = costs[i];
    for (double t : {l.fwd, l.bwd, l.tail})
      if (!std::isfinite(t) || t < 0)
        throw std::invalid_argument(fmt::format("partition: layer {}: times must be finite and >= 0", i));
    if (l.weight_bytes < 0 || l.grad_bytes < 0 || l.act_bytes < 0 || l.scratch_bytes < 0 || l.io_bytes < 0 ||
        l.router_stats_bytes < 0 || l.disk_bytes < 0)
      throw std::invalid_argument(fmt::format("partition: layer {}: byte counts must be >= 0", i));
  }
}

Ctx make_ctx(const std::vector<LayerCost>& costs, const PartitionOptions& o) {
  Ctx c{o};
  c.n = int(costs.size());
  for (auto& l : costs) c.A = std::max(c.A, l.act_bytes);
  c.ids = costs.front().io_bytes;
  c.targets = costs.back().io_bytes;
  c.act0 = costs.front().act_bytes;
  c.w0 = c.weights(costs.front());
  c.up0 = c.uploaded(costs.front());
  c.disk0 = costs.front().disk_bytes;
  for (auto& l : costs) c.stats = std::max(c.stats, l.router_stats_bytes);
  return c;
}

std::string layer_name(int l, int n) {
  if (l == 0) return "layer 0 (embedding)";
  if (l == n - 1) return fmt::format("layer {} (tail)", l);
  return fmt::format("layer {} (decoder {})", l, l - 1);
}

// The parts of a stage's memory. `prefetch`: the total counts room for the next stage's weights
// beside the working set (StageEstimate::memory_bytes), else the working set alone (work_bytes).
std::string memory_breakdown(const StageEstimate& e, const PartitionOptions& o, bool prefetch) {
  const int64_t room = prefetch ? int64_t(o.weight_buffers - 1) * e.weight_bytes : 0;
  return fmt::format(
      "weights {}{}, gradients {}, scratch and activations {}", format_bytes(double(e.weight_bytes)),
      room > 0
          ? fmt::format(" plus {} of room to prefetch the next stage's weights", format_bytes(double(room)))
          : "",
      format_bytes(double(e.grad_bytes)), format_bytes(double(e.work_bytes - e.weight_bytes - e.grad_bytes)));
}

// Prefix sums, so that any stage is evaluated in O(1).
struct Prefix {
  const Ctx& c;
  std::vector<double> cf, cb, ct;
  std::vector<int64_t> w, g, act, attn, attn_raw, up, disk;
  std::vector<int64_t> fp8[2];               // FP8 weight caches: backward / tail form, forward form
  std::vector<int> sparse;                   // sparse decoders (router_stats_bytes > 0) before each layer
  std::vector<std::vector<int64_t>> scr[2];  // sparse tables of scratch maxima: backward, forward
  Prefix(const Ctx& ctx, const std::vector<LayerCost>& costs) : c(ctx) {
    const size_t n = costs.size();
    cf.assign(n + 1, 0), cb.assign(n + 1, 0), ct.assign(n + 1, 0);
    w.assign(n + 1, 0), g.assign(n + 1, 0), up.assign(n + 1, 0), act.assign(n + 1, 0), attn.assign(n + 1, 0),
        attn_raw.assign(n + 1, 0), disk.assign(n + 1, 0);
    sparse.assign(n + 1, 0);
    fp8[0].assign(n + 1, 0), fp8[1].assign(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      fp8[0][i + 1] = fp8[0][i] + c.fp8(costs[i], StageKind::backward);
      fp8[1][i + 1] = fp8[1][i] + c.fp8(costs[i], StageKind::forward);
      cf[i + 1] = cf[i] + costs[i].fwd;
      cb[i + 1] = cb[i] + costs[i].bwd;
      ct[i + 1] = ct[i] + costs[i].tail;
      w[i + 1] = w[i] + c.weights(costs[i]);
      up[i + 1] = up[i] + c.uploaded(costs[i]);
      g[i + 1] = g[i] + c.grads(costs[i]);
      act[i + 1] = act[i] + c.P(costs[i].act_bytes);
      attn[i + 1] = attn[i] + c.saved(costs[i]);
      attn_raw[i + 1] = attn_raw[i] + costs[i].attn_o_bytes + costs[i].attn_lse_bytes;
      sparse[i + 1] = sparse[i] + (costs[i].router_stats_bytes > 0);
      disk[i + 1] = disk[i] + costs[i].disk_bytes;
    }
    for (int fwd = 0; fwd < 2; ++fwd) {
      auto& t = scr[fwd];
      t.emplace_back();
      for (auto& l : costs) t[0].push_back(fwd ? l.scratch_fwd_bytes : l.scratch_bytes);
      for (size_t k = 1; (size_t(1) << k) <= n; ++k) {
        t.emplace_back(n - (size_t(1) << k) + 1);
        for (size_t i = 0; i + (size_t(1) << k) <= n; ++i)
          t[k][i] = std::max(t[k - 1][i], t[k - 1][i + (size_t(1) << (k - 1))]);
      }
    }
  }
  int64_t max_scratch(StageKind kind, int a, int b) const {
    const auto& t = scr[kind == StageKind::forward ? 1 : 0];
    int k = 31 - __builtin_clz(unsigned(b - a + 1));
    return std::max(t[size_t(k)][size_t(a)], t[size_t(k)][size_t(b - (1 << k) + 1)]);
  }
  StageEstimate eval(StageKind k, int a, int b) const {
    Sums s;
    const auto& pc = k == StageKind::forward ? cf : k == StageKind::backward ? cb : ct;
    s.compute = pc[size_t(b) + 1] - pc[size_t(a)];
    s.w = w[size_t(b) + 1] - w[size_t(a)];
    s.g = g[size_t(b) + 1] - g[size_t(a)];
    s.up = up[size_t(b) + 1] - up[size_t(a)];
    s.act = act[size_t(b) + 1] - act[size_t(a)];
    s.attn = attn[size_t(b) + 1] - attn[size_t(a)];
    s.attn_raw = attn_raw[size_t(b) + 1] - attn_raw[size_t(a)];
    s.scratch = max_scratch(k, a, b);
    s.sparse = sparse[size_t(b) + 1] > sparse[size_t(a)];
    const auto& f8 = fp8[k == StageKind::forward ? 1 : 0];
    s.fp8 = f8[size_t(b) + 1] - f8[size_t(a)];
    s.disk = disk[size_t(b) + 1] - disk[size_t(a)];
    return assemble(c, k, a, b, s);
  }
};

// Fewest stages covering layers 0..a-1 of one pass with every tau <= T and mem <= cap
// (greedy: each stage takes as many layers as fit). kInf when a single layer does not fit.
struct Packing {
  int stages = 0;
  double tmax = 0;
  std::vector<int> ends;  // last layer of each stage (only when asked for)
};

bool fits(const StageEstimate& e, double T, int64_t cap) {
  return e.seconds <= T && (cap <= 0 || e.memory_bytes <= cap);
}

Packing pack(const Prefix& p, StageKind k, int a, double T, int64_t cap, bool keep) {
  Packing r;
  int i = 0;
  while (i < a) {
    StageEstimate e = p.eval(k, i, i);
    if (!fits(e, T, cap)) return {kInf, 0, {}};
    int j = i;
    double t = e.seconds;
    while (j + 1 < a) {
      StageEstimate f = p.eval(k, i, j + 1);
      if (!fits(f, T, cap)) break;
      ++j;
      t = f.seconds;
    }
    r.stages++;
    r.tmax = std::max(r.tmax, t);
    if (keep) r.ends.push_back(j);
    i = j + 1;
  }
  return r;
}

struct Eval {
  int stages = kInf;
  double tmax = 0;
  int tail_first = 0;
};

Eval evaluate(const Prefix& p, double T, int64_t cap, int64_t& counter) {
  ++counter;
  const int n = p.c.n;
  // smallest tail start that fits (fits for a implies fits for a + 1)
  int lo = 1, hi = n - 1;
  if (!fits(p.eval(StageKind::tail, hi, n - 1), T, cap)) return {};
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (fits(p.eval(StageKind::tail, mid, n - 1), T, cap)) hi = mid;
    else lo = mid + 1;
  }
  const int a = lo;
  Packing f = pack(p, StageKind::forward, a, T, cap, false);
  if (f.stages >= kInf) return {};
  Packing b = pack(p, StageKind::backward, a, T, cap, false);
  if (b.stages >= kInf) return {};
  Eval e;
  e.stages = 1 + f.stages + b.stages;
  e.tmax = std::max({f.tmax, b.tmax, p.eval(StageKind::tail, a, n - 1).seconds});
  e.tail_first = a;
  return e;
}

// Why nothing fits, naming the layer. Called when no plan exists at an unbounded T.
[[noreturn]] void explain_infeasible(const Prefix& p, const PartitionOptions& o) {
  const int n = p.c.n;
  const double inf = std::numeric_limits<double>::infinity();
  int a = -1;
  for (int t = n - 1; t >= 1 && fits(p.eval(StageKind::tail, t, n - 1), inf, o.memory_cap); --t) a = t;
  if (a < 0) {
    StageEstimate e = p.eval(StageKind::tail, n - 1, n - 1);
    throw std::runtime_error(
        fmt::format("{} needs {} as the tail stage on its own ({}), over the memory cap {}",
                    layer_name(n - 1, n), format_bytes(double(e.memory_bytes)), memory_breakdown(e, o, true),
                    format_bytes(double(o.memory_cap))));
  }
  for (int l = 0; l < a; ++l)
    for (StageKind k : {StageKind::forward, StageKind::backward}) {
      StageEstimate e = p.eval(k, l, l);
      if (!fits(e, inf, o.memory_cap))
        throw std::runtime_error(
            fmt::format("{} needs {} as a {} stage on its own ({}), over the memory cap {}", layer_name(l, n),
                        format_bytes(double(e.memory_bytes)), stage_kind_name(k),
                        memory_breakdown(e, o, true), format_bytes(double(o.memory_cap))));
    }
  throw std::runtime_error("partition: no plan fits the memory cap");  // not reached
}

}  // namespace

StageEstimate estimate_stage(const std::vector<LayerCost>& costs, const Stage& st,
                             const PartitionOptions& opt) {
  const int n = int(costs.size());
  if (st.first < 0 || st.last >= n || st.first > st.last)
    throw std::invalid_argument(fmt::format("stage {}-{} outside layers 0..{}", st.first, st.last, n - 1));
  Ctx c = make_ctx(costs, opt);
  Sums s;
  for (int l = st.first; l <= st.last; ++l) {
    const LayerCost& x = costs[size_t(l)];
    s.compute += cost_of(x, st.kind);
    s.w += c.weights(x);
    s.up += c.uploaded(x);
    s.g += c.grads(x);
    s.act += c.P(x.act_bytes);
    s.attn += c.saved(x);
    s.attn_raw += x.attn_o_bytes + x.attn_lse_bytes;
    s.scratch = std::max(s.scratch, st.kind == StageKind::forward ? x.scratch_fwd_bytes : x.scratch_bytes);
    s.sparse = s.sparse || x.router_stats_bytes > 0;
    s.fp8 += c.fp8(x, st.kind);
    s.disk += x.disk_bytes;
  }
  return assemble(c, st.kind, st.first, st.last, s);
}

std::vector<StageEstimate> check_plan(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                                      const PartitionOptions& opt, const std::string& where) {
  validate_plan(plan, where);
  if (plan.num_layers != int(costs.size()))
    throw std::invalid_argument(
        fmt::format("{}: the plan has {} layers, the model {}", where, plan.num_layers, costs.size()));
  std::vector<StageEstimate> out;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const Stage& s = plan.stages[i];
    StageEstimate e = estimate_stage(costs, s, opt);
    if (opt.memory_cap > 0 && e.work_bytes > opt.memory_cap)
      throw std::invalid_argument(fmt::format("{}: stage {} {} needs {} ({}), over the memory cap {}", where,
                                              i, s.label(), format_bytes(double(e.work_bytes)),
                                              memory_breakdown(e, opt, false),
                                              format_bytes(double(opt.memory_cap))));
    out.push_back(e);
  }
  return out;
}

PartitionResult plan_result(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                            const PartitionOptions& opt, const std::string& where) {
  PartitionResult r;
  r.plan = plan;
  r.stages = check_plan(costs, plan, opt, where);
  for (const StageEstimate& e : r.stages) r.tmax = std::max(r.tmax, e.seconds);
  r.objective = plan_objective(r.stages, opt.gpus);
  return r;
}

double plan_objective(const std::vector<StageEstimate>& stages, int gpus) {
  double tmax = 0;
  for (auto& s : stages) tmax = std::max(tmax, s.seconds);
  return double(std::max<int64_t>(int64_t(stages.size()), gpus)) * tmax;
}

namespace {

PartitionResult partition_once(const std::vector<LayerCost>& costs, const PartitionOptions& opt) {
  const Ctx ctx = make_ctx(costs, opt);
  const Prefix p(ctx, costs);
  const int n = ctx.n;
  const int64_t cap = opt.memory_cap;
  PartitionResult res;

  // Candidate tmax values: tau of every memory-feasible run of consecutive layers.
  std::vector<double> cand;
  cand.reserve(size_t(n) * size_t(n) + size_t(n));
  for (StageKind k : {StageKind::forward, StageKind::backward})
    for (int a = 0; a + 1 < n; ++a)
      for (int b = a; b + 1 < n; ++b) {
        StageEstimate e = p.eval(k, a, b);
        if (cap > 0 && e.memory_bytes > cap) break;  // memory only grows with b
        cand.push_back(e.seconds);
      }
  for (int a = n - 1; a >= 1; --a) {
    StageEstimate e = p.eval(StageKind::tail, a, n - 1);
    if (cap > 0 && e.memory_bytes > cap) break;  // memory only grows as a decreases
    cand.push_back(e.seconds);
  }
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  res.candidates = int64_t(cand.size());

  std::vector<Eval> memo(cand.size());
  std::vector<char> done(cand.size(), 0);
  auto at = [&](size_t i) -> const Eval& {
    if (!done[i]) memo[i] = evaluate(p, cand[i], cap, res.evaluations), done[i] = 1;
    return memo[i];
  };
  if (cand.empty() || at(cand.size() - 1).stages >= kInf) explain_infeasible(p, opt);

  // For each reachable stage count s (increasing), the smallest candidate reaching it.
  const int G = opt.gpus;
  double best = std::numeric_limits<double>::infinity();
  size_t best_i = cand.size() - 1;
  size_t hi = cand.size() - 1;  // S(cand[hi]) is the current target
  while (true) {
    const int s = at(hi).stages;
    size_t lo = 0, h = hi;  // smallest i in [0, hi] with S(cand[i]) <= s
    while (lo < h) {
      size_t mid = (lo + h) / 2;
      if (at(mid).stages <= s) h = mid;
      else lo = mid + 1;
    }
    const Eval& e = at(lo);
    const double obj = double(std::max(e.stages, G)) * e.tmax;
    if (obj < best * (1 - 1e-12)) best = obj, best_i = lo;
    if (lo == 0 || at(lo - 1).stages >= kInf) break;
    hi = lo - 1;                                                      // more stages, smaller tmax
    if (double(std::max(at(hi).stages, G)) * cand[0] >= best) break;  // cannot win any more
  }

  // Rebuild the winning plan.
  const double T = cand[best_i];
  const int a = at(best_i).tail_first;
  Packing f = pack(p, StageKind::forward, a, T, cap, true);
  Packing b = pack(p, StageKind::backward, a, T, cap, true);
  IterationPlan& plan = res.plan;
  plan.num_layers = n;
  int first = 0;
  for (int e : f.ends) plan.stages.push_back({StageKind::forward, first, e}), first = e + 1;
  plan.stages.push_back({StageKind::tail, a, n - 1});
  std::vector<Stage> back;
  first = 0;
  for (int e : b.ends) back.push_back({StageKind::backward, first, e}), first = e + 1;
  plan.stages.insert(plan.stages.end(), back.rbegin(), back.rend());
  validate_plan(plan, "partition");
  for (auto& s : plan.stages) res.stages.push_back(estimate_stage(costs, s, opt));
  for (auto& s : res.stages) res.tmax = std::max(res.tmax, s.seconds);
  res.objective = plan_objective(res.stages, G);
  return res;
}

}  // namespace

PartitionResult partition(const std::vector<LayerCost>& costs, const PartitionOptions& opt) {
  check_inputs(costs, opt);
  return partition_once(costs, opt);
}

}  // namespace rp
