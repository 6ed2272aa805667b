// `roundpipe plan`'s options at their edges: the largest pool plans in seconds, and a value of
// the wrong kind is one line naming the option and what it expects.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const std::string kConfigs = std::string(RP_SOURCE_DIR) + "/examples/configs/";

// 1024 GPUs (the most --gpus accepts) on LLaMA-3.1-70B's 108 stages: the replay covered 2050
// iterations, each event visiting every GPU, and ran for many minutes.
TEST(CliPlanOptions, TheLargestPoolPlansInSeconds) {
  auto d = tmpdir();
  const auto t0 = std::chrono::steady_clock::now();
  const CliRun r =
      roundpipe_in(d, "plan --model " + kConfigs + "llama-3.1-70b.json --gpus 1024 --seq 4096 --micro 64", d,
                   "timeout 120");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.err;  // 124: timed out
  EXPECT_LT(s, 60) << r.out;
  EXPECT_NE(r.out.find("over 130 simulated iterations"), std::string::npos) << r.out;
  fs::remove_all(d);
}

}  // namespace
