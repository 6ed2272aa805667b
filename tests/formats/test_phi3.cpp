// Phi-3's fused projections (formats/phi3_hf.hpp): a checkpoint's qkv_proj / gate_up_proj are split
// as it loads and fused again as a folder is saved; PEFT's fused adapters of rank r (lora_A
// shared by the parts) and ours of rank n r (block diagonal) both come apart into our per-part
// adapters; what cannot be computed is refused in one line.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "formats/phi3_hf.hpp"
#include "formats/safetensors.hpp"
#include "lora_test_layout.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "test_io_util.hpp"

namespace {

using namespace rp;
using namespace rp::test;
using nlohmann::json;

const std::string kPhi3 = std::string(RP_FIXTURES_DIR) + "/hf_golden/tiny_phi3";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Phi3, LoadsFusedProjectionsAsTheirRowsAndSavesThemFused) {
  const LoadedModel m = load_model(kPhi3);
  const SafetensorsFile file(kPhi3 + "/model.safetensors");
  const HostTensor qkv = file.read_f32(*file.find("model.layers.1.self_attn.qkv_proj.weight"));
  const HostTensor& k = m.tensors.at("model.layers.1.self_attn.k_proj.weight");
  ASSERT_EQ(k.shape, (std::vector<int64_t>{16, 32}));  // 2 kv heads x 8 after the 32 rows of q
  EXPECT_EQ(k.data, std::vector<float>(qkv.data.begin() + 32 * 32, qkv.data.begin() + 48 * 32));
  const HostTensor gu = file.read_f32(*file.find("model.layers.0.mlp.gate_up_proj.weight"));
  EXPECT_EQ(m.tensors.at("model.layers.0.mlp.up_proj.weight").data,
            std::vector<float>(gu.data.begin() + 48 * 32, gu.data.end()));
  EXPECT_FALSE(m.tensors.count("model.layers.0.self_attn.qkv_proj.weight"));
  // saved: the fused tensors again, as transformers' Phi3ForCausalLM names them
  const ModelLayout layout = make_layout(m.config);
  std::vector<std::vector<float>> groups;
  fill_groups(m, layout, groups);
  TempDir d("phi3_save");
  std::vector<const float*> ptrs;
  for (const auto& g : groups) ptrs.push_back(g.data());
  save_hf_checkpoint(d / "out", layout, ptrs, json(), "", DType::f32);
  const SafetensorsFile saved(d / "out/model.safetensors");
  EXPECT_EQ(saved.find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  ASSERT_NE(saved.find("model.layers.1.self_attn.qkv_proj.weight"), nullptr);
  EXPECT_EQ(saved.read_f32(*saved.find("model.layers.1.self_attn.qkv_proj.weight")).data, qkv.data);
  EXPECT_EQ(saved.read_f32(*saved.find("model.layers.0.mlp.gate_up_proj.weight")).data, gu.data);
  const LoadedModel back = load_model(d / "out");
  for (const auto& [name, t] : m.tensors) EXPECT_EQ(back.tensors.at(name).data, t.data) << name;
}

TEST(Phi3, RefusesAMisshapenFusedTensorInOneLine) {
  TempDir d("phi3_bad");
  fs::copy(kPhi3, d.path / "m");
  const SafetensorsFile f(kPhi3 + "/model.safetensors");
  std::vector<HostTensor> keep;
  std::vector<TensorRef> refs;
  for (const auto& e : f.entries()) {
    keep.push_back(f.read_f32(e));
    if (e.name == "model.layers.0.mlp.gate_up_proj.weight") keep.back().shape = {48, 64};  // not [2F, H]
    refs.push_back({e.name, keep.back().shape, keep.back().data.data()});
  }
  save_safetensors(d / "m/model.safetensors", refs, DType::f32);
  const std::string e = error_of([&] { load_model(d / "m"); });
  EXPECT_NE(
      e.find("tensor 'model.layers.0.mlp.gate_up_proj.weight': expected shape [96, 32] (gate_proj, up_proj "
             "fused), got [48, 64]"),
      std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(Phi3, PeftFusedAdaptersSplitIntoOursExactly) {
  const ModelConfig c = load_model(kPhi3).config;
  const int64_t r = 2, H = 32, rows = 64;  // q 32 + k 16 + v 16
  const std::string p = "model.layers.0.self_attn.";
  // PEFT's own (rank r, lora_A shared): each part gets A and its rows of B
  std::map<std::string, HostTensor> t;
  t[p + "qkv_proj.lora_A.weight"] = {{r, H}, random_values(size_t(r * H), 1)};
  t[p + "qkv_proj.lora_B.weight"] = {{rows, r}, random_values(size_t(rows * r), 2)};
  auto parts = split_fused_adapters(t, c, r, "a.safetensors");
  EXPECT_FALSE(parts.count(p + "qkv_proj.lora_A.weight"));
  EXPECT_EQ(parts.at(p + "v_proj.lora_A.weight").data, t[p + "qkv_proj.lora_A.weight"].data);
  const auto& b = t[p + "qkv_proj.lora_B.weight"].data;
  EXPECT_EQ(parts.at(p + "k_proj.lora_B.weight").data,
            std::vector<float>(b.begin() + 32 * r, b.begin() + 48 * r));
  // rank 3r that is not block diagonal is not ours: refused, naming the key and the place
  t[p + "qkv_proj.lora_A.weight"] = {{3 * r, H}, random_values(size_t(3 * r * H), 3)};
  t[p + "qkv_proj.lora_B.weight"] = {{rows, 3 * r}, random_values(size_t(rows * 3 * r), 4)};
  const std::string e = error_of([&] { split_fused_adapters(t, c, r, "a.safetensors"); });
  EXPECT_EQ(
      e.rfind(
          "a.safetensors: key 'base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight': rank 6 = "
          "3 x lora.r but not block diagonal",
          0),
      0u)
      << e;
  // another rank altogether
  t[p + "qkv_proj.lora_A.weight"] = {{5, H}, random_values(size_t(5 * H), 3)};
  EXPECT_NE(error_of([&] { split_fused_adapters(t, c, r, "a.safetensors"); }).find("expected shape [2, 32]"),
            std::string::npos);
}

TEST(Phi3, LoraTargetsAllPartsOfAFusedModuleOrNone) {
  const ModelConfig c = load_model(kPhi3).config;
  LoraConfig l;
  l.r = 2;
  l.target_modules = {"q_proj", "v_proj"};
  EXPECT_EQ(error_of([&] { make_layout(c, l); }),
            "lora.target_modules: Phi-3 fuses q_proj, k_proj, v_proj into qkv_proj in its checkpoints and "
            "adapters; "
            "target all of them or none");
  l.target_modules = {"q_proj", "k_proj", "v_proj", "gate_proj"};
  EXPECT_NE(error_of([&] { make_layout(c, l); }).find("gate_proj, up_proj into gate_up_proj"),
            std::string::npos);
  l.target_modules = {"all-linear"};
  EXPECT_NO_THROW(make_layout(c, l));
}

json phi3_mini() {
  std::ifstream f(std::string(RP_SOURCE_DIR) + "/examples/configs/phi-3-mini-4k-instruct.json");
  return json::parse(f);
}

TEST(Phi3, ConfigWindowParametersAndRefusals) {
  const ModelConfig c = config_from_json(phi3_mini(), "config.json");
  EXPECT_EQ(c.num_parameters(), 3821079552);  // transformers' Phi3ForCausalLM of this config
  EXPECT_EQ(c.attention_window(0), 2047);
  EXPECT_EQ(c.attention_window(31), 2047);
  EXPECT_EQ(config_to_json(c)["architectures"][0], "Phi3ForCausalLM");
  auto err = [](const json& j) { return error_of([&] { config_from_json(j, "config.json"); }); };
  json j = phi3_mini();
  j["rope_scaling"] = {{"type", "longrope"}, {"long_factor", {1.0}}, {"short_factor", {1.0}}};
  EXPECT_EQ(err(j).rfind("config.json: key 'rope_scaling.short_factor': expected a list of rotary_dim/2 = 48 "
                         "positive finite numbers",
                         0),
            0u)
      << err(j);
  j = phi3_mini();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}};  // Phi3Config reads it as longrope
  EXPECT_NE(
      err(j).find("key 'rope_scaling.short_factor': expected a list of rotary_dim/2 = 48 positive finite "
                  "numbers (rope_type longrope needs it)"),
      std::string::npos)
      << err(j);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // Phi3Config refuses the other types
  EXPECT_NE(err(j).find("key 'rope_scaling.rope_type': expected \"default\" or \"longrope\" for phi3, got "
                        "\"linear\""),
            std::string::npos)
      << err(j);
  j = phi3_mini();
  j["architectures"] = {"MistralForCausalLM"};
  EXPECT_NE(err(j).find("key 'architectures': expected [\"Phi3ForCausalLM\"]"), std::string::npos) << err(j);
}

// Phi-4-mini: partial rotary (96 of 128 features), read at the top level or (transformers 5)
// in rope_parameters, written back; refused off phi3 and where int(head_dim * f) is odd.
TEST(Phi3, Phi4MiniPartialRotaryConfig) {
  std::ifstream f(std::string(RP_SOURCE_DIR) + "/examples/configs/phi-4-mini-instruct.json");
  const json j4 = json::parse(f);
  const ModelConfig c = config_from_json(j4, "config.json");
  EXPECT_EQ(c.num_parameters(), 3836021760);  // transformers' Phi3ForCausalLM of this config
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim(), 96);
  EXPECT_EQ(config_from_json(config_to_json(c), "config.json").rotary_dim(), 96);
  auto err = [](const json& j) { return error_of([&] { config_from_json(j, "config.json"); }); };
  json j = phi3_mini();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}};
  EXPECT_EQ(config_from_json(j, "config.json").rotary_dim(), 48);
  j["rope_parameters"]["partial_rotary_factor"] = 0.7;  // int(96 * 0.7) = 67: odd
  EXPECT_EQ(err(j).rfind(
                "config.json: key 'rope_parameters.partial_rotary_factor': expected a number in (0, 1]", 0),
            0u)
      << err(j);
  j = j4;
  j["partial_rotary_factor"] = 1.5;
  EXPECT_NE(err(j).find("key 'partial_rotary_factor': expected a number in (0, 1]"), std::string::npos)
      << err(j);
  j = j4;  // the published LongRoPE: 48 factors each (96 rotary features)
  EXPECT_EQ(c.rope_scaling.type, "longrope");
  EXPECT_EQ(c.rope_scaling.long_factor.size(), 48u);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  j["rope_scaling"]["long_factor"] = {1.0};
  EXPECT_NE(err(j).find("key 'rope_scaling.long_factor': expected a list of rotary_dim/2 = 48"),
            std::string::npos)
      << err(j);
  json l = j4;
  l["model_type"] = "llama";
  l["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(
      err(l).find(
          "key 'partial_rotary_factor': expected 1.0 (partial rotary embeddings: model_type phi3 only)"),
      std::string::npos)
      << err(l);
}

}  // namespace
