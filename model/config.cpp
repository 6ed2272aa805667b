#include "model/config.hpp"
#include "model/config_keys.hpp"

#include "base/host_resources.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rp {

using config_keys::bad;
using config_keys::get_bool;
using config_keys::get_int;
using config_keys::get_num;
using config_keys::get_token_id;
using config_keys::missing;
using config_keys::val;
using nlohmann::json;

namespace {

/// Parses a rope_scaling (legacy) or rope_parameters (transformers 5) object into `rs`; `c`:
/// the config read so far (model_type, the rotary dimension).
void parse_rope(const json& r, const std::string& key, const std::string& where, const ModelConfig& c,
                RopeScaling& rs) {
  if (!r.is_object()) bad(where, key, "null or an object", r);
  std::string type;
  for (const char* k : {"rope_type", "type"}) {
    auto it = r.find(k);
    if (it != r.end() && !it->is_null()) {
      if (!it->is_string()) bad(where, key + "." + k, "a string", *it);
      type = it->get<std::string>();
      break;
    }
  }
  if (type.empty()) type = "default";
  // transformers' Phi3Config reads the earlier names of LongRoPE ("su", "yarn") as longrope
  if (c.architecture == "phi3" && (type == "su" || type == "yarn")) type = "longrope";
  const std::string kt = key + ".rope_type";
  if (type != "default" && type != "linear" && type != "llama3" && type != "yarn" && type != "longrope")
    bad(where, kt, "one of \"default\", \"linear\", \"llama3\", \"yarn\", \"longrope\"", json(type));
  // transformers' Phi3Config refuses the other types (named under the key the file gave)
  if (c.architecture == "phi3" && type != "default" && type != "longrope")
    throw std::runtime_error(fmt::format(
        "{}: key '{}': expected \"default\" or \"longrope\" for phi3, got \"{}\"", where, kt, type));
  rs = RopeScaling{};
  rs.type = type;
  // every scaling number is positive and feeds float32 tables (absent: `def`)
  auto num = [&](const char* k, double def) {
    auto it = r.find(k);
    if (it == r.end() || it->is_null()) return def;
    return config_keys::float32_value(*it, key + "." + k, where);
  };
  auto integer = [&](const char* k, bool required) -> int64_t {
    auto it = r.find(k);
    if (it == r.end() || it->is_null()) {
      if (required)
        missing(where, key + "." + k, "an integer >= 1", fmt::format(" (rope_type {} needs it)", type));
      return 0;
    }
    if (!it->is_number() || it->get<double>() < 1 || it->get<double>() != std::floor(it->get<double>()))
      bad(where, key + "." + k, "an integer >= 1", *it);
    return int64_t(it->get<double>());
  };
  if (type == "default") return;
  if (type == "longrope") return config_families::parse_longrope(r, key, where, c.rotary_dim(), rs);
  auto fit = r.find("factor");
  if (fit == r.end() || fit->is_null())
    missing(where, key + ".factor", "a positive number", fmt::format(" (rope_type {} needs it)", type));
  rs.factor = num("factor", 1.0);
  if (type == "llama3") {
    rs.low_freq_factor = num("low_freq_factor", 1.0);
    rs.high_freq_factor = num("high_freq_factor", 4.0);
    rs.original_max_position_embeddings = integer("original_max_position_embeddings", true);
  } else if (type == "yarn") {
    rs.beta_fast = num("beta_fast", 32.0);
    rs.beta_slow = num("beta_slow", 1.0);
    // it scales the cos/sin tables: 0 (transformers takes it as given) would zero them
    rs.attention_factor = num("attention_factor", 0.0);
    rs.original_max_position_embeddings = integer("original_max_position_embeddings", false);
    if (auto t = r.find("truncate"); t != r.end() && !t->is_null()) {
      if (!t->is_boolean()) bad(where, key + ".truncate", "true or false", *t);
      rs.truncate = t->get<bool>();
    }
  }
}

// transformers 5's rope_parameters per layer type (Gemma 3): "full_attention" is rope_theta and
// rope_scaling, "sliding_attention" (default RoPE, no scaling) rope_local_theta.
void parse_rope_per_layer_type(const json& rp, const std::string& where, ModelConfig& c) {
  if (c.architecture != "gemma3_text")
    bad(where, "rope_parameters", "one RoPE (per layer type: Gemma 3 only)", rp);
  const json full = val(rp, "full_attention"), sliding = val(rp, "sliding_attention");
  parse_rope(full, "rope_parameters.full_attention", where, c, c.rope_scaling);
  c.rope_theta = get_num(full, "rope_theta", where, c.rope_theta, true);
  if (sliding.is_null()) return;
  RopeScaling local;
  parse_rope(sliding, "rope_parameters.sliding_attention", where, c, local);
  if (local.type != "default")
    bad(where, "rope_parameters.sliding_attention.rope_type", "\"default\"", json(local.type));
  c.rope_local_theta = get_num(sliding, "rope_theta", where, c.rope_local_theta, true);
}

// The sparse-block keys of a "qwen3_moe" config.json (transformers' Qwen3MoeConfig names).
void parse_moe(const json& j, const std::string& where, ModelConfig& c) {
  // transformers 5 writes num_local_experts, earlier releases and the published checkpoints
  // num_experts
  const char* ne =
      j.contains("num_experts") && !j["num_experts"].is_null() ? "num_experts" : "num_local_experts";
  c.num_experts = get_int(j, ne, where, true, 0, 1);
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", where, true, 0, 1);
  if (c.num_experts_per_tok > c.num_experts)
    bad(where, "num_experts_per_tok", fmt::format("an integer in [1, {} = {}]", ne, c.num_experts),
        val(j, "num_experts_per_tok"));
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", where, true, 0, 1);
  c.norm_topk_prob = get_bool(j, "norm_topk_prob", where, false);
  c.decoder_sparse_step = get_int(j, "decoder_sparse_step", where, false, 1, 1);
  if (auto m = j.find("mlp_only_layers"); m != j.end() && !m->is_null()) {
    if (!m->is_array()) bad(where, "mlp_only_layers", "a list of layer indices", *m);
    for (const auto& v : *m) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        bad(where, "mlp_only_layers", "a list of layer indices (integers >= 0)", *m);
      c.mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  c.router_aux_loss_coef = get_num(j, "router_aux_loss_coef", where, 0.001, false);
  if (c.router_aux_loss_coef < 0)
    bad(where, "router_aux_loss_coef", "a number >= 0", val(j, "router_aux_loss_coef"));
  c.output_router_logits = get_bool(j, "output_router_logits", where, false);
}

// The keys of a "gpt_oss" config.json (transformers' GptOssConfig names and defaults) but
// for the attention's, read by config_from_json. Every layer is sparse; intermediate_size is
// the experts' width.
void parse_gpt_oss(const json& j, const std::string& where, ModelConfig& c) {
  const char* ne = j.contains("num_local_experts") && !j["num_local_experts"].is_null() ? "num_local_experts"
                                                                                        : "num_experts";
  c.num_experts = get_int(j, ne, where, true, 0, 1);
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", where, true, 0, 1);
  if (c.num_experts_per_tok > c.num_experts)
    bad(where, "num_experts_per_tok", fmt::format("an integer in [1, {} = {}]", ne, c.num_experts),
        val(j, "num_experts_per_tok"));
  c.moe_intermediate_size = c.intermediate_size;
  c.norm_topk_prob = true;  // softmax over the top-k logits = renormalised top-k of softmax
  c.decoder_sparse_step = 1;
  c.router_aux_loss_coef = get_num(j, "router_aux_loss_coef", where, 0.001, false);
  if (c.router_aux_loss_coef < 0)
    bad(where, "router_aux_loss_coef", "a number >= 0", val(j, "router_aux_loss_coef"));
  c.output_router_logits = get_bool(j, "output_router_logits", where, false);
  c.swiglu_alpha = get_num(j, "swiglu_alpha", where, 1.702, true);
  c.swiglu_limit = get_num(j, "swiglu_limit", where, 7.0, true);
  c.attention_sinks = true;
  c.sliding_window = get_int(j, "sliding_window", where, false, 0, 1);
  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    const json m = q->is_object() ? val(*q, "quant_method") : json();
    if (!m.is_string() || m != "mxfp4") bad(where, "quantization_config.quant_method", "\"mxfp4\"", m);
  }
}

// layer_types of a gpt_oss or Gemma config (after num_hidden_layers is read): one of
// "sliding_attention" / "full_attention" per layer; absent: transformers' default, sliding
// on even layers (0, 2, ...), for Gemma 3 every layer but each sliding_window_pattern-th
// (default 6). A sliding layer needs sliding_window.
void parse_layer_types(const json& j, const std::string& where, ModelConfig& c) {
  const int64_t L = c.num_hidden_layers;
  auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) {
    const int64_t every =
        c.architecture == "gemma3_text" ? get_int(j, "sliding_window_pattern", where, false, 6, 1) : 2;
    for (int64_t i = 0; i < L; ++i)
      c.layer_types.push_back((i + 1) % every != 0 ? "sliding_attention" : "full_attention");
  } else {
    const std::string expected = fmt::format(
        "a list of num_hidden_layers = {} entries \"sliding_attention\" or \"full_attention\"", L);
    if (!it->is_array() || int64_t(it->size()) != L) bad(where, "layer_types", expected, *it);
    for (const auto& t : *it) {
      if (t != "sliding_attention" && t != "full_attention") bad(where, "layer_types", expected, *it);
      c.layer_types.push_back(t.get<std::string>());
    }
  }
  for (const auto& t : c.layer_types)
    if (t == "sliding_attention" && c.sliding_window <= 0)
      bad(where, "sliding_window", "an integer >= 1 (layer_types has sliding layers)",
          val(j, "sliding_window"));
}

constexpr const char* kModelTypes =
    "\"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"qwen3_moe\", \"gpt_oss\", \"olmo2\", \"granite\", "
    "\"phi3\", \"gemma2\" or \"gemma3_text\"";

bool known_model_type(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3" || t == "qwen3_moe" ||
         t == "gpt_oss" || t == "olmo2" || t == "granite" || t == "phi3" || t == "gemma2" ||
         t == "gemma3_text";
}

// transformers' class for each model_type (config.json's "architectures")
const char* hf_class(const std::string& t) {
  return t == "llama"         ? "LlamaForCausalLM"
         : t == "mistral"     ? "MistralForCausalLM"
         : t == "qwen2"       ? "Qwen2ForCausalLM"
         : t == "qwen3"       ? "Qwen3ForCausalLM"
         : t == "gpt_oss"     ? "GptOssForCausalLM"
         : t == "olmo2"       ? "Olmo2ForCausalLM"
         : t == "granite"     ? "GraniteForCausalLM"
         : t == "phi3"        ? "Phi3ForCausalLM"
         : t == "gemma2"      ? "Gemma2ForCausalLM"
         : t == "gemma3_text" ? "Gemma3ForCausalLM"
                              : "Qwen3MoeForCausalLM";
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t i) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) return false;
  return (i + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::attention_window(int64_t i) const {
  if (i < 0 || size_t(i) >= layer_types.size() || layer_types[size_t(i)] != "sliding_attention") return 0;
  return sliding_window;
}

int64_t ModelConfig::num_moe_layers() const {
  if (num_experts <= 0 || decoder_sparse_step <= 0 || num_hidden_layers <= 0) return 0;
  int64_t n = num_hidden_layers / decoder_sparse_step;  // layers i with (i + 1) % step == 0
  std::vector<int64_t> only(mlp_only_layers);
  std::sort(only.begin(), only.end());
  only.erase(std::unique(only.begin(), only.end()), only.end());
  for (int64_t i : only) n -= i >= 0 && i < num_hidden_layers && (i + 1) % decoder_sparse_step == 0;
  return n;
}

namespace {
// Parameters of `c` in 128 bits; `active`: each sparse block counts its router and
// num_experts_per_tok experts only. nullopt for negative sizes or a count beyond 2^48.
std::optional<int64_t> count_parameters(const ModelConfig& c, bool active) {
  const int64_t H = c.hidden_size, D = c.head_dim, F = c.intermediate_size, V = c.vocab_size;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads, L = c.num_hidden_layers;
  const int64_t E = c.num_experts, Fe = c.moe_intermediate_size, k = c.num_experts_per_tok;
  if (H < 0 || D < 0 || F < 0 || V < 0 || nq < 0 || nkv < 0 || L < 0 || E < 0 || Fe < 0 || k < 0)
    return std::nullopt;
  constexpr int64_t kMax = int64_t(1) << 48;
  // every term below is a product of two or three sizes: compute each in 128 bits
  using W = __int128;
  // Gemma: pre_feedforward_layernorm and post_feedforward_layernorm besides the two others
  const W attention = W(c.gemma() ? 4 : 2) * H + W(H) * nq * D + W(2) * H * nkv * D + W(nq) * D * H +
                      (c.qk_norm ? (c.qk_norm_whole ? W(nq + nkv) * D : W(2) * D) : 0) +
                      (c.has_qkv_bias() ? W(nq) * D + W(2) * nkv * D : 0) + (c.attention_bias ? H : 0) +
                      (c.attention_sinks ? nq : 0);
  const W dense = W(3) * H * F;
  // a GPT-OSS block adds the router's bias and each expert's three biases (2 Fe + H)
  const W expert = W(3) * H * Fe + (c.gpt_oss() ? W(2) * Fe + H : 0);
  const W sparse = W(E) * H + (c.gpt_oss() ? E : 0) + W(active ? std::min(k, E) : E) * expert;
  const int64_t sparse_layers = c.num_moe_layers();
  if (attention > kMax || dense > kMax || sparse > kMax) return std::nullopt;
  W n = W(V) * H * (c.tie_word_embeddings ? 1 : 2) + W(L) * attention + W(L - sparse_layers) * dense +
        W(sparse_layers) * sparse + H;
  if (n > kMax) return std::nullopt;
  return int64_t(n);
}
}  // namespace

int64_t ModelConfig::num_parameters() const { return count_parameters(*this, false).value_or(-1); }
int64_t ModelConfig::num_active_parameters() const { return count_parameters(*this, true).value_or(-1); }

std::optional<int64_t> parameter_count(const ModelConfig& c) { return count_parameters(c, false); }

void ModelConfig::validate() const {
  auto fail = [](const std::string& key, const std::string& what) {
    throw std::invalid_argument(fmt::format("{}: {}", key, what));
  };
  if (!known_model_type(architecture))
    fail("model_type", fmt::format("{} expected, got \"{}\"", kModelTypes, architecture));
  if (gpt_oss()) {
    if (num_experts <= 0) fail("num_local_experts", fmt::format("must be > 0, got {}", num_experts));
    if (num_moe_layers() != num_hidden_layers)
      fail("decoder_sparse_step", "every GPT-OSS layer is sparse (step 1, no mlp_only_layers)");
    if (!norm_topk_prob) fail("norm_topk_prob", "GPT-OSS softmaxes its top-k logits (true)");
    if (!(swiglu_limit > 0) || !std::isfinite(swiglu_limit))
      fail("swiglu_limit", fmt::format("must be a finite number > 0, got {}", swiglu_limit));
    if (!(swiglu_alpha > 0) || !std::isfinite(swiglu_alpha))
      fail("swiglu_alpha", fmt::format("must be a finite number > 0, got {}", swiglu_alpha));
  } else if (attention_sinks ||
             (!layer_types.empty() && architecture != "mistral" && architecture != "phi3" && !gemma())) {
    fail(attention_sinks ? "attention_sinks" : "layer_types",
         "only GPT-OSS (model_type gpt_oss), Mistral, Phi-3 and Gemma (layer_types) have them");
  }
  if (!layer_types.empty() && int64_t(layer_types.size()) != num_hidden_layers)
    fail("layer_types", fmt::format("must have num_hidden_layers = {} entries, got {}", num_hidden_layers,
                                    layer_types.size()));
  for (const auto& t : layer_types) {
    if (t != "sliding_attention" && t != "full_attention")
      fail("layer_types",
           fmt::format("entries \"sliding_attention\" or \"full_attention\" expected, got \"{}\"", t));
    if (t == "sliding_attention" && sliding_window <= 0)
      fail("sliding_window", fmt::format("must be > 0 for sliding layers, got {}", sliding_window));
  }
  if (sliding_window < 0) fail("sliding_window", fmt::format("must be >= 0, got {}", sliding_window));
  if (num_experts < 0) fail("num_experts", fmt::format("must be >= 0, got {}", num_experts));
  if (num_experts > 0) {
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
      fail("num_experts_per_tok",
           fmt::format("must lie in [1, num_experts = {}], got {}", num_experts, num_experts_per_tok));
    if (moe_intermediate_size <= 0)
      fail("moe_intermediate_size", fmt::format("must be > 0, got {}", moe_intermediate_size));
    if (decoder_sparse_step <= 0)
      fail("decoder_sparse_step", fmt::format("must be > 0, got {}", decoder_sparse_step));
    if (num_experts > (int64_t(1) << 20))
      fail("num_experts", fmt::format("must be <= 2^20, got {}", num_experts));
    if (!(router_aux_loss_coef >= 0) || !std::isfinite(router_aux_loss_coef))
      fail("router_aux_loss_coef", fmt::format("must be a finite number >= 0, got {}", router_aux_loss_coef));
  }
  auto pos = [&](const char* key, int64_t v) {
    if (v <= 0) fail(key, fmt::format("must be > 0, got {}", v));
  };
  pos("vocab_size", vocab_size);
  pos("hidden_size", hidden_size);
  if (num_experts == 0 || num_moe_layers() < num_hidden_layers) pos("intermediate_size", intermediate_size);
  pos("num_hidden_layers", num_hidden_layers);
  pos("num_attention_heads", num_attention_heads);
  pos("num_key_value_heads", num_key_value_heads);
  pos("head_dim", head_dim);
  pos("max_position_embeddings", max_position_embeddings);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("num_key_value_heads", fmt::format("must divide num_attention_heads ({}), got {}",
                                            num_attention_heads, num_key_value_heads));
  if (head_dim % 2 != 0) fail("head_dim", fmt::format("must be even for RoPE, got {}", head_dim));
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    fail("rms_norm_eps", fmt::format("must be > 0, got {}", rms_norm_eps));
  if (!(rope_theta > 0) || !std::isfinite(rope_theta))
    fail("rope_theta", fmt::format("must be > 0, got {}", rope_theta));
  const auto& rs = rope_scaling;
  if (rs.type != "default" && rs.type != "linear" && rs.type != "llama3" && rs.type != "yarn" &&
      rs.type != "longrope")
    fail("rope_scaling.rope_type",
         fmt::format("default, linear, llama3, yarn or longrope expected, got \"{}\"", rs.type));
  if (rs.type != "default" && rs.type != "longrope" && !(rs.factor > 0))
    fail("rope_scaling.factor", fmt::format("must be > 0, got {}", rs.factor));
  if (rs.type == "llama3") {
    if (rs.original_max_position_embeddings <= 0)
      fail("rope_scaling.original_max_position_embeddings", "must be > 0 for llama3");
    if (!(rs.high_freq_factor > rs.low_freq_factor))
      fail("rope_scaling.high_freq_factor", "must be > low_freq_factor");
  }
  if (attention_bias && !gpt_oss()) fail("attention_bias", "only false is supported (biases: GPT-OSS only)");
  if (qkv_bias && architecture != "qwen2")
    fail("qkv_bias", "only Qwen2 (model_type qwen2) has q/k/v-only biases");
  config_families::validate_family_keys(*this);
  // sizes multiply into tensor shapes and byte counts: refuse a product beyond 2^48 before
  // anything is allocated from it (a layer count of 2^32 used to be allocated layer by layer)
  if (!parameter_count(*this))
    fail(config_keys::largest_size_key(*this),
         fmt::format(
             "expected sizes whose parameter count fits 2^48 (vocab {} x hidden {}, {} layers of {} x {} "
             "FFN, {} heads x {}), got more",
             vocab_size, hidden_size, num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
             head_dim));
  for (auto [k, v] : {std::pair{"bos_token_id", bos_token_id},
                      {"eos_token_id", eos_token_id},
                      {"pad_token_id", pad_token_id}})
    if (v >= vocab_size) fail(k, fmt::format("must be < vocab_size ({}), got {}", vocab_size, v));
}

ModelConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    throw std::runtime_error(fmt::format("{}: expected a JSON object, got {}", where, j.type_name()));
  ModelConfig c;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) bad(where, "model_type", kModelTypes, mt == j.end() ? json() : *mt);
  c.architecture = mt->get<std::string>();
  if (c.architecture == "gemma3")  // Gemma3ForConditionalGeneration: text_config + vision tower
    bad(where, "model_type",
        "\"gemma3_text\" (Gemma 3's multimodal checkpoints are not supported: use the text-only one)", *mt);
  if (!known_model_type(c.architecture)) bad(where, "model_type", kModelTypes, *mt);
  const bool gemma = c.gemma();
  // Phi-3 slides as Mistral does: every layer, when sliding_window is set
  const bool oss = c.architecture == "gpt_oss",
             mistral = c.architecture == "mistral" || c.architecture == "phi3";
  const bool qwen2 = c.architecture == "qwen2";
  if (auto a = j.find("architectures"); a != j.end() && !a->is_null()) {
    const std::string want = hf_class(c.architecture);
    if (!a->is_array() || a->size() != 1 || (*a)[0] != want)
      bad(where, "architectures", fmt::format("[\"{}\"]", want), *a);
  }
  if (auto h = j.find("hidden_act"); !gemma && h != j.end() && !h->is_null() && *h != "silu")
    bad(where, "hidden_act", "\"silu\"", *h);
  c.vocab_size = get_int(j, "vocab_size", where, true, 0, 1);
  c.hidden_size = get_int(j, "hidden_size", where, true, 0, 1);
  const bool moe = c.architecture == "qwen3_moe";
  c.intermediate_size = get_int(j, "intermediate_size", where, !moe, 0, moe ? 0 : 1);
  if (moe) parse_moe(j, where, c);
  if (oss) parse_gpt_oss(j, where, c);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", where, true, 0, 1);
  if (gemma) c.sliding_window = get_int(j, "sliding_window", where, false, 4096, 1);
  if (oss || gemma) parse_layer_types(j, where, c);
  c.num_attention_heads = get_int(j, "num_attention_heads", where, true, 0, 1);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", where, false, c.num_attention_heads, 1);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    bad(where, "num_key_value_heads",
        fmt::format("a divisor of num_attention_heads ({})", c.num_attention_heads),
        val(j, "num_key_value_heads"));
  int64_t hd_default = c.hidden_size / c.num_attention_heads;
  c.head_dim = get_int(j, "head_dim", where, false, 0, 1);
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      bad(where, "head_dim", "an integer (hidden_size is not a multiple of num_attention_heads)", json());
    c.head_dim = hd_default;
  }
  if (c.head_dim % 2 != 0) bad(where, "head_dim", "an even integer", val(j, "head_dim"));
  c.rms_norm_eps = get_num(j, "rms_norm_eps", where, oss || c.architecture == "olmo2" ? 1e-5 : 1e-6, true);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", where, false, 2048, 1);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", where, gemma);
  // Qwen2's q/k/v always carry biases (its config has no key for them), its o_proj none
  c.qkv_bias = qwen2;
  c.attention_bias = !qwen2 && get_bool(j, "attention_bias", where, oss);
  if (c.attention_bias && !oss)
    bad(where, "attention_bias", "false (biases: GPT-OSS only)", val(j, "attention_bias"));
  if (get_bool(j, "mlp_bias", where, false)) bad(where, "mlp_bias", "false", val(j, "mlp_bias"));
  if (!oss && get_bool(j, "use_sliding_window", where, false))
    bad(where, "use_sliding_window", "false (sliding-window attention: GPT-OSS, Mistral and Phi-3 only)",
        val(j, "use_sliding_window"));
  if (mistral) {  // a window (Mistral 7B v0.1) makes every layer slide; null (v0.3, Nemo): none
    c.sliding_window = get_int(j, "sliding_window", where, false, 0, 1);
    if (c.sliding_window > 0) c.layer_types.assign(size_t(c.num_hidden_layers), "sliding_attention");
  }
  c.qk_norm = c.architecture == "qwen3" || moe;
  config_families::parse_family_keys(j, where, c);
  c.bos_token_id = get_token_id(j, "bos_token_id", where);
  c.eos_token_id = get_token_id(j, "eos_token_id", where);
  c.pad_token_id = get_token_id(j, "pad_token_id", where);

  c.rope_theta = get_num(j, "rope_theta", where, oss ? 150000.0 : 10000.0, true);
  if (oss && val(j, "rope_scaling").is_null() && val(j, "rope_parameters").is_null()) {
    // GptOssConfig's default: YaRN x32 over a 4096-token pre-training context, untruncated
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.truncate = false;
  }
  // transformers 5 stores rope_theta and the scaling in "rope_parameters"; legacy files in
  // "rope_theta" + "rope_scaling". Both are accepted; rope_parameters wins when present.
  if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null())
    parse_rope(*rs, "rope_scaling", where, c, c.rope_scaling);
  if (auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
    if (rp->is_object() && rp->contains("full_attention")) {  // per layer type (Gemma 3)
      parse_rope_per_layer_type(*rp, where, c);
    } else {
      parse_rope(*rp, "rope_parameters", where, c, c.rope_scaling);
      if (rp->contains("rope_theta")) c.rope_theta = get_num(*rp, "rope_theta", where, 10000.0, true);
    }
  }
  if (c.rope_scaling.type == "longrope") config_families::longrope_original_context(j, where, c);
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    // validate() says "key: what", what either a rule ("must be > 0, got 0", "only ...", "... expected,
    // got ...") or what is expected ("a list of ...")
    const std::string msg = e.what();
    const auto colon = msg.find(':');
    std::string key = msg.substr(0, colon);
    const std::string what = msg.substr(colon == std::string::npos ? 0 : colon + 2);
    if (key == "num_experts" && !j.contains("num_experts") && j.contains("num_local_experts"))
      key = "num_local_experts";  // the file's spelling of the expert count
    const bool rule = what.rfind("must ", 0) == 0 || what.rfind("only ", 0) == 0 ||
                      what.rfind("expected ", 0) == 0 || what.find(" expected") != std::string::npos;
    throw std::runtime_error(fmt::format("{}: key '{}': {}{}", where, key, rule ? "" : "expected ", what));
  }
  return c;
}

nlohmann::json config_to_json(const ModelConfig& c) {
  const bool oss = c.gpt_oss();
  const bool qwen = c.architecture.rfind("qwen", 0) == 0;
  const bool moe = c.architecture == "qwen3_moe";
  auto id = [](int64_t v) { return v < 0 ? json() : json(v); };
  json j = json::object();
  j["architectures"] = json::array({hf_class(c.architecture)});
  j["model_type"] = c.architecture;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  json rs;  // null = default
  const auto& r = c.rope_scaling;
  if (r.type != "default") {
    rs = {{"rope_type", r.type}, {"factor", r.factor}};
    if (r.type == "llama3") {
      rs["low_freq_factor"] = r.low_freq_factor;
      rs["high_freq_factor"] = r.high_freq_factor;
      rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
    } else if (r.type == "yarn") {
      rs["beta_fast"] = r.beta_fast;
      rs["beta_slow"] = r.beta_slow;
      if (r.attention_factor != 0) rs["attention_factor"] = r.attention_factor;
      if (r.original_max_position_embeddings > 0)
        rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
      if (!r.truncate) rs["truncate"] = false;
    }
  }
  j["rope_scaling"] = rs;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.architecture != "qwen2") j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
  }
  if (oss) {
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["intermediate_size"] = c.moe_intermediate_size;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
    j["swiglu_alpha"] = c.swiglu_alpha;
    j["swiglu_limit"] = c.swiglu_limit;
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json();
    j["layer_types"] = c.layer_types;
  } else if (qwen) {
    val(j, "use_sliding_window") = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  } else if (c.architecture == "mistral" || c.architecture == "phi3") {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json();
  } else {
    val(j, "mlp_bias") = false;
    j["pretraining_tp"] = 1;
  }
  config_families::family_keys_to_json(c, j);
  j["bos_token_id"] = id(c.bos_token_id);
  j["eos_token_id"] = id(c.eos_token_id);
  j["pad_token_id"] = id(c.pad_token_id);
  j["torch_dtype"] = "float32";
  j["dtype"] = "float32";
  return j;
}

void check_weights_fit_files(const ModelConfig& c, uint64_t file_bytes, double min_bytes_per_param,
                             const std::string& where, const std::string& layers_key,
                             const std::string& held_by) {
  const auto n = parameter_count(c);
  const double need = n ? double(*n) * min_bytes_per_param : INFINITY;
  if (!(need <= double(file_bytes)))
    throw std::runtime_error(fmt::format(
        "{}: the sizes in the metadata ({} {}, hidden {}, FFN {}, vocab {}) need {} parameters, at least {} "
        "of weights, but {} {} {} bytes",
        where, layers_key, c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size,
        n ? fmt::format("{}", *n) : std::string("more than 2^48"), byte_text(need), held_by,
        held_by.ends_with(" files") ? "hold" : "holds", file_bytes));
}

void check_host_memory_to_load(const ModelConfig& c, const std::string& where) {
  const auto n = parameter_count(c);
  const double need = n ? double(*n) * 8.0 : INFINITY;
  const size_t avail = host_available_bytes();
  if (avail > 0 && !(need <= double(avail)))
    throw std::runtime_error(
        fmt::format("{}: loading {} parameters as fp32 needs about {} of host memory, {} is available", where,
                    n ? fmt::format("{}", *n) : std::string("more than 2^48"), byte_text(need),
                    byte_text(double(avail))));
}

}  // namespace rp
