// "fp8": true in full fine-tuning (FP8 weight gradients by default) on models whose decoder
// linears' input widths are not all multiples of 16, which the FP8 weight gradient's GEMM needs
// (model/fp8_linear.hpp, fp8_wgrad_width): the run's start line says which weight gradients run
// in FP8, the checkpoint records the linear compute that ran, and a checkpoint that recorded
// "fp8+wgrad" for a model where none could run resumes without a warning about it.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/layout.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/trainer/trainer_log.hpp"
#include "tests/trainer/varied_model.hpp"
#include "trainer/trainer_state.hpp"

namespace {

using namespace rp::clitest;
using rp::test::run_logging;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form.\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light.\"}\n";

// tiny_model's tokenizer and layer count with hidden 24, attention 2 x 12 and an MLP of 40: no
// linear reads a width that is a multiple of 16. Varied weights, so FP8 rounding shows.
fs::path odd_width_model(const fs::path& d) {
  rp::ModelConfig c = tiny_config_of(d);
  c.hidden_size = 24;
  c.head_dim = 12;
  c.intermediate_size = 40;
  return varied_model(d, c, "tiny-odd");
}

rp::TrainSpec spec_of(const fs::path& d, const fs::path& model, const std::string& out,
                      const std::string& extra, int64_t steps) {
  rp::TrainSpec s = rp::spec_from_json(
      nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / out, extra + ", \"save_dtype\": \"f32\"")),
      "test spec");
  s.steps = steps;
  s.seed = 5;
  return s;
}

std::vector<double> losses(const rp::TrainSpec& s) {
  std::vector<double> loss;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { loss.push_back(r.loss); };
  rp::Trainer(s).run(cb);
  return loss;
}

std::string recorded_compute(const fs::path& run) {
  return rp::read_trainer_state((run / "state/final/roundpipe_state.json").string())
      .linear_compute.value_or("");
}

TEST(TrainerFp8Widths, NoLinearWideEnoughKeepsBf16WeightGradientsAndSaysSo) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const fs::path model = odd_width_model(d);
  const std::string log = run_logging(spec_of(d, model, "fp8", ", \"fp8\": true", 2));
  EXPECT_NE(log.find("; FP8 e4m3 linears, weight gradients in bf16 (FP8 weight gradients need a linear whose "
                     "input width is a multiple of 16; this model has none)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("linears and weight gradients"), std::string::npos) << log;
  EXPECT_EQ(recorded_compute(d / "fp8"), "fp8");
  // what runs is the bf16 weight gradients' run: the same losses to the bit
  const std::vector<double> on = losses(spec_of(d, model, "on", ", \"fp8\": true", 3)),
                            off = losses(spec_of(d, model, "off",
                                                 ", \"fp8\": true, \"fp8_weight_gradients\": false", 3));
  ASSERT_EQ(on.size(), 3u);
  EXPECT_EQ(on, off);
  fs::remove_all(d);
}

// tiny_model: q, k, v, o, gate and up read 16 wide, down 24: 12 of the 14 linears
TEST(TrainerFp8Widths, SomeLinearsWideEnoughAreCounted) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const std::string log = run_logging(spec_of(d, tiny_model(d), "fp8", ", \"fp8\": true", 2));
  EXPECT_NE(
      log.find("; FP8 e4m3 linears and weight gradients (12 of 14 linears; the others, whose input width "
               "is not a multiple of 16, in bf16)"),
      std::string::npos)
      << log;
  EXPECT_EQ(recorded_compute(d / "fp8"), "fp8+wgrad");
  fs::remove_all(d);
}

// A checkpoint that recorded "fp8+wgrad" (the spec's intent) on a model where no linear could
// take FP8 weight gradients ran "fp8": resuming with "fp8" says nothing about the linear compute;
// resuming without FP8 names the change from "fp8".
TEST(TrainerFp8Widths, ARecordOfTheIntentResumesWithoutAWarning) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const fs::path model = odd_width_model(d);
  const rp::TrainResult first = rp::Trainer(spec_of(d, model, "first", ", \"fp8\": true", 2)).run();
  const fs::path state = d / "first/state/final/roundpipe_state.json";
  nlohmann::json j = nlohmann::json::parse(slurp(state));
  ASSERT_EQ(j.at("linear_compute"), "fp8");
  j["linear_compute"] = "fp8+wgrad";
  write(state, j.dump(2));
  // into other folders: the save would not replace a state file changed since it was written
  rp::TrainSpec fp8 = spec_of(d, model, "second", ", \"fp8\": true", 3);
  fp8.resume_from = first.checkpoint;
  const std::string log = run_logging(fp8);
  EXPECT_NE(log.find("resuming"), std::string::npos) << log;
  EXPECT_EQ(log.find("linear layers in"), std::string::npos) << log;
  rp::TrainSpec bf16 = spec_of(d, model, "third", "", 3);
  bf16.resume_from = first.checkpoint;
  const std::string plain = run_logging(bf16);
  EXPECT_NE(plain.find("linear layers in bf16 (saved run fp8;"), std::string::npos) << plain;
  fs::remove_all(d);
}

}  // namespace
