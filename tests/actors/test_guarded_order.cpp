// Guarded steps (clipping, loss scaling, inf/NaN skipping): every group of a step waits for the
// step's StepScale, then they all update at once. The order matters (docs/architecture.md,
// "Guarded steps"): async mode updates in the order the gradients completed (the next
// iteration's backward writes them again in that order, and rule 3 makes each write wait for
// this update); sync mode updates in ascending group order (the next forward uploads them so).
// One real shard, driven message by message from a scoped actor standing in for the scheduler
// and the workers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "actors/messages.hpp"
#include "actors/optimizer_shard.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

struct Observed {
  std::vector<int> sumsq_order, update_order;
  bool skipped_untouched = true;
};

Observed drive(int staleness, const std::vector<int>& completion, bool skip) {
  ModelLayout m = make_layout(tiny_config(false, true));
  const int G = int(m.groups.size());
  ParamStore store(m, DType::f32);
  std::vector<std::vector<float>> master = random_weights(m, 3);
  const auto initial = master;
  std::vector<AdamWState> states(static_cast<size_t>(G));
  std::vector<ShardGroup> groups;
  for (int g = 0; g < G; ++g) groups.push_back(ShardGroup{g, &master[size_t(g)], &states[size_t(g)], 0, 1});
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  Observed out;
  {
    caf::scoped_actor self{sys};
    ShardOptions so;
    so.staleness = staleness;
    so.guard = true;
    ShardActor shard = spawn_optimizer_shard(sys, groups, &store, so, caf::actor_cast<SchedulerActor>(self));
    self->send(shard, CloseStep{0, 1, 0.01f, 1e-2});
    for (int g : completion) {
      self->request(shard, caf::infinite, AcquireGradSlot{g, 0})
          .receive([](GradGrant&) {}, [](caf::error&) {});
      float* grad = store.grad[size_t(g)].as<float>();
      for (int64_t i = 0; i < m.groups[size_t(g)].numel; ++i) grad[i] = 0.01f * float(i % 7) - 0.02f;
      self->send(shard, GradWritten{g, 0});
      // the shard reports the group's sum of squares as soon as its gradient is complete
      self->receive([&](GradSumSq& s) { out.sumsq_order.push_back(s.group); });
    }
    self->send(shard, StepScale{0, skip, skip ? 0.f : 0.01f});
    for (int i = 0; i < G; ++i) self->receive([&](GroupUpdated& u) { out.update_order.push_back(u.group); });
    self->send(shard, Shutdown{});
  }
  sys.await_all_actors_done();
  for (int g = 0; g < G; ++g)
    if (std::memcmp(master[size_t(g)].data(), initial[size_t(g)].data(), master[size_t(g)].size() * 4) != 0 ||
        states[size_t(g)].step != 0)
      out.skipped_untouched = false;
  return out;
}

TEST(GuardedOrder, AsyncUpdatesInTheOrderGradientsCompleted) {
  // backward order of a tied model: the tail writes the head group and the embedding first
  const std::vector<int> completion{5, 0, 4, 3, 2, 1};
  const Observed o = drive(1, completion, false);
  EXPECT_EQ(o.sumsq_order, completion);
  EXPECT_EQ(o.update_order, completion);
  EXPECT_FALSE(o.skipped_untouched);  // the updates happened
  const std::vector<int> other{2, 5, 1, 0, 4, 3};
  EXPECT_EQ(drive(1, other, false).update_order, other);
}

TEST(GuardedOrder, SyncUpdatesInForwardOrder) {
  const Observed o = drive(0, {5, 0, 4, 3, 2, 1}, false);
  EXPECT_EQ(o.update_order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(GuardedOrder, ASkippedStepStillReportsEveryGroupAndChangesNothing) {
  const Observed o = drive(1, {5, 0, 4, 3, 2, 1}, true);
  EXPECT_EQ(o.update_order.size(), 6u);
  EXPECT_TRUE(o.skipped_untouched);
}

}  // namespace
}  // namespace rp::test
