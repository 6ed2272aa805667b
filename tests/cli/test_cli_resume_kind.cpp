// `roundpipe train --resume`: a checkpoint of a LoRA run resumed with a spec for full
// fine-tuning (no "lora" key), or a full fine-tuning checkpoint resumed with a LoRA spec, is one
// line naming the checkpoint, what it was trained as and what to change; the refused start
// leaves the output folder as it was, and the change it names resumes the checkpoint.
#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

/// Every entry under `dir` with its bytes (a folder: "<folder>").
std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? slurp(e.path()) : "<folder>";
  return out;
}

const char* kData = "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n";
const std::string kLora =
    ", \"lora\": {\"r\": 4, \"alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"]}";
const std::string kSteps = ", \"steps\": 2, \"save_every\": 1";

/// `spec` resuming `checkpoint` into `out` for a third step.
CliRun resume(const fs::path& d, const fs::path& spec, const fs::path& checkpoint, const fs::path& out) {
  return roundpipe("train " + spec.string() + " --steps 3 --resume " + checkpoint.string() +
                       " --output-dir " + out.string(),
                   d);
}

TEST(CliResumeKind, ALoraCheckpointWithAFullFineTuningSpecNamesTheLoraKeyThatResumesIt) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "lora.json", spec_for(model, d / "data.jsonl", d / "lo", kLora + kSteps));
  write(d / "full.json", spec_for(model, d / "data.jsonl", d / "lo", kSteps));
  ASSERT_EQ(roundpipe("train " + (d / "lora.json").string(), d).code, 0);
  const fs::path ck = d / "lo/checkpoint-1";
  const auto before = contents(d / "lo");
  const CliRun r = resume(d, d / "full.json", ck, d / "lo");
  EXPECT_EQ(r.out, "") << "printed before the refusal";
  expect_one_line_error(
      r, "checkpoint " + ck.string() + " was written by a LoRA run (r=4 on q_proj,v_proj); " +
             (d / "full.json").string() + " asks for full fine-tuning (no \"lora\" key): add \"lora\": ");
  EXPECT_NE(r.err.find(" to resume it, or start a new output folder without --resume or \"resume_from\"\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(contents(d / "lo"), before) << "the refused start changed the output folder";
  // the key it names, pasted into the spec, resumes the checkpoint
  const size_t from = r.err.find("\"lora\": {") + 8, to = r.err.find(" to resume it");
  ASSERT_LT(from, to) << r.err;
  nlohmann::json spec = nlohmann::json::parse(slurp(d / "full.json"));
  spec["lora"] = nlohmann::json::parse(r.err.substr(from, to - from));
  EXPECT_EQ(spec["lora"]["alpha"], 16) << r.err;  // the checkpoint's, not the default 8
  write(d / "advised.json", spec.dump());
  const CliRun ok = resume(d, d / "advised.json", ck, d / "lo");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("resuming " + ck.string() + " at step 1"), std::string::npos) << ok.out;
  fs::remove_all(d);
}

TEST(CliResumeKind, AFullFineTuningCheckpointWithALoraSpecSaysToRemoveTheKey) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "full.json", spec_for(model, d / "data.jsonl", d / "fu", kSteps));
  write(d / "lora.json", spec_for(model, d / "data.jsonl", d / "fu", kLora + kSteps));
  ASSERT_EQ(roundpipe("train " + (d / "full.json").string(), d).code, 0);
  const fs::path ck = d / "fu/checkpoint-1";
  const auto before = contents(d / "fu");
  EXPECT_EQ(resume(d, d / "lora.json", ck, d / "fu").out, "") << "printed before the refusal";
  expect_one_line_error(
      resume(d, d / "lora.json", ck, d / "fu"),
      "checkpoint " + ck.string() +
          " was written by a full fine-tuning run (config.json and all weights, no "
          "adapter_config.json); " +
          (d / "lora.json").string() +
          " asks for LoRA (the \"lora\" key): remove the \"lora\" key to resume it, or train "
          "adapters on its weights with \"model\": \"" +
          ck.string() + "\" in a new output folder without --resume or \"resume_from\"");
  EXPECT_EQ(contents(d / "fu"), before) << "the refused start changed the output folder";
  // a folder typed with a trailing '/' is named as the checkpoint it is
  expect_one_line_error(resume(d, d / "lora.json", ck.string() + "/", d / "fu"),
                        "checkpoint " + ck.string() + " was written by a full fine-tuning run");
  // an "adapter" key is LoRA too
  nlohmann::json spec = nlohmann::json::parse(slurp(d / "full.json"));
  fs::create_directories(d / "adapter");
  spec["adapter"] = (d / "adapter").string();
  write(d / "adapter.json", spec.dump());
  expect_one_line_error(resume(d, d / "adapter.json", ck, d / "fu"),
                        "asks for LoRA (the \"adapter\" key): remove the \"adapter\" key to resume it");
  EXPECT_EQ(contents(d / "fu"), before);
  fs::remove_all(d);
}

// A LoRA checkpoint resumed with adapters of another rank names the rank and the change that
// resumes it (in the spec, or on the command line where the rank was set there); an
// adapter_config.json that is no JSON is named with its line and column, whatever the spec asks.
// Both are refused before anything is printed, leaving the output folder as it was.
TEST(CliResumeKind, ALoraCheckpointOfAnotherRankOrACorruptConfigIsNamedBeforeAnyOutput) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "lora.json", spec_for(model, d / "data.jsonl", d / "lo", kLora + kSteps));
  ASSERT_EQ(roundpipe("train " + (d / "lora.json").string(), d).code, 0);
  nlohmann::json spec = nlohmann::json::parse(slurp(d / "lora.json"));
  spec["lora"]["r"] = 8;
  write(d / "r8.json", spec.dump());
  const fs::path ck = d / "lo/checkpoint-1";
  const auto before = contents(d / "lo");
  const std::string rank4 =
      "checkpoint " + ck.string() + " was written by a LoRA run of rank 4 (r=4 on q_proj,v_proj); ";
  CliRun r = resume(d, d / "r8.json", ck, d / "lo");
  expect_one_line_error(r,
                        rank4 + (d / "r8.json").string() +
                            " asks for rank 8: set \"r\": 4 in its \"lora\" key to resume it, or start a new "
                            "output folder without --resume or \"resume_from\"\n");
  EXPECT_EQ(r.out, "") << "printed before the refusal";
  r = roundpipe("train " + (d / "lora.json").string() + " --set lora.r=8 --steps 3 --resume " + ck.string() +
                    " --output-dir " + (d / "lo").string(),
                d);
  expect_one_line_error(r, rank4 + "--set lora.r=8 asks for rank 8: pass --set lora.r=4 to resume it");
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(contents(d / "lo"), before) << "the refused start changed the output folder";

  const fs::path config = ck / "adapter_config.json";
  write(config, "{\n  \"peft_type\": \"LORA\",\n  \"r\": 4,,\n}\n");  // a save cut short, then edited
  write(d / "full.json", spec_for(model, d / "data.jsonl", d / "lo", kSteps));
  for (const fs::path& s : {d / "full.json", d / "lora.json"}) {
    r = resume(d, s, ck, d / "lo");
    expect_one_line_error(r, "roundpipe: error: " + config.string() + ":3:");
    EXPECT_NE(r.err.find(": invalid JSON: syntax error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(checkpoint " + ck.string() + " cannot be resumed without its adapter settings)\n"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("LoRA run"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  fs::remove_all(d);
}

}  // namespace
