// Readers of single config.json keys (defined in model/config_keys.cpp), shared by model/config.cpp and the
// per-family parsers (model/config_families.cpp). Each throws std::runtime_error
// "<where>: key '<key>': expected <...>, got <type> <value>" on a bad value.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "roundpipe/model.hpp"

namespace rp::config_keys {

/// j[key], or null when absent.
nlohmann::json val(const nlohmann::json& j, const std::string& key);
/// The one-line refusal of `got` at `key`.
[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& expected,
                      const nlohmann::json& got);
/// A required key that is absent (or null); `why` follows the expectation.
[[noreturn]] void missing(const std::string& where, const std::string& key, const std::string& expected,
                          const std::string& why);
/// An integer >= min_value; absent/null: `def`, or a refusal when `required`.
int64_t get_int(const nlohmann::json& j, const std::string& key, const std::string& where, bool required,
                int64_t def, int64_t min_value);
/// A finite number (> 0 when `positive`); absent/null: `def`.
double get_num(const nlohmann::json& j, const std::string& key, const std::string& where, double def,
               bool positive);
/// `v` as a positive number float32 holds (1.2e-38 to 3.4e38): the refusal of `key` otherwise.
double float32_value(const nlohmann::json& v, const std::string& key, const std::string& where);
/// A positive number float32 holds; absent/null: `def`.
double get_float32(const nlohmann::json& j, const std::string& key, const std::string& where, double def);
/// true or false; absent/null: `def`.
bool get_bool(const nlohmann::json& j, const std::string& key, const std::string& where, bool def);
/// A token id: an integer >= 0, a list of them (the first is used) or null (-1).
int64_t get_token_id(const nlohmann::json& j, const std::string& key, const std::string& where);

/// The size key of `c` furthest beyond what a model of today has (its value over a generous
/// ceiling): the one to name when the product of the sizes overflows.
const char* largest_size_key(const ModelConfig& c);

}  // namespace rp::config_keys

namespace rp::config_families {

/// The keys only OLMo 2 ("olmo2"), Granite ("granite"), Phi-3 ("phi3") and Gemma ("gemma2",
/// "gemma3_text") have, read into `c`
/// after the common ones (model/config_families.cpp); nothing for the other families.
void parse_family_keys(const nlohmann::json& j, const std::string& where, ModelConfig& c);
/// Those keys of `c` written into a config.json object `j` (config_to_json).
void family_keys_to_json(const ModelConfig& c, nlohmann::json& j);
/// ModelConfig::validate's share: std::invalid_argument("<key>: <what>") when a family's field
/// is set on another family or out of range.
void validate_family_keys(const ModelConfig& c);
/// rope_type "longrope" of rope_scaling / rope_parameters object `r` (`key` names it) into `rs`:
/// short_factor and long_factor (required: `rotary_dim`/2 positive finite numbers each),
/// factor, attention_factor (optional, > 0; absent: 0, derived) and
/// original_max_position_embeddings (optional; see longrope_original_context).
void parse_longrope(const nlohmann::json& r, const std::string& key, const std::string& where,
                    int64_t rotary_dim, RopeScaling& rs);
/// LongRoPE's pre-training context as transformers 5 settles it (standardize_rope_params):
/// config.json's top-level original_max_position_embeddings wins, then Phi3Config's default
/// 4096 (model_type phi3), then rope_scaling's own, then max_position_embeddings.
void longrope_original_context(const nlohmann::json& j, const std::string& where, ModelConfig& c);

}  // namespace rp::config_families
