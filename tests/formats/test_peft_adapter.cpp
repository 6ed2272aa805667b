// PEFT adapter folders made by the real peft library (tests/fixtures/peft/make_fixture.py):
// importing them into the adapter groups of a LoRA layout reproduces every tensor of the file,
// and folding them in (from the groups, and from the files alone) equals peft's
// merge_and_unload() to fp32 rounding, including tied embeddings kept tied
// (ensure_weight_tying) and untied (lm_head trained apart from the tied embedding).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "formats/safetensors.hpp"
#include "lora_test_layout.hpp"
#include "roundpipe/adapter.hpp"
#include "test_io_util.hpp"

namespace {

using namespace rp;
using namespace rp::test;

const std::string kDir = std::string(RP_FIXTURES_DIR) + "/peft/";

struct Case {
  const char* name;
  const char* base;
  int64_t r;
  double alpha;
  std::vector<std::string> targets;
  bool rslora;
  std::vector<std::string> modules_to_save;
  bool unties;
};

const std::vector<Case> kCases = {
    {"untied_all",
     "base_untied",
     4,
     8,
     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
     false,
     {"lm_head"},
     false},
    {"tied_rslora", "base_tied", 4, 6, {"q_proj", "v_proj", "down_proj"}, true, {"embed_tokens"}, false},
    {"tied_untie", "base_tied", 3, 5, {"k_proj", "o_proj", "up_proj"}, false, {"lm_head"}, true},
};

/// max |a - b| / max(1, max |b|)
double rel_diff(const float* a, const float* b, int64_t n) {
  double d = 0, m = 1;
  for (int64_t i = 0; i < n; ++i) {
    d = std::max(d, double(std::abs(a[i] - b[i])));
    m = std::max(m, double(std::abs(b[i])));
  }
  return d / m;
}

/// Compares every tensor of `layout`/`groups` (a merged, plain layout) with peft's merged state
/// dict; a tied layout's embedding stands for both ends.
void expect_equals_peft_merge(const ModelLayout& layout, const std::vector<std::vector<float>>& groups,
                              const std::string& merged_file, const std::string& what) {
  SafetensorsFile peft(merged_file);
  int compared = 0;
  for (size_t g = 0; g < layout.groups.size(); ++g)
    for (const TensorSpec& t : layout.groups[g].tensors) {
      std::vector<std::string> names = {t.name};
      if (t.name == "model.embed_tokens.weight" && layout.config.tie_word_embeddings)
        names.push_back("lm_head.weight");
      for (const auto& n : names) {
        const SafetensorsEntry* e = peft.find(n);
        ASSERT_NE(e, nullptr) << what << ": " << n;
        const HostTensor ref = peft.read_f32(*e);
        ASSERT_EQ(ref.shape, t.shape) << what << ": " << n;
        EXPECT_LE(rel_diff(groups[g].data() + t.offset, ref.data.data(), t.numel()), 1e-6)
            << what << ": " << n;
        ++compared;
      }
    }
  EXPECT_EQ(compared, int(peft.entries().size())) << what << ": every tensor of peft's merge is compared";
}

class PeftFixture : public ::testing::TestWithParam<Case> {};

TEST_P(PeftFixture, ReadsTheConfigAsPeftWroteIt) {
  const Case& c = GetParam();
  const PeftAdapter a = read_peft_adapter(kDir + c.name + "/adapter");
  EXPECT_EQ(a.lora.r, c.r);
  EXPECT_EQ(a.lora.alpha, c.alpha);
  EXPECT_EQ(a.lora.target_modules, c.targets);
  EXPECT_EQ(a.lora.use_rslora, c.rslora);
  EXPECT_EQ(a.lora.modules_to_save, c.modules_to_save);
  EXPECT_EQ(a.lora.dropout, 0.0);
  EXPECT_EQ(a.base_model_name_or_path, std::string("../../") + c.base);
  const LoadedModel base = load_model(kDir + c.base);
  EXPECT_EQ(peft_adapter_unties(a, base.config), c.unties);
}

TEST_P(PeftFixture, ImportFillsEveryTensorOfTheFile) {
  const Case& c = GetParam();
  const PeftAdapter a = read_peft_adapter(kDir + c.name + "/adapter");
  LoadedModel base = load_model(kDir + c.base);
  if (peft_adapter_unties(a, base.config)) untie_embeddings(base);
  const ModelLayout layout = lora_test_layout(base.config, a.lora);
  auto groups = base_groups(layout, base.tensors);
  load_peft_adapter(a, layout, groups);
  // every key of the file, read independently of read_peft_adapter, is in its group
  SafetensorsFile file(kDir + c.name + "/adapter/adapter_model.safetensors");
  ASSERT_GT(file.entries().size(), 4u);
  for (const auto& e : file.entries()) {
    std::string name = tensor_name_of_peft_key(e.name);
    ASSERT_FALSE(name.empty()) << e.name;
    if (name == "lm_head.weight" && layout.config.tie_word_embeddings) name = "model.embed_tokens.weight";
    bool found = false;
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      const int i = layout.groups[g].find(name);
      if (i < 0) continue;
      const TensorSpec& t = layout.groups[g].tensors[size_t(i)];
      const HostTensor ref = file.read_f32(e);
      ASSERT_EQ(ref.shape, t.shape) << e.name;
      EXPECT_EQ(0, std::memcmp(groups[g].data() + t.offset, ref.data.data(), size_t(t.numel()) * 4))
          << e.name;
      found = true;
    }
    EXPECT_TRUE(found) << e.name;
  }
}

TEST_P(PeftFixture, MergeOfTheGroupsEqualsPeftsMergeAndUnload) {
  const Case& c = GetParam();
  const PeftAdapter a = read_peft_adapter(kDir + c.name + "/adapter");
  LoadedModel base = load_model(kDir + c.base);
  if (peft_adapter_unties(a, base.config)) untie_embeddings(base);
  const ModelLayout layout = lora_test_layout(base.config, a.lora);
  auto groups = base_groups(layout, base.tensors);
  load_peft_adapter(a, layout, groups);
  const MergedWeights m = merge_adapters(layout, pointers(groups));
  EXPECT_EQ(m.layout.config.tie_word_embeddings, !c.unties && std::string(c.base) == "base_tied");
  EXPECT_EQ(m.layout.groups.size(), size_t(layout.config.num_hidden_layers + 2));
  expect_equals_peft_merge(m.layout, m.groups, kDir + c.name + "/merged.safetensors", c.name);
  // the adapters changed the weights they target (so the comparison above can fail)
  const int iq = m.layout.groups[1].find("model.layers.0.self_attn.q_proj.weight");
  const auto& wq = base.tensors.at("model.layers.0.self_attn.q_proj.weight").data;
  const bool q_targeted = std::find(c.targets.begin(), c.targets.end(), "q_proj") != c.targets.end();
  EXPECT_EQ(rel_diff(m.groups[1].data() + m.layout.groups[1].tensors[size_t(iq)].offset, wq.data(),
                     int64_t(wq.size())) > 1e-4,
            q_targeted);
}

TEST_P(PeftFixture, MergeOfTheFilesEqualsPeftsMergeAndUnload) {
  const Case& c = GetParam();
  const PeftAdapter a = read_peft_adapter(kDir + c.name + "/adapter");
  LoadedModel base = load_model(kDir + c.base);
  merge_peft_adapter(base, a);
  const ModelLayout plain = make_layout(base.config);
  std::vector<std::vector<float>> groups;
  fill_groups(base, plain, groups);
  expect_equals_peft_merge(plain, groups, kDir + c.name + "/merged.safetensors", c.name);
}

TEST_P(PeftFixture, MergedCheckpointIsAPlainHuggingFaceFolder) {
  const Case& c = GetParam();
  const PeftAdapter a = read_peft_adapter(kDir + c.name + "/adapter");
  LoadedModel base = load_model(kDir + c.base);
  if (peft_adapter_unties(a, base.config)) untie_embeddings(base);
  const ModelLayout layout = lora_test_layout(base.config, a.lora);
  auto groups = base_groups(layout, base.tensors);
  load_peft_adapter(a, layout, groups);
  TempDir d("peft_merged");
  save_merged_checkpoint(d / "merged", layout, pointers(groups), nullptr, "", DType::f32);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(d / "merged")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"}));
  const LoadedModel back = load_model(d / "merged");
  EXPECT_EQ(back.config.tie_word_embeddings, layout.config.tie_word_embeddings);
  EXPECT_EQ(back.tensors.count("lm_head.weight"), layout.config.tie_word_embeddings ? 0u : 1u);
  const ModelLayout plain = make_layout(back.config);
  std::vector<std::vector<float>> g2;
  fill_groups(back, plain, g2);
  expect_equals_peft_merge(plain, g2, kDir + c.name + "/merged.safetensors", c.name);
}

// `roundpipe merge`: the base found through base_model_name_or_path (relative to the adapter
// folder here), the merge written as a plain folder equal to peft's merge_and_unload.
TEST_P(PeftFixture, MergeFolderFindsTheBaseAndWritesPeftsMerge) {
  const Case& c = GetParam();
  TempDir d("peft_merge_folder");
  const std::string base = merge_peft_folder(kDir + c.name + "/adapter", d / "out", "", DType::f32);
  EXPECT_TRUE(fs::equivalent(base, kDir + c.base)) << base;
  const LoadedModel m = load_model(d / "out");
  EXPECT_EQ(m.config.tie_word_embeddings, std::string(c.base) == "base_tied" && !c.unties);
  const ModelLayout plain = make_layout(m.config);
  std::vector<std::vector<float>> groups;
  fill_groups(m, plain, groups);
  expect_equals_peft_merge(plain, groups, kDir + c.name + "/merged.safetensors", c.name);
}

INSTANTIATE_TEST_SUITE_P(Peft, PeftFixture, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(PeftMergeFolder, ABaseModelThatIsNotLocalIsNamed) {
  TempDir d("peft_merge_nobase");
  fs::copy(kDir + "untied_all/adapter", d / "a");
  std::ifstream in(d / "a/adapter_config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  j["base_model_name_or_path"] = "meta-llama/Llama-3.2-1B";
  std::ofstream(d / "a/adapter_config.json") << j.dump();
  std::string e;
  try {
    merge_peft_folder(d / "a", d / "out", "", DType::bf16);
  } catch (const std::exception& ex) {
    e = ex.what();
  }
  EXPECT_NE(e.find("adapter_config.json: key 'base_model_name_or_path': 'meta-llama/Llama-3.2-1B' is not a "
                   "local model"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(d / "out"));
  // given explicitly, the same folder merges
  merge_peft_folder(d / "a", d / "out", kDir + "base_untied", DType::bf16);
  EXPECT_TRUE(fs::exists(d / "out/model.safetensors"));
}

}  // namespace
