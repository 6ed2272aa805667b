// The trainer's end of fp16 loss scaling on the CUDA backend ("compute_dtype": "f16"): an
// initial loss scale of 2^40 overflows the tiny model's f16 gradients for real, and
//  - with "min_scale" at that scale the first step overflows at the floor: the run stops with
//    the documented error and writes no checkpoint;
//  - with a floor far below and "max_skipped_steps": 3, three overflowing steps in a row (the
//    scale halving each time, still far too large) stop the run with the skip-limit error;
//  - with a backoff that brings the scale down at once, the overflowing steps are skipped and
//    counted and the run finishes.
// The CPU backend refuses f16, so tests/trainer/test_robust.cpp feeds StepWatch by hand there.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "roundpipe/device.hpp"
#include "roundpipe/errors.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n";

rp::TrainSpec f16_spec(const fs::path& d, int64_t steps, const std::string& loss_scaling,
                       const std::string& extra = "") {
  write(d / "data.jsonl", kData);
  const std::string s =
      "{\"model\": \"" + tiny_model(d).string() + "\", \"data\": \"" + (d / "data.jsonl").string() +
      "\", \"output_dir\": \"" + (d / "run").string() +
      "\", \"seq_len\": 16, \"sequences_per_step\": 2, \"micro_batches\": 2, \"steps\": " +
      std::to_string(steps) +
      ", \"backend\": \"cuda\", \"workers\": 2, \"compute_dtype\": \"f16\", \"loss_scaling\": " +
      loss_scaling + extra + "}";
  return rp::spec_from_json(nlohmann::json::parse(s), "f16.json");
}

std::string diverged(const rp::TrainSpec& s, std::vector<rp::StepReport>* seen = nullptr) {
  rp::TrainerCallbacks cb;
  if (seen) cb.on_step = [seen](const rp::StepReport& r) { seen->push_back(r); };
  try {
    rp::Trainer(s).run(cb);
  } catch (const rp::TrainingDiverged& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

constexpr const char* kNoGpu = "no CUDA device visible: compute_dtype f16 needs the CUDA backend";

TEST(LossScalingCudaTrainer, OverflowAtTheFloorStopsTheRunWithTheDocumentedError) {
  if (rp::cuda_device_count() == 0) GTEST_SKIP() << kNoGpu;
  for (const char* async : {"false", "true"}) {
    auto d = tmpdir() / (std::string("async_") + async);
    fs::create_directories(d);
    const rp::TrainSpec s = f16_spec(d, 6, "{\"init_scale\": 1099511627776, \"min_scale\": 1099511627776}",
                                     std::string(", \"async\": ") + async);
    std::vector<rp::StepReport> seen;
    const std::string e = diverged(s, &seen);
    EXPECT_NE(e.find("step 1: the gradients overflow even at the loss scale's floor 1.09951e+12 "
                     "(loss_scaling.min_scale)"),
              std::string::npos)
        << async << ": " << e;
    EXPECT_NE(e.find("no checkpoint was written"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    ASSERT_EQ(seen.size(), 1u) << async;
    EXPECT_TRUE(seen[0].skipped);
    EXPECT_EQ(seen[0].loss_scale, std::ldexp(1.f, 40));
    EXPECT_FALSE(fs::exists(d / "run/final"));
  }
}

TEST(LossScalingCudaTrainer, TooManyOverflowsInARowStopTheRun) {
  if (rp::cuda_device_count() == 0) GTEST_SKIP() << kNoGpu;
  for (const char* async : {"false", "true"}) {
    auto d = tmpdir() / (std::string("async_") + async);
    fs::create_directories(d);
    const rp::TrainSpec s = f16_spec(d, 10, "{\"init_scale\": 1099511627776, \"backoff_factor\": 0.5}",
                                     std::string(", \"max_skipped_steps\": 3, \"async\": ") + async);
    std::vector<rp::StepReport> seen;
    const std::string e = diverged(s, &seen);
    EXPECT_NE(e.find("step 3: 3 steps in a row were skipped (overflowing gradients, loss scale"),
              std::string::npos)
        << async << ": " << e;
    ASSERT_EQ(seen.size(), 3u) << async;
    for (size_t k = 0; k < seen.size(); ++k) {
      EXPECT_TRUE(seen[k].skipped) << async << " step " << k + 1;
      EXPECT_FALSE(std::isfinite(seen[k].grad_norm)) << async << " step " << k + 1;
      if (k > 0) {
        EXPECT_LE(seen[k].loss_scale, seen[k - 1].loss_scale) << async << ": the scale only backs off";
      }
    }
    // each overflow halves the scale; a step uses the scale decided one step (sync) or two
    // steps (async) before it
    EXPECT_EQ(seen[2].loss_scale, std::ldexp(1.f, std::string(async) == "true" ? 39 : 38)) << async;
    EXPECT_FALSE(fs::exists(d / "run/final"));
  }
}

TEST(LossScalingCudaTrainer, OverflowingStepsAreSkippedAndTheRunFinishes) {
  if (rp::cuda_device_count() == 0) GTEST_SKIP() << kNoGpu;
  auto d = tmpdir();
  const rp::TrainSpec s =
      f16_spec(d, 8, "{\"init_scale\": 1099511627776, \"backoff_factor\": 9.313225746154785e-10}",
               ", \"max_skipped_steps\": 3");  // async: the first 2 steps overflow
  std::vector<rp::StepReport> seen;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { seen.push_back(r); };
  const rp::TrainResult res = rp::Trainer(s).run(cb);
  EXPECT_EQ(res.steps_done, 8);
  EXPECT_EQ(res.skipped_steps, 2);
  ASSERT_EQ(seen.size(), 8u);
  for (size_t k = 0; k < seen.size(); ++k) {
    EXPECT_EQ(seen[k].skipped, k < 2) << "step " << k + 1;
    EXPECT_EQ(seen[k].loss_scale, k < 2 ? std::ldexp(1.f, 40) : std::ldexp(1.f, 10)) << "step " << k + 1;
    EXPECT_TRUE(std::isfinite(seen[k].loss)) << "step " << k + 1;
  }
  EXPECT_TRUE(fs::exists(d / "run/final/model.safetensors"));
  const std::string csv = slurp(d / "run/metrics.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 9) << csv;  // the header and every step
}

}  // namespace
