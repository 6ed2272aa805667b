// A stop (Ctrl-C, SIGTERM, StopToken) while the run waits for an evaluation keeps every
// finished step: the steps queued behind the evaluation in the pipeline finish once it has, and
// are saved like at a stop anywhere else. It used to spend the whole stop_timeout_s on a long
// evaluation and abandon the step behind it, saving nothing. A stop before the first step skips
// the sample before fine-tuning.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/checkpoint_bundle.hpp"

namespace {

using namespace rp::clitest;

TEST(StopDuringEval, AStopWhileAnEvaluationRunsSavesTheFinishedSteps) {
  auto d = tmpdir();
  std::string data;
  for (int i = 0; i < 40; ++i)
    data += "{\"text\": \"Verse " + std::to_string(i) + ": and God saw the light, that it was good.\"}\n";
  write(d / "data.jsonl", data);
  rp::TrainSpec spec = rp::spec_from_json(
      nlohmann::json::parse(spec_for(tiny_model(d), d / "data.jsonl", d / "out")), "test spec");
  spec.steps = 4;
  spec.save_dtype = "f32";
  spec.eval_fraction = 0.5;  // dozens of evaluation passes, each far shorter than stop_timeout_s
  spec.eval_every = 1;
  spec.pcie_gbps = 2e-4;  // every copy at 200 KB/s: the passes take time, not CPU luck
  spec.stop_timeout_s = 1.5;
  rp::StopToken stop;
  rp::TrainerCallbacks cb;
  // asked while step 2's batch is read: step 2 is queued behind the evaluation after step 1,
  // which the run then waits for
  using Clock = std::chrono::steady_clock;
  Clock::time_point asked, reported;
  cb.on_batch = [&](int64_t step, int64_t pass, const rp::TokenBatch&) {
    if (step == 1 && pass == 0) stop.request_stop(), asked = Clock::now();
  };
  cb.on_step = [&](const rp::StepReport& r) {
    if (r.step == 1) reported = Clock::now();  // after the evaluation behind step 1
  };
  const rp::TrainResult res = rp::Trainer(spec).run(cb, stop);
  EXPECT_TRUE(res.stopped);
  EXPECT_EQ(res.steps_done, 2) << "the step behind the evaluation was abandoned";
  EXPECT_EQ(res.steps_abandoned, 0);
  EXPECT_EQ(res.checkpoint, (d / "out/checkpoint-2").string());
  EXPECT_TRUE(rp::resumable_checkpoint((d / "out/checkpoint-2").string()));
  const std::string metrics = slurp(d / "out/metrics.csv");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 3) << metrics;  // header + steps 1 and 2
  // the case this test is about: the wait for the evaluation outlasted stop_timeout_s
  EXPECT_GT(std::chrono::duration<double>(reported - asked).count(), spec.stop_timeout_s)
      << "the evaluation was too short to test the stop during it; slow pcie_gbps down";
  fs::remove_all(d);
}

// A stop asked once the run is ready, before its first step, skips the sample before
// fine-tuning instead of generating it all first.
TEST(StopDuringEval, AStopBeforeTheFirstStepSkipsTheSampleBeforeFineTuning) {
  auto d = tmpdir();
  write(d / "data.jsonl", "{\"text\": \"And God saw the light, that it was good.\"}\n");
  rp::TrainSpec spec = rp::spec_from_json(
      nlohmann::json::parse(spec_for(tiny_model(d), d / "data.jsonl", d / "out")), "test spec");
  spec.sample_prompt = "Say hi";
  rp::StopToken stop;
  rp::TrainerCallbacks cb;
  cb.on_ready = [&] { stop.request_stop(); };
  std::ostringstream logged;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("run", std::make_shared<spdlog::sinks::ostream_sink_mt>(logged)));
  rp::TrainResult res;
  try {
    res = rp::Trainer(spec).run(cb, stop);
  } catch (...) {
    spdlog::set_default_logger(previous);
    throw;
  }
  spdlog::set_default_logger(previous);
  EXPECT_TRUE(res.stopped);
  EXPECT_EQ(res.steps_done, 0);
  EXPECT_EQ(logged.str().find("sample before fine-tuning:"), std::string::npos) << logged.str();
  EXPECT_NE(logged.str().find("the sample before fine-tuning is skipped"), std::string::npos) << logged.str();
  fs::remove_all(d);
}

}  // namespace
