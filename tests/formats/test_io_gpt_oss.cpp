// GPT-OSS checkpoints: config.json keys and their one-line errors, the layout, the bf16 and
// MXFP4 forms of one tiny model (tests/fixtures/hf_gpt_oss/make_gpt_oss_golden.py) loading to
// the same weights, and the HF export (stacked, interleaved experts) loading back unchanged.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "formats/safetensors.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "model/layout.hpp"
#include "tests/formats/test_io_util.hpp"

namespace rp::test {
namespace {

using nlohmann::json;

const std::string kDir = std::string(RP_FIXTURES_DIR) + "/hf_gpt_oss/";

json fixture_config() {
  std::ifstream f(kDir + "tiny_gpt_oss/config.json");
  return json::parse(f);
}

std::string error_of(const json& j) {
  try {
    config_from_json(j, "config.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(IoGptOss, ConfigKeys) {
  const ModelConfig c = config_from_json(fixture_config(), "config.json");
  EXPECT_TRUE(c.gpt_oss());
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.num_moe_layers(), 3);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.attention_sinks);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.attention_window(0), 3);
  EXPECT_EQ(c.attention_window(1), 0);
  EXPECT_EQ(c.attention_window(2), 3);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(c.rope_theta, 150000.0);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(c.swiglu_alpha, 1.702);
  EXPECT_DOUBLE_EQ(c.aux_loss_coef(), 0.02);
  // written back and read again: the same model
  const ModelConfig d = config_from_json(config_to_json(c), "out.json");
  EXPECT_EQ(d.layer_types, c.layer_types);
  EXPECT_EQ(d.sliding_window, 3);
  EXPECT_FALSE(d.rope_scaling.truncate);
  EXPECT_EQ(d.num_parameters(), c.num_parameters());
  EXPECT_EQ(d.num_experts, 4);
  // defaults of GptOssConfig when keys are absent: alternating layers from a sliding one
  json j = fixture_config();
  j.erase("layer_types");
  j.erase("rope_parameters");
  const ModelConfig e = config_from_json(j, "config.json");
  EXPECT_EQ(e.layer_types,
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention"}));
  EXPECT_EQ(e.rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(e.rope_scaling.factor, 32.0);
  EXPECT_EQ(e.rope_scaling.original_max_position_embeddings, 4096);
}

// The published GPT-OSS-20B config.json (examples/configs): 20.9 B parameters (transformers
// counts 20,914,757,184), 4.2 B of them multiplied per token (4 of 32 experts, embeddings and
// the LM head included).
TEST(IoGptOss, PublishedTwentyBillionConfig) {
  const ModelConfig c = load_config_file(std::string(RP_SOURCE_DIR) + "/examples/configs/gpt-oss-20b.json");
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.attention_window(0), 128);
  EXPECT_EQ(c.attention_window(23), 0);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.num_parameters(), 20914757184);
  EXPECT_NEAR(double(c.num_active_parameters()), 4.19e9, 0.01e9);
}

TEST(IoGptOss, ConfigErrorsNameTheKey) {
  json j = fixture_config();
  j["layer_types"] = json::array({"sliding_attention", "full_attention"});
  EXPECT_NE(error_of(j).find("key 'layer_types'"), std::string::npos) << error_of(j);
  j = fixture_config();
  j["layer_types"][1] = "chunked_attention";
  EXPECT_NE(error_of(j).find("key 'layer_types'"), std::string::npos) << error_of(j);
  j = fixture_config();
  j.erase("sliding_window");
  EXPECT_NE(error_of(j).find("key 'sliding_window'"), std::string::npos) << error_of(j);
  j = fixture_config();
  j["quantization_config"] = {{"quant_method", "bitsandbytes"}};
  EXPECT_NE(error_of(j).find("key 'quantization_config.quant_method'"), std::string::npos) << error_of(j);
  j = fixture_config();
  j["num_experts_per_tok"] = 5;
  EXPECT_NE(error_of(j).find("key 'num_experts_per_tok'"), std::string::npos) << error_of(j);
  j = fixture_config();
  j.erase("num_local_experts");
  EXPECT_NE(error_of(j).find("key 'num_experts'"), std::string::npos) << error_of(j);
  j = fixture_config();
  j["swiglu_limit"] = -1;
  EXPECT_NE(error_of(j).find("key 'swiglu_limit'"), std::string::npos) << error_of(j);
  j = fixture_config();
  j["rope_parameters"]["truncate"] = "no";
  EXPECT_NE(error_of(j).find("key 'rope_parameters.truncate'"), std::string::npos) << error_of(j);
  for (const std::string& e : {error_of(j)}) EXPECT_EQ(e.find('\n'), std::string::npos);
  // biases stay GPT-OSS only
  json q = {{"model_type", "qwen3"},  {"vocab_size", 16},       {"hidden_size", 8},
            {"intermediate_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
            {"attention_bias", true}};
  EXPECT_NE(error_of(q).find("key 'attention_bias'"), std::string::npos) << error_of(q);
}

TEST(IoGptOss, LayoutHoldsBiasesSinksAndStackedExperts) {
  const ModelConfig c = config_from_json(fixture_config(), "config.json");
  const ModelLayout m = make_layout(c);
  const ParamGroup& g = m.groups[1];
  for (const char* n : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                        "self_attn.o_proj.bias", "self_attn.sinks", "mlp.router.weight", "mlp.router.bias",
                        "mlp.experts.3.gate_proj.bias", "mlp.experts.0.down_proj.weight"})
    EXPECT_GE(g.find(std::string("model.layers.0.") + n), 0) << n;
  EXPECT_LT(g.find("model.layers.0.self_attn.q_norm.weight"), 0);
  const auto& gb0 = g.tensors[size_t(g.find("model.layers.0.mlp.experts.0.gate_proj.bias"))];
  const auto& gb1 = g.tensors[size_t(g.find("model.layers.0.mlp.experts.1.gate_proj.bias"))];
  EXPECT_EQ(gb1.offset - gb0.offset, 32);  // [E, F] stack
  int64_t n = 0;
  for (const auto& grp : m.groups) n += grp.numel;
  EXPECT_EQ(n, c.num_parameters());
}

TEST(IoGptOss, Mxfp4CheckpointLoadsToTheBf16Weights) {
  const LoadedModel a = load_model(kDir + "tiny_gpt_oss");
  const LoadedModel b = load_model(kDir + "tiny_gpt_oss_mxfp4");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  int experts = 0;
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    ASSERT_NE(it, b.tensors.end()) << name;
    ASSERT_EQ(t.shape, it->second.shape) << name;
    EXPECT_EQ(0, std::memcmp(t.data.data(), it->second.data.data(), t.data.size() * 4)) << name;
    experts += name.find(".mlp.experts.") != std::string::npos;
  }
  EXPECT_EQ(experts, 3 * 4 * 6);
  // the expert weights are not all zero (a dequantization that lost them would match nothing)
  const auto& w = a.tensors.at("model.layers.1.mlp.experts.2.up_proj.weight").data;
  double s = 0;
  for (float v : w) s += std::abs(v);
  EXPECT_GT(s, 1.0);
  // a truncated scales tensor is named
  TempDir tmp("gptoss_bad");
  {
    SafetensorsFile f(kDir + "tiny_gpt_oss_mxfp4/model.safetensors");
    std::vector<HostTensor> keep;
    std::vector<TensorRef> refs;
    for (const auto& e : f.entries()) keep.push_back(f.read_f32(e));
    for (size_t i = 0; i < keep.size(); ++i) {
      const auto& e = f.entries()[i];
      if (e.name == "model.layers.0.mlp.experts.gate_up_proj_scales")  // [4, 64, 2] -> [4, 64, 1]
        keep[i].shape[2] = 1, keep[i].data.resize(size_t(4 * 64));
      refs.push_back({e.name, keep[i].shape, keep[i].data.data()});
    }
    save_safetensors(tmp / "model.safetensors", refs, DType::f32);
    fs::copy_file(kDir + "tiny_gpt_oss_mxfp4/config.json", tmp / "config.json");
  }
  try {
    load_model(tmp.path.string());
    FAIL() << "a misshapen scales tensor loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("gate_up_proj_scales"), std::string::npos) << e.what();
  }
}

// A frozen GPT-OSS base in mxfp4 keeps the experts in mxfp4 (the checkpoint's own codes: an
// expert dequantized from the MXFP4 file re-encodes losslessly) and the attention in bf16.
TEST(IoGptOss, FrozenMxfp4BaseKeepsTheExpertsExactly) {
  const LoadedModel a = load_model(kDir + "tiny_gpt_oss_mxfp4");
  ModelLayout m = make_layout(a.config);
  freeze_group(m, 2, WeightFormat::mxfp4);
  const ParamGroup& g = m.groups[2];
  int experts = 0;
  for (const TensorSpec& t : g.tensors) {
    const bool expert_matrix = t.name.find(".mlp.experts.") != std::string::npos && t.shape.size() == 2;
    if (expert_matrix) {
      EXPECT_EQ(t.format, WeightFormat::mxfp4) << t.name;
      const std::vector<float>& w = a.tensors.at(t.name).data;
      std::vector<uint8_t> q(weight_format_bytes(WeightFormat::mxfp4, t.numel()));
      std::vector<float> back(w.size());
      quantize_weights(WeightFormat::mxfp4, w.data(), q.data(), t.numel());
      dequantize_weights(WeightFormat::mxfp4, q.data(), back.data(), t.numel());
      EXPECT_EQ(0, std::memcmp(w.data(), back.data(), w.size() * 4)) << t.name;
      ++experts;
    } else if (t.shape.size() == 2) {
      EXPECT_EQ(t.format, WeightFormat::bf16) << t.name;
    } else {
      EXPECT_EQ(t.format, WeightFormat::f32) << t.name;
    }
  }
  EXPECT_EQ(experts, 4 * 3);
}

TEST(IoGptOss, ExportRoundTripsThroughHfNames) {
  const LoadedModel a = load_model(kDir + "tiny_gpt_oss");
  const ModelLayout layout = make_layout(a.config);
  std::vector<std::vector<float>> groups;
  fill_groups(a, layout, groups);
  std::vector<const float*> ptrs;
  for (const auto& g : groups) ptrs.push_back(g.data());
  TempDir tmp("gptoss_export");
  const std::string out = tmp / "ckpt";
  save_hf_checkpoint(out, layout, ptrs, nullptr, "", DType::f32);
  // transformers' names and shapes
  SafetensorsFile f(out + "/model.safetensors");
  const SafetensorsEntry* gu = f.find("model.layers.2.mlp.experts.gate_up_proj");
  ASSERT_NE(gu, nullptr);
  EXPECT_EQ(gu->shape, (std::vector<int64_t>{4, 64, 64}));
  ASSERT_NE(f.find("model.layers.2.mlp.experts.down_proj_bias"), nullptr);
  EXPECT_EQ(f.find("model.layers.2.mlp.experts.0.gate_proj.weight"), nullptr);
  // the exported stack equals the fixture's (bf16 values, exact in fp32)
  SafetensorsFile src(kDir + "tiny_gpt_oss/model.safetensors");
  for (const char* n :
       {"model.layers.2.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_bias",
        "model.layers.1.mlp.experts.down_proj", "model.layers.1.mlp.experts.down_proj_bias"}) {
    const HostTensor x = f.read_f32(*f.find(n)), y = src.read_f32(*src.find(n));
    ASSERT_EQ(x.shape, y.shape) << n;
    EXPECT_EQ(0, std::memcmp(x.data.data(), y.data.data(), x.data.size() * 4)) << n;
  }
  const LoadedModel b = load_model(out);
  EXPECT_EQ(b.config.layer_types, a.config.layer_types);
  for (const auto& [name, t] : a.tensors)
    EXPECT_EQ(0, std::memcmp(t.data.data(), b.tensors.at(name).data.data(), t.data.size() * 4)) << name;
}

}  // namespace
}  // namespace rp::test
