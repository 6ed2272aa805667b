// The config.json keys of the families that extend LLaMA's decoder with their own knobs:
// OLMo 2 (transformers' Olmo2Config), Granite (GraniteConfig) and Phi-3 (Phi3Config: its window
// is Mistral's, read by config_from_json). See roundpipe/model.hpp.
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "model/config_keys.hpp"

namespace rp {

float ModelConfig::attention_scale() const {
  return attention_multiplier > 0 ? float(attention_multiplier) : float(1.0 / std::sqrt(double(head_dim)));
}

namespace config_families {

using config_keys::get_num;
using nlohmann::json;

void parse_family_keys(const json& j, const std::string& where, ModelConfig& c) {
  if (c.architecture == "olmo2") {  // q/k norms over the whole q and k, norms after each branch
    c.qk_norm = c.qk_norm_whole = c.post_norms = true;
  } else if (c.architecture == "granite") {
    c.embedding_multiplier = get_num(j, "embedding_multiplier", where, 1.0, true);
    c.residual_multiplier = get_num(j, "residual_multiplier", where, 1.0, true);
    c.attention_multiplier = get_num(j, "attention_multiplier", where, 1.0, true);
    c.logits_scaling = get_num(j, "logits_scaling", where, 1.0, true);
  }
  // RoPE on part of each head (Phi-4-mini's 0.75, in rope_parameters with transformers 5)
  const json rp = config_keys::val(j, "rope_parameters");
  for (const json* o : {&j, &rp}) {
    if (!o->is_object()) continue;
    const std::string key = o == &j ? "partial_rotary_factor" : "rope_parameters.partial_rotary_factor";
    if (get_num(*o, "partial_rotary_factor", where, 1.0, true) != 1.0)
      config_keys::bad(where, key, "1.0 (partial rotary embeddings are not supported)",
                       config_keys::val(*o, "partial_rotary_factor"));
  }
}

void family_keys_to_json(const ModelConfig& c, json& j) {
  if (c.architecture != "granite") return;
  j["embedding_multiplier"] = c.embedding_multiplier;
  j["residual_multiplier"] = c.residual_multiplier;
  j["attention_multiplier"] = c.attention_scale();
  j["logits_scaling"] = c.logits_scaling;
  j["mlp_bias"] = false;
}

void validate_family_keys(const ModelConfig& c) {
  auto fail = [](const std::string& key, const std::string& what) {
    throw std::invalid_argument(fmt::format("{}: {}", key, what));
  };
  const bool olmo2 = c.architecture == "olmo2", granite = c.architecture == "granite";
  if (c.post_norms != olmo2) fail("post_norms", "OLMo 2 (model_type olmo2) and only it has post-norms");
  if (c.qk_norm_whole != olmo2)
    fail("qk_norm_whole", "OLMo 2 (model_type olmo2) and only it normalizes whole q/k");
  if (olmo2 && !c.qk_norm) fail("qk_norm", "OLMo 2 has q/k norms");
  if ((c.post_norms || c.qk_norm_whole) && c.num_experts > 0) fail("num_experts", "OLMo 2 is dense");
  const std::pair<const char*, double> mult[] = {{"embedding_multiplier", c.embedding_multiplier},
                                                 {"residual_multiplier", c.residual_multiplier},
                                                 {"logits_scaling", c.logits_scaling}};
  for (auto [key, v] : mult) {
    if (!(v > 0) || !std::isfinite(v)) fail(key, fmt::format("must be a finite number > 0, got {}", v));
    if (!granite && v != 1.0) fail(key, "only Granite (model_type granite) has it (1 elsewhere)");
  }
  if (!(c.attention_multiplier >= 0) || !std::isfinite(c.attention_multiplier))
    fail("attention_multiplier", fmt::format("must be a finite number > 0, got {}", c.attention_multiplier));
  if (!granite && c.attention_multiplier != 0)
    fail("attention_multiplier", "only Granite (model_type granite) has it (0: 1/sqrt(head_dim) elsewhere)");
}

}  // namespace config_families
}  // namespace rp
