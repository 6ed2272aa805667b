// A session that ends while gradient sums are in flight (a run abandoned by a stop or a
// failure): the communication thread may still use the gradient slots and the peers wait for
// sums that will never finish. The session must fail the replicas (Replicas::abort, naming
// the sums) before it frees its buffers, and keep the buffers when the abort is not confirmed.
// A fake Replicas (rank 0 of 2) holds every sum without finishing it, as a peer that never
// sends its half would.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

class StuckReplicas final : public Replicas {
 public:
  struct Sum {
    float* data;
    int64_t n;
    std::function<void(const std::string&)> done;
  };
  /// confirm: abort() fails the replicas (failure() non-empty, every held sum gets the error),
  /// as MpiReplicas does; else abort() is recorded and nothing else happens.
  explicit StuckReplicas(bool confirm) : confirm_(confirm) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void sum_async(int, float* data, int64_t n, std::string,
                 std::function<void(const std::string&)> done) override {
    std::lock_guard lk(mu_);
    held_.push_back({data, n, std::move(done)});
  }
  std::vector<std::vector<double>> allgather(const std::vector<double>& v) override { return {v, v}; }
  void abort(const std::string& error) override {
    std::vector<Sum> fail;
    {
      std::lock_guard lk(mu_);
      aborts_.push_back(error);
      if (!confirm_) return;
      failure_ = "replica 0 failed: " + error;
      fail.swap(held_);
    }
    for (auto& s : fail) s.done(failure_);
  }
  ReplicaStats stats() const override { return {}; }
  std::string failure() const override {
    std::lock_guard lk(mu_);
    return failure_;
  }
  size_t held() const {
    std::lock_guard lk(mu_);
    return held_.size();
  }
  std::vector<std::string> aborts() const {
    std::lock_guard lk(mu_);
    return aborts_;
  }
  std::vector<Sum> take_held() {
    std::lock_guard lk(mu_);
    return std::move(held_);
  }

 private:
  const bool confirm_;
  mutable std::mutex mu_;
  std::vector<Sum> held_;
  std::vector<std::string> aborts_;
  std::string failure_;
};

/// A session of a tiny model, one worker, 2 micro-batches of one 6-token sequence, with step 0
/// submitted (its sums go to `replicas`).
struct StepZero {
  ModelLayout m = make_layout(tiny_config(false, true, 2));
  TestSession s;
  explicit StepZero(const std::shared_ptr<StuckReplicas>& replicas)
      : s(m, random_weights(m, 5), options(replicas)) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, 2 * 6, 40, ids, tg);
    s.forward_backward(ids, tg);
    s.step(1e-3, 100);
  }
  static TestSessionOptions options(const std::shared_ptr<StuckReplicas>& replicas) {
    TestSessionOptions o;
    o.workers = 1;
    o.micro_batches = 2;
    o.micro = {1, 6};
    o.adam = adam_opts();
    o.replicas = replicas;
    o.watchdog_s = 0;
    return o;
  }
};

/// Runs step 0 until `replicas` holds at least one sum, then ends the session.
void end_with_sums_in_flight(const std::shared_ptr<StuckReplicas>& replicas) {
  StepZero run(replicas);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (replicas->held() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GT(replicas->held(), 0u) << "no gradient sum was issued within 30 s";
}

TEST(ReplicaTeardown, SumsInFlightFailTheReplicasBeforeTheBuffersAreFreed) {
  auto replicas = std::make_shared<StuckReplicas>(true);
  end_with_sums_in_flight(replicas);
  const auto aborts = replicas->aborts();
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_NE(aborts[0].find("replica 0 ended its session with"), std::string::npos) << aborts[0];
  EXPECT_NE(aborts[0].find("in flight"), std::string::npos) << aborts[0];
  EXPECT_EQ(replicas->held(), 0u) << "the abort failed every held sum";
}

TEST(ReplicaTeardown, AnUnconfirmedAbortLeavesTheGradientBuffersAllocated) {
  std::ostringstream logged;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(logged);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("teardown", sink));
  auto replicas = std::make_shared<StuckReplicas>(false);
  end_with_sums_in_flight(replicas);
  spdlog::set_default_logger(previous);
  EXPECT_EQ(replicas->aborts().size(), 1u);
  EXPECT_NE(logged.str().find("the gradient buffers are left allocated"), std::string::npos) << logged.str();
  // what a late communication thread would do: the slots are still there to write
  for (auto& s : replicas->take_held()) {
    for (int64_t i = 0; i < s.n; ++i) s.data[i] = 1.f;
    s.done("late");
  }
}

// A session whose sums all finished ends without aborting anyone.
TEST(ReplicaTeardown, NoAbortWhenEverySumFinished) {
  auto replicas = std::make_shared<StuckReplicas>(true);
  {
    StepZero run(replicas);
    // finish every sum as a healthy peer would (the data stays: the other half counts as zeros)
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::optional<StepResult> r;
    while (!r && std::chrono::steady_clock::now() < deadline) {
      for (auto& h : replicas->take_held()) h.done("");
      r = run.s.wait_for(0, 0.01);
    }
    ASSERT_TRUE(r) << "step 0 did not close";
    run.s.synchronize();
  }
  EXPECT_TRUE(replicas->aborts().empty());
}

}  // namespace
}  // namespace rp::test
