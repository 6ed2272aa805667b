// A detached optimizer shard runs its long jobs (AdamW updates, deferred casts) off its
// actor thread (actors/optimizer_shard.cpp, JobRunner): while a large group updates, the
// shard still answers requests for its other groups. One real shard, driven from a scoped
// actor standing in for the scheduler and the workers.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/optimizer_shard.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

TEST(ShardJobs, OtherGroupsAreGrantedWhileALargeGroupUpdates) {
  ModelConfig c = tiny_config(false, true);
  c.vocab_size = 400000;  // embedding: 12.8M elements, an AdamW update of ~0.4 GB of traffic
  const ModelLayout m = make_layout(c);
  const int G = int(m.groups.size());
  ParamStore store(m, DType::f32);
  std::vector<std::vector<float>> master = random_weights(m, 3);
  std::vector<AdamWState> states(static_cast<size_t>(G));
  std::vector<ShardGroup> groups;
  for (int g = 0; g < G; ++g) groups.push_back(ShardGroup{g, &master[size_t(g)], &states[size_t(g)], 0, 1});
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<std::string> events;
  {
    caf::scoped_actor self{sys};
    ShardOptions so;  // detached, one thread: the update takes tens of milliseconds
    so.staleness = 1;
    ShardActor shard = spawn_optimizer_shard(sys, groups, &store, so, caf::actor_cast<SchedulerActor>(self));
    self->send(shard, CloseStep{0, 1, 1.f, 1e-2});
    self->request(shard, caf::infinite, AcquireGradSlot{0, 0}).receive([](GradGrant&) {}, [](caf::error&) {});
    float* grad = store.grad[0].as<float>();
    for (int64_t i = 0; i < m.groups[0].numel; ++i) grad[i] = 0.01f * float(i % 7) - 0.02f;
    self->send(shard, GradWritten{0, 0});  // the embedding's update for step 0 starts
    // iteration 1 reads version -1 of group 1, published from the start: answered at once
    // (a plain send: the grant comes back as an ordinary message, so both can be awaited)
    self->send(shard, AcquireWeights{1, 1});
    for (int i = 0; i < 2; ++i)
      self->receive([&](WeightsGranted& w) { events.push_back("granted " + std::to_string(w.group)); },
                    [&](GroupUpdated& u) { events.push_back("updated " + std::to_string(u.group)); },
                    caf::after(std::chrono::seconds(60)) >> [&] { events.push_back("timeout"); });
    self->send(shard, Shutdown{});
  }
  sys.await_all_actors_done();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "granted 1") << "the grant waited for the other group's update";
  EXPECT_EQ(events[1], "updated 0");
  EXPECT_EQ(states[0].step, 1) << "the update ran";
}

}  // namespace
}  // namespace rp::test
