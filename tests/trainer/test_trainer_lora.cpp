// LoRA through rp::Trainer: adapters train on a frozen base, final/ is a PEFT adapter folder and
// final-merged/ the base with the adapters folded in (the same model the adapter folder makes
// on the base), a resumed run with adapter dropout continues bit for bit (the dropout masks are
// numbered by step, training pass and micro-batch, not by anything a restart changes), and a
// run continues from a PEFT adapter folder with that folder's weights.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/trainer/trainer_log.hpp"

namespace {

using namespace rp::clitest;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light.\"}\n";

rp::TrainSpec lora_spec(const fs::path& d, const std::string& out, int64_t steps, rp::WeightFormat base) {
  write(d / "data.jsonl", kData);
  rp::TrainSpec s = rp::spec_from_json(
      nlohmann::json::parse(spec_for(tiny_model(d), d / "data.jsonl", d / out)), "test spec");
  s.steps = steps;
  s.seed = 5;
  s.save_dtype = "f32";
  s.adam.lr = 0.02;
  s.lr_schedule.kind = "constant";
  s.lr_schedule.lr = 0.02;
  s.lr_schedule.total_steps = steps;
  rp::LoraConfig l;
  l.r = 4;
  l.alpha = 8;
  l.dropout = 0.1;
  l.target_modules = {"all-linear"};
  l.base_format = base;
  l.seed = 5;
  s.lora = l;
  return s;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<double> losses(const fs::path& csv) {
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);  // header: step,loss,...
  std::vector<double> out;
  while (std::getline(f, line)) {
    const size_t a = line.find(',');
    out.push_back(std::stod(line.substr(a + 1, line.find(',', a + 1) - a - 1)));
  }
  return out;
}

TEST(TrainerLora, AdaptersTrainOnAFrozenBaseAndExportAsPeftAndMerged) {
  auto d = tmpdir();
  rp::TrainSpec spec = lora_spec(d, "run", 8, rp::WeightFormat::f32);
  spec.merge_adapters = true;
  // the tiny model's weights are all equal (every token looks the same to the frozen layers),
  // so the loss can only fall through a trained head: modules_to_save, beside the adapters
  spec.lora->modules_to_save = {"lm_head"};
  spec.adam.lr = spec.lr_schedule.lr = 0.1;
  const rp::TrainResult r = rp::Trainer(spec).run();
  EXPECT_EQ(r.steps_done, 8);
  const std::vector<double> l = losses(d / "run/metrics.csv");
  ASSERT_EQ(l.size(), 8u);
  EXPECT_LT(l.back(), l.front() - 0.1) << "the adapters learnt nothing";

  // final/ is an adapter folder, not a model
  EXPECT_TRUE(fs::exists(d / "run/final" / rp::kAdapterConfigFile));
  EXPECT_TRUE(fs::exists(d / "run/final" / rp::kAdapterWeightsFile));
  EXPECT_FALSE(fs::exists(d / "run/final/model.safetensors"));
  EXPECT_FALSE(fs::exists(d / "run/final-merged" / rp::kAdapterConfigFile));
  const rp::PeftAdapter a = rp::read_peft_adapter((d / "run/final").string());
  EXPECT_EQ(a.lora.r, 4);
  // the base is named by its absolute path: the folder finds it from any working directory
  EXPECT_TRUE(fs::path(a.base_model_name_or_path).is_absolute()) << a.base_model_name_or_path;
  EXPECT_TRUE(fs::equivalent(a.base_model_name_or_path, spec.model)) << a.base_model_name_or_path;
  double b_norm = 0;
  for (const auto& [name, t] : a.tensors)
    if (name.find("lora_B") != std::string::npos)
      for (float v : t.data) b_norm += double(v) * v;
  EXPECT_GT(b_norm, 0) << "lora_B stayed at its zero initialisation";

  // final-merged = the untouched base + the exported adapters, folded by the file-level merge
  rp::LoadedModel base = rp::load_model((d / "tiny").string());
  rp::merge_peft_adapter(base, a);
  const rp::LoadedModel merged = rp::load_model((d / "run/final-merged").string());
  ASSERT_EQ(merged.tensors.size(), base.tensors.size());
  for (const auto& [name, t] : base.tensors) {
    const auto& m = merged.tensors.at(name);
    ASSERT_EQ(m.data.size(), t.data.size()) << name;
    for (size_t i = 0; i < t.data.size(); ++i)
      ASSERT_NEAR(m.data[i], t.data[i], 1e-6 * (1 + std::fabs(t.data[i]))) << name << "[" << i << "]";
  }
  fs::remove_all(d);
}

// spec base_model_id: the adapter folder names the id (portable: what PEFT's Auto classes load
// from the hub), keeps the local base in roundpipe_base.json, and generate / merge still find the
// local base without --base.
TEST(TrainerLora, AdapterNamesTheSpecsBaseModelIdAndKeepsTheLocalPath) {
  auto d = tmpdir();
  rp::TrainSpec spec = lora_spec(d, "run", 1, rp::WeightFormat::f32);
  spec.base_model_id = "HuggingFaceTB/SmolLM2-135M";
  spec.merge_adapters = true;
  rp::Trainer(spec).run();
  const rp::PeftAdapter a = rp::read_peft_adapter((d / "run/final").string());
  EXPECT_EQ(a.base_model_name_or_path, "HuggingFaceTB/SmolLM2-135M");
  const std::string local = rp::adapter_base_path((d / "run/final").string());
  EXPECT_TRUE(fs::path(local).is_absolute()) << local;
  EXPECT_TRUE(fs::equivalent(local, spec.model)) << local;
  std::string found;
  rp::load_merged_adapter((d / "run/final").string(), "", &found);
  EXPECT_TRUE(fs::equivalent(found, spec.model)) << found;
  // final/ and final-merged/ carry model cards naming the id; a user's README.md survives a rerun
  const std::string card = bytes_of(d / "run/final/README.md"),
                    merged = bytes_of(d / "run/final-merged/README.md");
  EXPECT_NE(card.find("library_name: peft\nbase_model: \"HuggingFaceTB/SmolLM2-135M\""), std::string::npos)
      << card;
  EXPECT_NE(card.find("| train (step 1) | "), std::string::npos) << card;
  EXPECT_NE(merged.find("library_name: transformers\nbase_model: \"HuggingFaceTB/SmolLM2-135M\""),
            std::string::npos)
      << merged;
  { std::ofstream(d / "run/final/README.md") << "# my notes\n"; }
  spec.overwrite_output_dir = true;
  rp::Trainer(spec).run();
  EXPECT_EQ(bytes_of(d / "run/final/README.md"), "# my notes\n");
  EXPECT_EQ(bytes_of(d / "run/final-merged/README.md").substr(0, 20), merged.substr(0, 20));
  // a spec value that is no model id is refused with one line naming the key
  try {
    rp::spec_from_json(nlohmann::json::parse(spec_for(d / "tiny", d / "data.jsonl", d / "x",
                                                      ", \"base_model_id\": \"/abs/model.gguf\"")),
                       "s.json");
    ADD_FAILURE() << "accepted a path as base_model_id";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("s.json: key 'base_model_id': expected a Hugging Face model id"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(d);
}

TEST(TrainerLora, ResumeWithDropoutContinuesBitForBit) {
  auto d = tmpdir();
  rp::TrainSpec whole = lora_spec(d, "whole", 6, rp::WeightFormat::q8_0);
  whole.save_every = 3;
  rp::Trainer(whole).run();
  rp::TrainSpec rest = lora_spec(d, "rest", 6, rp::WeightFormat::q8_0);
  rest.resume_from = (d / "whole/checkpoint-3").string();
  const rp::TrainResult r = rp::Trainer(rest).run();
  EXPECT_EQ(r.first_step, 3);
  EXPECT_EQ(r.steps_done, 6);
  const std::string a = bytes_of(d / "whole/final" / rp::kAdapterWeightsFile);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == bytes_of(d / "rest/final" / rp::kAdapterWeightsFile));
  const std::vector<double> lw = losses(d / "whole/metrics.csv"), lr = losses(d / "rest/metrics.csv");
  ASSERT_EQ(lr.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(lw[3 + i], lr[i]) << "step " << 3 + i;
  // dropout changes the result: without it the same run ends elsewhere
  rp::TrainSpec nodrop = lora_spec(d, "nodrop", 6, rp::WeightFormat::q8_0);
  nodrop.lora->dropout = 0;
  rp::Trainer(nodrop).run();
  EXPECT_FALSE(a == bytes_of(d / "nodrop/final" / rp::kAdapterWeightsFile));
  fs::remove_all(d);
}

// A LoRA resume checks the optimizer state against the groups the run trains before the base
// loads: a spec that trains a module more (modules_to_save) than the checkpoint's run is refused
// naming the state file; the run that unties the tied embeddings (lm_head trained alone, as the
// checkpoint's) resumes.
TEST(TrainerLora, AResumeChecksTheStateAgainstTheGroupsTheRunTrains) {
  auto d = tmpdir();
  rp::TrainSpec whole = lora_spec(d, "whole", 4, rp::WeightFormat::f32);
  whole.save_every = 2;
  whole.lora->modules_to_save = {"lm_head"};
  rp::Trainer(whole).run();
  rp::TrainSpec rest = whole;
  rest.output_dir = (d / "rest").string();
  rest.resume_from = (d / "whole/checkpoint-2").string();
  EXPECT_EQ(rp::Trainer(rest).run().steps_done, 4);
  rp::TrainSpec fewer = rest;
  fewer.output_dir = (d / "fewer").string();
  fewer.lora->modules_to_save.clear();
  try {
    rp::Trainer(fewer).run();
    ADD_FAILURE() << "resumed the state of a run that trained lm_head too";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("state/checkpoint-2/optimizer_state.bin: the state has "), std::string::npos) << what;
    EXPECT_NE(what.find("saved for another model"), std::string::npos) << what;
  }
  fs::remove_all(d);
}

// A run on an fp8 base end to end (the spec's base_format, the base read tensor by tensor into
// fp8 rows, the adapters exported): its losses stay within 2% of the same run on a bf16 base.
TEST(TrainerLora, Fp8BaseTrainsLikeABf16Base) {
  auto d = tmpdir();
  rp::Trainer(lora_spec(d, "bf16", 4, rp::WeightFormat::bf16)).run();
  const rp::TrainResult r = rp::Trainer(lora_spec(d, "fp8", 4, rp::WeightFormat::fp8)).run();
  EXPECT_EQ(r.steps_done, 4);
  const std::vector<double> a = losses(d / "fp8/metrics.csv"), b = losses(d / "bf16/metrics.csv");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t t = 0; t < a.size(); ++t) EXPECT_NEAR(a[t], b[t], 0.02 * b[t]) << "step " << t;
  EXPECT_TRUE(fs::exists(d / "fp8/final" / rp::kAdapterWeightsFile));
  fs::remove_all(d);
}

// The spec's frozen_tier: the base streams from a cache file and the run (losses, adapters and
// the merged model, which reads the base back from the file) equals the run that holds it; with
// spill_layers the saved inputs of two layers go to a hidden file beside it, and the run still does.
TEST(TrainerLora, ABaseStreamedFromTheDiskTierTrainsAndMergesBitForBit) {
  auto d = tmpdir();
  rp::TrainSpec held = lora_spec(d, "held", 3, rp::WeightFormat::q8_0);
  held.merge_adapters = true;
  rp::Trainer(held).run();
  rp::TrainSpec tiered = lora_spec(d, "tiered", 3, rp::WeightFormat::q8_0);
  tiered.merge_adapters = true;
  tiered.frozen_tier = rp::TrainSpec::FrozenTier{(d / "tier" / "base.cache").string(), 0};
  const std::string log = rp::test::run_logging(tiered);  // the run's log: it ends with what the tier read
  const size_t at = log.find("frozen tier: read ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find(" per step ("), std::string::npos) << line;
  EXPECT_NE(line.find(" GB/s while reading; the reader busy "), std::string::npos) << line;
  EXPECT_EQ(line.find("read 0 bytes"), std::string::npos) << "a streamed base is read every step: " << line;
  EXPECT_TRUE(fs::exists(d / "tier" / "base.cache"));
  EXPECT_EQ(losses(d / "tiered/metrics.csv"), losses(d / "held/metrics.csv"));
  const std::string a = bytes_of(d / "held/final" / rp::kAdapterWeightsFile);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == bytes_of(d / "tiered/final" / rp::kAdapterWeightsFile));
  ASSERT_TRUE(fs::exists(d / "held/final-merged/model.safetensors"));
  EXPECT_TRUE(bytes_of(d / "held/final-merged/model.safetensors") ==
              bytes_of(d / "tiered/final-merged/model.safetensors"));
  rp::TrainSpec spilled = lora_spec(d, "spilled", 3, rp::WeightFormat::q8_0);
  spilled.frozen_tier = rp::TrainSpec::FrozenTier{(d / "spill" / "base.cache").string(), 0};
  spilled.frozen_tier->spill_layers = 2;
  const std::string spill_log = rp::test::run_logging(spilled);
  const size_t end = spill_log.find("frozen tier: read ");
  ASSERT_NE(end, std::string::npos) << spill_log;
  const std::string end_line = spill_log.substr(end, spill_log.find('\n', end) - end);
  EXPECT_NE(end_line.find("; the activation spill wrote "), std::string::npos) << end_line;
  EXPECT_EQ(end_line.find("wrote 0 B"), std::string::npos) << "the spill's traffic is counted: " << end_line;
  EXPECT_EQ(losses(d / "spilled/metrics.csv"), losses(d / "held/metrics.csv"));
  EXPECT_TRUE(a == bytes_of(d / "spilled/final" / rp::kAdapterWeightsFile));
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(d / "spill")) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"base.cache"})) << "the spill file has no name, the lock goes";
  fs::remove_all(d);
}

TEST(TrainerLora, ContinuesFromAPeftAdapterFolder) {
  auto d = tmpdir();
  rp::Trainer(lora_spec(d, "first", 3, rp::WeightFormat::f32)).run();
  // the adapter's own settings (no "lora" object), a learning rate too small to move a weight
  rp::TrainSpec next = lora_spec(d, "next", 1, rp::WeightFormat::f32);
  next.lora.reset();
  next.adapter = (d / "first/final").string();
  next.adam.lr = next.lr_schedule.lr = 1e-30;
  rp::Trainer(next).run();
  const rp::PeftAdapter a = rp::read_peft_adapter((d / "first/final").string());
  const rp::PeftAdapter b = rp::read_peft_adapter((d / "next/final").string());
  EXPECT_EQ(b.lora.r, a.lora.r);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_EQ(t.data, b.tensors.at(name).data) << name;
  fs::remove_all(d);
}

// A frozen_tier.host_budget_gib too small for the run is refused in one line that names the
// spec file and the key, as every other spec error does, and leaves no output folder behind.
TEST(TrainerLora, ATooSmallHostBudgetNamesTheSpecFileAndTheKey) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const fs::path spec = d / "budget_spec.json";
  write(spec, spec_for(tiny_model(d), d / "data.jsonl", d / "out",
                       ", \"lora\": {\"r\": 4, \"alpha\": 8, \"target_modules\": \"all-linear\"}, "
                       "\"frozen_tier\": {\"path\": \"" +
                           (d / "tier" / "base.cache").string() + "\", \"host_budget_gib\": 0.001}"));
  try {
    rp::Trainer::from_file(spec.string()).run();
    ADD_FAILURE() << "a 0.001 GiB host budget ran";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_EQ(
        msg.rfind(spec.string() + ": key 'frozen_tier.host_budget_gib': 0.001 GiB cannot hold this run", 0),
        0u)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(d / "out")) << "the run made the folder and left it";
  fs::remove_all(d);
}

// A cache path the tier cannot use (a file of the user's there) is refused in one line that names
// the spec file and the key too, and the user's file stays as it was.
TEST(TrainerLora, AForeignFileAtTheCachePathNamesTheSpecFileAndTheKey) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  write(d / "notes.txt", "the user's notes, not a cache");
  const fs::path spec = d / "foreign_spec.json";
  write(spec, spec_for(tiny_model(d), d / "data.jsonl", d / "out",
                       ", \"lora\": {\"r\": 4, \"alpha\": 8, \"target_modules\": \"all-linear\"}, "
                       "\"frozen_tier\": {\"path\": \"" +
                           (d / "notes.txt").string() + "\"}"));
  try {
    rp::Trainer::from_file(spec.string()).run();
    ADD_FAILURE() << "a run replaced or used the user's file";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(spec.string() + ": key 'frozen_tier.path': " + (d / "notes.txt").string() +
                            ": exists and is not a roundpipe tier cache",
                        0),
              0u)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(bytes_of(d / "notes.txt"), "the user's notes, not a cache");
  EXPECT_FALSE(fs::exists(d / "out")) << "the run made the folder and left it";
  fs::remove_all(d);
}

}  // namespace
