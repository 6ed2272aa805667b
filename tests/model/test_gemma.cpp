// Gemma 2 / Gemma 3 text config.json (model/config_families.cpp): the keys read, transformers'
// defaults for the absent ones, the layer types and per-type RoPE, the settings refused in one
// line (Gemma 3's attention soft-capping, the multimodal gemma3, another activation), Gemma 2's
// logit soft-capping (values, defaults, null), and the round trip through config_to_json. The numerics are
// golden-tested in test_hf_parity.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/layers.hpp"
#include "model/layout.hpp"

namespace {

using namespace rp;
using nlohmann::json;

// google/gemma-3-1b-pt's config.json (transformers 4.50 keys)
json gemma3_json() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
    "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256, "attn_logit_softcapping": null, "final_logit_softcapping": null,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_local_base_freq": 10000, "rope_scaling": null,
    "sliding_window": 512, "sliding_window_pattern": 6, "max_position_embeddings": 32768,
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "cache_implementation": "hybrid"})");
}

// google/gemma-2-2b's config.json
json gemma2_json() {
  return json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 256000,
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 224,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "sliding_window": 4096, "max_position_embeddings": 8192,
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0})");
}

std::string error_of(const json& j) {
  try {
    config_from_json(j, "cfg.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Gemma, ParsesGemma3Text) {
  const ModelConfig c = config_from_json(gemma3_json(), "cfg.json");
  EXPECT_TRUE(c.gemma());
  EXPECT_EQ(c.norm_weight_offset(), 1.0f);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qk_norm_whole);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma's default
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / 16.0f);
  EXPECT_DOUBLE_EQ(c.embedding_scale(), std::sqrt(1152.0));
  // every sixth layer global (5, 11, ...), the others a 512-token window on base 10000
  ASSERT_EQ(c.layer_types.size(), 26u);
  for (int64_t i = 0; i < 26; ++i) {
    EXPECT_EQ(c.attention_window(i), (i + 1) % 6 == 0 ? 0 : 512) << i;
    EXPECT_DOUBLE_EQ(rope_params(c, i).theta, (i + 1) % 6 == 0 ? 1e6 : 1e4) << i;
  }
  EXPECT_EQ(c.num_parameters(), int64_t(999885952));  // transformers' Gemma3ForCausalLM
  std::vector<std::string> names;
  const ModelLayout layout = make_layout(c);
  for (const TensorSpec& t : layout.groups[1].tensors) names.push_back(t.name);
  for (const char* n : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                        "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"})
    EXPECT_NE(std::find(names.begin(), names.end(), fmt::format("model.layers.0.{}.weight", n)), names.end())
        << n;
}

// transformers 5 writes rope_parameters per layer type; the linear scaling is the global
// layers' only
TEST(Gemma, Gemma3RopeParametersPerLayerType) {
  json j = gemma3_json();
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5e3}}}};
  const ModelConfig c = config_from_json(j, "cfg.json");
  EXPECT_EQ(rope_params(c, 5).type, "linear");
  EXPECT_DOUBLE_EQ(rope_params(c, 5).factor, 8.0);
  EXPECT_DOUBLE_EQ(rope_params(c, 5).theta, 1e6);
  EXPECT_EQ(rope_params(c, 0).type, "default");
  EXPECT_DOUBLE_EQ(rope_params(c, 0).theta, 5e3);
  // and back through config_to_json
  const ModelConfig back = config_from_json(config_to_json(c), "saved.json");
  EXPECT_EQ(config_to_json(back), config_to_json(c));
  EXPECT_EQ(rope_params(back, 5).type, "linear");
  EXPECT_DOUBLE_EQ(rope_params(back, 0).theta, 5e3);
  j["rope_parameters"]["sliding_attention"]["rope_type"] = "yarn";
  j["rope_parameters"]["sliding_attention"]["factor"] = 2.0;
  EXPECT_NE(error_of(j).find("key 'rope_parameters.sliding_attention.rope_type'"), std::string::npos)
      << error_of(j);
}

TEST(Gemma, ParsesGemma2) {
  const ModelConfig c = config_from_json(gemma2_json(), "cfg.json");
  EXPECT_TRUE(c.gemma());
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FLOAT_EQ(c.attention_scale(), float(1.0 / std::sqrt(224.0)));
  for (int64_t i = 0; i < 26; ++i) {  // sliding from layer 0, alternating
    EXPECT_EQ(c.attention_window(i), i % 2 == 0 ? 4096 : 0) << i;
    EXPECT_DOUBLE_EQ(rope_params(c, i).theta, 1e4) << i;
  }
  EXPECT_EQ(c.num_parameters(), int64_t(2614341888));  // transformers' Gemma2ForCausalLM
  const ModelConfig back = config_from_json(config_to_json(c), "saved.json");
  EXPECT_EQ(config_to_json(back), config_to_json(c));
  EXPECT_EQ(config_to_json(c)["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_FALSE(config_to_json(c).contains("hidden_act"));
  EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(config_to_json(c)["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(config_to_json(c)["final_logit_softcapping"], 30.0);
}

// Gemma2Config's defaults (50, 30) when the keys are absent; null turns each off; Gemma 3
// applies only the final cap (Gemma3ForCausalLM.forward), default none; other families none.
TEST(Gemma, SoftcappingKeys) {
  json j = gemma2_json();
  j.erase("attn_logit_softcapping");
  j.erase("final_logit_softcapping");
  ModelConfig c = config_from_json(j, "cfg.json");
  EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 30.0);
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = 12.5;
  c = config_from_json(j, "cfg.json");
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 12.5);
  const json out = config_to_json(c);
  EXPECT_TRUE(out["attn_logit_softcapping"].is_null());
  EXPECT_EQ(out["final_logit_softcapping"], 12.5);
  EXPECT_EQ(config_to_json(config_from_json(out, "saved.json")), out);
  // caps float32 cannot carry (the kernels divide by them) are refused naming the key
  for (double cap : {1e300, 1e31, 1e-50}) {
    json k = gemma2_json();
    k["final_logit_softcapping"] = cap;
    try {
      config_from_json(k, "cfg.json");
      ADD_FAILURE() << "a cap of " << cap << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("final_logit_softcapping"), std::string::npos) << e.what();
    }
  }
  c = config_from_json(gemma3_json(), "cfg.json");
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  j = gemma3_json();
  j["final_logit_softcapping"] = 30.0;
  c = config_from_json(j, "cfg.json");
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(config_to_json(c)["final_logit_softcapping"], 30.0);
  EXPECT_TRUE(config_to_json(c)["attn_logit_softcapping"].is_null());
  c.attn_logit_softcapping = 50.0;  // validate: Gemma 2 only
  EXPECT_THROW(c.validate(), std::invalid_argument);
  ModelConfig llama = config_from_json(json::parse(R"({"model_type": "llama", "vocab_size": 64,
      "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_key_value_heads": 2})"),
                                       "cfg.json");
  EXPECT_EQ(llama.final_logit_softcapping, 0.0);
  llama.final_logit_softcapping = 30.0;
  EXPECT_THROW(llama.validate(), std::invalid_argument);
}

TEST(Gemma, RefusalsNameTheKey) {
  auto expect = [](const json& j, const std::string& want) {
    const std::string e = error_of(j);
    EXPECT_EQ(e.rfind("cfg.json: key '", 0), 0u) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  json j = gemma3_json();  // transformers' Gemma3 attention ignores it: refused, not ignored
  j["attn_logit_softcapping"] = 50.0;
  expect(j, "key 'attn_logit_softcapping': expected null (Gemma 3's attention does not soft-cap");
  j = gemma2_json();
  j["attn_logit_softcapping"] = -1.0;
  expect(j, "key 'attn_logit_softcapping'");
  j = gemma2_json();
  j["final_logit_softcapping"] = "30";
  expect(j, "key 'final_logit_softcapping'");
  j = gemma2_json();
  j["final_logit_softcapping"] = 0;
  expect(j, "key 'final_logit_softcapping'");
  j = gemma3_json();
  j["hidden_activation"] = "gelu";
  expect(j, "key 'hidden_activation': expected \"gelu_pytorch_tanh\"");
  j = gemma3_json();
  j["use_bidirectional_attention"] = true;
  expect(j, "key 'use_bidirectional_attention'");
  j = gemma3_json();
  j["model_type"] = "gemma3";
  expect(j, "key 'model_type': expected \"gemma3_text\" (Gemma 3's multimodal checkpoints are not supported");
  j = gemma3_json();
  j["architectures"] = {"Gemma2ForCausalLM"};
  expect(j, "key 'architectures'");
  j = gemma2_json();
  j["query_pre_attn_scalar"] = -1;
  expect(j, "key 'query_pre_attn_scalar'");
}

}  // namespace
