// refine_for_prefetch (scheduler/prefetch_refine.hpp): over a sweep of memory caps on a tied
// Qwen3-1.7B-shaped model, a refined plan is never slower in the simulator than the
// partitioner's, keeps every stage within the cap, and at some caps removes a refused
// prefetch and gains; without a cap or a refusal it changes nothing; automatic_partition
// applies it.
#include <gtest/gtest.h>

#include <algorithm>

#include "scheduler/cost_model.hpp"
#include "scheduler/prefetch_refine.hpp"
#include "scheduler/replan.hpp"
#include "scheduler/stage_peak.hpp"

namespace rp {
namespace {

std::vector<LayerCost> qwen3_costs() {
  ModelShape m;
  m.vocab_size = 151936, m.hidden_size = 2048, m.intermediate_size = 6144, m.num_layers = 28;
  m.num_heads = 16, m.num_kv_heads = 8, m.head_dim = 128, m.tie_word_embeddings = true, m.qk_norm = true;
  DeviceModel d;  // H200-like defaults
  return layer_costs(estimate_layers(m, 1, 8192, d));
}

PartitionOptions options(int gpus, double cap_gib) {
  PartitionOptions po;
  po.gpus = gpus;
  po.micro_batches = 8;
  po.pcie_bandwidth = 55e9;
  po.memory_cap = int64_t(cap_gib * double(int64_t(1) << 30));
  return po;
}

int refused_count(const PartitionResult& r, const PartitionOptions& po) {
  const std::vector<char> f = prefetch_refused(r.stages, po);
  return int(std::count(f.begin(), f.end(), 1));
}

double predicted(const std::vector<LayerCost>& costs, const PartitionResult& r, const PartitionOptions& po) {
  return simulate(r.plan, stage_costs(costs, r.plan, po), refine_sim_options(po)).iteration_seconds;
}

TEST(PrefetchRefine, NeverSlowerAlwaysWithinTheCapAndSometimesFaster) {
  const auto costs = qwen3_costs();
  int with_refusals = 0, gained = 0;
  for (int gpus : {1, 2}) {
    for (double cap = 4.0; cap <= 9.0; cap += 0.25) {
      PartitionOptions po = options(gpus, cap);
      PartitionResult base;
      try {
        base = partition(costs, po);
      } catch (const std::runtime_error&) {
        continue;  // nothing fits this cap
      }
      const int before = refused_count(base, po);
      const PartitionResult r = refine_for_prefetch(costs, base, po, refine_sim_options(po));
      validate_plan(r.plan, "refined");
      ASSERT_EQ(r.stages.size(), r.plan.stages.size());
      for (const StageEstimate& e : r.stages) EXPECT_LE(e.memory_bytes, po.memory_cap) << r.plan.summary();
      const double t0 = predicted(costs, base, po), t1 = predicted(costs, r, po);
      EXPECT_LE(t1, t0 * (1 + 1e-12)) << gpus << " GPUs, cap " << cap;
      if (before == 0) {
        EXPECT_EQ(r.plan.stages, base.plan.stages) << "nothing to move at cap " << cap;
      }
      if (before > 0) ++with_refusals;
      if (r.plan.stages != base.plan.stages) {
        EXPECT_LT(t1, t0 * (1 - kPrefetchRefineMinGain)) << "a change must gain";
        EXPECT_LT(refused_count(r, po), before) << r.plan.summary();
        ++gained;
      }
    }
  }
  EXPECT_GT(with_refusals, 0) << "no cap of the sweep refused a prefetch: the sweep tests nothing";
  EXPECT_GT(gained, 0);
}

TEST(PrefetchRefine, NoCapChangesNothing) {
  const auto costs = qwen3_costs();
  PartitionOptions po = options(1, 0);
  po.memory_cap = 0;
  const PartitionResult base = partition(costs, po);
  EXPECT_EQ(refine_for_prefetch(costs, base, po, refine_sim_options(po)).plan.stages, base.plan.stages);
}

TEST(PrefetchRefine, AutomaticPartitionRefines) {
  const auto costs = qwen3_costs();
  for (double cap = 4.0; cap <= 9.0; cap += 0.25) {
    PartitionOptions po = options(1, cap), auto_po = po;
    PartitionResult base;
    try {
      base = partition(costs, po);
    } catch (const std::runtime_error&) {
      continue;
    }
    const PartitionResult a = automatic_partition(costs, auto_po);
    ASSERT_EQ(auto_po.weight_buffers, 2) << "cap " << cap;
    EXPECT_EQ(a.plan.stages, refine_for_prefetch(costs, base, po, refine_sim_options(po)).plan.stages)
        << "cap " << cap;
    EXPECT_EQ(a.candidates, base.candidates);
  }
}

}  // namespace
}  // namespace rp
