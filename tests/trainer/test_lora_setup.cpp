// lora_run_weights reads the frozen base tensor by tensor from the model file into its storage
// form: the same RunWeights as the eager path (load_model's fp32 tensors quantized group by
// group), for a dense and a mixture-of-experts model and each storage form.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kernels/weight_format.hpp"
#include "model/lora.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/model_source.hpp"
#include "roundpipe/session.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/lora_setup.hpp"

namespace {

using namespace rp::clitest;

void check_run_weights(bool moe, rp::WeightFormat f) {
  const fs::path d = tmpdir();
  const fs::path model = tiny_model(d, moe);
  rp::TrainSpec spec;
  rp::LoraConfig l;
  l.r = 4;
  // a MoE layer's experts take no adapters
  l.target_modules =
      moe ? std::vector<std::string>{"q_proj", "o_proj"} : std::vector<std::string>{"q_proj", "down_proj"};
  l.modules_to_save = {"lm_head"};  // tied: the embedding group trains in fp32
  l.base_format = f;
  l.seed = 3;
  spec.lora = l;
  spec.seed = 3;
  rp::ModelSource src = rp::ModelSource::open(model.string());
  const rp::RunWeights w = rp::lora_run_weights(spec, src, "");
  const rp::LoadedModel eager = rp::load_model(model.string());
  ASSERT_EQ(w.layout.groups.size(), w.frozen.size());
  int64_t frozen_groups = 0;
  for (size_t g = 0; g < w.layout.groups.size(); ++g) {
    const rp::ParamGroup& grp = w.layout.groups[g];
    if (g >= size_t(w.layout.num_layers())) {  // adapters: PEFT's initialisation
      EXPECT_EQ(w.trainable[g], rp::lora_initial_group(w.layout, int(g))) << grp.name;
      continue;
    }
    std::vector<float> tr(grp.frozen ? 0 : size_t(grp.numel));
    std::vector<uint8_t> fr(grp.frozen ? size_t(grp.storage_bytes) : 0);
    for (const rp::TensorSpec& t : grp.tensors) {
      const auto& v = eager.tensors.at(t.name).data;
      if (grp.frozen) rp::quantize_weights(t.format, v.data(), fr.data() + t.byte_offset, t.numel());
      else std::copy(v.begin(), v.end(), tr.begin() + t.offset);
    }
    frozen_groups += grp.frozen;
    EXPECT_EQ(w.trainable[g], tr) << grp.name;
    EXPECT_EQ(w.frozen[g], fr) << grp.name;
  }
  EXPECT_EQ(frozen_groups, w.layout.num_layers() - 1);
  fs::remove_all(d);
}

TEST(LoraSetup, DenseBaseMatchesEagerLoad) {
  for (auto f :
       {rp::WeightFormat::bf16, rp::WeightFormat::f32, rp::WeightFormat::q8_0, rp::WeightFormat::nf4})
    check_run_weights(false, f);
}

TEST(LoraSetup, MoeBaseMatchesEagerLoad) {
  for (auto f : {rp::WeightFormat::bf16, rp::WeightFormat::q4_0}) check_run_weights(true, f);
}

TEST(LoraSetup, MergedModelEqualsMergeAdaptersOfAllGroups) {
  // merged_model builds the merged fp32 model group by group; merge_adapters (the reference)
  // folds from a full fp32 copy of every group
  const fs::path d = tmpdir();
  rp::TrainSpec spec;
  rp::LoraConfig l;
  l.r = 4;
  l.target_modules = {"all-linear"};
  l.base_format = rp::WeightFormat::q8_0;
  spec.lora = l;
  rp::ModelSource src = rp::ModelSource::open(tiny_model(d).string());
  rp::RunWeights w = rp::lora_run_weights(spec, src, "");
  for (size_t g = size_t(w.layout.num_layers()); g < w.trainable.size(); ++g)  // non-zero B: the fold matters
    for (size_t i = 0; i < w.trainable[g].size(); ++i) w.trainable[g][i] = 0.01f * float(int(i % 7) - 3);
  rp::SessionOptions o;
  o.backend = "cpu";
  o.workers = 1;
  o.micro = {1, 8};
  rp::Session session(w.layout, std::move(w.trainable), std::move(w.frozen), o);
  const rp::PlainModel m = rp::merged_model(session);
  const std::vector<std::vector<float>> all = rp::all_group_weights(session);
  std::vector<const float*> ptrs;
  for (const auto& g : all) ptrs.push_back(g.data());
  const rp::MergedWeights want = rp::merge_adapters(session.layout(), ptrs);
  ASSERT_EQ(m.groups.size(), want.groups.size());
  for (size_t g = 0; g < m.groups.size(); ++g) EXPECT_EQ(m.groups[g], want.groups[g]) << g;
  EXPECT_NE(m.groups[1], all[1]);  // the adapters changed the decoder weights
  fs::remove_all(d);
}

}  // namespace
