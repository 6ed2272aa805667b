// A stop (SIGTERM) ends a run within stop_timeout_s plus the teardown even when the work in
// flight is one long device op: the CPU backend's attention, whose time grows with seq_len
// squared, stops after its current block once the session tears down.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

// 200,000-token sequences of a tiny model: each attention of the first step takes many minutes on
// the CPU backend. One SIGTERM abandons the step after stop_timeout_s (1 s), and the run used to
// stay in the teardown, waiting for that attention to finish, long after saying so.
TEST(CliStop, OneSigtermEndsARunStuckInALongAttention) {
  TinyRun t = tiny_run("{\"text\": \"In the beginning God created the heaven and the earth.\"}\n",
                       ", \"seq_len\": 200000, \"steps\": 3, \"stop_timeout_s\": 1");
  const SignalledRun r = train_with_signals(t.d, "spec.json", "sleep 4; kill -TERM $pid");
  const std::string& all = r.all;
  EXPECT_EQ(r.rc, "130\n") << all;
  EXPECT_LT(r.seconds, 20.0) << "4 s before the signal, 1 s stop timeout: the stop took too long\n" << all;
  EXPECT_NE(all.find("stop: step 1/3 did not finish within 1 s"), std::string::npos) << all;
  EXPECT_NE(all.find("no checkpoint was written"), std::string::npos) << all;
  for (const auto& e : fs::directory_iterator(t.d / "run"))
    EXPECT_EQ(e.path().filename().string().rfind("checkpoint-", 0), std::string::npos) << e.path();
  fs::remove_all(t.d);
}

}  // namespace
