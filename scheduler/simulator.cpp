#include "scheduler/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trace/chrome_trace.hpp"

namespace rp {

std::vector<StageCost> stage_costs(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                                   const PartitionOptions& opt) {
  std::vector<StageCost> out;
  for (const Stage& s : plan.stages) {
    StageEstimate e = estimate_stage(costs, s, opt);
    StageCost c;
    for (int l = s.first; l <= s.last; ++l) {
      const LayerCost& x = costs[size_t(l)];
      c.compute += s.kind == StageKind::forward ? x.fwd : s.kind == StageKind::backward ? x.bwd : x.tail;
    }
    c.act_up_bytes = e.act_up_bytes;
    c.act_down_bytes = e.act_down_bytes;
    c.param_bytes = e.weight_bytes;
    c.grad_bytes = e.grad_bytes;
    out.push_back(c);
  }
  return out;
}

double uniform_bubble_ratio(int gpus, int64_t micro_batches, int stages) {
  const double nn = double(gpus) * double(gpus - 1);
  return nn / (double(micro_batches) * double(stages) + nn);
}

namespace {

double xfer(int64_t bytes, double bw) { return bw > 0 ? double(bytes) / bw : 0.0; }

void check(const IterationPlan& plan, const std::vector<StageCost>& costs, const SimOptions& o) {
  validate_plan(plan, "simulate");
  if (costs.size() != plan.stages.size())
    throw std::invalid_argument(fmt::format("simulate: {} stage costs for a plan of {} stages", costs.size(),
                                            plan.stages.size()));
  auto opt = [](const char* k, bool ok) {
    if (!ok) throw std::invalid_argument(fmt::format("simulate: option '{}' out of range", k));
  };
  opt("gpus", o.gpus >= 1);
  opt("micro_batches", o.micro_batches >= 1);
  opt("iterations", o.iterations >= 0);
  opt("staleness", o.staleness == 0 || o.staleness == 1);
  opt("passes_in_flight", o.passes_in_flight >= 0);
  opt("weight_buffers", o.weight_buffers >= 1);
  opt("act_slots", o.act_slots >= 1);
  opt("pointer", o.pointer >= 0);
  opt("bandwidth", o.bandwidth.act_up >= 0 && o.bandwidth.act_down >= 0 && o.bandwidth.param_up >= 0 &&
                       o.bandwidth.grad_down >= 0);
  opt("optimizer_seconds", o.optimizer_seconds.empty() || int(o.optimizer_seconds.size()) == plan.num_layers);
  for (size_t i = 0; i < costs.size(); ++i) {
    const StageCost& c = costs[i];
    if (!std::isfinite(c.compute) || c.compute < 0 || c.act_up_bytes < 0 || c.act_down_bytes < 0 ||
        c.param_bytes < 0 || c.grad_bytes < 0)
      throw std::invalid_argument(fmt::format("simulate: stage {}: costs must be finite and >= 0", i));
  }
}

struct Gpu {
  double free[5] = {0, 0, 0, 0, 0};  // per SimInterval::Stream
  std::vector<double> comp_end, down_end;  // per unit (micro-batch computed), in order
  std::vector<double> task_finish;         // per task, in order
  double busy = 0;
};

}  // namespace

SimResult simulate(const IterationPlan& plan, const std::vector<StageCost>& costs, const SimOptions& o) {
  check(plan, costs, o);
  const int S = int(plan.stages.size()), G = o.gpus, L = plan.num_layers;
  const int cycle = G / std::gcd(S, G);
  const int iterations = o.iterations > 0 ? o.iterations : std::max(4, 2 * cycle + 2);
  const int64_t M = o.micro_batches;
  const auto& bw = o.bandwidth;
  std::vector<Gpu> gpus(static_cast<size_t>(G));
  // publish[t][l]: when iteration t's update of layer l is on the host
  std::vector<std::vector<double>> publish(size_t(iterations), std::vector<double>(size_t(L), 0.0));
  SimResult r;
  r.iteration_end.assign(size_t(iterations), 0.0);
  std::vector<double> prev_down(size_t(M), 0.0), cur_down(size_t(M), 0.0);
  auto record = [&](int g, SimInterval::Stream st, int t, int s, int64_t m, double a, double b) {
    if (o.record_timeline && b > a) r.timeline.push_back({g, st, t, s, m, a, b});
  };

  for (int t = 0; t < iterations; ++t) {
    const double admitted = o.passes_in_flight > 0 && t >= o.passes_in_flight
                                ? r.iteration_end[size_t(t - o.passes_in_flight)]
                                : 0.0;
    const int dep_iter = t - 1 - o.staleness;  // whose update the weights must include
    for (int s = 0; s < S; ++s) {
      const Stage& st = plan.stages[size_t(s)];
      const StageCost& c = costs[size_t(s)];
      const int g = int((o.pointer + int64_t(t) * S + s) % G);
      Gpu& gp = gpus[size_t(g)];
      const size_t k = gp.task_finish.size();  // this task's index on the GPU
      // parameters: a free buffer, the admitted pass, the updates they must contain
      double ready = admitted;
      if (k >= size_t(o.weight_buffers)) ready = std::max(ready, gp.task_finish[k - size_t(o.weight_buffers)]);
      if (dep_iter >= 0)
        for (int l = st.first; l <= st.last; ++l) ready = std::max(ready, publish[size_t(dep_iter)][size_t(l)]);
      const double p0 = std::max(gp.free[SimInterval::param_up], ready);
      const double p1 = p0 + xfer(c.param_bytes, bw.param_up);
      gp.free[SimInterval::param_up] = p1;
      record(g, SimInterval::param_up, t, s, -1, p0, p1);
      // without prefetch the whole task waits for the previous one (the current worker)
      const double gate = o.weight_buffers == 1 && k > 0 ? std::max(admitted, gp.task_finish[k - 1]) : admitted;
      for (int64_t m = 0; m < M; ++m) {
        const size_t u = gp.comp_end.size();
        const size_t slots = size_t(o.act_slots);
        double in = s > 0 ? prev_down[size_t(m)] : admitted;
        double u0 = std::max({gp.free[SimInterval::act_up], in, gate, u >= slots ? gp.comp_end[u - slots] : 0.0});
        double u1 = u0 + xfer(c.act_up_bytes, bw.act_up);
        gp.free[SimInterval::act_up] = u1;
        record(g, SimInterval::act_up, t, s, m, u0, u1);
        double c0 = std::max({gp.free[SimInterval::compute], u1, p1, u >= slots ? gp.down_end[u - slots] : 0.0});
        double c1 = c0 + c.compute;
        gp.free[SimInterval::compute] = c1;
        gp.busy += c.compute;
        record(g, SimInterval::compute, t, s, m, c0, c1);
        double d0 = std::max(gp.free[SimInterval::act_down], c1);
        double d1 = d0 + xfer(c.act_down_bytes, bw.act_down);
        gp.free[SimInterval::act_down] = d1;
        record(g, SimInterval::act_down, t, s, m, d0, d1);
        gp.comp_end.push_back(c1);
        gp.down_end.push_back(d1);
        cur_down[size_t(m)] = d1;
      }
      double finish = gp.down_end.back();
      if (st.kind != StageKind::forward) {
        const double g0 = std::max(gp.free[SimInterval::grad_down], finish);
        const double g1 = g0 + xfer(c.grad_bytes, bw.grad_down);
        gp.free[SimInterval::grad_down] = g1;
        record(g, SimInterval::grad_down, t, s, -1, g0, g1);
        finish = g1;
        for (int l = st.first; l <= st.last; ++l)
          publish[size_t(t)][size_t(l)] =
              g1 + (o.optimizer_seconds.empty() ? 0.0 : o.optimizer_seconds[size_t(l)]);
      }
      gp.task_finish.push_back(finish);
      r.iteration_end[size_t(t)] = std::max(r.iteration_end[size_t(t)], finish);
      std::swap(prev_down, cur_down);
    }
  }

  const int n = iterations;
  r.makespan = *std::max_element(r.iteration_end.begin(), r.iteration_end.end());
  r.first_iteration_seconds = r.iteration_end[0];
  if (n == 1) {
    r.iteration_seconds = r.makespan;
  } else {
    // average over the second half, in whole deal cycles when possible (the GPU that
    // starts an iteration repeats every `cycle` iterations)
    int span = (n - 1) / 2 / cycle * cycle;
    if (span == 0) span = n - 1 - std::max(0, n / 2 - 1);
    r.iteration_seconds =
        (r.iteration_end[size_t(n - 1)] - r.iteration_end[size_t(n - 1 - span)]) / double(span);
  }
  double busy = 0, work = 0;
  for (auto& gp : gpus) {
    r.gpu_busy.push_back(gp.busy);
    r.gpu_idle.push_back(r.makespan - gp.busy);
    busy += gp.busy;
  }
  for (auto& c : costs) work += double(M) * c.compute;
  r.bubble_ratio = r.makespan > 0 ? 1 - busy / (double(G) * r.makespan) : 0;
  // clamp rounding noise: whole deal cycles cannot take less than the work divided by G
  r.steady_bubble_ratio = r.iteration_seconds > 0 ? std::max(0.0, 1 - work / (double(G) * r.iteration_seconds)) : 0;
  return r;
}

double predict_iteration_seconds(const IterationPlan& plan, const std::vector<StageCost>& costs, int gpus,
                                 int64_t micro_batches, SimOptions base) {
  base.gpus = gpus;
  base.micro_batches = micro_batches;
  base.record_timeline = false;
  return simulate(plan, costs, base).iteration_seconds;
}

nlohmann::json sim_trace_json(const SimResult& r, const IterationPlan& plan) {
  static const char* stream_name[] = {"compute", "act_up", "act_down", "param_up", "grad_down"};
  std::vector<TraceInterval> iv;
  iv.reserve(r.timeline.size());
  for (auto& i : r.timeline) {
    const Stage& st = plan.stages.at(size_t(i.stage));
    const char c = st.kind == StageKind::forward ? 'F' : st.kind == StageKind::tail ? 'T' : 'B';
    std::string name = fmt::format("{}{} L{}-{}", c, i.stage, st.first, st.last);
    if (i.micro >= 0) name += fmt::format(" mb{}", i.micro);
    iv.push_back({fmt::format("gpu{}.{}", i.gpu, stream_name[int(i.stream)]), std::move(name), i.start, i.end,
                  {{"iteration", i.iteration}, {"stage", i.stage}, {"micro_batch", double(i.micro)}}});
  }
  return chrome_trace_json(iv);
}

void write_sim_trace(const std::string& path, const SimResult& r, const IterationPlan& plan) {
  write_trace_file(path, sim_trace_json(r, plan));
}

}  // namespace rp
