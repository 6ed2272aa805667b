// Iteration plans of a given stage count for the scheduler tests (simulator, disk tier).
#pragma once
#include <algorithm>
#include <vector>

#include "scheduler/partition.hpp"

namespace rp {

// A valid plan with exactly S stages (S >= 3): f forward stages, the tail, b backward.
inline IterationPlan plan_with_stages(int S) {
  const int f = (S - 1) / 2, b = S - 1 - f;
  const int a = std::max(f, b);  // layers before the tail
  IterationPlan p;
  p.num_layers = a + 2;
  auto split = [&](int parts, StageKind k, std::vector<Stage>& out) {
    int first = 0;
    for (int i = 0; i < parts; ++i) {
      int last = i + 1 == parts ? a - 1 : first;
      out.push_back({k, first, last});
      first = last + 1;
    }
  };
  std::vector<Stage> fw, bw;
  split(f, StageKind::forward, fw);
  split(b, StageKind::backward, bw);
  p.stages = fw;
  p.stages.push_back({StageKind::tail, a, a + 1});
  p.stages.insert(p.stages.end(), bw.rbegin(), bw.rend());
  validate_plan(p, "test plan");
  return p;
}

}  // namespace rp
