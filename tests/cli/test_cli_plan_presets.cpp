// `roundpipe plan --gpu NAME`, `--list-gpus` and the plan's host-memory section: a preset sets
// the rates and the memory cap, a flag beside it wins, an unknown name is a usage error naming
// the known ones, and the host need printed is the library's with its advice.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "base/host_resources.hpp"
#include "model/config.hpp"
#include "scheduler/gpu_presets.hpp"
#include "scheduler/host_memory.hpp"
#include "tests/cli/cli_util.hpp"

namespace fs = std::filesystem;

namespace {

using namespace rp::clitest;

const std::string kQwen = std::string(RP_SOURCE_DIR) + "/examples/configs/qwen3-1.7b.json";

// The "device" line of a plan's output.
std::string device_line(const std::string& out) {
  const auto a = out.find("\ndevice ");
  if (a == std::string::npos) return "";
  return out.substr(a + 1, out.find('\n', a + 1) - a - 1);
}

TEST(CliPlanPresets, ListPrintsEveryPresetWithItsSource) {
  auto d = tmpdir();
  CliRun r = roundpipe("plan --list-gpus", d);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const rp::GpuPreset& p : rp::gpu_presets()) {
    EXPECT_NE(r.out.find(p.name), std::string::npos) << p.name;
    EXPECT_NE(r.out.find(p.source), std::string::npos) << p.source;
  }
  EXPECT_NE(r.out.find("measured"), std::string::npos);
  fs::remove_all(d);
}

TEST(CliPlanPresets, APresetSetsTheRatesAndFlagsOverrideIt) {
  auto d = tmpdir();
  const std::string base = "plan --model " + kQwen + " --gpus 8 --seq 4096 --micro 8";
  CliRun r = roundpipe(base + " --gpu rtx4090", d);
  ASSERT_EQ(r.code, 0) << r.err;
  const rp::GpuRates want = rp::achievable_rates(*rp::find_gpu_preset("RTX 4090"));
  std::string line = device_line(r.out);
  EXPECT_NE(line.find("RTX 4090"), std::string::npos) << line;
  EXPECT_NE(line.find(fmt::format("{:.4g} TFLOP/s", want.tflops)), std::string::npos) << line;
  EXPECT_NE(line.find(fmt::format("PCIe {:.4g} GB/s", want.pcie_gbps)), std::string::npos) << line;
  EXPECT_NE(line.find("memory cap 24.00 GiB"), std::string::npos) << line;
  // an alias gives the same plan; explicit flags win over the preset's fields they name
  CliRun alias = roundpipe(base + " --gpu 4090", d);
  EXPECT_EQ(device_line(alias.out), line);
  r = roundpipe(base + " --gpu 4090 --peak-tflops 100 --memory-cap 20GiB", d);
  ASSERT_EQ(r.code, 0) << r.err;
  line = device_line(r.out);
  EXPECT_NE(line.find(" 100 TFLOP/s"), std::string::npos) << line;
  EXPECT_NE(line.find("memory cap 20.00 GiB"), std::string::npos) << line;
  EXPECT_NE(line.find(fmt::format("PCIe {:.4g} GB/s", want.pcie_gbps)), std::string::npos) << line;
  // a faster GPU predicts more tokens/s for the same plan shape
  auto tokens = [](const std::string& out) {
    const auto at = out.find(" tokens/s\n");
    const auto from = out.rfind(' ', at - 1);
    return std::stod(out.substr(from + 1, at - from - 1));
  };
  CliRun h200 = roundpipe(base + " --gpu h200 --memory-cap 24GiB", d);
  ASSERT_EQ(h200.code, 0) << h200.err;
  EXPECT_GT(tokens(h200.out), 2 * tokens(alias.out));
  fs::remove_all(d);
}

TEST(CliPlanPresets, AnUnknownGpuIsAUsageErrorListingTheKnownOnes) {
  auto d = tmpdir();
  CliRun r = roundpipe("plan --model " + kQwen + " --gpu rtx4080", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--gpu: unknown GPU 'rtx4080'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(rp::gpu_preset_names()), std::string::npos) << r.err;
  r = roundpipe("plan --gpu h200", d);  // --model is still required for a plan
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--model is required"), std::string::npos) << r.err;
  fs::remove_all(d);
}

TEST(CliPlanPresets, HostMemoryNeedAndAdviceComeFromTheHostModel) {
  auto d = tmpdir();
  const std::string base = "plan --model " + kQwen + " --gpu 4090 --gpus 8 --seq 8192 --micro 16";
  rp::HostRun run;
  run.seq_len = 8192, run.micro_batches = 16, run.workers = 8;
  const rp::ModelConfig c = rp::load_config_file(kQwen);
  const double need = rp::host_memory_need(c, run).total();
  CliRun r = roundpipe(base + " --host-gib 64", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("the run needs " + rp::byte_text(need)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over 90% of 64.0 GiB"), std::string::npos) << r.out;
  for (const rp::HostMemoryChange& ch : rp::host_memory_alternatives(c, run, 64.0 * (1 << 30))) {
    const std::string want =
        fmt::format("- {}: needs {} ({})", ch.what, rp::byte_text(ch.need), ch.fits ? "fits" : "still over");
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("--lora-r 16 --frozen nf4"), std::string::npos) << r.out;
  r = roundpipe(base + " --host-gib 1024", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("fits 90% of 1.00 TiB"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Changes that lower it"), std::string::npos) << r.out;
  r = roundpipe(base + " --host-gib -1", d);
  EXPECT_EQ(r.code, 2) << r.err;
  // one sequence per pass is the singular ("1 sequences per pass" before)
  r = roundpipe(
      "plan --model " + std::string(RP_SOURCE_DIR) +
          "/examples/configs/qwen3-30b-a3b.json --gpus 1 --seq 4096 --micro 8 --lora-r 32 --host-gib 40",
      d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("- 1 sequence per pass instead of 8 "), std::string::npos) << r.out;
  fs::remove_all(d);
}

// Over several nodes the advice keeps the step's batch with an accumulation the spec accepts
// (a multiple of the nodes: each runs accumulation / N passes) and names the plan's per-node
// --accumulation.
TEST(CliPlanPresets, FewerSequencesPerPassKeepTheBatchOverNodes) {
  auto d = tmpdir();
  const CliRun r = roundpipe("plan --model " + kQwen +
                                 " --gpu 4090 --gpus 8 --seq 8192 --micro 16 --nodes 2 --accumulation 3 "
                                 "--host-gib 16",
                             d);
  ASSERT_EQ(r.code, 0) << r.err;
  // 16 per pass, 3 passes on each of 2 nodes: a step of 96 sequences; 1 per pass takes 96 passes
  EXPECT_NE(r.out.find("- 1 sequence per pass instead of 16 (the batch of 96 kept with accumulation 96)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("plan --micro 1 --sequences-per-micro 1 --accumulation 48; spec: "
                       "\"sequences_per_step\": 96, \"micro_batches\": 1, \"accumulation\": 96\n"),
            std::string::npos)
      << r.out;
  fs::remove_all(d);
}

}  // namespace
