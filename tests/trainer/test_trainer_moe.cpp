// A mixture-of-experts model through rp::Trainer: metrics.csv and the step reports carry the
// load-balancing loss and the expert utilisation, the training loss falls, and the final
// checkpoint (config with the sparse-block keys, per-expert tensors) loads back as the same
// model.
#include <gtest/gtest.h>

#include <algorithm>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const char* kMoeData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light.\"}\n";

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string f;
  while (std::getline(ss, f, ',')) out.push_back(f);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

TEST(TrainerMoe, ReportsExpertUtilisationAndSavesALoadableCheckpoint) {
  auto d = tmpdir();
  write(d / "data.jsonl", kMoeData);
  const fs::path model = tiny_model(d, true);
  rp::TrainSpec s =
      rp::spec_from_json(nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / "run")), "spec");
  s.steps = 6;
  s.seed = 5;
  s.save_dtype = "f32";
  s.adam.lr = 0.02;
  s.lr_schedule.lr = 0.02;
  std::vector<rp::StepReport> steps;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { steps.push_back(r); };
  const rp::TrainResult res = rp::Trainer(s).run(cb);
  ASSERT_EQ(res.steps_done, 6);
  ASSERT_EQ(steps.size(), 6u);
  for (const auto& r : steps) {
    EXPECT_EQ(r.experts, 4);
    EXPECT_GT(r.aux_loss, 0.0);
    EXPECT_LE(r.expert_load_min, 1.0);
    EXPECT_GE(r.expert_load_max, 1.0);
    EXPECT_GE(r.expert_load_min, 0.0);
    EXPECT_LE(r.expert_load_max, 4.0);  // one expert cannot take more than every token
  }
  EXPECT_LT(steps.back().loss, steps.front().loss);
  std::ifstream csv(res.metrics);
  std::string header, row;
  std::getline(csv, header);
  ASSERT_TRUE(std::getline(csv, row));
  const auto h = fields(header), v = fields(row);
  ASSERT_EQ(h.size(), v.size()) << row;
  // the router columns by name (metrics.csv appends later columns, e.g. epoch, after them)
  auto col = [&](const char* name) { return size_t(std::find(h.begin(), h.end(), name) - h.begin()); };
  ASSERT_LT(col("aux_loss"), h.size());
  ASSERT_LT(col("expert_load_max"), h.size());
  EXPECT_NEAR(std::stod(v[col("aux_loss")]), steps[0].aux_loss, 1e-5 * steps[0].aux_loss);
  EXPECT_NEAR(std::stod(v[col("expert_load_max")]), steps[0].expert_load_max, 1e-4);
  // the final checkpoint is a Qwen3-MoE folder that loads as the same architecture
  const rp::LoadedModel back = rp::load_model(res.checkpoint);
  EXPECT_EQ(back.config.architecture, "qwen3_moe");
  EXPECT_EQ(back.config.num_experts, 4);
  EXPECT_EQ(back.config.num_experts_per_tok, 2);
  EXPECT_TRUE(back.config.output_router_logits);
}

// GPT-OSS through the trainer: full fine-tuning saves a checkpoint in transformers' form
// (stacked, interleaved experts) that loads back as the same model; LoRA on the attention of a
// frozen base whose experts are mxfp4 trains (the loss falls) and saves a PEFT adapter.
TEST(TrainerMoe, GptOssTrainsFullyAndWithLoraOnAnMxfp4Base) {
  auto d = tmpdir();
  write(d / "data.jsonl", kMoeData);
  const fs::path model = tiny_model(d, true, true);
  {
    rp::TrainSpec s =
        rp::spec_from_json(nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / "full")), "spec");
    s.steps = 4;
    s.save_dtype = "f32";
    const rp::TrainResult res = rp::Trainer(s).run({});
    ASSERT_EQ(res.steps_done, 4);
    const rp::LoadedModel back = rp::load_model(res.checkpoint);
    EXPECT_EQ(back.config.architecture, "gpt_oss");
    EXPECT_EQ(back.config.layer_types, (std::vector<std::string>{"sliding_attention", "full_attention"}));
    std::ifstream cfg(fs::path(res.checkpoint) / "config.json");
    const nlohmann::json j = nlohmann::json::parse(cfg);
    EXPECT_EQ(j["model_type"], "gpt_oss");
    EXPECT_EQ(j["num_local_experts"], 4);
  }
  rp::TrainSpec s =
      rp::spec_from_json(nlohmann::json::parse(spec_for(
                             model, d / "data.jsonl", d / "lora",
                             ", \"lora\": {\"r\": 4, \"alpha\": 8, \"target_modules\": \"all-linear\", "
                             "\"base_format\": \"mxfp4\"}")),
                         "spec");
  s.steps = 8;
  s.seed = 3;
  s.adam.lr = 0.02;
  s.lr_schedule.lr = 0.02;
  std::vector<rp::StepReport> steps;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { steps.push_back(r); };
  const rp::TrainResult res = rp::Trainer(s).run(cb);
  ASSERT_EQ(res.steps_done, 8);
  EXPECT_LT(steps.back().loss, steps.front().loss);
  EXPECT_TRUE(fs::exists(fs::path(res.checkpoint) / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(res.checkpoint) / "adapter_config.json"));
}

}  // namespace
