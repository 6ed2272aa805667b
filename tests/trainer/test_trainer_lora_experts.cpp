// LoRA on the experts of a tiny Qwen3-MoE through rp::Trainer (spec key lora.target_parameters):
// the expert adapters train on a frozen base, final/ is a PEFT adapter folder with
// target_parameters and PEFT's expert keys, final-merged/ is the base with every adapter (the
// experts' too) folded in, a resumed run ends bit for bit where the uninterrupted one did (the
// expert adapters are optimizer groups like the others), and a run continues from the folder.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light.\"}\n";

rp::TrainSpec spec(const fs::path& d, const std::string& out, int64_t steps) {
  write(d / "data.jsonl", kData);
  const fs::path model = tiny_model(d, true);
  nlohmann::json j = nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / out));
  // through the spec parser: the new key, experts and attention
  j["lora"] = {{"r", 4},
               {"alpha", 8},
               {"target_modules", {"q_proj", "o_proj"}},
               {"target_parameters", {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}},
               {"base_format", "f32"}};
  rp::TrainSpec s = rp::spec_from_json(j, "test spec");
  s.steps = steps;
  s.seed = 5;
  s.save_dtype = "f32";
  s.adam.lr = s.lr_schedule.lr = 0.02;
  s.lr_schedule.kind = "constant";
  s.lr_schedule.total_steps = steps;
  return s;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(TrainerLoraExperts, ExpertAdaptersTrainExportMergeAndResume) {
  auto d = tmpdir();
  rp::TrainSpec whole = spec(d, "whole", 4);
  whole.save_every = 2;
  whole.merge_adapters = true;
  ASSERT_TRUE(whole.lora);
  EXPECT_EQ(whole.lora->target_parameters.size(), 2u);
  rp::Trainer(whole).run();
  const fs::path fin = d / "whole/final";
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fin / rp::kAdapterConfigFile));
  EXPECT_EQ(cfg.at("target_parameters"),
            nlohmann::json({"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  EXPECT_EQ(cfg.at("target_modules"), nlohmann::json({"q_proj", "o_proj"}));
  const rp::PeftAdapter a = rp::read_peft_adapter(fin.string());
  double expert_b = 0;
  int expert_tensors = 0;
  for (const auto& [name, t] : a.tensors)
    if (name.find(".mlp.experts.") != std::string::npos) {
      ++expert_tensors;
      if (name.find("lora_B") != std::string::npos)
        for (float v : t.data) expert_b += double(v) * v;
    }
  EXPECT_GT(expert_tensors, 0);
  EXPECT_GT(expert_b, 0) << "the experts' lora_B stayed at zero";
  // final-merged = the base + the exported adapters folded by the file-level merge
  rp::LoadedModel base = rp::load_model((d / "tiny-moe").string());
  rp::merge_peft_adapter(base, a);
  const rp::LoadedModel merged = rp::load_model((d / "whole/final-merged").string());
  ASSERT_EQ(merged.tensors.size(), base.tensors.size());
  int changed_experts = 0;
  const rp::LoadedModel plain = rp::load_model((d / "tiny-moe").string());
  for (const auto& [name, t] : base.tensors) {
    const auto& m = merged.tensors.at(name);
    ASSERT_EQ(m.data.size(), t.data.size()) << name;
    for (size_t i = 0; i < t.data.size(); ++i)
      ASSERT_NEAR(m.data[i], t.data[i], 1e-5 * (1 + std::fabs(t.data[i]))) << name << "[" << i << "]";
    if (name.find(".mlp.experts.") != std::string::npos && plain.tensors.at(name).data != t.data)
      ++changed_experts;
  }
  EXPECT_GT(changed_experts, 0) << "the merge folded no expert adapter";
  // resume from checkpoint-2: the same final adapter, byte for byte
  rp::TrainSpec rest = spec(d, "rest", 4);
  rest.resume_from = (d / "whole/checkpoint-2").string();
  rp::Trainer(rest).run();
  const std::string wa = bytes_of(fin / rp::kAdapterWeightsFile);
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == bytes_of(d / "rest/final" / rp::kAdapterWeightsFile));
  // continue from the folder alone (its config gives the targets), with a learning rate too small to move
  rp::TrainSpec next = spec(d, "next", 1);
  next.lora.reset();
  next.adapter = fin.string();
  next.adam.lr = next.lr_schedule.lr = 1e-30;
  rp::Trainer(next).run();
  const rp::PeftAdapter b = rp::read_peft_adapter((d / "next/final").string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_EQ(t.data, b.tensors.at(name).data) << name;
  fs::remove_all(d);
}

TEST(TrainerLoraExperts, SpecRefusesDropoutAndUnknownParameters) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const fs::path model = tiny_model(d, true);
  nlohmann::json j = nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / "x"));
  j["lora"] = {{"r", 4}, {"dropout", 0.1}, {"target_parameters", {"mlp.experts.down_proj"}}};
  try {
    rp::spec_from_json(j, "spec");
    ADD_FAILURE() << "dropout with target_parameters accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("lora.dropout"), std::string::npos) << e.what();
  }
  j["lora"] = {{"r", 4}, {"target_parameters", {"mlp.experts.w1"}}};
  try {
    rp::spec_from_json(j, "spec");
    ADD_FAILURE() << "an unknown target parameter accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("lora.target_parameters"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

}  // namespace
