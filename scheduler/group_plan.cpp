#include "scheduler/group_plan.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

void count_per_pass(const ModelLayout& m, const IterationPlan& plan, std::vector<int>& uploads,
                    std::vector<int>& grads) {
  uploads.assign(m.groups.size(), 0);
  grads.assign(m.groups.size(), 0);
  for (auto& st : plan.stages) {
    const std::vector<int> layers = st.layers();
    // frozen groups: never requested from a shard, no gradient
    for (int g : m.groups_uploaded(layers, st.kind == StageKind::backward))
      if (!m.groups[size_t(g)].frozen) uploads[size_t(g)]++;
    if (st.kind != StageKind::forward)
      for (int g : m.groups_of(layers))
        if (!m.groups[size_t(g)].frozen) grads[size_t(g)]++;
  }
}

std::vector<int> assign_shards(const ModelLayout& m, int shards) {
  if (shards < 1)
    throw std::invalid_argument(fmt::format("assign_shards: {} shards, need at least 1", shards));
  std::vector<int> order;  // the trainable groups; frozen ones have no shard (-1)
  int64_t total = 0;
  for (size_t g = 0; g < m.groups.size(); ++g)
    if (!m.groups[g].frozen) {
      order.push_back(int(g));
      total += m.groups[g].numel;
    }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return m.groups[a].numel > m.groups[b].numel; });
  const int64_t share = total / shards;
  std::vector<int64_t> load(size_t(shards), 0);
  std::vector<char> exclusive(size_t(shards), 0);
  std::vector<int> shard_of(m.groups.size(), -1);
  for (int g : order) {
    int s = -1;  // the least loaded shard not kept by a large group (all kept: any)
    for (int k = 0; k < shards; ++k)
      if (!exclusive[size_t(k)] && (s < 0 || load[size_t(k)] < load[size_t(s)])) s = k;
    if (s < 0) s = int(std::min_element(load.begin(), load.end()) - load.begin());
    if (load[size_t(s)] == 0 && m.groups[size_t(g)].numel >= share &&
        std::count(exclusive.begin(), exclusive.end(), 0) > 1)
      exclusive[size_t(s)] = 1;
    load[size_t(s)] += m.groups[size_t(g)].numel;
    shard_of[size_t(g)] = s;
  }
  return shard_of;
}

}  // namespace rp
