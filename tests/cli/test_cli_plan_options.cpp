// `roundpipe plan`'s options at their edges: the largest pool plans in seconds, and a value of
// the wrong kind is one line naming the option and what it expects; --fp8 plans FP8 weight
// gradients unless --bf16-wgrad.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

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

// Every numeric flag given a value of the wrong kind: one line naming it and what it expects, in
// the words of its range check (CLI11 said "Could not convert: --gpus = two").
TEST(CliPlanOptions, AValueOfTheWrongKindIsOneLineNamingTheFlag) {
  auto d = tmpdir();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--gpus two", "--gpus: expected an integer in 1..1024, got two"},
      {"--gpus 99999999999", "--gpus: expected an integer in 1..1024, got 99999999999"},
      {"--seq x", "--seq: expected an integer >= 1, got x"},
      {"--micro 1.5", "--micro: expected an integer >= 1, got 1.5"},
      {"--sequences-per-micro q", "--sequences-per-micro: expected an integer >= 1, got q"},
      {"--peak-tflops abc", "--peak-tflops: expected a rate from 0.001 to 1e6 TFLOP/s, got abc"},
      {"--fp8-tflops z",
       "--fp8-tflops: expected 0 (the preset's) or a rate from 0.001 to 1e6 TFLOP/s, got z"},
      {"--hbm-gbps 1e999", "--hbm-gbps: expected a rate from 0.001 to 1e6 GB/s, got 1e999"},
      {"--pcie-gbps fast", "--pcie-gbps: expected 0 (free) or a rate from 0.001 to 1e6 GB/s, got fast"},
      {"--iterations many", "--iterations: expected 0 (enough for whole deal cycles) to 10000, got many"},
      {"--mlp-chunk 4k", "--mlp-chunk: expected an integer >= 0 (0: 8192), got 4k"},
      {"--lora-r r16", "--lora-r: expected 0 (none) or an integer in 1..65536, got r16"},
      {"--nodes two", "--nodes: expected an integer >= 1, got two"},
      {"--net-gbps z", "--net-gbps: expected a rate from 0.001 to 1e6 Gbit/s, got z"},
      {"--net-latency-us z", "--net-latency-us: expected 0 to 1e6 microseconds, got z"},
      {"--accumulation 2.5", "--accumulation: expected an integer >= 1, got 2.5"},
      {"--grouped-gemm-efficiency half",
       "--grouped-gemm-efficiency: expected a fraction in [0.001, 1] (0: by --expert-gemm), got half"},
      {"--disk-gbps z", "--disk-gbps: expected 0 (off) or a rate from 0.001 to 1e6 GB/s, got z"},
      {"--disk-write-gbps z",
       "--disk-write-gbps: expected 0 (the read rate) or a rate from 0.001 to 1e6 GB/s"},
      {"--host-budget-gib z", "--host-budget-gib: expected 0 (default) or 0.001 to 1048576 GiB, got z"},
      {"--disk-ring z", "--disk-ring: expected an integer >= 2 (the runtime's ring has at least two), got z"},
      {"--host-gib z", "--host-gib: expected 0 (this machine's) or 0.001 to 1048576 GiB, got z"},
      // hexadecimal, infinities and NaNs are no decimal number, as for the integer flags (std::stod
      // read "0x10" as 16)
      {"--disk-gbps 0x10", "--disk-gbps: expected 0 (off) or a rate from 0.001 to 1e6 GB/s, got 0x10"},
      {"--host-gib 0X1p4", "--host-gib: expected 0 (this machine's) or 0.001 to 1048576 GiB, got 0X1p4"},
      {"--peak-tflops inf", "--peak-tflops: expected a rate from 0.001 to 1e6 TFLOP/s, got inf"},
      {"--grouped-gemm-efficiency nan",
       "--grouped-gemm-efficiency: expected a fraction in [0.001, 1] (0: by --expert-gemm), got nan"},
      {"--memory-cap 0x10GiB", "--memory-cap: '0x10GiB' is not a byte size (e.g. 24GiB, 512MB, 1e10)"},
      {"--disk-ring 0x10",
       "--disk-ring: expected an integer >= 2 (the runtime's ring has at least two), got 0x10"},
      // a number out of range: the same words
      {"--seq 0", "--seq: expected an integer >= 1, got 0"},
      {"--disk-ring 1", "--disk-ring: expected an integer >= 2 (the runtime's ring has at least two), got 1"},
  };
  for (const auto& [args, want] : cases) {
    const CliRun r = roundpipe("plan --model m.json " + args, d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: " + want), 0u) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("Could not convert"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  fs::remove_all(d);
}

// A flag given twice, or without its value, in any subcommand: one line naming the flag (CLI11
// said "--disk-gbps: At Most 1 required but received 2" and "--seq: 1 required INT missing").
TEST(CliPlanOptions, AFlagGivenTwiceOrWithoutItsValueIsOneLineNamingIt) {
  auto d = tmpdir();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plan --model m.json --disk-gbps 1 --disk-gbps 2", "--disk-gbps given twice"},
      {"plan --model m.json --gpus 2 --gpus 2 --gpus 4", "--gpus given 3 times"},
      {"plan --model m.json --model n.json", "--model given twice"},
      {"train s.json --steps 1 --steps 2", "--steps given twice"},
      {"convert m.gguf out --dtype f32 --dtype bf16", "--dtype given twice"},
      {"merge a out --base b --base c", "--base given twice"},
      {"plan --model m.json --seq", "--seq: expected an integer after it, got nothing"},
      {"plan --model m.json --disk-gbps", "--disk-gbps: expected a number after it, got nothing"},
      {"plan --model", "--model: expected a value after it, got nothing"},
  };
  for (const auto& [args, want] : cases) {
    const CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: " + want), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  fs::remove_all(d);
}

// --fp8 plans FP8 weight gradients in full fine-tuning, as the spec's default; --bf16-wgrad
// keeps them bf16 and predicts other times, --fp8-wgrad (the default) changes nothing. A LoRA
// run's frozen base has no weight gradient: there both give one plan. Either flag without
// --fp8, or both, is one line naming them.
TEST(CliPlanOptions, Fp8PlansFp8WeightGradientsUnlessBf16Wgrad) {
  auto d = tmpdir();
  const std::string base = "plan --model " + kConfigs + "qwen3-1.7b.json --gpus 1 --seq 8192 --micro 8 --fp8";
  auto tokens = [](const CliRun& r) {
    const auto at = r.out.find(" tokens/s\n");
    const auto from = r.out.rfind(' ', at - 1);
    return at == std::string::npos ? 0.0 : std::stod(r.out.substr(from + 1, at - from - 1));
  };
  auto untimed = [](std::string out) {  // the report less the planner's own time ("found in 0.15 ms")
    const auto at = out.find("found in ");
    if (at != std::string::npos) out.erase(at, out.find(" ms", at) - at);
    return out;
  };
  const CliRun fp8 = roundpipe(base, d), wgrad = roundpipe(base + " --fp8-wgrad", d),
               bf16 = roundpipe(base + " --bf16-wgrad", d);
  for (const CliRun* r : {&fp8, &wgrad, &bf16}) ASSERT_EQ(r->code, 0) << r->err;
  ASSERT_GT(tokens(fp8), 0) << fp8.out;
  EXPECT_EQ(untimed(fp8.out), untimed(wgrad.out));
  EXPECT_NE(tokens(fp8), tokens(bf16)) << fp8.out << bf16.out;
  EXPECT_NE(fp8.out.find(", their weight gradients too)"), std::string::npos) << fp8.out;
  EXPECT_EQ(bf16.out.find("their weight gradients"), std::string::npos) << bf16.out;
  const CliRun lora = roundpipe(base + " --lora-r 8", d),
               lora_bf16 = roundpipe(base + " --lora-r 8 --bf16-wgrad", d);
  ASSERT_EQ(lora.code, 0) << lora.err;
  EXPECT_EQ(untimed(lora.out), untimed(lora_bf16.out));
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--fp8-wgrad", "--fp8-wgrad needs --fp8"},
      {"--bf16-wgrad", "--bf16-wgrad needs --fp8"},
      {"--fp8 --fp8-wgrad --bf16-wgrad", "--fp8-wgrad and --bf16-wgrad: expected one of them"},
      {"--lora-targets q_proj", "--lora-targets needs --lora-r"},
      {"--frozen nf4 --lora-targets q_proj", "--lora-targets needs --lora-r"},
  };
  for (const auto& [args, want] : refused) {
    const CliRun r = roundpipe("plan --model m.json " + args, d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: " + want), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  fs::remove_all(d);
}

}  // namespace
