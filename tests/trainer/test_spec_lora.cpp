// The spec's LoRA keys ("lora", "adapter", "merge_adapters"; docs/spec.md, "LoRA"): parsed
// into LoraConfig with the one-line "file: key 'k': expected ..., got ..." errors, the same
// rules for a spec built in code, and a run that refuses LoRA until the trainer trains it.
#include <fstream>
#include <gtest/gtest.h>
#include <iterator>

#include <nlohmann/json.hpp>

#include "roundpipe/spec.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/trainer_state.hpp"

namespace {

const char* kSpecData = "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n";

rp::TrainSpec parse(const std::string& extra) {
  const std::string s = std::string("{\"model\": \"m\", \"data\": \"d.jsonl\", \"seed\": 7") + extra + "}";
  return rp::spec_from_json(nlohmann::json::parse(s), "s.json");
}

std::string error_of(const std::string& extra) {
  try {
    parse(extra);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "ok";
}

TEST(SpecLora, AbsentMeansFullFineTuning) {
  const rp::TrainSpec s = parse("");
  EXPECT_FALSE(s.lora);
  EXPECT_TRUE(s.adapter.empty());
  EXPECT_FALSE(s.merge_adapters);
}

TEST(SpecLora, EveryKeyIsRead) {
  const rp::TrainSpec s = parse(
      ", \"lora\": {\"r\": 16, \"alpha\": 32, \"dropout\": 0.05, \"target_modules\": [\"q_proj\", "
      "\"down_proj\"], "
      "\"use_rslora\": true, \"modules_to_save\": [\"lm_head\"], \"seed\": 3, \"base_format\": \"nf4\"}, "
      "\"adapter\": \"runs/a/final\", \"merge_adapters\": true");
  ASSERT_TRUE(s.lora);
  EXPECT_EQ(s.lora->r, 16);
  EXPECT_EQ(s.lora->alpha, 32);
  EXPECT_EQ(s.lora->dropout, 0.05);
  EXPECT_EQ(s.lora->target_modules, (std::vector<std::string>{"q_proj", "down_proj"}));
  EXPECT_TRUE(s.lora->use_rslora);
  EXPECT_EQ(s.lora->modules_to_save, (std::vector<std::string>{"lm_head"}));
  EXPECT_EQ(s.lora->seed, 3u);
  EXPECT_EQ(s.lora->base_format, rp::WeightFormat::nf4);
  EXPECT_DOUBLE_EQ(s.lora->scaling(), 32.0 / 4.0);  // rsLoRA: alpha / sqrt(r)
  EXPECT_EQ(s.adapter, "runs/a/final");
  EXPECT_TRUE(s.merge_adapters);
}

TEST(SpecLora, DefaultsFollowPeftAndTheSpecSeed) {
  const rp::TrainSpec s = parse(", \"lora\": {\"target_modules\": \"all-linear\"}");
  ASSERT_TRUE(s.lora);
  EXPECT_EQ(s.lora->r, 8);
  EXPECT_EQ(s.lora->alpha, 8);
  EXPECT_EQ(s.lora->dropout, 0);
  EXPECT_EQ(s.lora->target_modules, (std::vector<std::string>{"all-linear"}));
  EXPECT_TRUE(s.lora->modules_to_save.empty());
  EXPECT_EQ(s.lora->seed, 7u);  // the spec's seed
  EXPECT_EQ(s.lora->base_format, rp::WeightFormat::bf16);
  const rp::TrainSpec t = parse(", \"lora\": {}");
  EXPECT_EQ(t.lora->target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  // expert parameters alone leave no module adapters; an empty list of them changes nothing
  EXPECT_TRUE(
      parse(", \"lora\": {\"target_parameters\": [\"mlp.experts.down_proj\"]}").lora->target_modules.empty());
  EXPECT_EQ(parse(", \"lora\": {\"target_parameters\": []}").lora->target_modules,
            (std::vector<std::string>{"q_proj", "v_proj"}));
  for (const char* f : {"f32", "f16", "bf16", "q8_0", "q4_0", "nf4", "fp8"})
    EXPECT_EQ(error_of(std::string(", \"lora\": {\"base_format\": \"") + f + "\"}"), "ok") << f;
}

TEST(SpecLora, WrongValuesNameTheNestedKey) {
  EXPECT_EQ(error_of(", \"lora\": {\"r\": 0}"),
            "s.json: key 'lora.r': expected an integer in 1..65536, got 0");
  EXPECT_EQ(error_of(", \"lora\": {\"r\": \"8\"}"), "s.json: key 'lora.r': expected an integer, got \"8\"");
  EXPECT_EQ(error_of(", \"lora\": {\"alpha\": 0}"),
            "s.json: key 'lora.alpha': expected a finite number > 0, got 0.0");
  EXPECT_EQ(error_of(", \"lora\": {\"dropout\": 1}"),
            "s.json: key 'lora.dropout': expected a number in [0, 1), got 1.0");
  EXPECT_NE(error_of(", \"lora\": {\"target_modules\": [\"lm_head\"]}")
                .find("s.json: key 'lora.target_modules': expected a non-empty list of q_proj"),
            std::string::npos);
  EXPECT_NE(error_of(", \"lora\": {\"target_modules\": []}").find("key 'lora.target_modules'"),
            std::string::npos);
  EXPECT_NE(error_of(", \"lora\": {\"target_modules\": \".*proj\"}").find("key 'lora.target_modules'"),
            std::string::npos);
  EXPECT_EQ(
      error_of(", \"lora\": {\"modules_to_save\": [\"norm\"]}"),
      "s.json: key 'lora.modules_to_save': expected a list of \"embed_tokens\", \"lm_head\", got [\"norm\"]");
  EXPECT_EQ(
      error_of(", \"lora\": {\"base_format\": \"q5_k\"}"),
      "s.json: key 'lora.base_format': expected \"bf16\", \"f16\", \"f32\", \"q8_0\", \"q4_0\", \"nf4\", "
      "\"mxfp4\" or \"fp8\", got \"q5_k\"");
  // base_format is a LoRA setting: an fp8 base without a "lora" block is an unknown key, in one line
  const std::string outside = error_of(", \"base_format\": \"fp8\"");
  EXPECT_NE(outside.find("s.json: unknown key 'base_format'"), std::string::npos) << outside;
  EXPECT_EQ(outside.find('\n'), std::string::npos) << outside;
  EXPECT_EQ(
      error_of(", \"lora\": {\"base_format\": \"e4m3\"}"),
      "s.json: key 'lora.base_format': expected \"bf16\", \"f16\", \"f32\", \"q8_0\", \"q4_0\", \"nf4\", "
      "\"mxfp4\" or \"fp8\", got \"e4m3\"");
  EXPECT_NE(error_of(", \"lora\": {\"rank\": 8}").find("s.json: unknown key 'lora.rank' (known keys:"),
            std::string::npos);
  EXPECT_EQ(error_of(", \"lora\": 8"), "s.json: key 'lora': expected an object, got 8");
  EXPECT_EQ(error_of(", \"adapter\": \"\""),
            "s.json: key 'adapter': expected a PEFT adapter folder, got \"\"");
  EXPECT_NE(
      error_of(", \"merge_adapters\": true").find("s.json: key 'merge_adapters': expected false without"),
      std::string::npos);
  EXPECT_EQ(error_of(", \"adapter\": \"a\", \"merge_adapters\": true"), "ok");
}

// A rank past 65536 is refused while the spec is read: its adapter sizes and parameter
// counts would wrap around int64_t (a crash, or a vector past max_size()).
TEST(SpecLora, AHugeRankIsRefusedNamingTheKey) {
  EXPECT_EQ(error_of(", \"lora\": {\"r\": 4611686018427387904}"),
            "s.json: key 'lora.r': expected an integer in 1..65536, got 4611686018427387904");
  EXPECT_EQ(error_of(", \"lora\": {\"r\": 65537}"),
            "s.json: key 'lora.r': expected an integer in 1..65536, got 65537");
  EXPECT_EQ(error_of(", \"lora\": {\"r\": 65536}"), "ok");
  rp::TrainSpec s = parse("");
  s.lora = rp::LoraConfig{};
  s.lora->r = int64_t(1) << 62;
  EXPECT_THROW(rp::validate_spec(s), std::invalid_argument);
}

TEST(SpecLora, ASpecBuiltInCodeIsCheckedLikeAFile) {
  rp::TrainSpec s = parse("");
  s.source = "code";
  s.lora = rp::LoraConfig{};
  EXPECT_NO_THROW(rp::validate_spec(s));
  s.lora->r = 0;
  EXPECT_THROW(
      {
        try {
          rp::validate_spec(s);
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "code: key 'lora.r': expected an integer in 1..65536, got 0");
          throw;
        }
      },
      std::invalid_argument);
  s.lora.reset();
  s.merge_adapters = true;
  EXPECT_THROW(rp::validate_spec(s), std::invalid_argument);
}

// A LoRA run whose base model is missing stops with the path, before anything is written.
TEST(SpecLora, ALoraRunWithoutItsBaseModelNamesIt) {
  auto d = rp::clitest::tmpdir();
  rp::clitest::write(d / "data.jsonl", kSpecData);
  rp::TrainSpec s =
      rp::spec_from_json(nlohmann::json::parse(rp::clitest::spec_for(d / "no-model", d / "data.jsonl",
                                                                     d / "run", ", \"lora\": {\"r\": 4}")),
                         "s.json");
  std::string e;
  try {
    rp::Trainer(s).run({});
  } catch (const std::exception& ex) {
    e = ex.what();
  }
  EXPECT_NE(e.find("no-model"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "run/final"));
  fs::remove_all(d);
}

// A LoRA checkpoint records the storage form of its frozen base; resuming on another one is
// named among the differences the run warns about (the adapters were trained on other
// weights), and a full fine-tuning checkpoint or the same form says nothing about it.
TEST(SpecLora, ResumingOnAnotherBaseFormatIsNamed) {
  auto d = rp::clitest::tmpdir();
  const rp::TrainSpec nf4 = parse(R"(, "lora": {"r": 4, "base_format": "nf4"})");
  const std::string file = (d / "state.json").string();
  rp::write_trainer_state(file, rp::trainer_state_of(nf4, 3, 12));
  const rp::TrainerState saved = rp::read_trainer_state(file);
  EXPECT_EQ(saved.base_format, "nf4");
  auto mentions_base = [](const std::vector<std::string>& diffs) {
    for (const auto& s : diffs)
      if (s.find("base_format") != std::string::npos) return true;
    return false;
  };
  EXPECT_FALSE(mentions_base(rp::resume_differences(saved, nf4)));
  const auto diffs = rp::resume_differences(saved, parse(R"(, "lora": {"r": 4, "base_format": "bf16"})"));
  ASSERT_TRUE(mentions_base(diffs));
  bool named_both = false;
  for (const auto& s : diffs) named_both |= s.find("base_format bf16 (saved run nf4)") != std::string::npos;
  EXPECT_TRUE(named_both);
  const rp::TrainSpec full = parse("");
  rp::write_trainer_state(file, rp::trainer_state_of(full, 3, 12));
  EXPECT_EQ(rp::read_trainer_state(file).base_format, "");
  EXPECT_FALSE(mentions_base(rp::resume_differences(rp::read_trainer_state(file), full)));
  fs::remove_all(d);
}

}  // namespace

// A checkpoint records whether its linear layers ran in FP8 (and their weight gradients);
// resuming with the other compute is named among the differences the run warns about, and a
// file of an earlier release (no record) or the same compute says nothing about it. "fp8"
// alone in full fine-tuning is FP8 weight gradients too, so a checkpoint of FP8 linears with
// bf16 weight gradients resumed by it is named.
TEST(SpecLora, ResumingWithOtherLinearComputeIsNamed) {
  auto d = rp::clitest::tmpdir();
  const std::string file = (d / "state.json").string();
  const rp::TrainSpec bf16 = parse("");
  const rp::TrainSpec fp8 = parse(R"(, "compute_dtype": "bf16", "fp8": true, "fp8_weight_gradients": false)");
  const rp::TrainSpec fp8w = parse(R"(, "compute_dtype": "bf16", "fp8": true, "fp8_weight_gradients": true)");
  const rp::TrainSpec fp8_default = parse(R"(, "compute_dtype": "bf16", "fp8": true)");
  EXPECT_EQ(rp::trainer_state_of(fp8_default, 3, 12).linear_compute, "fp8+wgrad");
  rp::write_trainer_state(file, rp::trainer_state_of(fp8, 3, 12));
  const rp::TrainerState saved = rp::read_trainer_state(file);
  ASSERT_TRUE(saved.linear_compute.has_value());
  EXPECT_EQ(*saved.linear_compute, "fp8");
  auto named = [](const std::vector<std::string>& diffs, const std::string& what) {
    for (const auto& s : diffs)
      if (s.find(what) != std::string::npos) return true;
    return false;
  };
  EXPECT_FALSE(named(rp::resume_differences(saved, fp8), "linear layers"));
  EXPECT_TRUE(named(rp::resume_differences(saved, bf16), "linear layers in bf16 (saved run fp8;"));
  EXPECT_TRUE(named(rp::resume_differences(saved, fp8w), "linear layers in fp8+wgrad (saved run fp8;"));
  // the warning names the keys that set it, so the user knows what to change back
  EXPECT_TRUE(named(rp::resume_differences(saved, fp8w), "\"fp8_weight_gradients\""));
  EXPECT_TRUE(
      named(rp::resume_differences(saved, fp8_default), "linear layers in fp8+wgrad (saved run fp8;"));
  rp::TrainerState old = saved;  // an earlier release's file: not recorded
  old.linear_compute.reset();
  EXPECT_FALSE(named(rp::resume_differences(old, bf16), "linear layers"));
  // a damaged record is refused naming the key
  std::string text;
  {
    std::ifstream in(file);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find("\"fp8\"", text.find("\"linear_compute\""));
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 5, "\"fp4\"");
  std::ofstream(file, std::ios::trunc) << text;
  try {
    rp::read_trainer_state(file);
    ADD_FAILURE() << "a linear_compute of fp4 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("linear_compute"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}
