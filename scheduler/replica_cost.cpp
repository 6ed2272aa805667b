#include "scheduler/replica_cost.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace rp {

ReductionEstimate estimate_reduction(const std::vector<LayerCost>& costs, int64_t grad_elem_bytes, int nodes,
                                     double net_bytes_per_s, double latency_s, double iteration_s,
                                     int64_t passes, bool tied) {
  if (nodes < 1 || !(net_bytes_per_s > 0) || !(latency_s >= 0) || !(iteration_s > 0) || passes < 1 ||
      grad_elem_bytes < 1)
    throw std::invalid_argument(
        "estimate_reduction: nodes, passes >= 1 and bandwidth, iteration time > 0 expected");
  ReductionEstimate e;
  const double step = iteration_s * double(passes);
  e.step_sync_s = e.step_async_s = step;
  double total_bwd = 0;
  for (size_t i = 0; i < costs.size(); ++i) total_bwd += i + 1 == costs.size() ? costs[i].tail : costs[i].bwd;
  auto values_of = [&](size_t k) {
    double v = double(costs[k].grad_bytes);
    if (tied && k + 1 == costs.size() && k > 0) v -= double(costs[0].grad_bytes);
    return std::max(0.0, v) / double(grad_elem_bytes);
  };
  if (nodes == 1) {
    for (size_t k = 0; k < costs.size(); ++k) e.values += values_of(k);
    return e;
  }
  const double share = 2.0 * (nodes - 1) / nodes;
  double below = total_bwd;  // backward cost of the layers whose gradients are not complete yet
  double link_free = step - iteration_s, last_end = 0, worst_wait = 0;
  for (size_t k = costs.size(); k-- > 0;) {  // backward order: tail first, embedding last
    const LayerCost& c = costs[k];
    below -= k + 1 == costs.size() ? c.tail : c.bwd;
    const double values = values_of(k);
    if (values <= 0) continue;
    const double ready = step - (total_bwd > 0 ? iteration_s * below / total_bwd : 0.0);
    const double t = share * values * 4 / net_bytes_per_s + 2.0 * (nodes - 1) * latency_s;
    const double start = std::max(ready, link_free);
    link_free = last_end = start + t;
    worst_wait = std::max(worst_wait, last_end - ready);
    e.values += values;
    e.link_s += t;
  }
  e.bytes_per_node = share * e.values * 4;
  e.exposed_sync_s = std::max(0.0, last_end - step);
  e.exposed_async_s = std::max(0.0, std::max(e.link_s, worst_wait) - step);
  e.step_sync_s = step + e.exposed_sync_s;
  e.step_async_s = step + e.exposed_async_s;
  e.passes_to_hide =
      std::max<int64_t>(1, int64_t(std::ceil(std::max(e.link_s, worst_wait) / iteration_s - 1e-9)));
  return e;
}

}  // namespace rp
