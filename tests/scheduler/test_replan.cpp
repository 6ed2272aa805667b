// Replanner (scheduler/replan.hpp): the one re-planning decision from a settled profile,
// never for explicit plans, never before the profile settled, once; automatic_partition's
// fallback to single-buffered weights.
#include <gtest/gtest.h>

#include <cstdio>

#include "scheduler/replan.hpp"

namespace rp {
namespace {

constexpr int kLayers = 10;  // embedding, 8 decoders, tail

/// Uniform analytic costs: every decoder 1 ms forward, 3 ms backward; light embedding, a
/// tail as heavy as two decoders.
std::vector<LayerCost> analytic_costs() {
  std::vector<LayerCost> c(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    LayerCost& x = c[size_t(l)];
    const bool dec = l > 0 && l < kLayers - 1;
    x.fwd = dec ? 1e-3 : 1e-4;
    x.bwd = dec ? 3e-3 : 2e-4;
    x.tail = dec ? x.fwd + x.bwd : 8e-3;
    x.weight_bytes = 1 << 20;
    x.grad_bytes = 2 << 20;
    x.act_bytes = 1 << 16;
    x.scratch_bytes = 1 << 18;
    x.io_bytes = (l == 0 || l == kLayers - 1) ? 1 << 12 : 0;
  }
  return c;
}

PartitionOptions part_options() {
  PartitionOptions o;
  o.gpus = 2;
  o.micro_batches = 4;
  return o;
}

SimOptions sim_options() {
  SimOptions s;
  s.passes_in_flight = 2;
  return s;
}

/// Feeds `p` with `n` identical samples per series: decoder l's forward takes fwd(l) and its
/// backward bwd(l); the tail layer `tail` seconds (enough for settled(0.05, 3) when n >= 4).
template <class F, class B>
void feed(Profile& p, int n, F fwd, B bwd, double tail) {
  for (int i = 0; i < n; ++i) {
    for (int l = 0; l + 1 < kLayers; ++l) {
      p.record(l, ProfileKind::forward, fwd(l));
      p.record(l, ProfileKind::backward, bwd(l));
    }
    p.record(kLayers - 1, ProfileKind::tail, tail);
  }
}

Replanner make(bool automatic, const IterationPlan&) {
  ReplanOptions ro;
  ro.automatic = automatic;
  return Replanner(Profile(kLayers, 1, 128), analytic_costs(), part_options(), sim_options(), ro);
}

TEST(Replanner, DecidesOnceAndOnlyAfterTheProfileSettled) {
  const auto analytic = analytic_costs();
  PartitionOptions po = part_options();
  const IterationPlan initial = automatic_partition(analytic, po).plan;
  Replanner r = make(true, initial);
  EXPECT_FALSE(r.poll(initial, 0).has_value());  // nothing measured
  // Measured: the first four decoders are 6x slower than the model says (e.g. longer
  // attention), the others as predicted.
  auto fwd = [](int l) { return l >= 1 && l <= 4 ? 6e-3 : (l == 0 ? 1e-4 : 1e-3); };
  auto bwd = [](int l) { return l >= 1 && l <= 4 ? 18e-3 : (l == 0 ? 2e-4 : 3e-3); };
  feed(r.profile(), 2, fwd, bwd, 8e-3);
  EXPECT_FALSE(r.poll(initial, 1).has_value()) << "decided on 1 kept sample per series";
  EXPECT_FALSE(r.decided());
  feed(r.profile(), 3, fwd, bwd, 8e-3);
  auto d = r.poll(initial, 7);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(r.decided());
  EXPECT_EQ(d->pass, 7);
  EXPECT_TRUE(d->error.empty()) << d->error;
  // the new plan is the partition of the measured costs
  const auto measured = r.profile().apply(analytic);
  const IterationPlan want = partition(measured, po).plan;
  EXPECT_EQ(d->new_plan.stages, want.stages) << d->new_plan.summary() << " vs " << want.summary();
  EXPECT_NE(d->new_plan.stages, initial.stages) << "the measured costs should move the stage boundaries";
  EXPECT_TRUE(d->changed);
  EXPECT_LT(d->new_seconds, d->old_seconds);
  EXPECT_DOUBLE_EQ(d->old_seconds, r.predict(initial, measured));
  const std::string line = d->line();
  std::printf("%s\n", line.c_str());
  EXPECT_NE(line.find(initial.summary()), std::string::npos) << line;
  EXPECT_NE(line.find(d->new_plan.summary()), std::string::npos) << line;
  EXPECT_NE(line.find("->"), std::string::npos) << line;
  EXPECT_NE(line.find("pass 7"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line";
  // once only
  feed(r.profile(), 3, fwd, bwd, 8e-3);
  EXPECT_FALSE(r.poll(d->new_plan, 9).has_value());
}

TEST(Replanner, NoisyTimingsDecideAfterMaxSamples) {
  const IterationPlan initial = make_uniform_plan(kLayers, 2, 1, 0);
  ReplanOptions ro;
  ro.settle_max_samples = 12;
  Replanner r(Profile(kLayers, 1, 128), analytic_costs(), part_options(), sim_options(), ro);
  // every sample alternates between 1x and 3x: the estimate keeps moving by more than 5%
  int i = 0;
  auto noisy = [&](double base) { return (i % 2 ? 3 : 1) * base; };
  for (; i < 12; ++i) {
    feed(
        r.profile(), 1, [&](int) { return noisy(1e-3); }, [&](int) { return noisy(3e-3); }, noisy(5e-3));
    EXPECT_FALSE(r.poll(initial, i).has_value()) << "decided after " << i + 1 << " samples";
  }
  EXPECT_FALSE(r.profile().settled(ro.settle_rel_tol, ro.settle_min_samples));
  feed(
      r.profile(), 1, [&](int) { return noisy(1e-3); }, [&](int) { return noisy(3e-3); }, noisy(5e-3));
  auto d = r.poll(initial, 12);  // 13 samples seen, 12 kept
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->line().find("12 samples per series"), std::string::npos) << d->line();
}

TEST(Replanner, KeepsThePlanWhenMeasurementsConfirmTheEstimate) {
  const auto analytic = analytic_costs();
  PartitionOptions po = part_options();
  const IterationPlan initial = automatic_partition(analytic, po).plan;
  Replanner r = make(true, initial);
  // measured = 2x analytic everywhere: same ratios, same best plan
  feed(
      r.profile(), 5, [&](int l) { return 2 * analytic[size_t(l)].fwd; },
      [&](int l) { return 2 * analytic[size_t(l)].bwd; }, 2 * analytic.back().tail);
  auto d = r.poll(initial, 3);
  ASSERT_TRUE(d.has_value());
  EXPECT_FALSE(d->changed);
  EXPECT_EQ(d->new_plan.stages, initial.stages);
  EXPECT_NE(d->line().find("keeping"), std::string::npos) << d->line();
}

TEST(Replanner, ExplicitPlansAreNeverChanged) {
  const IterationPlan explicit_plan = make_uniform_plan(kLayers, 1, 1, 0);
  Replanner r = make(false, explicit_plan);
  bool called = false;
  r.set_planner([&](const std::vector<LayerCost>&) {
    called = true;
    return make_uniform_plan(kLayers, 3, 2, 1);
  });
  feed(
      r.profile(), 6, [](int) { return 1e-3; }, [](int) { return 3e-3; }, 5e-3);
  ASSERT_TRUE(r.profile().settled());
  EXPECT_FALSE(r.poll(explicit_plan, 5).has_value());
  EXPECT_FALSE(called);
  EXPECT_FALSE(r.decided());
}

TEST(Replanner, APlannerHookIsValidatedAndAFailureKeepsThePlan) {
  const IterationPlan initial = make_uniform_plan(kLayers, 2, 1, 0);
  Replanner r = make(true, initial);
  r.set_planner([](const std::vector<LayerCost>&) { return make_uniform_plan(kLayers + 1, 2, 1, 0); });
  feed(
      r.profile(), 5, [](int) { return 1e-3; }, [](int) { return 3e-3; }, 5e-3);
  auto d = r.poll(initial, 2);
  ASSERT_TRUE(d.has_value());
  EXPECT_FALSE(d->changed);
  EXPECT_FALSE(d->error.empty());
  EXPECT_EQ(d->new_plan.stages, initial.stages);
  EXPECT_NE(d->line().find("keeping"), std::string::npos) << d->line();
  // a valid hook plan is taken whenever it differs
  Replanner r2 = make(true, initial);
  const IterationPlan forced = make_uniform_plan(kLayers, 3, 2, 1);
  r2.set_planner([&](const std::vector<LayerCost>&) { return forced; });
  feed(
      r2.profile(), 5, [](int) { return 1e-3; }, [](int) { return 3e-3; }, 5e-3);
  auto d2 = r2.poll(initial, 2);
  ASSERT_TRUE(d2.has_value());
  EXPECT_TRUE(d2->changed);
  EXPECT_EQ(d2->new_plan.stages, forced.stages);
}

TEST(Replanner, RejectsCostsOfTheWrongLength) {
  std::vector<LayerCost> c = analytic_costs();
  c.pop_back();
  EXPECT_THROW(Replanner(Profile(kLayers, 1, 128), c, part_options(), sim_options(), ReplanOptions{}),
               std::invalid_argument);
}

TEST(AutomaticPartition, FallsBackToSingleBufferedWeights) {
  const auto costs = analytic_costs();
  PartitionOptions po = part_options();
  const PartitionResult two = automatic_partition(costs, po);
  EXPECT_EQ(po.weight_buffers, 2);
  // the smallest cap a double-buffered plan needs; just below it only single buffers fit
  int64_t need2 = 0;
  for (int l = 0; l < kLayers; ++l)
    for (StageKind k : {StageKind::forward, StageKind::backward}) {
      if (l == kLayers - 1) k = StageKind::tail;
      PartitionOptions o = po;
      need2 = std::max(
          need2, estimate_stage(costs, Stage{k, l, k == StageKind::tail ? kLayers - 1 : l}, o).memory_bytes);
    }
  PartitionOptions tight = po;
  tight.memory_cap = need2 - (1 << 20) / 2;  // half a layer's weights short
  const PartitionResult one = automatic_partition(costs, tight);
  EXPECT_EQ(tight.weight_buffers, 1);
  for (auto& s : one.stages)
    EXPECT_LE(s.memory_bytes, tight.memory_cap) << s.stage.first << "-" << s.stage.last;
  PartitionOptions impossible = po;
  impossible.memory_cap = 1 << 16;
  EXPECT_THROW(automatic_partition(costs, impossible), std::runtime_error);
  EXPECT_EQ(impossible.weight_buffers, 2) << "options unchanged when nothing fits";
}

}  // namespace
}  // namespace rp
