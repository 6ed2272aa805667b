// The optimizer shard's rule engine on its own (actors/shard_rules.hpp): events in, the exact
// actions out, one rule at a time. (test_protocol*.cpp drive it through the shard actor in
// 25,000+ delivery orders.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "actors/shard_rules.hpp"

namespace rp {
namespace {

std::string show(const ShardAction& a) {
  switch (a.kind) {
    case ShardAction::Kind::grant_weights:
      return fmt::format("grant weights g{} t{} #{}", a.group, a.step, a.ticket);
    case ShardAction::Kind::grant_grad_slot:
      return fmt::format("grant slot g{} t{} #{} {}", a.group, a.step, a.ticket,
                         a.overwrite ? "overwrite" : "accumulate");
    case ShardAction::Kind::run_job:
      return fmt::format("job {} g{}{}", describe(a.job), a.group, a.job.publish ? " +publish" : "");
    case ShardAction::Kind::report_sumsq: return fmt::format("sumsq g{} t{} = {}", a.group, a.step, a.sumsq);
    case ShardAction::Kind::group_updated: return fmt::format("updated g{} t{}", a.group, a.step);
  }
  return "?";
}

/// A shard's rules plus the actions of the last call, as text.
struct Shard {
  ShardRules rules;
  std::vector<std::string> out;
  Shard(std::vector<ShardRules::Group> g, int staleness, bool guard = false, int off = 0, bool reduce = false)
      : rules(g, staleness, guard, off, reduce) {}
  std::vector<std::string> pump(int g) {
    std::vector<ShardAction> a;
    rules.pump(g, a);
    return record(a);
  }
  std::vector<std::string> done(int g, double sumsq = 0) {
    std::vector<ShardAction> a;
    rules.job_done(g, sumsq, a);
    return record(a);
  }
  std::vector<std::string> record(const std::vector<ShardAction>& a) {
    out.clear();
    for (auto& x : a) out.push_back(show(x));
    return out;
  }
};

using V = std::vector<std::string>;

ClosedStep one_pass() {
  ClosedStep c;
  c.passes = 1;
  c.grad_scale = 0.5f;
  c.lr = 0.1;
  return c;
}

// Rule 1 (staleness 1): iteration t reads version t-2; rule 5: version k is published only
// after every upload of iterations <= k+1 finished, by the update itself when allowed, else by
// a cast later.
TEST(ShardRules, UploadsWaitForTheirVersionAndPublishWaitsForTheUploads) {
  Shard s({{0, 1, 1}}, 1);
  s.rules.request_weights(0, 0, 1);
  EXPECT_EQ(s.pump(0), (V{"grant weights g0 t0 #1"})) << "iteration 0 reads the initial weights";
  s.rules.request_weights(0, 2, 2);
  EXPECT_EQ(s.pump(0), V{}) << "iteration 2 needs version 0";
  s.rules.weights_released(0, 0);
  s.rules.close_step(0, one_pass());
  s.rules.request_grad_slot(0, 0, 3);
  EXPECT_EQ(s.pump(0), (V{"grant slot g0 t0 #3 overwrite"}));
  s.rules.grad_written(0, 0);
  // iteration 1's upload is not done: the update may not write the low-precision copy
  EXPECT_EQ(s.pump(0), (V{"job AdamW update of step 0 g0"}));
  EXPECT_TRUE(s.rules.busy(0));
  EXPECT_EQ(s.pump(0), V{}) << "a busy group makes no transition";
  EXPECT_EQ(s.done(0), (V{"updated g0 t0"}));
  EXPECT_EQ(s.rules.updated(0), 0);
  EXPECT_EQ(s.rules.published(0), -1);
  s.rules.close_step(1, one_pass());
  s.rules.weights_released(0, 1);  // iteration 1's upload finished: version 0 may go out
  EXPECT_EQ(s.pump(0), (V{"job cast of version 0 g0"}));
  EXPECT_EQ(s.done(0), (V{"grant weights g0 t2 #2"}));
  EXPECT_EQ(s.rules.published(0), 0);
}

// An upload reads only the low-precision copy: while an update that does not publish runs
// (it writes the fp32 master and moments), an upload of the published version is granted at
// once, e.g. the next iteration's tail reading a tied embedding whose update of the last step
// is still running. A gradient slot still waits for the update.
TEST(ShardRules, UploadsOfAPublishedVersionGoOutWhileAnUpdateThatDoesNotPublishRuns) {
  Shard s({{0, 2, 1}}, 1);  // two uploads per pass (an embedding tied to the LM head)
  for (int64_t ticket : {1, 2}) {
    s.rules.request_weights(0, 0, ticket);
    EXPECT_EQ(s.pump(0), (V{fmt::format("grant weights g0 t0 #{}", ticket)}));
    s.rules.weights_released(0, 0);
  }
  s.rules.close_step(0, one_pass());
  s.rules.request_grad_slot(0, 0, 3);
  EXPECT_EQ(s.pump(0), (V{"grant slot g0 t0 #3 overwrite"}));
  s.rules.grad_written(0, 0);
  s.rules.request_weights(0, 1, 4);  // iteration 1 reads version -1
  EXPECT_EQ(s.pump(0), (V{"job AdamW update of step 0 g0"}));
  ASSERT_TRUE(s.rules.busy(0));
  EXPECT_EQ(s.pump(0), (V{"grant weights g0 t1 #4"}))
      << "the running update leaves the low-precision copy alone";
  s.rules.request_grad_slot(0, 1, 5);
  EXPECT_EQ(s.pump(0), V{}) << "the update still reads the gradient slot";
  EXPECT_EQ(s.done(0), (V{"updated g0 t0", "grant slot g0 t1 #5 overwrite"}));
}

// Synchronous (staleness 0): the update publishes at once when the step's uploads are done.
TEST(ShardRules, SyncUpdatePublishesInTheSameJob) {
  Shard s({{3, 1, 1}}, 0);
  s.rules.request_weights(3, 1, 7);
  EXPECT_EQ(s.pump(3), V{});
  s.rules.close_step(0, one_pass());
  s.rules.weights_released(3, 0);
  s.rules.request_grad_slot(3, 0, 8);
  s.pump(3);
  s.rules.grad_written(3, 0);
  EXPECT_EQ(s.pump(3), (V{"job AdamW update of step 0 g3 +publish"}));
  EXPECT_EQ(s.done(3), (V{"updated g3 t0", "grant weights g3 t1 #7"}));
}

// Rule 3 and the shard's half of rule 2: one writer at a time, the first of a step overwrites,
// later ones accumulate, a slot for step t+1 only after step t consumed it, earliest step first.
TEST(ShardRules, GradientSlotsOneWriterAtATimeAndOnlyAfterTheUpdate) {
  Shard s({{0, 1, 2}}, 1);              // two contributions per pass (a tied embedding)
  s.rules.request_grad_slot(0, 1, 11);  // step 1's request arrives first
  s.rules.request_grad_slot(0, 0, 10);
  s.rules.request_grad_slot(0, 0, 12);
  EXPECT_EQ(s.pump(0), (V{"grant slot g0 t0 #10 overwrite"}));
  EXPECT_EQ(s.pump(0), V{}) << "a writer is active";
  s.rules.grad_written(0, 0);
  EXPECT_EQ(s.pump(0), (V{"grant slot g0 t0 #12 accumulate"})) << "step 1 waits for step 0's update";
  s.rules.grad_written(0, 0);
  EXPECT_EQ(s.pump(0), V{}) << "step 0 is not closed: no update, step 1 still waits";
  s.rules.close_step(0, one_pass());
  s.rules.weights_released(0, 0);
  EXPECT_EQ(s.pump(0), (V{"job AdamW update of step 0 g0"}));
  EXPECT_EQ(s.done(0), (V{"updated g0 t0", "grant slot g0 t1 #11 overwrite"}));
}

// Rule 4 with a guard: the sum of squares is reported once the gradient is complete; the update
// waits for the step's scale; a skipped step changes nothing but still advances the version.
TEST(ShardRules, GuardedStepsReportTheSumOfSquaresAndWaitForTheScale) {
  Shard s({{0, 1, 1}, {1, 1, 1}}, 1, /*guard=*/true);
  for (int g : {1, 0}) {
    s.rules.close_step(0, one_pass());
    s.rules.weights_released(g, 0);
    s.rules.request_grad_slot(g, 0, uint64_t(20 + g));
    s.pump(g);
    s.rules.grad_written(g, 0);
    EXPECT_EQ(s.pump(g), (V{fmt::format("job sum of squares of step 0 g{}", g)}));
    EXPECT_EQ(s.done(g, 2.5 + g), (V{fmt::format("sumsq g{} t0 = {}", g, 2.5 + g)}));
  }
  EXPECT_NE(s.rules.describe().find("waits for the scheduler's step scale"), std::string::npos)
      << s.rules.describe();
  // async: the groups update in the order their gradients completed (1 first)
  EXPECT_EQ(s.rules.scale_arrived(0, false, 0.25f), (std::vector<int>{1, 0}));
  EXPECT_EQ(s.pump(1), (V{"job AdamW update of step 0 g1"}));
  EXPECT_EQ(s.done(1), (V{"updated g1 t0"}));
  // a skip: no job, version 0 = version -1
  Shard k({{0, 1, 1}}, 1, true);
  k.rules.close_step(0, one_pass());
  k.rules.request_grad_slot(0, 0, 1);
  k.pump(0);
  k.rules.grad_written(0, 0);
  k.pump(0);
  k.done(0, 1e30);
  k.rules.scale_arrived(0, true, 0.f);
  EXPECT_EQ(k.pump(0), (V{"updated g0 t0"}));
  EXPECT_EQ(k.rules.published(0), 0);
  // sync: ascending groups whatever order the sums came in
  Shard y({{0, 1, 1}, {1, 1, 1}}, 0, true);
  EXPECT_EQ(y.rules.scale_arrived(0, false, 1.f), (std::vector<int>{0, 1}));
}

// Data-parallel replicas: once a group's gradient of a step is complete, the sum over the
// replicas runs first (the group busy meanwhile: no slot for the next step), then the guard's
// sum of squares or the update; with two writers it waits for both.
TEST(ShardRules, ReplicasSumTheCompleteGradientBeforeTheSumOfSquaresAndTheUpdate) {
  Shard s({{0, 1, 2}}, 1, /*guard=*/true, 0, /*reduce=*/true);
  s.rules.close_step(0, one_pass());
  s.rules.weights_released(0, 0);
  s.rules.request_grad_slot(0, 0, 1);
  EXPECT_EQ(s.pump(0), (V{"grant slot g0 t0 #1 overwrite"}));
  s.rules.grad_written(0, 0);
  EXPECT_EQ(s.pump(0), V{}) << "one of two contributions";
  s.rules.request_grad_slot(0, 0, 2);
  EXPECT_EQ(s.pump(0), (V{"grant slot g0 t0 #2 accumulate"}));
  s.rules.grad_written(0, 0);
  EXPECT_EQ(s.pump(0), (V{"job sum over the replicas of step 0 g0"}));
  s.rules.request_grad_slot(0, 1, 3);
  EXPECT_EQ(s.pump(0), V{}) << "busy while the sum runs";
  EXPECT_NE(s.rules.describe().find("sum over the replicas of step 0 running"), std::string::npos)
      << s.rules.describe();
  EXPECT_EQ(s.done(0), (V{"job sum of squares of step 0 g0"}));
  EXPECT_EQ(s.done(0, 4.0), (V{"sumsq g0 t0 = 4"}));
  s.rules.scale_arrived(0, false, 0.5f);
  EXPECT_EQ(s.pump(0), (V{"job AdamW update of step 0 g0"}));
  EXPECT_EQ(s.done(0), (V{"updated g0 t0", "grant slot g0 t1 #3 overwrite"}));
  // without a guard the update follows the sum directly; a resumed run has summed its past steps
  Shard u({{0, 1, 1}}, 0, false, 0, true);
  EXPECT_TRUE(u.rules.resume_at(3));
  u.rules.close_step(3, one_pass());
  u.rules.weights_released(0, 3);
  u.rules.request_grad_slot(0, 3, 1);
  u.pump(0);
  u.rules.grad_written(0, 3);
  EXPECT_EQ(u.pump(0), (V{"job sum over the replicas of step 3 g0"}));
  EXPECT_EQ(u.done(0), (V{"job AdamW update of step 3 g0 +publish"}));
  // no replicas: no sum
  Shard n({{0, 1, 1}}, 0);
  n.rules.close_step(0, one_pass());
  n.rules.weights_released(0, 0);
  n.rules.request_grad_slot(0, 0, 1);
  n.pump(0);
  n.rules.grad_written(0, 0);
  EXPECT_EQ(n.pump(0), (V{"job AdamW update of step 0 g0 +publish"}));
}

// Which running job is a replica sum (the shard charges the wait of a request it could not
// grant to that sum) along one step of each configuration; a slot request of the next step
// waits throughout, and has_waiters says so until the update grants it.
TEST(ShardRules, OnlyTheReduceJobIsARunningReplicaSum) {
  struct Row {
    bool guard, reduce;
    V jobs;  ///< each job the group runs, in order; "*": running_replica_sum returned it
  };
  const Row rows[] = {
      {false, false, {"AdamW update of step 0"}},
      {true, false, {"sum of squares of step 0", "AdamW update of step 0"}},
      {false, true, {"sum over the replicas of step 0 *", "AdamW update of step 0"}},
      {true,
       true,
       {"sum over the replicas of step 0 *", "sum of squares of step 0", "AdamW update of step 0"}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(fmt::format("guard {} reduce {}", r.guard, r.reduce));
    Shard s({{0, 1, 1}}, 1, r.guard, 0, r.reduce);
    s.rules.close_step(0, one_pass());
    s.rules.weights_released(0, 0);
    s.rules.request_grad_slot(0, 0, 1);
    s.pump(0);
    EXPECT_EQ(s.rules.running_replica_sum(0), nullptr) << "no job runs";
    EXPECT_FALSE(s.rules.has_waiters(0)) << "the slot was granted";
    s.rules.grad_written(0, 0);
    s.rules.request_grad_slot(0, 1, 2);  // waits for step 0's update (rule 3)
    s.pump(0);
    V seen;
    while (const ShardJob* j = s.rules.running_job(0)) {
      const ShardJob* sum = s.rules.running_replica_sum(0);
      if (sum) {
        EXPECT_EQ(sum, j);
      }
      seen.push_back(describe(*j) + (sum ? " *" : ""));
      EXPECT_TRUE(s.rules.has_waiters(0));
      s.done(0, 1.0);
      if (r.guard && !s.rules.busy(0) && s.rules.updated(0) < 0) {
        s.rules.scale_arrived(0, false, 0.5f);
        s.pump(0);
      }
    }
    EXPECT_EQ(seen, r.jobs);
    EXPECT_EQ(s.rules.updated(0), 0);
    EXPECT_EQ(s.rules.running_replica_sum(0), nullptr);
    EXPECT_FALSE(s.rules.has_waiters(0)) << "the update granted step 1's slot";
  }
  EXPECT_THROW(Shard({{0, 1, 1}}, 1).rules.running_replica_sum(3), std::logic_error);
}

// The guard-removal switches of the protocol tests: with rule 1 off an upload of a future
// iteration is granted at once; with rule 2 off two writers get the slot.
TEST(ShardRules, DisabledGuardsLetViolationsThrough) {
  Shard one({{0, 1, 1}}, 1, false, /*off=*/1);
  one.rules.request_weights(0, 5, 1);
  EXPECT_EQ(one.pump(0), (V{"grant weights g0 t5 #1"}));
  Shard two({{0, 1, 2}}, 1, false, /*off=*/2);
  two.rules.request_grad_slot(0, 0, 1);
  two.rules.request_grad_slot(0, 0, 2);
  EXPECT_EQ(two.pump(0), (V{"grant slot g0 t0 #1 overwrite", "grant slot g0 t0 #2 overwrite"}));
}

TEST(ShardRules, ResumeAndMisuse) {
  Shard s({{0, 1, 1}}, 1);
  EXPECT_TRUE(s.rules.resume_at(4));
  EXPECT_EQ(s.rules.updated(0), 3);
  EXPECT_EQ(s.rules.published(0), 2);
  s.rules.request_weights(0, 4, 1);
  EXPECT_EQ(s.pump(0), (V{"grant weights g0 t4 #1"}));
  EXPECT_FALSE(s.rules.resume_at(5)) << "only before anything happened";
  EXPECT_THROW(s.rules.request_weights(9, 0, 2), std::logic_error);
  EXPECT_THROW(s.done(0), std::logic_error) << "no job was running";
  EXPECT_EQ(Shard({{0, 1, 1}}, 1).rules.describe(), "idle");
}

}  // namespace
}  // namespace rp
