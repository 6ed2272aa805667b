// Each rule of the per-layer protocol has a guard in the optimizer shard; switching one
// off (ShardOptions::disable_rule, testing only) must make the protocol tests fail: some
// delivery order exposes a violation of exactly that rule (tests/actors/protocol_harness.hpp,
// docs/protocol.md). The guards are:
//   1  AcquireWeights(g, t) granted only once version max(t-1-s, -1) is published
//   2  the gradient slot granted to one writer at a time (the host half of rule 2)
//   3  the gradient slot for step t granted only after step t-1 consumed it
//   4  g's update of step t runs only when all of its step-t contributions are written
//   5  version k published only after every upload of iterations <= k+s finished
// Rule 3 and rule 5 only show in async mode: with staleness 0, iteration t+1 cannot start
// before step t's update, so the data flow alone keeps them (the test runs async there).
#include <gtest/gtest.h>

#include "tests/actors/protocol_harness.hpp"

namespace rp::test {
namespace {

using namespace proto;

struct GuardCase {
  int rule;
  int staleness;
};

std::string case_name(const ::testing::TestParamInfo<GuardCase>& i) {
  return fmt::format("Rule{}{}", i.param.rule, i.param.staleness ? "Async" : "Sync");
}

class ProtocolGuards : public ::testing::TestWithParam<GuardCase> {};

// The orders tried: random ones interleaved with adversarial ones (each actor delayed or
// prioritised in turn, shards or workers starved, FIFO, LIFO), so a guard whose absence
// only shows under one extreme is still found. A fixed number: the test is bounded.
std::vector<Order> probe_orders(const Pipeline& p, int n) {
  Roles roles{p.shards, p.workers};
  std::vector<Order> v;
  const Events evs[3] = {Events::random, Events::early, Events::late};
  for (int i = 0; int(v.size()) < n; ++i) {
    const uint64_t seed = 7000 + uint64_t(i);
    const Events ev = evs[i % 3];
    const bool so = i % 2 == 0;  // Session order, or closes lagging behind later passes
    v.push_back(Order{Policy::random, ev, seed, -1, so});
    switch (i % 6) {
      case 0: v.push_back(Order{Policy::delay, ev, seed, i / 6 % roles.count(), so}); break;
      case 1: v.push_back(Order{Policy::prioritize, ev, seed, i / 6 % roles.count(), so}); break;
      case 2: v.push_back(Order{Policy::starve_shards, ev, seed, -1, so}); break;
      case 3: v.push_back(Order{Policy::starve_workers, ev, seed, -1, so}); break;
      case 4: v.push_back(Order{Policy::fifo, ev, seed, -1, so}); break;
      case 5: v.push_back(Order{Policy::lifo, ev, seed, -1, so}); break;
    }
  }
  v.resize(size_t(n));
  return v;
}

TEST_P(ProtocolGuards, RemovingTheGuardIsCaught) {
  if (!shard_is_testable() || !shard_has_guard_switch())
    GTEST_SKIP() << "ShardOptions lacks 'detached' / 'disable_rule' (apply the patch in docs/protocol.md)";
  const GuardCase c = GetParam();
  const int n = 200;  // orders per pipeline shape
  int caught_total = 0;
  for (bool coarse : {false, true}) {
    Pipeline p = coarse ? Pipeline::coarse(c.staleness) : Pipeline::fine(c.staleness);
    Harness h(p);
    auto orders = probe_orders(p, n);
    int caught = 0, failed = 0, first = -1;
    std::string example;
    for (int i = 0; i < n; ++i) {
      Outcome out = h.run(orders[i], c.rule);
      failed += !out.ok();
      if (out.violated(c.rule) && caught++ == 0) {
        first = i;
        for (auto& v : out.violations)
          if (v.rule == c.rule) {
            example = v.what;
            break;
          }
      }
    }
    // Control: the same orders with every guard on are clean (a few suffice here;
    // test_protocol.cpp runs thousands).
    for (int i = 0; i < 10; ++i) {
      Outcome out = h.run(orders[i], 0);
      ASSERT_TRUE(out.ok()) << "order " << i << " fails with every guard on: " << out.describe();
    }
    caught_total += caught;
    std::printf(
        "[ protocol ] guard %d off, %s, staleness %d: rule %d violated in %d of %d orders (first: order "
        "%d), %d fail in some way; e.g. \"%s\"\n",
        c.rule, coarse ? "3 stages" : "5 stages", c.staleness, c.rule, caught, n, first, failed,
        example.c_str());
  }
  EXPECT_GT(caught_total, 0) << "with rule " << c.rule << "'s guard off, none of " << 2 * n
                             << " orders violated rule " << c.rule;
}

INSTANTIATE_TEST_SUITE_P(Guards, ProtocolGuards,
                         ::testing::Values(GuardCase{1, 1}, GuardCase{1, 0}, GuardCase{2, 1}, GuardCase{2, 0},
                                           GuardCase{3, 1}, GuardCase{4, 1}, GuardCase{4, 0},
                                           GuardCase{5, 1}),
                         case_name);

}  // namespace
}  // namespace rp::test
