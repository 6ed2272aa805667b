// The exposed part of the replicas' gradient sums (actors/reduce_wait.hpp): the accounting of
// ReduceWaitMeter on made-up times, then a Session whose sums are made slow by a fake
// Replicas: the wait must show up in StepResult::reduce_wait_s, and stay small when they are
// instant.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "actors/reduce_wait.hpp"
#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

using Clock = ReduceWaitMeter::Clock;
using ms = std::chrono::milliseconds;

TEST(ReduceWait, CountsFromTheFirstWaitingRequestToTheSumsEndMergedOverGroups) {
  ReduceWaitMeter m;
  const Clock::time_point t0 = Clock::now();
  m.blocked(0, 3, t0);  // no sum of group 0 runs yet: a wait for something else
  m.started(0, 3, t0);
  m.started(1, 3, t0 + ms(5));
  m.started(2, 3, t0);
  m.blocked(0, 3, t0 + ms(10));
  m.blocked(0, 3, t0 + ms(30));  // a later request of the same group: the first one counts
  m.blocked(1, 3, t0 + ms(20));
  m.done(0, 3, t0 + ms(50));      // [10, 50)
  m.done(1, 3, t0 + ms(60));      // [20, 60): overlaps, the union is [10, 60)
  m.done(2, 3, t0 + ms(100));     // nothing waited: hidden
  m.blocked(2, 3, t0 + ms(110));  // after its end: nothing to wait for
  m.started(3, 3, t0 + ms(200));
  m.blocked(3, 3, t0 + ms(190));  // waiting already when the sum started: counts from the start
  m.done(3, 3, t0 + ms(205));     // [200, 205)
  m.started(0, 4, t0 + ms(60));
  m.blocked(0, 4, t0 + ms(70));
  m.done(0, 4, t0 + ms(90));
  EXPECT_NEAR(m.seconds(3), 0.055, 1e-9);
  EXPECT_NEAR(m.seconds(3), 0.055, 1e-9) << "reading it twice gives the same";
  EXPECT_NEAR(m.seconds(4), 0.020, 1e-9);
  EXPECT_EQ(m.seconds(5), 0.0);
}

/// Replica 0 of two whose sums take `delay` (the other replica's part counts as zeros: the data
/// stays as it is) on their own threads, as the MPI thread would.
class SlowReplicas final : public Replicas {
 public:
  explicit SlowReplicas(ms delay) : delay_(delay) {}
  ~SlowReplicas() override {
    for (auto& f : pending_) f.wait();
  }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void sum_async(int, float*, int64_t, std::string, std::function<void(const std::string&)> done) override {
    std::lock_guard lk(mu_);
    pending_.push_back(std::async(std::launch::async, [d = delay_, done = std::move(done)] {
      std::this_thread::sleep_for(d);
      done("");
    }));
  }
  std::vector<std::vector<double>> allgather(const std::vector<double>& v) override { return {v, v}; }
  void abort(const std::string&) override {}
  ReplicaStats stats() const override { return {}; }
  std::string failure() const override { return ""; }

 private:
  const ms delay_;
  std::mutex mu_;
  std::vector<std::future<void>> pending_;
};

/// reduce_wait_s of steps 0..4 of a tiny model whose sums take `delay`.
std::vector<double> waits(bool async, ms delay) {
  auto replicas = std::make_shared<SlowReplicas>(delay);
  std::vector<double> out;
  {
    ModelLayout m = make_layout(tiny_config(false, true, 2));
    TestSessionOptions o;
    o.workers = 1;
    o.micro_batches = 2;
    o.micro = {1, 6};
    o.async = async;
    o.adam = adam_opts();
    o.replicas = replicas;
    TestSession s(m, random_weights(m, 5), o);
    for (int t = 0; t < 5; ++t) {
      std::vector<int32_t> ids, tg;
      random_tokens(m.config.vocab_size, 2 * 6, 40 + t, ids, tg);
      s.forward_backward(ids, tg);
      int64_t tokens = 0;
      for (int32_t y : tg) tokens += y >= 0;
      s.step(lr_at(t), 2 * tokens);  // both replicas' target tokens
    }
    for (int t = 0; t < 5; ++t) out.push_back(s.wait(t).reduce_wait_s);
  }
  return out;
}

// Steps 0..3 are followed by a step whose forward (sync) or backward (staleness 1) needs their
// summed gradients' update: a 150 ms sum is waited for, mostly; an instant one is not.
TEST(ReduceWait, ASlowSumShowsUpInTheStepsWaitAndAnInstantOneDoesNot) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "staleness 1" : "sync");
    const std::vector<double> slow = waits(async, ms(150)), fast = waits(async, ms(0));
    ASSERT_EQ(slow.size(), 5u);
    for (int t = 0; t < 4; ++t) {
      EXPECT_GT(slow[size_t(t)], 0.075) << "step " << t;
      EXPECT_LT(slow[size_t(t)], 1.0) << "step " << t;  // one sum's time, not all groups' added up
      EXPECT_LT(fast[size_t(t)], 0.05) << "step " << t;
    }
    for (double w : slow) EXPECT_GE(w, 0.0);
  }
}

}  // namespace
}  // namespace rp::test
