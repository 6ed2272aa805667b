// Dying actors and stalled runs (actors/fault_injection.hpp, the scheduler's watchdog):
//  - a failure injected into a device op, a copy on a transfer stream, a transfer actor's
//    handler, a worker's handler, an optimizer job or the scheduler's handler reaches Session::wait and
//    synchronize as a RuntimeFailure naming what failed, promptly, for every later waiter too, and the
//    session is torn down without hanging;
//  - a run stuck on a throttled link makes the watchdog log one line naming what it waits
//    for (steps and passes, each worker's task and outstanding copies, each shard), wait_for
//    gives up, and the teardown does not wait for the link; a healthy run logs nothing.
// Every run is under tests/actors/bounded.hpp's watchdog: a hang aborts the test program.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/session_testing.hpp"
#include "tests/actors/bounded.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

using Clock = std::chrono::steady_clock;
using Site = FaultInjection::Site;

constexpr int64_t kNSeq = 2, kSeqLen = 5;

struct Scenario {
  int workers = 2;
  int64_t M = 3;
  int steps = 3;
  bool async = true;
  double pcie_bytes_per_s = 0;
  double watchdog_s = 0;
  std::function<void(const std::string&)> watchdog_log;
  FaultInjection faults;
};

/// A session on the tiny model with `steps` steps submitted (nothing waited for yet).
std::unique_ptr<TestSession> start(const Scenario& r) {
  ModelLayout m = make_layout(tiny_config(false, true));
  TestSessionOptions o;
  o.workers = r.workers;
  o.micro_batches = r.M;
  o.micro = {kNSeq, kSeqLen};
  o.async = r.async;
  o.adam = adam_opts();
  o.plan = make_uniform_plan(m.num_layers(), 2, 2, 1);  // F F T B B: every worker runs several stages
  o.shards = 2;
  o.device.pcie_bytes_per_s = r.pcie_bytes_per_s;
  o.watchdog_s = r.watchdog_s;
  o.watchdog_log = r.watchdog_log;
  o.faults = r.faults;
  auto s = std::make_unique<TestSession>(m, random_weights(m, 7), o);
  const int64_t n = r.M * kNSeq * kSeqLen;
  for (int t = 0; t < r.steps; ++t) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, n, 100 + t, ids, tg);
    s->forward_backward(ids, tg);
    s->step(lr_at(t));
  }
  return s;
}

/// Runs `r` (which must fail) and checks that wait(0), synchronize() and a wait for the last
/// step each throw one line containing every string of `needles`, within 10 s of the start
/// (a failure arrives promptly: these runs take milliseconds), and that the session is torn
/// down afterwards.
void expect_failure(const std::string& what, const Scenario& r, const std::vector<std::string>& needles) {
  SCOPED_TRACE(what);
  bounded(what, [&] {
    const auto t0 = Clock::now();
    auto s = start(r);
    std::vector<std::string> messages;
    auto expect_throw = [&](const char* call, auto&& fn) {
      try {
        fn();
        ADD_FAILURE() << call << " returned; expected RuntimeFailure";
      } catch (const RuntimeFailure& e) {
        messages.push_back(e.what());
      }
    };
    expect_throw("wait(0)", [&] { s->wait(0); });
    expect_throw("synchronize()", [&] { s->synchronize(); });
    expect_throw("wait(last)", [&] { s->wait(r.steps - 1); });
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_LT(seconds, 10.0) << "the failure took " << seconds << " s to arrive";
    for (const std::string& m : messages) {
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      for (const std::string& n : needles)
        EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
    }
    if (!messages.empty()) std::printf("%s: %s\n", what.c_str(), messages[0].c_str());
    s.reset();  // the teardown with work in flight
  });
}

TEST(Failures, DeviceOpFailureReachesEveryWaiter) {
  Scenario r;
  r.faults.site = Site::device_op;
  r.faults.worker = 1;
  r.faults.micro_batch = 1;
  expect_failure("device op", r, {"worker 1 (", "injected failure: device op of micro-batch 1"});
}

TEST(Failures, CopyFailingOnItsStreamReachesEveryWaiter) {
  Scenario r;
  r.faults.site = Site::transfer;
  r.faults.worker = 0;
  r.faults.copy = CopyKind::output;
  r.faults.micro_batch = 0;
  expect_failure("copy on its stream", r,
                 {"worker 0 (", "injected failure: worker0.act_down: copy of the output of micro-batch 0"});
}

TEST(Failures, WeightsCopyFailingReachesEveryWaiter) {
  Scenario r;
  r.faults.site = Site::transfer;
  r.faults.worker = 1;
  r.faults.copy = CopyKind::weights;
  r.faults.group = 2;
  expect_failure("weights copy", r,
                 {"worker 1 (", "injected failure: worker1.param_up: copy of the weights of group 2"});
}

TEST(Failures, TransferActorDyingFailsTheRun) {
  Scenario r;
  r.faults.site = Site::transfer_handler;
  r.faults.worker = 1;
  r.faults.copy = CopyKind::input;
  r.faults.micro_batch = 0;
  expect_failure(
      "transfer actor dies", r,
      {"worker 1", "transfer actor stopped: worker1.act_up: injected failure: request for the input"});
}

TEST(Failures, WorkerDyingFailsTheRun) {
  Scenario r;
  r.faults.site = Site::worker_handler;
  r.faults.worker = 0;
  r.faults.micro_batch = 2;
  expect_failure("worker dies", r, {"worker 0 (", "injected failure: the completion of micro-batch 2"});
}

TEST(Failures, OptimizerJobFailureReachesEveryWaiter) {
  for (bool async : {true, false}) {
    Scenario r;
    r.async = async;
    r.faults.site = Site::optimizer_job;
    r.faults.group = 1;
    r.faults.step = 0;
    expect_failure(
        async ? "optimizer job, async" : "optimizer job, sync", r,
        {"optimizer shard ", "AdamW update of step 0 of group 1 failed: injected failure: the AdamW kernel"});
  }
}

// The scheduler itself dies: the waiter it holds hears of it before it goes, later waits see
// it gone (Session::wait monitors it) instead of hanging.
TEST(Failures, SchedulerDyingFailsEveryWaiter) {
  Scenario r;
  r.faults.site = Site::scheduler_handler;
  expect_failure("scheduler dies", r, {"scheduler", "injected failure: a StageDone handler"});
}

/// Collects the watchdog's lines (from the scheduler's thread).
struct Lines {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& l) {
      std::lock_guard lk(mu);
      lines.push_back(l);
    };
  }
  std::vector<std::string> get() {
    std::lock_guard lk(mu);
    return lines;
  }
};

// A link of 2 KB/s: a layer's weights (~20 KB) take about 10 s per copy, so nothing completes
// for seconds. The watchdog (0.2 s) names what the run waits for; wait_for gives up; the
// teardown does not wait for the link.
TEST(Watchdog, AStalledRunSaysWhatItWaitsForAndTearsDownPromptly) {
  Lines log;
  bounded("stalled run", [&] {
    Scenario r;
    r.pcie_bytes_per_s = 2000;
    r.watchdog_s = 0.2;
    r.watchdog_log = log.sink();
    r.steps = 2;
    auto s = start(r);
    const auto t0 = Clock::now();
    EXPECT_FALSE(s->wait_for(0, 0.3).has_value()) << "a step finished on a 2 KB/s link";
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0) << "wait_for did not give up";
    while (log.get().empty() && Clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::vector<std::string> lines = log.get();
    ASSERT_FALSE(lines.empty()) << "no watchdog line within 20 s of a stall";
    const std::string& l = lines[0];
    std::printf("%s\n", l.c_str());
    EXPECT_EQ(l.find('\n'), std::string::npos);
    for (const char* n : {"watchdog: no progress for", "step 0", "pass 0",
                          "worker 0: current forward stage 0 of pass 0", "worker 1:", "copies outstanding: ",
                          "weights of group", "optimizer shard 0:", "optimizer shard 1:"})
      EXPECT_NE(l.find(n), std::string::npos) << "'" << n << "' not in: " << l;
    const std::string st = s->status();
    EXPECT_NE(st.find("worker 0: current forward stage 0 of pass 0"), std::string::npos) << st;
    const auto t1 = Clock::now();
    s.reset();
    const double teardown = std::chrono::duration<double>(Clock::now() - t1).count();
    EXPECT_LT(teardown, 5.0) << "the teardown waited for the throttled link";
  });
}

TEST(Watchdog, AHealthyRunLogsNothing) {
  Lines log;
  bounded("healthy run", [&] {
    Scenario r;
    r.watchdog_s = 2;
    r.watchdog_log = log.sink();
    auto s = start(r);
    s->synchronize();
    EXPECT_NE(s->status().find("nothing in flight"), std::string::npos) << s->status();
  });
  EXPECT_TRUE(log.get().empty()) << log.get()[0];
}

TEST(Watchdog, RejectsANegativePeriod) {
  ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.watchdog_s = -1;
  EXPECT_THROW(Session(m, random_weights(m, 7), o), std::invalid_argument);
}

}  // namespace
}  // namespace rp::test
