// Partitioner: equals brute force on every small random instance, respects the memory cap,
// names the layer that cannot fit, rejects invalid plans with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/plan.hpp"

namespace rp {
namespace {

struct Instance {
  std::vector<LayerCost> costs;
  PartitionOptions opt;
};

Instance random_instance(uint32_t seed) {
  std::mt19937 rng(seed);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto ival = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  Instance in;
  const int decoders = ival(1, 10);  // L <= 10
  const int n = decoders + 2;
  for (int l = 0; l < n; ++l) {
    LayerCost c;
    c.fwd = uni(0.05, 2.0);
    c.bwd = c.fwd * uni(1.5, 4.0);
    c.tail = c.fwd + c.bwd * uni(0.8, 1.2);
    // a third of the instances have integer costs, so that ties are common
    if (seed % 3 == 0) c.fwd = ival(1, 3), c.bwd = ival(1, 9), c.tail = ival(2, 12);
    c.weight_bytes = ival(0, 1000);
    c.grad_bytes = c.weight_bytes * ival(1, 2);
    c.act_bytes = ival(10, 120);
    c.scratch_bytes = ival(0, 400);
    c.io_bytes = l == 0 || l == n - 1 ? ival(1, 20) : 0;
    in.costs.push_back(c);
  }
  in.opt.gpus = ival(1, 6);
  in.opt.micro_batches = ival(1, 8);
  in.opt.weight_buffers = ival(1, 2);
  in.opt.act_slots = ival(1, 2);
  switch (seed % 4) {
    case 0: in.opt.memory_cap = 0; break;                 // unlimited
    case 1: in.opt.memory_cap = ival(1500, 6000); break;  // binding, sometimes infeasible
    default: in.opt.memory_cap = ival(3000, 12000); break;
  }
  // PCIe: free, comparable to compute, or dominant
  const int p = ival(0, 2);
  in.opt.pcie_bandwidth = p == 0 ? 0.0 : p == 1 ? uni(200, 2000) : uni(20, 200);
  return in;
}

// Best objective over every plan: every tail start a, every forward and backward
// composition of layers 0..a-1 (each composition evaluated by estimate_stage).
struct Brute {
  bool feasible = false;
  double objective = std::numeric_limits<double>::infinity();
};

Brute brute_force(const std::vector<LayerCost>& costs, const PartitionOptions& o) {
  const int n = int(costs.size());
  const double inf = std::numeric_limits<double>::infinity();
  auto fits = [&](const StageEstimate& e) { return o.memory_cap <= 0 || e.memory_bytes <= o.memory_cap; };
  Brute best;
  for (int a = 1; a <= n - 1; ++a) {
    StageEstimate tail = estimate_stage(costs, {StageKind::tail, a, n - 1}, o);
    if (!fits(tail)) continue;
    // per pass: the smallest tmax for each number of stages, over all 2^(a-1) compositions
    auto frontier = [&](StageKind k) {
      std::map<int, double> best_for_count;
      for (uint32_t mask = 0; mask < (1u << (a - 1)); ++mask) {  // bit i: a cut after layer i
        int first = 0, count = 0;
        double tmax = 0;
        bool ok = true;
        for (int l = 0; l < a && ok; ++l) {
          if (l == a - 1 || (mask >> l & 1u)) {
            StageEstimate e = estimate_stage(costs, {k, first, l}, o);
            ok = fits(e);
            tmax = std::max(tmax, e.seconds);
            ++count;
            first = l + 1;
          }
        }
        if (!ok) continue;
        auto it = best_for_count.find(count);
        if (it == best_for_count.end() || tmax < it->second) best_for_count[count] = tmax;
      }
      return best_for_count;
    };
    auto f = frontier(StageKind::forward), b = frontier(StageKind::backward);
    for (auto& [nf, tf] : f)
      for (auto& [nb, tb] : b) {
        const double obj = double(std::max(1 + nf + nb, o.gpus)) * std::max({tf, tb, tail.seconds});
        best.feasible = true;
        best.objective = std::min(best.objective, obj);
      }
  }
  (void)inf;
  return best;
}

TEST(Partition, EqualsBruteForceOnSmallRandomInstances) {
  int feasible = 0, infeasible = 0;
  for (uint32_t seed = 1; seed <= 5000; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Instance in = random_instance(seed);
    Brute bf = brute_force(in.costs, in.opt);
    if (!bf.feasible) {
      EXPECT_THROW(partition(in.costs, in.opt), std::runtime_error);
      ++infeasible;
      continue;
    }
    ++feasible;
    PartitionResult r = partition(in.costs, in.opt);
    EXPECT_NEAR(r.objective, bf.objective, 1e-9 * bf.objective);
    // the plan is valid, respects the cap, and its objective is what it claims
    std::vector<StageEstimate> est = check_plan(in.costs, r.plan, in.opt, "result");
    EXPECT_NEAR(plan_objective(est, in.opt.gpus), r.objective, 1e-12 * r.objective);
    for (auto& e : est) {
      if (in.opt.memory_cap > 0) {
        EXPECT_LE(e.memory_bytes, in.opt.memory_cap);
      }
    }
  }
  EXPECT_GT(feasible, 3000);
  std::printf("brute force: %d feasible, %d infeasible instances\n", feasible, infeasible);
  EXPECT_GT(infeasible, 50);  // the error path is exercised too
}

std::vector<LayerCost> uniform_costs(int decoders, double f, double b) {
  std::vector<LayerCost> c(size_t(decoders) + 2);
  for (auto& x : c) x = LayerCost{f, b, f + b, 100, 200, 10, 50, 0};
  c.front().fwd = c.front().bwd = 0.01;
  c.back().tail = 3 * (f + b);
  return c;
}

TEST(Partition, AsymmetricSplitForBackwardThreeTimesForward) {
  PartitionOptions o;
  o.gpus = 4;
  o.micro_batches = 8;
  PartitionResult r = partition(uniform_costs(24, 1.0, 3.0), o);
  int fwd_layers = 0, bwd_layers = 0;
  for (auto& s : r.plan.stages) {
    if (s.kind == StageKind::forward && s.first > 0) fwd_layers = std::max(fwd_layers, s.num_layers());
    if (s.kind == StageKind::backward && s.first > 0) bwd_layers = std::max(bwd_layers, s.num_layers());
  }
  EXPECT_GE(fwd_layers, 2 * bwd_layers) << r.plan.summary();
  EXPECT_GE(r.plan.num_forward(), 1);
  EXPECT_LT(r.plan.num_forward(), r.plan.num_backward()) << r.plan.summary();
}

TEST(Partition, MemoryCapIsRespected) {
  auto costs = uniform_costs(30, 1.0, 3.0);
  for (int64_t cap : {int64_t(0), int64_t(4000), int64_t(2500), int64_t(1500)}) {
    PartitionOptions o;
    o.gpus = 2;
    o.micro_batches = 4;
    o.memory_cap = cap;
    PartitionResult r = partition(costs, o);
    for (auto& e : r.stages) {
      if (cap > 0) {
        EXPECT_LE(e.memory_bytes, cap) << r.plan.summary();
      }
    }
  }
}

TEST(Partition, ErrorNamesTheLayerThatCannotFit) {
  auto costs = uniform_costs(8, 1.0, 3.0);
  PartitionOptions o;
  o.memory_cap = 5000;
  costs[5].weight_bytes = 4000;  // decoder 4: 2 x 4000 weights alone exceed the cap
  try {
    partition(costs, o);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 5 (decoder 4)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory cap"), std::string::npos) << e.what();
    // the room a second weight buffer takes is said in bytes, not as a "+1" that reads like a size
    EXPECT_NE(std::string(e.what()).find(
                  "weights 3.91 KiB plus 3.91 KiB of room to prefetch the next stage's weights, gradients"),
              std::string::npos)
        << e.what();
  }
  o.weight_buffers = 1;  // no prefetch: none claimed
  costs[5].weight_bytes = 6000;
  try {
    partition(costs, o);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).find("prefetch"), std::string::npos) << e.what();
  }
  o.weight_buffers = 2;
  costs = uniform_costs(8, 1.0, 3.0);
  costs.back().weight_bytes = 9000;  // the tail cannot fit at all
  try {
    partition(costs, o);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 9 (tail)"), std::string::npos) << e.what();
  }
}

TEST(Partition, RejectsBadInputs) {
  PartitionOptions o;
  EXPECT_THROW(partition(std::vector<LayerCost>(2), o), std::invalid_argument);
  auto c = uniform_costs(4, 1, 3);
  c[2].bwd = -1;
  EXPECT_THROW(partition(c, o), std::invalid_argument);
  o.gpus = 0;
  EXPECT_THROW(partition(uniform_costs(4, 1, 3), o), std::invalid_argument);
}

TEST(Partition, InvalidExplicitPlansAreRejectedWithTheReason) {
  const auto costs = uniform_costs(6, 1.0, 3.0);  // 8 layers
  PartitionOptions o;
  auto expect_reason = [&](const nlohmann::json& j, const std::string& reason) {
    try {
      IterationPlan p = plan_from_json(j, 8, 2, "spec.plan");
      check_plan(costs, p, o, "spec.plan");
      FAIL() << "accepted " << j.dump();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  // a stage is named as `roundpipe plan`'s table and summary line show it: its index from 0 and
  // its label (these used to count from 1, or name no stage at all)
  expect_reason({{"forward", {{0, 2}, {4, 5}}}, {"tail", {6, 7}}, {"backward", {{5, 0}}}},
                "spec.plan: stage 1 F[4-5] starts at layer 4, expected layer 3");
  // an empty object is no plan (it once meant the uniform default plan)
  expect_reason(nlohmann::json::object(), "spec.plan: the plan is empty; expected \"forward\"");
  expect_reason({{"forward", {{0, 5}}}, {"tail", {6, 6}}, {"backward", {{5, 0}}}},
                "spec.plan: stage 1 T[6-6], the tail stage, covers layers 6-6, expected 6-7");
  expect_reason({{"forward", {{0, 5}}}, {"tail", {6, 7}}, {"backward", {{5, 2}}}},
                "spec.plan: stage 2 B[5-2] stops at layer 2, expected the backward stages to reach layer 0");
  expect_reason({{"forward", {{0, 5}}}, {"tail", {6, 7}}, {"backward", {{4, 0}}}},
                "spec.plan: stage 2 B[4-0] starts at layer 4, expected layer 5");
  // a forward stage past the layers before the tail (the tail's range was blamed, "expected 9-7")
  expect_reason({{"forward", {{0, 8}}}, {"tail", {9, 9}}, {"backward", {{8, 0}}}},
                "spec.plan: stage 0 F[0-8] runs to layer 8; forward stages end by layer 6, before the tail");
  expect_reason({{"forward", {{0, 5}}}, {"tail", {6, 7}}, {"backward", nlohmann::json::array()}},
                "spec.plan: expected backward stages after the tail stage, from layer 5 down to layer 0");
  expect_reason({{"forward_layers", 0}}, "key 'forward_layers': expected 1..7");
  // an explicit plan is never changed: a stage longer than the layers before the tail used to
  // be clamped silently
  expect_reason({{"forward_layers", 100}}, "key 'forward_layers': expected 1..7 (the layers before the tail");
  expect_reason({{"backward_layers", 7}, {"tail_decoders", 2}}, "key 'backward_layers': expected 1..5");
  EXPECT_THROW(make_default_plan(8, -1), std::invalid_argument);  // negative workers used to plan as 1
  // integers beyond int used to wrap around (4294967300 -> 4, 4294967298 -> 2)
  expect_reason({{"forward", {{0, 4294967300LL}}}, {"tail", {6, 7}}, {"backward", {{5, 0}}}},
                "pair of layer indices");
  expect_reason({{"forward_layers", 4294967298LL}}, "key 'forward_layers': expected an integer");
  // without a model: what check_plan_json refuses, the model-free part of the checks above
  auto model_free = [](const nlohmann::json& j) -> std::string {
    try {
      check_plan_json(j, "spec.plan");
      return "";
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  EXPECT_EQ(model_free(nullptr), "");
  EXPECT_EQ(model_free({{"forward_layers", 100}, {"tail_decoders", 0}}), "") << "the range needs the model";
  EXPECT_EQ(model_free({{"forward", {{0, 8}}}, {"tail", {9, 9}}, {"backward", {{8, 0}}}}), "");
  EXPECT_EQ(model_free({{"forward_layers", 0}}),
            "spec.plan: key 'forward_layers': expected an integer >= 1, got 0");
  EXPECT_EQ(model_free({{"tail_decoders", -1}}),
            "spec.plan: key 'tail_decoders': expected an integer >= 0, got -1");
  EXPECT_NE(model_free({{"forward_layers", 2}, {"tail", {6, 7}}}).find("does not go with explicit"),
            std::string::npos);
  EXPECT_NE(model_free({{"forward", {{0, 5}}}, {"tail", {6, 7}}}).find("missing key 'backward'"),
            std::string::npos);
  EXPECT_NE(model_free({{"forward", {{0, 4294967300LL}}}, {"tail", {6, 7}}, {"backward", {{5, 0}}}})
                .find("pair of layer indices"),
            std::string::npos);
  EXPECT_NE(model_free(nlohmann::json::object()).find("the plan is empty"), std::string::npos);
  // a uniform-plan key next to explicit stages used to be ignored
  expect_reason({{"forward_layers", 2}, {"forward", {{0, 5}}}, {"tail", {6, 7}}, {"backward", {{5, 0}}}},
                "key 'forward_layers' does not go with explicit");
  expect_reason({{"forward", {{-4294967296LL, 5}}}, {"tail", {6, 7}}, {"backward", {{5, 0}}}},
                "pair of layer indices");
  // well-formed but over the memory cap: the stage and the cap are named
  o.memory_cap = 600;  // the forward stage's working set: 600 B of weights and 6 outputs of 10 B
  expect_reason({{"forward", {{0, 5}}}, {"tail", {6, 7}}, {"backward", {{5, 0}}}},
                "spec.plan: stage 0 F[0-5] needs ");
  // the cap is checked against the working set: no room to prefetch is counted, nor claimed
  // (the weights used to read "600 B (+1 for the next stage's)")
  expect_reason({{"forward", {{0, 5}}}, {"tail", {6, 7}}, {"backward", {{5, 0}}}},
                "(weights 600 B, gradients");
  // a plan for another model
  o.memory_cap = 0;
  IterationPlan p = make_uniform_plan(10, 2, 1);
  EXPECT_THROW(check_plan(costs, p, o, "plan"), std::invalid_argument);
}

TEST(Partition, TransferTimeIsChargedAndAvoided) {
  // Tiny compute, big weights: every stage is transfer-bound; tau is the upload time.
  auto costs = uniform_costs(6, 1e-4, 3e-4);
  PartitionOptions o;
  o.micro_batches = 2;
  o.pcie_bandwidth = 1e5;
  StageEstimate e = estimate_stage(costs, {StageKind::backward, 1, 3}, o);
  EXPECT_TRUE(e.transfer_bound());
  EXPECT_DOUBLE_EQ(e.seconds, std::max(e.upload_seconds, e.download_seconds));
  // A plan chosen blind to PCIe is never better, and on some instances strictly worse.
  int strictly_better = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    Instance in = random_instance(seed * 7919u);
    in.opt.memory_cap = 0;
    if (in.opt.pcie_bandwidth == 0) in.opt.pcie_bandwidth = 60;
    PartitionOptions blind = in.opt;
    blind.pcie_bandwidth = 0;
    PartitionResult aware = partition(in.costs, in.opt);
    PartitionResult b = partition(in.costs, blind);
    double blind_obj = plan_objective(check_plan(in.costs, b.plan, in.opt, "blind"), in.opt.gpus);
    EXPECT_LE(aware.objective, blind_obj * (1 + 1e-12));
    strictly_better += aware.objective < blind_obj * (1 - 1e-9);
  }
  EXPECT_GT(strictly_better, 0);
}

TEST(Partition, BackwardStagesUploadNoEmbeddingWeights) {
  // the worker uploads no weight for the embedding's backward (ModelLayout::groups_uploaded)
  auto costs = uniform_costs(6, 1e-4, 3e-4);
  costs[0].weight_bytes = 5000;
  PartitionOptions o;
  o.micro_batches = 2;
  o.pcie_bandwidth = 1e5;
  int64_t w13 = 0;
  for (int l = 1; l <= 3; ++l) w13 += costs[size_t(l)].weight_bytes;
  const StageEstimate with0 = estimate_stage(costs, {StageKind::backward, 0, 3}, o);
  const StageEstimate without0 = estimate_stage(costs, {StageKind::backward, 1, 3}, o);
  EXPECT_EQ(with0.weight_bytes, w13);
  EXPECT_EQ(without0.weight_bytes, w13);
  EXPECT_EQ(estimate_stage(costs, {StageKind::backward, 0, 0}, o).weight_bytes, 0);
  // nor in its memory (weight buffers) or its upload time
  const StageEstimate b0 = estimate_stage(costs, {StageKind::backward, 0, 0}, o);
  PartitionOptions o2 = o;
  o2.weight_buffers = o.weight_buffers + 3;
  EXPECT_EQ(estimate_stage(costs, {StageKind::backward, 0, 0}, o2).memory_bytes, b0.memory_bytes);
  EXPECT_NE(estimate_stage(costs, {StageKind::forward, 0, 0}, o2).memory_bytes,
            estimate_stage(costs, {StageKind::forward, 0, 0}, o).memory_bytes);
  const double act_up_s = double(o.micro_batches) * double(b0.act_up_bytes) / o.pcie_bandwidth;
  EXPECT_DOUBLE_EQ(b0.upload_seconds, act_up_s);
  EXPECT_DOUBLE_EQ(
      with0.upload_seconds - without0.upload_seconds,
      double(o.micro_batches) * double(with0.act_up_bytes - without0.act_up_bytes) / o.pcie_bandwidth);
  // the forward stage and a whole-model tail run the embedding's forward: they upload it
  EXPECT_EQ(estimate_stage(costs, {StageKind::forward, 0, 3}, o).weight_bytes, w13 + 5000);
  EXPECT_GE(estimate_stage(costs, {StageKind::tail, 0, 5}, o).weight_bytes, w13 + 5000);
}

TEST(Partition, DeepModelsPlanFast) {
  // 94 decoder layers of the Qwen3-235B-A22B shape, and 64 dense layers.
  ModelShape m;
  m.vocab_size = 151936, m.hidden_size = 4096, m.num_layers = 94, m.num_heads = 64, m.num_kv_heads = 4;
  m.head_dim = 128, m.num_experts = 128, m.experts_per_token = 8, m.moe_intermediate_size = 1536;
  m.qk_norm = true;
  DeviceModel d;
  auto costs = layer_costs(estimate_layers(m, 1, 8192, d));
  PartitionOptions o;
  o.gpus = 8;
  o.micro_batches = 16;
  o.pcie_bandwidth = d.pcie_bandwidth;
  o.memory_cap = int64_t(141) << 30;
  auto t0 = std::chrono::steady_clock::now();
  PartitionResult r = partition(costs, o);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.5);
  EXPECT_EQ(r.plan.num_layers, 96);
  EXPECT_GT(r.plan.stages.size(), 8u);
}

}  // namespace
}  // namespace rp
