// Evaluation passes in the per-layer protocol (docs/protocol.md): each step has a training
// pass and two evaluation passes (forward stages and the tail, forward only) dealt in a
// random order around it ("train, eval, eval, train, ..."), on the real shards and CAF's
// deterministic test coordinator, in random and adversarial delivery orders. In every order
// every rule holds (the evaluation uploads count with their step's for rule 5), the run
// completes, the weights equal the sequential reference bit for bit (evaluation disturbs
// nothing), and both evaluations of a step read that step's weights, so their losses agree
// bit for bit.
#include <gtest/gtest.h>

#include <set>

#include "tests/actors/protocol_harness.hpp"

namespace rp::test {
namespace {
using namespace proto;

void explore_with_evals(int staleness, bool coarse, int random_runs) {
  Pipeline p = coarse ? Pipeline::coarse(staleness) : Pipeline::fine(staleness);
  p.evals_per_step = 2;
  Harness h(p);
  Roles roles{p.shards, p.workers};
  std::vector<Order> orders;
  for (int i = 0; i < random_runs; ++i)
    orders.push_back(Order{Policy::random, Events::random, uint64_t(7000 + i), -1, i % 2 == 0});
  for (bool so : {true, false})
    for (Events ev : {Events::random, Events::early, Events::late}) {
      orders.push_back(Order{Policy::fifo, ev, 1, -1, so});
      orders.push_back(Order{Policy::lifo, ev, 1, -1, so});
      orders.push_back(Order{Policy::starve_shards, ev, 11, -1, so});
      orders.push_back(Order{Policy::starve_workers, ev, 12, -1, so});
      for (int r = 0; r < roles.count(); ++r) {
        orders.push_back(Order{Policy::delay, ev, uint64_t(100 + r), r, so});
        orders.push_back(Order{Policy::prioritize, ev, uint64_t(200 + r), r, so});
      }
    }
  std::set<uint64_t> distinct;
  int failures = 0;
  std::string first;
  for (const auto& o : orders) {
    const Outcome out = h.run(o);
    distinct.insert(out.order_hash);
    if (!out.ok() && failures++ == 0)
      first = fmt::format("policy {} events {} session_order {} seed {}: {}", int(o.policy), int(o.events),
                          o.session_order, o.seed, out.describe());
  }
  EXPECT_EQ(failures, 0) << first;
  EXPECT_GT(distinct.size(), orders.size() * 9 / 10);
}

#define RP_REQUIRE_TESTABLE_SHARD() \
  if (!shard_is_testable()) GTEST_SKIP() << "ShardOptions has no 'detached' switch"

TEST(ProtocolEval, TrainEvalEvalTrainInEveryOrderAsync5Stages) {
  RP_REQUIRE_TESTABLE_SHARD();
  explore_with_evals(1, false, 2000);
}
TEST(ProtocolEval, TrainEvalEvalTrainInEveryOrderSync5Stages) {
  RP_REQUIRE_TESTABLE_SHARD();
  explore_with_evals(0, false, 2000);
}
TEST(ProtocolEval, TrainEvalEvalTrainInEveryOrderAsync3Stages) {
  RP_REQUIRE_TESTABLE_SHARD();
  explore_with_evals(1, true, 2000);
}
TEST(ProtocolEval, TrainEvalEvalTrainInEveryOrderSync3Stages) {
  RP_REQUIRE_TESTABLE_SHARD();
  explore_with_evals(0, true, 2000);
}

// The check can fail: without counting the evaluation uploads in a step's totals (rule 5),
// a version may be published while an evaluation still reads the old one.
TEST(ProtocolEval, UncountedEvaluationUploadsAreCaught) {
  RP_REQUIRE_TESTABLE_SHARD();
  Pipeline p = Pipeline::coarse(1);
  p.evals_per_step = 2;
  Harness h(p);
  int caught = 0;
  for (int i = 0; i < 300 && caught == 0; ++i) {
    Order o{Policy::random, Events::random, uint64_t(9000 + i), -1, i % 2 == 0};
    // the monitor expects the evaluation uploads; the shard is told only the training ones
    caught += !h.run_with_uncounted_evals(o).ok();
  }
  EXPECT_GT(caught, 0);
}

}  // namespace
}  // namespace rp::test
