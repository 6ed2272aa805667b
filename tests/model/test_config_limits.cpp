// config.json values the kernels cannot carry and the one-line refusals that name them: RoPE
// scaling numbers outside float32 (or not positive where only a positive one means anything),
// a number JSON cannot hold as a double (1e400), and a phi3 RoPE type under the key it was
// actually given as (transformers 5's rope_parameters); a rule broken reads as the rule (not
// "expected must ..."), under the key the file spells, and an overflowing product of sizes names
// the size that is out of range.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "tests/formats/test_io_util.hpp"

namespace rp {
namespace {

using nlohmann::json;

json llama_json() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05, "rope_theta": 10000, "max_position_embeddings": 256,
    "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2})");
}

// LongRoPE on 4 heads of 16: 8 factors per list
json phi3_longrope_json() {
  json j = json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rope_theta": 10000.0, "max_position_embeddings": 64,
    "original_max_position_embeddings": 16})");
  j["rope_scaling"] = {{"type", "longrope"},
                       {"factor", 2.0},
                       {"short_factor", std::vector<double>(8, 1.0)},
                       {"long_factor", std::vector<double>(8, 2.0)}};
  return j;
}

std::string error_of(const json& j) {
  try {
    config_from_json(j, "cfg.json");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// one line, naming the file first and then the key
void expect_refused(const json& j, const std::string& key, const std::string& what) {
  const std::string e = error_of(j);
  EXPECT_EQ(e.rfind("cfg.json: key '" + key + "'", 0), 0u) << what << ": " << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << what << ": " << e;
}

TEST(ConfigLimits, RopeScalingNumbersFloat32CannotCarryAreRefused) {
  // YaRN's attention_factor multiplies the cos/sin tables (float32): 1e300 became inf there
  for (double af : {1e300, 1e39, -1.0, 0.0, 1e-300}) {
    json j = llama_json();
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", 4.0},
                         {"original_max_position_embeddings", 64},
                         {"attention_factor", af}};
    expect_refused(j, "rope_scaling.attention_factor", "yarn attention_factor " + json(af).dump());
    json p = llama_json();  // the same under transformers 5's key
    p["rope_parameters"] = j["rope_scaling"];
    expect_refused(p, "rope_parameters.attention_factor", "rope_parameters " + json(af).dump());
  }
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"rope_type", "linear"}, {"factor", 1e300}}, "factor"},
      {{{"rope_type", "linear"}, {"factor", 1e-300}}, "factor"},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1e300}}, "beta_fast"},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_slow", 1e-300}}, "beta_slow"},
      {{{"rope_type", "llama3"},
        {"factor", 8.0},
        {"low_freq_factor", 1.0},
        {"high_freq_factor", 1e300},
        {"original_max_position_embeddings", 64}},
       "high_freq_factor"},
  };
  for (const auto& [rs, key] : bad) {
    json j = llama_json();
    j["rope_scaling"] = rs;
    expect_refused(j, "rope_scaling." + key, rs.dump());
  }
  // LongRoPE: its attention_factor and every entry of its factor lists
  json j = phi3_longrope_json();
  ASSERT_EQ(error_of(j), "(no error)");
  j["rope_scaling"]["attention_factor"] = 1e300;
  expect_refused(j, "rope_scaling.attention_factor", "longrope attention_factor 1e300");
  j = phi3_longrope_json();
  j["rope_scaling"]["long_factor"][2] = 1e300;
  expect_refused(j, "rope_scaling.long_factor[2]", "long_factor entry 1e300");
  j = phi3_longrope_json();
  j["rope_scaling"]["short_factor"][0] = 1e-300;
  expect_refused(j, "rope_scaling.short_factor[0]", "short_factor entry 1e-300");
  // what float32 carries still loads, and an absent attention_factor is still derived (0)
  j = llama_json();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}};
  EXPECT_EQ(config_from_json(j, "cfg.json").rope_scaling.attention_factor, 1.5);
  j["rope_scaling"].erase("attention_factor");
  EXPECT_EQ(config_from_json(j, "cfg.json").rope_scaling.attention_factor, 0.0);
}

// 1e400 overflows a double: the JSON reader refuses it, and the refusal names the file and the key
TEST(ConfigLimits, ANumberBeyondADoubleNamesTheFileAndTheKey) {
  test::TempDir dir("cfg_limits");
  const std::string path = dir / "config.json";
  std::string text = llama_json().dump();
  text.replace(text.find("\"rms_norm_eps\":1e-05"), std::string("\"rms_norm_eps\":1e-05").size(),
               "\"rms_norm_eps\":1e400");
  std::ofstream(path) << text;
  try {
    load_config_file(path);
    ADD_FAILURE() << "1e400 was accepted";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(path + ":1: key 'rms_norm_eps'", 0), 0u) << m;
    EXPECT_NE(m.find("1e400"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // inside an object and inside a list: the key path down to it
  json j = phi3_longrope_json();
  text = j.dump();
  const std::string at = "\"long_factor\":[";
  text.insert(text.find(at) + at.size(), "-1e999,");
  std::ofstream(path, std::ios::trunc) << text;
  try {
    load_config_file(path);
    ADD_FAILURE() << "-1e999 was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ":1: key 'rope_scaling.long_factor[0]'", 0), 0u) << e.what();
  }
  // the other JSON errors still name the file
  std::ofstream(path, std::ios::trunc) << "{\"model_type\": ";
  try {
    load_config_file(path);
    ADD_FAILURE() << "broken JSON was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ":1:16: invalid JSON", 0), 0u) << e.what();
  }
}

// Phi3Config accepts "default" and "longrope" only; the refusal names the key the file used
TEST(ConfigLimits, Phi3RopeTypeIsNamedUnderTheKeyGiven) {
  json j = phi3_longrope_json();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_NE(
      error_of(j).find("cfg.json: key 'rope_scaling.rope_type': expected \"default\" or \"longrope\" for "
                       "phi3, got \"linear\""),
      std::string::npos)
      << error_of(j);
  j = phi3_longrope_json();
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  EXPECT_EQ(
      error_of(j).rfind("cfg.json: key 'rope_parameters.rope_type': expected \"default\" or \"longrope\" "
                        "for phi3, got \"linear\"",
                        0),
      0u)
      << error_of(j);
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 16}};
  EXPECT_EQ(error_of(j).rfind("cfg.json: key 'rope_parameters.rope_type'", 0), 0u) << error_of(j);
}

TEST(ConfigLimits, BrokenRulesReadAsRulesUnderTheKeyTheFileSpells) {
  json j = llama_json();
  j["model_type"] = "qwen3_moe";
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["num_local_experts"] = int64_t(1) << 40;  // Mixtral's spelling of the expert count
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  EXPECT_EQ(error_of(j), "cfg.json: key 'num_local_experts': must be <= 2^20, got 1099511627776");
  j = llama_json();
  j["vocab_size"] = int64_t(1) << 50;
  const std::string e = error_of(j);
  EXPECT_EQ(e.rfind("cfg.json: key 'vocab_size': expected sizes whose parameter count fits 2^48", 0), 0u)
      << e;
  j = llama_json();
  j["num_hidden_layers"] = int64_t(1) << 36;
  expect_refused(j, "num_hidden_layers", "2^36 layers");
  j = llama_json();
  j["rope_theta"] = -1;
  const std::string r = error_of(j);
  EXPECT_EQ(r.find("expected must"), std::string::npos) << r;
}

}  // namespace
}  // namespace rp
