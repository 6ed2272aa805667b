// The config.json keys of the families that extend LLaMA's decoder with their own knobs:
// OLMo 2 (transformers' Olmo2Config), Granite (GraniteConfig) and Phi-3 (Phi3Config: its window
// is Mistral's, read by config_from_json), Gemma 2 and Gemma 3 text (Gemma2Config,
// Gemma3TextConfig: the window and layer_types are read by config_from_json; Gemma 2's logit
// soft-capping), and LongRoPE's keys (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini; transformers'
// _compute_longrope_parameters and Phi3Config). See roundpipe/model.hpp.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "model/config_keys.hpp"

namespace rp {

float ModelConfig::attention_scale() const {
  if (attention_multiplier > 0) return float(attention_multiplier);
  return float(1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : double(head_dim)));
}

double ModelConfig::embedding_scale() const {
  return gemma() ? std::sqrt(double(hidden_size)) : embedding_multiplier;
}

namespace config_families {

using config_keys::bad;
using config_keys::get_num;
using config_keys::val;
using nlohmann::json;

namespace {

// A soft-capping key: a number > 0, null (0: none), or `def` when absent (Gemma2Config's 50 / 30).
double softcap_key(const json& j, const char* key, const std::string& where, double def) {
  auto it = j.find(key);
  if (it == j.end()) return def;
  if (it->is_null()) return 0.0;
  const double v = get_num(j, key, where, 0.0, true);
  // the kernels take the cap as a float32 and divide by it: a cap float32 cannot hold (or whose
  // reciprocal it cannot) would overflow or vanish there
  if (!(v >= double(std::numeric_limits<float>::min()) && v <= 1e30))
    bad(where, key, "a positive number between 1.2e-38 and 1e30 (float32)", *it);
  return v;
}

// LongRoPE's settings of a config built in code (config.json's are checked as they are read).
void validate_longrope(const ModelConfig& c) {
  auto fail = [](const std::string& key, const std::string& what) {
    throw std::invalid_argument(fmt::format("{}: {}", key, what));
  };
  const RopeScaling& rs = c.rope_scaling;
  const size_t half = size_t(c.rotary_dim() / 2);
  for (auto [key, f] : {std::pair{"rope_scaling.short_factor", &rs.short_factor},
                        std::pair{"rope_scaling.long_factor", &rs.long_factor}}) {
    bool ok = f->size() == half;
    for (double v : *f) ok = ok && v > 0 && std::isfinite(v);
    if (!ok)
      fail(key, fmt::format("a list of rotary_dim/2 = {} positive finite numbers, got {} numbers", half,
                            f->size()));
  }
  if (rs.original_max_position_embeddings <= 0)
    fail("original_max_position_embeddings", "must be > 0 for longrope");
  const double orig = double(rs.original_max_position_embeddings);
  const double factor = rs.factor > 0 ? rs.factor : double(c.max_position_embeddings) / orig;
  if (rs.attention_factor == 0 && factor > 1 && orig < 2)  // transformers divides by ln(1) there
    fail("original_max_position_embeddings",
         "must be > 1 for longrope when attention_factor is derived (it divides by its logarithm)");
  if (!(rs.factor >= 0) || !std::isfinite(rs.factor))
    fail("rope_scaling.factor", fmt::format("must be > 0 (0: derived) for longrope, got {}", rs.factor));
  if (!(rs.attention_factor >= 0) || !std::isfinite(rs.attention_factor))
    fail("rope_scaling.attention_factor",
         fmt::format("must be > 0 (0: derived) for longrope, got {}", rs.attention_factor));
}

// Gemma 2 / Gemma 3 text: what differs from LLaMA's keys; the settings roundpipe does not run
// (bidirectional attention, another activation; Gemma 3's attn_logit_softcapping, which
// transformers' Gemma3 attention does not apply) are refused, not ignored.
void parse_gemma(const json& j, const std::string& where, ModelConfig& c) {
  const bool g2 = c.architecture == "gemma2";
  for (const char* k : {"hidden_activation", "hidden_act"}) {
    const json a = val(j, k);
    if (!a.is_null() && a != "gelu_pytorch_tanh") bad(where, k, "\"gelu_pytorch_tanh\"", a);
  }
  c.query_pre_attn_scalar = get_num(j, "query_pre_attn_scalar", where, 256.0, true);
  // Gemma2Config's defaults are 50 and 30 (absent means soft-capping there); Gemma3TextConfig's
  // are null, and its attention never soft-caps (only the final logits do)
  c.final_logit_softcapping = softcap_key(j, "final_logit_softcapping", where, g2 ? 30.0 : 0.0);
  if (g2) {
    c.attn_logit_softcapping = softcap_key(j, "attn_logit_softcapping", where, 50.0);
  } else if (!val(j, "attn_logit_softcapping").is_null()) {
    bad(where, "attn_logit_softcapping", "null (Gemma 3's attention does not soft-cap its scores)",
        val(j, "attn_logit_softcapping"));
  }
  if (config_keys::get_bool(j, "use_bidirectional_attention", where, false))
    bad(where, "use_bidirectional_attention", "false or null (causal attention)",
        val(j, "use_bidirectional_attention"));
  if (!g2) {  // q/k norms per head; the sliding layers' own RoPE base (a per-type rope_parameters wins)
    c.qk_norm = true;
    c.rope_local_theta = get_num(j, "rope_local_base_freq", where, 10000.0, true);
  }
}

}  // namespace

void parse_family_keys(const json& j, const std::string& where, ModelConfig& c) {
  if (c.gemma()) {
    parse_gemma(j, where, c);
  } else if (c.architecture == "olmo2") {  // q/k norms over the whole q and k, norms after each branch
    c.qk_norm = c.qk_norm_whole = c.post_norms = true;
  } else if (c.architecture == "granite") {
    c.embedding_multiplier = get_num(j, "embedding_multiplier", where, 1.0, true);
    c.residual_multiplier = get_num(j, "residual_multiplier", where, 1.0, true);
    c.attention_multiplier = get_num(j, "attention_multiplier", where, 1.0, true);
    c.logits_scaling = get_num(j, "logits_scaling", where, 1.0, true);
  }
  // RoPE on part of each head (Phi-4-mini's 0.75, in rope_parameters with transformers 5,
  // which wins as it does there); only Phi-3's attention slices q/k for it
  const json rp = config_keys::val(j, "rope_parameters");
  for (const json* o : {&j, &rp}) {
    if (!o->is_object()) continue;
    const std::string key = o == &j ? "partial_rotary_factor" : "rope_parameters.partial_rotary_factor";
    const double f = get_num(*o, "partial_rotary_factor", where, c.partial_rotary_factor, true);
    const int64_t R = int64_t(double(c.head_dim) * f);
    if (f != 1.0 && c.architecture != "phi3")
      config_keys::bad(where, key, "1.0 (partial rotary embeddings: model_type phi3 only)",
                       config_keys::val(*o, "partial_rotary_factor"));
    if (!(f > 0 && f <= 1) || R <= 0 || R % 2 != 0)
      config_keys::bad(where, key, "a number in (0, 1] making int(head_dim * it) even and > 0",
                       config_keys::val(*o, "partial_rotary_factor"));
    c.partial_rotary_factor = f;
  }
}

void family_keys_to_json(const ModelConfig& c, json& j) {
  if (const RopeScaling& r = c.rope_scaling; r.type == "longrope") {
    json rs = {{"rope_type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
    if (r.factor > 0) rs["factor"] = r.factor;
    if (r.attention_factor > 0) rs["attention_factor"] = r.attention_factor;
    rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
    j["rope_scaling"] = rs;
    // where transformers reads it first (Phi3Config's own default, 4096, would win otherwise)
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  }
  if (c.gemma()) {
    j.erase("hidden_act");
    j.erase("mlp_bias");
    j.erase("pretraining_tp");
    j["hidden_activation"] = "gelu_pytorch_tanh";
    // an integer in transformers' configs (its typed config refuses 256.0)
    const double q = c.query_pre_attn_scalar;
    j["query_pre_attn_scalar"] = q == std::floor(q) && q < 1e15 ? json(int64_t(q)) : json(q);
    auto cap = [](double v) { return v > 0 ? json(v) : json(); };  // 0: null (none)
    j["attn_logit_softcapping"] = cap(c.attn_logit_softcapping);
    j["final_logit_softcapping"] = cap(c.final_logit_softcapping);
    j["sliding_window"] = c.sliding_window;
    j["layer_types"] = c.layer_types;
    if (c.architecture == "gemma3_text") {  // transformers 5's RoPE per layer type
      json full = j["rope_scaling"].is_null() ? json{{"rope_type", "default"}} : j["rope_scaling"];
      full["rope_theta"] = c.rope_theta;
      j["rope_parameters"] = {
          {"full_attention", full},
          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", c.rope_local_theta}}}};
      j.erase("rope_scaling");
      j.erase("rope_theta");
    }
    return;
  }
  if (c.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = c.partial_rotary_factor;
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
  const int64_t R = c.rotary_dim();
  // transformers' Phi3Config refuses the other types (and reads "su" and "yarn" as longrope)
  if (c.architecture == "phi3" && c.rope_scaling.type != "default" && c.rope_scaling.type != "longrope")
    fail("rope_scaling.rope_type",
         fmt::format("\"default\" or \"longrope\" for phi3, got \"{}\"", c.rope_scaling.type));
  if (c.rope_scaling.type == "longrope") validate_longrope(c);
  if (c.partial_rotary_factor != 1.0 && c.architecture != "phi3")
    fail("partial_rotary_factor", "1 unless model_type phi3 (partial rotary embeddings)");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1) || R <= 0 || R % 2 != 0)
    fail("partial_rotary_factor",
         fmt::format("must be in (0, 1] with int(head_dim * it) even and > 0, got {}",
                     c.partial_rotary_factor));
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
  const bool gemma3 = c.architecture == "gemma3_text";
  if (c.gemma() ? !(c.query_pre_attn_scalar > 0) || !std::isfinite(c.query_pre_attn_scalar)
                : c.query_pre_attn_scalar != 0)
    fail("query_pre_attn_scalar",
         "Gemma (model_type gemma2, gemma3_text) and only it has it, a finite number > 0");
  if (gemma3 ? !(c.rope_local_theta > 0) || !std::isfinite(c.rope_local_theta) : c.rope_local_theta != 0)
    fail("rope_local_base_freq", "Gemma 3 (model_type gemma3_text) and only it has it, a finite number > 0");
  if (c.gemma() && c.qk_norm != gemma3) fail("qk_norm", "Gemma 3 has q/k norms per head, Gemma 2 none");
  if (c.gemma() && c.num_experts > 0) fail("num_experts", "Gemma is dense");
  const std::pair<const char*, double> caps[] = {{"attn_logit_softcapping", c.attn_logit_softcapping},
                                                 {"final_logit_softcapping", c.final_logit_softcapping}};
  for (auto [key, v] : caps) {
    if (!(v >= 0) || !std::isfinite(v))
      fail(key, fmt::format("must be 0 (none) or a finite number > 0, got {}", v));
    const bool allowed =
        std::string(key) == "attn_logit_softcapping" ? c.architecture == "gemma2" : c.gemma();
    if (v != 0 && !allowed)
      fail(key, std::string(key) == "attn_logit_softcapping"
                    ? "only Gemma 2 (model_type gemma2) soft-caps attention scores (0 elsewhere)"
                    : "only Gemma (model_type gemma2, gemma3_text) soft-caps the final logits (0 elsewhere)");
  }
}

void parse_longrope(const json& r, const std::string& key, const std::string& where, int64_t rotary_dim,
                    RopeScaling& rs) {
  // the keys read with their object's name (rope_scaling.factor, rope_parameters.factor)
  json named;
  for (const char* k : {"factor", "attention_factor", "original_max_position_embeddings"})
    named[key + "." + k] = val(r, k);
  rs.factor = config_keys::get_float32(named, key + ".factor", where, 0.0);
  rs.attention_factor = config_keys::get_float32(named, key + ".attention_factor", where, 0.0);
  rs.original_max_position_embeddings =
      config_keys::get_int(named, key + ".original_max_position_embeddings", where, false, 0, 1);
  for (auto [name, f] :
       {std::pair{"short_factor", &rs.short_factor}, std::pair{"long_factor", &rs.long_factor}}) {
    const json v = val(r, name);
    const std::string k = key + "." + name,
                      expected =
                          fmt::format("a list of rotary_dim/2 = {} positive finite numbers", rotary_dim / 2);
    if (v.is_null()) config_keys::missing(where, k, expected, " (rope_type longrope needs it)");
    if (!v.is_array() || int64_t(v.size()) != rotary_dim / 2) bad(where, k, expected, v);
    for (const json& e : v) {
      if (!e.is_number() || !(e.get<double>() > 0) || !std::isfinite(e.get<double>()))
        bad(where, k, expected, v);
      // divisors of the inverse frequencies, stored as float32
      f->push_back(config_keys::float32_value(e, fmt::format("{}[{}]", k, f->size()), where));
    }
  }
}

void longrope_original_context(const json& j, const std::string& where, ModelConfig& c) {
  int64_t& orig = c.rope_scaling.original_max_position_embeddings;
  if (!val(j, "original_max_position_embeddings").is_null())
    orig = config_keys::get_int(j, "original_max_position_embeddings", where, true, 0, 1);
  else if (c.architecture == "phi3") orig = 4096;
  else if (orig == 0) orig = c.max_position_embeddings;
}

}  // namespace config_families
}  // namespace rp
