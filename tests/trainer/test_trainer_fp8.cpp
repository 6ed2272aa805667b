// "fp8": true (docs/gpu.md, "FP8 linears") through the trainer on the CPU backend, whose FP8
// rounding is the CUDA backend's bit for bit: a tiny model trained with and without it from the
// same seed follows the same loss curve (windows of 20 steps within kFp8LossBar), and the spec
// key is refused with one line where it cannot run.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/layout.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/trainer/varied_model.hpp"

namespace {

using namespace rp::clitest;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light.\"}\n"
    "{\"text\": \"And God saw the light, that it was good: and God divided the light from the darkness.\"}\n";

// docs/fidelity.md, "FP8 linears": the bar of the loss curves' 20-step window means.
constexpr double kFp8LossBar = 0.01;
constexpr int64_t kWindow = 20, kSteps = 60;

// tiny_model's architecture and tokenizer with varied weights (tests/trainer/varied_model.hpp).
fs::path varied_tiny_model(const fs::path& d) { return varied_model(d, tiny_config_of(d), "tiny-varied"); }

// extra: spec keys added (", \"fp8\": true", ...)
std::vector<double> loss_curve(const fs::path& d, const std::string& out, const std::string& extra,
                               int64_t steps = kSteps, const fs::path& model = {}) {
  const fs::path m = model.empty() ? varied_tiny_model(d) : model;
  rp::TrainSpec s =
      rp::spec_from_json(nlohmann::json::parse(spec_for(m, d / "data.jsonl", d / out, extra)), "test spec");
  s.steps = steps;
  s.seed = 5;
  s.adam.lr = 0.003;
  s.lr_schedule.kind = "constant";
  s.lr_schedule.lr = 0.003;
  std::vector<double> loss;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { loss.push_back(r.loss); };
  const rp::TrainResult res = rp::Trainer(s).run(cb);
  EXPECT_EQ(res.steps_done, steps);
  return loss;
}

// FP8 linears with bf16 weight gradients; "fp8" alone in full fine-tuning: FP8 weight gradients too
const char* kFp8 = ", \"fp8\": true, \"fp8_weight_gradients\": false";
const char* kFp8Wgrad = ", \"fp8\": true";

// The windows of two loss curves within kFp8LossBar of each other, and some loss different.
void expect_windows_within_the_bar(const std::vector<double>& plain, const std::vector<double>& fp8) {
  ASSERT_EQ(plain.size(), size_t(kSteps));
  ASSERT_EQ(fp8.size(), size_t(kSteps));
  EXPECT_LT(plain.back(), 0.9 * plain.front()) << "the run does not learn: the comparison would be empty";
  bool differs = false;
  for (int64_t w = 0; w < kSteps / kWindow; ++w) {
    double a = 0, b = 0;
    for (int64_t i = w * kWindow; i < (w + 1) * kWindow; ++i) {
      a += plain[size_t(i)];
      b += fp8[size_t(i)];
      differs = differs || plain[size_t(i)] != fp8[size_t(i)];
    }
    const double rel = std::fabs(b - a) / a;
    std::printf("window %lld: bf16-path mean %.6f, fp8 mean %.6f, relative difference %.5f\n", (long long)w,
                a / kWindow, b / kWindow, rel);
    EXPECT_LT(rel, kFp8LossBar) << "window " << w;
  }
  EXPECT_TRUE(differs) << "the FP8 run's losses equal the other's: its linears did not run in FP8";
}

// With FP8 weight gradients as well ("fp8" alone, their default in full fine-tuning): the same
// bar against the compute-dtype run, and a curve of its own (not the FP8 run's with bf16
// weight gradients).
TEST(TrainerFp8, WeightGradientsInFp8StayWithinTheBar) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const std::vector<double> plain = loss_curve(d, "plain", ""), fp8 = loss_curve(d, "fp8", kFp8),
                            wgrad = loss_curve(d, "wgrad", kFp8Wgrad);
  expect_windows_within_the_bar(plain, wgrad);
  EXPECT_NE(wgrad, fp8)
      << "\"fp8\": true alone ran the bf16 weight gradients of \"fp8_weight_gradients\": false";
  fs::remove_all(d);
}

TEST(TrainerFp8, LossCurveFollowsTheComputeDtypeRun) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const std::vector<double> plain = loss_curve(d, "plain", ""), fp8 = loss_curve(d, "fp8", kFp8);
  expect_windows_within_the_bar(plain, fp8);
  fs::remove_all(d);
}

// Sums of two loss curves of one window (the FP8 run's losses each finite) and whether they differ.
struct CurveSums {
  double plain = 0, fp8 = 0;
  bool differs = false;
};
CurveSums sum_curves(const std::vector<double>& plain, const std::vector<double>& fp8) {
  CurveSums c;
  for (size_t i = 0; i < fp8.size(); ++i) {
    EXPECT_TRUE(std::isfinite(fp8[i])) << "step " << i + 1;
    c.plain += plain[i];
    c.fp8 += fp8[i];
    c.differs = c.differs || plain[i] != fp8[i];
  }
  return c;
}

// A sparse (Qwen3-MoE) model: its attention projections run in FP8, its router and experts
// stay bf16 (the weight cache holds the four attention linears only).
TEST(TrainerFp8, MixtureOfExpertsTrainsWithItsAttentionInFp8) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const fs::path moe = tiny_model(d, true);
  const std::vector<double> plain = loss_curve(d, "plain", "", kWindow, moe),
                            fp8 = loss_curve(d, "fp8", kFp8, kWindow, moe);
  ASSERT_EQ(fp8.size(), size_t(kWindow));
  const CurveSums c = sum_curves(plain, fp8);
  const double a = c.plain, b = c.fp8;
  const bool differs = c.differs;
  EXPECT_TRUE(differs);
  EXPECT_LT(std::fabs(b - a) / a, kFp8LossBar);
  fs::remove_all(d);
}

// LoRA over a base stored as fp8 (e4m3, a scale per row): with FP8 linears its linears whose
// sides are multiples of 16 (here q and o; k, v and the MLP's are not) run from the stored codes
// (the worker copies them as they are, model/fp8_linear.hpp), the others dequantize and
// requantize as before. The losses follow the run without FP8 linears on the same base within
// the bar; a layer reading storage bytes as weights (or weights as storage) would not.
TEST(TrainerFp8, LoraOverAnFp8StoredBaseRunsFromItsCodes) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const std::string lora =
      ", \"lora\": {\"r\": 4, \"alpha\": 8, \"target_modules\": \"all-linear\", \"base_format\": \"fp8\"}";
  const std::vector<double> plain = loss_curve(d, "plain", lora, kWindow),
                            fp8 =
                                loss_curve(d, "fp8", lora + kFp8 + ", \"fp8_stored_direct\": true", kWindow);
  ASSERT_EQ(fp8.size(), size_t(kWindow));
  const CurveSums c = sum_curves(plain, fp8);
  const double a = c.plain, b = c.fp8;
  const bool differs = c.differs;
  std::printf("fp8-stored base: mean loss without FP8 linears %.6f, with %.6f\n", a / kWindow, b / kWindow);
  EXPECT_TRUE(differs) << "the FP8 run's losses equal the other's: its linears did not run in FP8";
  EXPECT_LT(std::fabs(b - a) / a, kFp8LossBar);
  fs::remove_all(d);
}

TEST(TrainerFp8, SpecKeyIsChecked) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  auto parse = [&](const std::string& extra) {
    return spec_result(d, extra, [](const rp::TrainSpec& s) { return std::string(s.fp8 ? "ok fp8" : "ok"); });
  };
  EXPECT_EQ(parse(""), "ok");
  EXPECT_EQ(parse(", \"fp8\": true"), "ok fp8");
  EXPECT_EQ(parse(", \"fp8\": false"), "ok");
  EXPECT_EQ(
      parse(", \"compute_dtype\": \"f16\", \"fp8\": true"),
      "s.json: key 'fp8': needs \"compute_dtype\": \"bf16\" (the FP8 linears quantize bf16 activations; f16 "
      "is not supported)");
  EXPECT_EQ(parse(", \"compute_dtype\": \"f16\", \"gemm_accumulate\": \"f16\", \"fp8\": true")
                .find("s.json: key 'fp8'"),
            0u);
  EXPECT_NE(parse(", \"fp8\": \"yes\"").find("fp8"), std::string::npos);
  EXPECT_EQ(parse(", \"fp8\": true, \"fp8_weight_gradients\": true"), "ok fp8");
  EXPECT_EQ(parse(", \"fp8\": true, \"fp8_stored_direct\": true"), "ok fp8");
  EXPECT_EQ(parse(", \"fp8_stored_direct\": true"),
            "s.json: key 'fp8_stored_direct': needs \"fp8\": true (it runs an fp8 base's FP8 linears from "
            "its codes)");
  EXPECT_NE(parse(", \"fp8\": true, \"fp8_stored_direct\": 1").find("fp8_stored_direct"), std::string::npos);
  EXPECT_EQ(parse(", \"fp8_weight_gradients\": true"),
            "s.json: key 'fp8_weight_gradients': needs \"fp8\": true (it moves the FP8 linears' weight "
            "gradients to FP8 as well)");
  fs::remove_all(d);
}

// "fp8_weight_gradients" absent: on with "fp8" in full fine-tuning, off without "fp8" or with
// "lora" / "adapter" (a frozen base has no weight gradient); given: as given, true refused
// where it cannot run, and --set writes it either way.
TEST(TrainerFp8, WeightGradientsDefaultToFp8InFullFineTuning) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  auto wgrad = [&](const std::string& extra) {
    return spec_result(
        d, extra,
        [](const rp::TrainSpec& s) { return std::string(rp::fp8_weight_gradients_on(s) ? "on" : "off"); },
        true);
  };
  const std::string lora = ", \"lora\": {\"r\": 4}", adapter = ", \"adapter\": \"adapter-folder\"";
  EXPECT_EQ(wgrad(""), "off");
  EXPECT_EQ(wgrad(", \"fp8\": true"), "on");
  EXPECT_EQ(wgrad(", \"fp8\": false"), "off");
  EXPECT_EQ(wgrad(", \"fp8\": true" + lora), "off");
  EXPECT_EQ(wgrad(", \"fp8\": true" + adapter), "off");
  EXPECT_EQ(wgrad(", \"fp8\": true, \"fp8_weight_gradients\": false"), "off");
  EXPECT_EQ(wgrad(", \"fp8\": true, \"fp8_weight_gradients\": false" + lora), "off");
  EXPECT_EQ(wgrad(", \"fp8_weight_gradients\": false"), "off");
  EXPECT_EQ(wgrad(", \"fp8\": true, \"fp8_weight_gradients\": true"), "on");
  const std::string refused =
      "s.json: key 'fp8_weight_gradients': expected false with \"lora\" or \"adapter\" (a frozen base "
      "computes no weight gradient; the adapters' stay bf16), got true";
  EXPECT_EQ(wgrad(", \"fp8\": true, \"fp8_weight_gradients\": true" + lora), refused);
  EXPECT_EQ(wgrad(", \"fp8\": true, \"fp8_weight_gradients\": true" + adapter), refused);
  EXPECT_EQ(wgrad(", \"fp8_weight_gradients\": true"),
            "s.json: key 'fp8_weight_gradients': needs \"fp8\": true (it moves the FP8 linears' weight "
            "gradients to FP8 as well)");
  // --set over a spec file with "fp8": true
  const fs::path file = d / "s.json";
  write(file, spec_for(d / "m", d / "data.jsonl", d / "run", ", \"fp8\": true"));
  auto with_set = [&](const std::string& set) {
    return rp::fp8_weight_gradients_on(rp::load_spec(file.string(), {rp::parse_set_option(set)}));
  };
  EXPECT_FALSE(with_set("fp8_weight_gradients=false"));
  EXPECT_TRUE(with_set("fp8_weight_gradients=true"));
  EXPECT_FALSE(with_set("fp8=false"));
  // without "fp8" on a LoRA spec the LoRA conflict is named first (fixing "needs fp8" would
  // only lead into it), and as the spec is read, naming the --set that wrote the key
  EXPECT_EQ(wgrad(", \"fp8_weight_gradients\": true" + lora), refused);
  const fs::path lora_file = d / "lora.json";
  write(lora_file, spec_for(d / "m", d / "data.jsonl", d / "run", ", \"fp8\": true" + lora));
  try {
    rp::load_spec(lora_file.string(), {rp::parse_set_option("fp8_weight_gradients=true")});
    ADD_FAILURE() << "fp8_weight_gradients=true with lora was accepted when the spec was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--set fp8_weight_gradients=true: key 'fp8_weight_gradients'", 0),
              0u)
        << e.what();
  }
  fs::remove_all(d);
}

}  // namespace
