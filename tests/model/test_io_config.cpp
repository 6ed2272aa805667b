// config.json parsing, validation, parameter count and round trip.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/layout.hpp"
#include "tests/formats/test_io_util.hpp"

namespace rp {
namespace {

using nlohmann::json;

json llama_json() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05, "rope_theta": 100000, "max_position_embeddings": 8192,
    "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": null,
    "rope_scaling": null, "torch_dtype": "bfloat16"})");
}

json qwen3_json() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "max_position_embeddings": 40960, "tie_word_embeddings": true, "attention_bias": false,
    "use_sliding_window": false, "sliding_window": null, "bos_token_id": 151643,
    "eos_token_id": 151645, "rope_scaling": null})");
}

// Mistral-7B-v0.1's config.json (a 4096-token sliding window)
json mistral_json() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 32768,
    "sliding_window": 4096, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "bfloat16"})");
}

// Qwen2.5-0.5B's config.json
json qwen2_json() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
    "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 24,
    "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151643,
    "torch_dtype": "bfloat16"})");
}

std::string error_of(const json& j) {
  try {
    config_from_json(j, "cfg.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(IoConfig, ParsesLlama) {
  ModelConfig c = config_from_json(llama_json(), "cfg.json");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.rope_scaling.type, "default");
  EXPECT_EQ(c.num_parameters(), 134515008);  // SmolLM2-135M
}

TEST(IoConfig, ParsesQwen3) {
  ModelConfig c = config_from_json(qwen3_json(), "cfg.json");
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 128);  // explicit, != hidden/heads
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_EQ(c.num_parameters(), 596049920);  // Qwen3-0.6B
  auto layout = make_layout(c);
  EXPECT_EQ(layout.total_numel(), c.num_parameters());
}

TEST(IoConfig, ParsesMistral) {
  ModelConfig c = config_from_json(mistral_json(), "cfg.json");
  EXPECT_EQ(c.architecture, "mistral");
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.has_qkv_bias());
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.attention_window(0), 4096);  // every layer slides
  EXPECT_EQ(c.attention_window(31), 4096);
  EXPECT_EQ(c.num_parameters(), 7241732096);  // Mistral-7B-v0.1
  EXPECT_EQ(make_layout(c).total_numel(), c.num_parameters());
  // v0.3 / Nemo: no window, and Nemo's head_dim 128 with hidden 5120 and 32 heads
  json nemo = mistral_json();
  nemo["sliding_window"] = nullptr;
  nemo["hidden_size"] = 5120;
  nemo["head_dim"] = 128;
  ModelConfig n = config_from_json(nemo, "cfg.json");
  EXPECT_EQ(n.attention_window(0), 0);
  EXPECT_EQ(n.head_dim, 128);
  json bad = mistral_json();
  bad["sliding_window"] = 0;
  EXPECT_NE(error_of(bad).find("key 'sliding_window'"), std::string::npos) << error_of(bad);
  bad = mistral_json();
  bad["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(error_of(bad).find("MistralForCausalLM"), std::string::npos) << error_of(bad);
}

TEST(IoConfig, ParsesQwen2) {
  ModelConfig c = config_from_json(qwen2_json(), "cfg.json");
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.attention_bias);  // no o_proj bias
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.attention_window(0), 0);       // use_sliding_window false
  EXPECT_EQ(c.num_parameters(), 494032768);  // Qwen2.5-0.5B
  const ModelLayout layout = make_layout(c);
  EXPECT_EQ(layout.total_numel(), c.num_parameters());
  int biases = 0;
  for (const auto& t : layout.groups[1].tensors) biases += t.name.size() > 5 && t.name.ends_with(".bias");
  EXPECT_EQ(biases, 3);
  json swa = qwen2_json();
  swa["use_sliding_window"] = true;
  EXPECT_NE(error_of(swa).find("key 'use_sliding_window'"), std::string::npos) << error_of(swa);
  json unknown = qwen2_json();
  unknown["model_type"] = "qwen2_moe";
  EXPECT_NE(error_of(unknown).find("\"mistral\", \"qwen2\""), std::string::npos) << error_of(unknown);
}

// OLMo-2-1124-7B and Granite-3.1-8B as published (examples/configs/): the parameter counts are
// transformers' (the models built on the meta device from these files)
ModelConfig example_config(const char* name) {
  return load_config_file(std::string(RP_SOURCE_DIR) + "/examples/configs/" + name + ".json");
}

TEST(IoConfig, ParsesOlmo2) {
  const ModelConfig c = example_config("olmo-2-1124-7b");
  EXPECT_EQ(c.architecture, "olmo2");
  EXPECT_TRUE(c.qk_norm && c.qk_norm_whole && c.post_norms);
  EXPECT_EQ(c.num_parameters(), 7298617344);
  const ModelLayout layout = make_layout(c);
  EXPECT_EQ(layout.total_numel(), c.num_parameters());
  const ParamGroup& g = layout.groups[1];
  EXPECT_LT(g.find("model.layers.0.input_layernorm.weight"), 0);  // no pre-norm
  ASSERT_GE(g.find("model.layers.0.post_feedforward_layernorm.weight"), 0);
  ASSERT_GE(g.find("model.layers.0.self_attn.q_norm.weight"), 0);
  EXPECT_EQ(g.tensors[size_t(g.find("model.layers.0.self_attn.q_norm.weight"))].shape,
            std::vector<int64_t>{4096});
  json j = json::parse(std::ifstream(std::string(RP_SOURCE_DIR) + "/examples/configs/olmo-2-1124-7b.json"));
  j["attention_bias"] = true;  // OLMo 2's optional biases are not supported
  EXPECT_NE(error_of(j).find("key 'attention_bias'"), std::string::npos) << error_of(j);
  ModelConfig v = c;  // the family's fields stay with their family
  v.architecture = "llama";
  EXPECT_THROW(v.validate(), std::invalid_argument);
}

TEST(IoConfig, ParsesGranite) {
  const ModelConfig c = example_config("granite-3.1-8b");
  EXPECT_EQ(c.architecture, "granite");
  EXPECT_FALSE(c.qk_norm || c.post_norms);
  EXPECT_EQ(c.embedding_multiplier, 12.0);
  EXPECT_EQ(c.residual_multiplier, 0.22);
  EXPECT_EQ(c.attention_scale(), 0.0078125f);
  EXPECT_EQ(c.logits_scaling, 16.0);
  EXPECT_EQ(c.num_parameters(), 8170848256);
  EXPECT_EQ(make_layout(c).total_numel(), c.num_parameters());
  json j = json::parse(std::ifstream(std::string(RP_SOURCE_DIR) + "/examples/configs/granite-3.1-8b.json"));
  j["logits_scaling"] = 0;
  EXPECT_EQ(error_of(j), "cfg.json: key 'logits_scaling': expected a positive number, got number 0");
  j = json::parse(std::ifstream(std::string(RP_SOURCE_DIR) + "/examples/configs/granite-3.1-8b.json"));
  j["mlp_bias"] = true;
  EXPECT_NE(error_of(j).find("key 'mlp_bias'"), std::string::npos) << error_of(j);
  ModelConfig v = config_from_json(llama_json(), "x");
  v.residual_multiplier = 0.5;  // a LLaMA has no multipliers
  EXPECT_THROW(v.validate(), std::invalid_argument);
  EXPECT_EQ(v.attention_scale(), float(1.0 / 8.0));  // 1/sqrt(64) without attention_multiplier
}

TEST(IoConfig, RopeScalingVariants) {
  json j = llama_json();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["eos_token_id"] = {2, 1, 0};
  ModelConfig c = config_from_json(j, "cfg.json");
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_id, 2);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(config_from_json(j, "x").rope_scaling.type, "linear");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  c = config_from_json(j, "x");
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling.attention_factor, 0.0);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(config_from_json(j, "x").rope_scaling.type, "default");
  // transformers 5 layout
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 3.0}, {"rope_theta", 500000.0}};
  c = config_from_json(j, "x");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.factor, 3.0);
}

TEST(IoConfig, ErrorsNameFileAndKey) {
  auto expect = [](json j, const std::string& want) {
    std::string e = error_of(j);
    EXPECT_EQ(e.rfind("cfg.json: key '", 0), 0u) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  json j = llama_json();
  j["model_type"] = "falcon";
  expect(
      j,
      "key 'model_type': expected \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"qwen3_moe\", \"gpt_oss\", "
      "\"olmo2\", \"granite\", \"phi3\", \"gemma2\" or \"gemma3_text\", got string \"falcon\"");
  j = llama_json();
  j.erase("hidden_size");
  expect(j, "key 'hidden_size': expected an integer >= 1, got nothing");
  j = llama_json();
  j["hidden_size"] = "576";
  expect(j, "key 'hidden_size': expected an integer >= 1, got string \"576\"");
  j = llama_json();
  j["num_key_value_heads"] = 4;
  expect(j, "key 'num_key_value_heads'");
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  expect(j, "key 'rope_scaling.rope_type'");
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect(j, "key 'rope_scaling.original_max_position_embeddings'");
  // a missing key is named as missing (it used to read "got null null")
  expect(
      j,
      "key 'rope_scaling.original_max_position_embeddings': expected an integer >= 1 (rope_type llama3 needs "
      "it), got nothing");
  EXPECT_EQ(error_of(j).find("null null"), std::string::npos) << error_of(j);
  j = llama_json();
  j.erase("rope_scaling");
  j["rope_parameters"] = {
      {"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", nullptr}};
  expect(j,
         "key 'rope_parameters.original_max_position_embeddings': expected an integer >= 1 (rope_type llama3 "
         "needs it), got nothing");
  j["rope_parameters"] = {{"rope_type", "llama3"}};
  expect(j,
         "key 'rope_parameters.factor': expected a positive number (rope_type llama3 needs it), got nothing");
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "linear"}};
  expect(j, "key 'rope_scaling.factor'");
  j = llama_json();
  j["rope_scaling"] = 3;
  expect(j, "key 'rope_scaling': expected null or an object, got number 3");
  j = llama_json();
  j["attention_bias"] = true;
  expect(j, "key 'attention_bias'");
  j = llama_json();
  j["hidden_act"] = "gelu";
  expect(j, "key 'hidden_act'");
  j = llama_json();
  j["architectures"] = {"MistralForCausalLM"};
  expect(j, "key 'architectures'");
  j = llama_json();
  j["rms_norm_eps"] = -1;
  expect(j, "key 'rms_norm_eps'");
  j = llama_json();
  j["tie_word_embeddings"] = "yes";
  expect(j, "key 'tie_word_embeddings'");
  j = llama_json();
  j["eos_token_id"] = 49152;
  expect(j, "key 'eos_token_id'");
  EXPECT_THROW(config_from_json(json::array(), "cfg.json"), std::runtime_error);
}

TEST(IoConfig, ValidateThrowsInvalidArgument) {
  ModelConfig c = config_from_json(llama_json(), "x");
  c.num_key_value_heads = 2;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = config_from_json(llama_json(), "x");
  c.rope_scaling.type = "dynamic";
  try {
    c.validate();
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("rope_scaling.rope_type: ", 0), 0u) << e.what();
  }
}

TEST(IoConfig, JsonRoundTrip) {
  const std::string ex = std::string(RP_SOURCE_DIR) + "/examples/configs/";
  for (json src : {llama_json(), qwen3_json(), mistral_json(), qwen2_json(),
                   json::parse(std::ifstream(ex + "olmo-2-1124-7b.json")),
                   json::parse(std::ifstream(ex + "granite-3.1-8b.json"))}) {
    ModelConfig c = config_from_json(src, "x");
    c.rope_scaling = {"yarn", 4.0, 1.0, 4.0, 32768, 32.0, 1.0, 0.0};
    json out = config_to_json(c);
    EXPECT_EQ(out["hidden_act"], "silu");
    EXPECT_EQ(out["architectures"][0], src["architectures"][0]);
    EXPECT_TRUE(out.contains("torch_dtype"));
    ModelConfig back = config_from_json(out, "out");
    EXPECT_EQ(back.architecture, c.architecture);
    EXPECT_EQ(back.head_dim, c.head_dim);
    EXPECT_EQ(back.num_key_value_heads, c.num_key_value_heads);
    EXPECT_EQ(back.rope_scaling.type, "yarn");
    EXPECT_EQ(back.rope_scaling.original_max_position_embeddings, 32768);
    EXPECT_EQ(back.num_parameters(), c.num_parameters());
    EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(back.bos_token_id, c.bos_token_id);
    EXPECT_EQ(back.qkv_bias, c.qkv_bias);
    EXPECT_EQ(back.attention_window(0), c.attention_window(0));
    EXPECT_EQ(back.post_norms, c.post_norms);
    EXPECT_EQ(back.qk_norm_whole, c.qk_norm_whole);
    EXPECT_EQ(back.embedding_multiplier, c.embedding_multiplier);
    EXPECT_EQ(back.residual_multiplier, c.residual_multiplier);
    EXPECT_EQ(back.attention_scale(), c.attention_scale());
    EXPECT_EQ(back.logits_scaling, c.logits_scaling);
  }
}

TEST(IoConfig, LoadConfigFile) {
  test::TempDir dir("cfg");
  {
    std::ofstream o(dir / "config.json");
    o << qwen3_json().dump();
  }
  EXPECT_EQ(load_config_file(dir / "config.json").architecture, "qwen3");
  {
    std::ofstream o(dir / "broken.json");
    o << "{\"model_type\": ";
  }
  try {
    load_config_file(dir / "broken.json");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir / "broken.json:1:16: invalid JSON", 0), 0u) << e.what();
  }
  EXPECT_THROW(load_config_file(dir / "missing.json"), std::runtime_error);
}

}  // namespace
}  // namespace rp
