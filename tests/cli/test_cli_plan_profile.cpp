// `roundpipe plan --profile`: the profile a run writes records the linear compute it was measured
// in ("linear_compute"); planning it with flags that run another (--fp8, --bf16-wgrad) is one
// line naming the file, the recorded mode and the flags, and a profile written before the field
// existed plans with a warning on the costs line.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "scheduler/profile.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

/// ":<line>" of the first `needle` in `text`.
std::string line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return ":" +
         std::to_string(1 + std::count(text.begin(), text.begin() + long(std::min(at, text.size())), '\n'));
}

// The tiny model trained 2 steps with `extra` spec keys: its run folder.
fs::path trained(const fs::path& d, const std::string& name, const std::string& extra) {
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / (name + ".json"), spec_for(tiny_model(d), d / "data.jsonl", d / name, extra));
  const CliRun r = roundpipe("train " + (d / (name + ".json")).string(), d);
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  return d / name;
}

CliRun plan(const fs::path& d, const fs::path& run, const std::string& flags) {
  return roundpipe("plan --model " + (run / "final").string() + " --gpus 2 --seq 16 --micro 2 --profile " +
                       (run / "profile.json").string() + flags,
                   d);
}

TEST(CliPlanProfile, APlanInAnotherLinearComputeIsRefusedNamingTheFileAndFlags) {
  auto d = tmpdir();
  const fs::path bf16 = trained(d, "bf16", ""), fp8 = trained(d, "fp8", ", \"fp8\": true");
  // tiny_model's q, k, v, o, gate and up read 16 wide: FP8 weight gradients run there
  EXPECT_EQ(rp::Profile::load((bf16 / "profile.json").string()).linear_compute, "bf16");
  EXPECT_EQ(rp::Profile::load((fp8 / "profile.json").string()).linear_compute, "fp8+wgrad");
  const fs::path wgrad16 = trained(d, "fp8w", ", \"fp8\": true, \"fp8_weight_gradients\": false");
  EXPECT_EQ(rp::Profile::load((wgrad16 / "profile.json").string()).linear_compute, "fp8");

  for (const auto& [run, flags] : {std::pair{bf16, std::string()}, std::pair{fp8, std::string(" --fp8")},
                                   std::pair{wgrad16, std::string(" --fp8 --bf16-wgrad")}}) {
    const CliRun r = plan(d, run, flags);
    EXPECT_EQ(r.code, 0) << flags << ": " << r.err;
    EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
  }
  const std::string bf16_file = (bf16 / "profile.json").string(), fp8_file = (fp8 / "profile.json").string();
  expect_one_line_error(plan(d, bf16, " --fp8"),
                        bf16_file +
                            ": measured with linear layers in bf16, planned in fp8+wgrad (--fp8); plan it "
                            "without --fp8 or measure a profile in fp8+wgrad");
  expect_one_line_error(plan(d, fp8, ""), fp8_file +
                                              ": measured with linear layers in fp8+wgrad, planned in bf16 "
                                              "(no --fp8); plan it with --fp8 or measure");
  expect_one_line_error(plan(d, fp8, " --fp8 --bf16-wgrad"),
                        fp8_file +
                            ": measured with linear layers in fp8+wgrad, planned in fp8 (--fp8 "
                            "--bf16-wgrad); plan it with --fp8 or");
  expect_one_line_error(plan(d, wgrad16, " --fp8"),
                        "in fp8, planned in fp8+wgrad (--fp8); plan it with --fp8 --bf16-wgrad or");
  // a LoRA plan cannot have FP8 weight gradients: the hint says to drop the LoRA flags
  expect_one_line_error(plan(d, fp8, " --fp8 --lora-r 4"),
                        "planned in fp8 (--fp8); plan it with --fp8 and without --lora-r / --frozen (a "
                        "frozen base computes no weight gradient) or measure a profile in fp8");
  fs::remove_all(d);
}

// A profile without the field (as earlier releases wrote it) plans, saying once that its
// linear compute is unknown; a value outside the three is refused naming the key.
TEST(CliPlanProfile, AProfileWithoutTheRecordPlansWithOneWarning) {
  auto d = tmpdir();
  const fs::path run = trained(d, "run", "");
  const fs::path file = run / "profile.json";
  nlohmann::json j = nlohmann::json::parse(slurp(file));
  ASSERT_EQ(j.at("linear_compute"), "bf16");
  j.erase("linear_compute");
  write(file, j.dump(1));
  const CliRun r = plan(d, run, " --fp8");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string warning =
      "warning: it does not record the linear compute it was measured in (written before profiles did), "
      "planned as fp8+wgrad (--fp8)";
  const auto at = r.out.find(warning);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("linear compute", at + warning.size()), std::string::npos) << "said twice: " << r.out;
  EXPECT_EQ(r.out.rfind("costs     profile ", at), r.out.rfind('\n', at) + 1) << "not on the costs line";
  j["linear_compute"] = "fp4";
  write(file, j.dump(1));
  expect_one_line_error(plan(d, run, ""), file.string() + line_of(j.dump(1), "\"linear_compute\"") +
                                              ": key 'linear_compute': expected \"bf16\", \"fp8\" or "
                                              "\"fp8+wgrad\", got \"fp4\"");
  fs::remove_all(d);
}

// A profile measured at another micro-batch shape plans with a warning that says what it means:
// the measured layers keep their measured times (they are not rescaled to the planned tokens).
TEST(CliPlanProfile, AProfileOfAnotherShapeSaysItsTimesAreThatShapes) {
  auto d = tmpdir();
  const fs::path run = trained(d, "run", "");
  const rp::Profile p = rp::Profile::load((run / "profile.json").string());
  const std::string measured = std::to_string(p.n_seq()) + " x " + std::to_string(p.seq_len());
  const CliRun same = plan(d, run, " --sequences-per-micro " + std::to_string(p.n_seq()));
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(same.out.find("warning"), std::string::npos) << same.out;
  const int64_t other = p.n_seq() + 1;
  const CliRun r = plan(d, run, " --sequences-per-micro " + std::to_string(other));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string want = "warning: measured at " + measured + " tokens a micro-batch, planned at " +
                           std::to_string(other) + " x 16: the measured layers keep the measured times";
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  fs::remove_all(d);
}

// The profile a run wrote plans; the same file with a syntax error, a key given twice or a key
// misspelt ("layer" for "layers") is one line naming the file, and the line and column, the line,
// or the key and the keys expected.
TEST(CliPlanProfile, ABadProfileFileIsOneLineNamingThePlace) {
  auto d = tmpdir();
  const fs::path run = trained(d, "run", "");
  const fs::path file = run / "profile.json";
  ASSERT_EQ(plan(d, run, "").code, 0);
  const std::string text = slurp(file);
  const nlohmann::json j = nlohmann::json::parse(text);
  write(file, "{\n \"format\": \"roundpipe-profile\",\n \"version\": 1\n \"n_seq\": 1}\n");
  expect_one_line_error(plan(d, run, ""), file.string() + ":4:8: invalid JSON: syntax error");
  write(file, "{\"beta\": 0.5," + text.substr(text.find('{') + 1));  // before the real line 2
  expect_one_line_error(plan(d, run, ""), file.string() + ":2: key 'beta' given twice");
  nlohmann::json typo = j;
  typo["layer"] = typo["layers"];
  typo.erase("layers");
  write(file, typo.dump(1));
  expect_one_line_error(
      plan(d, run, ""),
      file.string() + line_of(typo.dump(1), "\"layer\"") +
          ": unknown key 'layer'; did you mean 'layers'? (known keys: beta, device, format, "
          "layers, linear_compute, n_seq, seq_len, version)");
  // a time no layer takes (a plan printed it as a 300-digit iteration time) is refused with its
  // line and the range
  nlohmann::json absurd = j;
  absurd["layers"][1]["forward"]["m"] = 1e300;
  write(file, absurd.dump(1));
  const CliRun r = plan(d, run, "");
  expect_one_line_error(
      r, file.string() + line_of(absurd.dump(1), "1e+300") +
             ": layer 1.forward: key 'm': expected a number of seconds in [0, 1e+06], got 1e+300");
  EXPECT_EQ(r.out, "");
  fs::remove_all(d);
}

}  // namespace

namespace {

// The device line says which weight gradients a plan runs in FP8: tiny_model's down_proj reads
// 24 wide (not a multiple of 16), so 12 of its 14 linears; none with --bf16-wgrad or a LoRA base.
TEST(CliPlanFp8, TheDeviceLineCountsTheLinearsWithFp8WeightGradients) {
  auto d = tmpdir();
  const std::string model = tiny_model(d).string(),
                    base = "plan --model " + model + " --gpus 2 --seq 16 --micro 2";
  const auto device_line = [&](const std::string& flags) {
    const CliRun r = roundpipe(base + flags, d);
    EXPECT_EQ(r.code, 0) << flags << ": " << r.err;
    const size_t at = r.out.find("device ");
    return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find('\n', at) - at);
  };
  EXPECT_NE(device_line(" --fp8").find("the weight gradients of 12 of 14"), std::string::npos)
      << device_line(" --fp8");
  EXPECT_EQ(device_line(" --fp8 --bf16-wgrad").find("weight gradients"), std::string::npos);
  EXPECT_EQ(device_line(" --fp8 --lora-r 4").find("weight gradients"), std::string::npos);
  fs::remove_all(d);
}

}  // namespace
