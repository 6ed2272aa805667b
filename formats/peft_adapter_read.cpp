// PEFT adapter folders read back (roundpipe/adapter.hpp): adapter_config.json checked key by
// key (a setting the runtime does not compute refused with one line naming it),
// adapter_model.safetensors read, and the adapter loaded into the runtime's parameter groups
// once it matches the run. The names and the layout's side: formats/peft_adapter.cpp.
#include "roundpipe/adapter.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/json_fields.hpp"
#include "base/json_text.hpp"
#include "formats/format_fail.hpp"
#include "formats/peft_adapter_impl.hpp"
#include "formats/peft_experts.hpp"
#include "formats/phi3_hf.hpp"
#include "formats/safetensors.hpp"
#include "model/error_text.hpp"
#include "model/lora.hpp"

namespace rp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// One "key: value" check of an adapter_config.json.
void read_lora_fields(const JsonFields& f, PeftAdapter& a) {
  LoraConfig& l = a.lora;
  if (!f.has("peft_type") || f.at("peft_type") != "LORA") f.fail("peft_type", "\"LORA\"");
  l.r = f.integer("r");
  if (l.r < 1 || l.r > LoraConfig::kMaxRank)
    f.fail("r", fmt::format("an integer in 1..{}", LoraConfig::kMaxRank));
  if (f.has("lora_alpha")) l.alpha = f.number("lora_alpha");
  else l.alpha = 8;  // PEFT's default
  if (!(l.alpha > 0) || !std::isfinite(l.alpha)) f.fail("lora_alpha", "a finite number > 0");
  l.dropout = 0;
  if (f.has("lora_dropout") && !f.at("lora_dropout").is_null()) l.dropout = f.number("lora_dropout");
  if (!(l.dropout >= 0 && l.dropout < 1)) f.fail("lora_dropout", "a number in [0, 1)");
  l.use_rslora = false;
  if (f.has("use_rslora") && !f.at("use_rslora").is_null()) l.use_rslora = f.boolean("use_rslora");
  l.target_parameters.clear();
  if (f.has("target_parameters") && !f.at("target_parameters").is_null()) {
    const json& tp = f.at("target_parameters");
    const char* tp_expected = "null or a list of \"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\"";
    if (!tp.is_array()) f.fail("target_parameters", tp_expected);
    for (const auto& e : tp) {
      // PEFT matches a target parameter by its suffix: "experts.down_proj" or a full path
      const std::string s = e.is_string() ? e.get<std::string>() : "";
      int found = -1;
      for (int p = 0; p < kExpertProjs; ++p) {
        const std::string n = kExpertProjNames[size_t(p)];
        const std::string tail = n.substr(n.find('.') + 1);  // "experts.gate_up_proj"
        if (s == n || s == tail || s.ends_with("." + tail)) found = p;
      }
      if (found < 0) f.fail("target_parameters", tp_expected);
      if (!lora_targets_experts(l, ExpertProj(found)))
        l.target_parameters.push_back(kExpertProjNames[size_t(found)]);
    }
    std::sort(l.target_parameters.begin(), l.target_parameters.end(),
              [](const std::string& a, const std::string& b) {
                return a.find("gate_up") != std::string::npos && b.find("gate_up") == std::string::npos;
              });
  }
  const json& tm = f.at("target_modules");
  const char* tm_expected =
      "a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (Phi-3: qkv_proj, "
      "gate_up_proj), or \"all-linear\"";
  l.target_modules.clear();
  if (tm.is_null() && !l.target_parameters.empty()) {
    // only the experts' parameters are adapted
  } else if (tm.is_string() && tm == "all-linear") {
    l.target_modules = kLinears;
  } else if (tm.is_array() && !tm.empty()) {
    std::set<std::string> seen;
    for (const auto& e : tm) {
      // PEFT saves "all-linear" as the full module paths ("model.layers.0.mlp.up_proj"): the
      // module is the last component (a path of only some layers leaves the others without
      // tensors, which load_peft_adapter names)
      const std::string s = e.is_string() ? e.get<std::string>() : "";
      const std::string m = s.substr(s.rfind('.') == std::string::npos ? 0 : s.rfind('.') + 1);
      if (m == "qkv_proj" ||
          m == "gate_up_proj") {  // Phi-3's fused modules: their parts (formats/phi3_hf.hpp)
        for (const char* part : m == "qkv_proj" ? std::vector<const char*>{"q_proj", "k_proj", "v_proj"}
                                                : std::vector<const char*>{"gate_proj", "up_proj"})
          seen.insert(part);
        continue;
      }
      if (std::find(kLinears.begin(), kLinears.end(), m) == kLinears.end())
        f.fail("target_modules", tm_expected);
      seen.insert(m);
    }
    for (const auto& m : kLinears)
      if (seen.count(m)) l.target_modules.push_back(m);
  } else {
    f.fail("target_modules", tm_expected);
  }
  l.modules_to_save.clear();
  if (const json& ms = f.at("modules_to_save"); !ms.is_null()) {
    if (!ms.is_array())
      f.fail("modules_to_save", "null or a list of \"embed_tokens\", \"lm_head\", \"model.norm\"");
    std::set<std::string> seen;
    for (const auto& e : ms) {
      const std::string n = e.is_string() ? module_to_save_name(e.get<std::string>()) : "";
      if (n.empty())
        f.fail("modules_to_save", "null or a list of \"embed_tokens\", \"lm_head\", \"model.norm\"");
      if (n == "norm") a.final_norm = true;
      else if (seen.insert(n).second) l.modules_to_save.push_back(n);
    }
  }
}

/// Settings of adapter_config.json the runtime does not compute: each must keep PEFT's default.
void refuse_unsupported(const JsonFields& f) {
  auto must = [&](const char* key, const json& ok, const char* expected) {
    if (f.has(key) && !f.at(key).is_null() && f.at(key) != ok) f.fail(key, expected);
  };
  must("use_dora", false, "false (DoRA is not supported)");
  must("bias", "none", "\"none\" (LoRA biases are not supported)");
  must("fan_in_fan_out", false, "false (Conv1D weights are not supported)");
  must("lora_bias", false, "false (LoRA biases are not supported)");
  for (const char* key : {"layers_to_transform", "layer_replication", "trainable_token_indices"})
    if (f.has(key) && !f.at(key).is_null() && !(f.at(key).is_array() && f.at(key).empty()))
      f.fail(key, "null (every decoder layer, whole modules)");
  must("use_qalora", false, "false (LoRA variants are not supported)");
  must("use_bdlora", false, "false (LoRA variants are not supported)");
  for (const char* key :
       {"alora_invocation_tokens", "arrow_config", "monteclora_config", "velora_config", "kasa_config"})
    if (f.has(key) && !f.at(key).is_null()) f.fail(key, "null (LoRA variants are not supported)");
  // PiSSA, OLoRA, LoftQ and CorDA adapters belong to base weights their initialisation changed
  if (const json& init = f.at("init_lora_weights");
      !init.is_null() && !init.is_boolean() && init != "gaussian")
    f.fail("init_lora_weights",
           "true, false or \"gaussian\" (adapters of PiSSA, OLoRA, LoftQ or CorDA need the base "
           "weights their initialisation changed)");
}

/// rank_pattern / alpha_pattern: empty, or (Phi-3, as roundpipe writes them: formats/phi3_hf.hpp)
/// a rank n r and an alpha that keep the scaling of r and lora_alpha for qkv_proj / gate_up_proj.
/// Returns each fused module's rank.
std::map<std::string, int64_t> fused_ranks(const JsonFields& f, const LoraConfig& l) {
  const char* rank_expected =
      "{} (one rank for every module), or qkv_proj / gate_up_proj at a multiple n of r";
  const char* alpha_expected =
      "{} (one alpha for every module), or qkv_proj / gate_up_proj at n lora_alpha (sqrt(n) "
      "lora_alpha with use_rslora) for rank n r";
  std::map<std::string, int64_t> ranks;
  const json none = json::object();
  const json& rp = f.has("rank_pattern") && !f.at("rank_pattern").is_null() ? f.at("rank_pattern") : none;
  const json& ap = f.has("alpha_pattern") && !f.at("alpha_pattern").is_null() ? f.at("alpha_pattern") : none;
  if (!rp.is_object()) f.fail("rank_pattern", rank_expected);
  if (!ap.is_object()) f.fail("alpha_pattern", alpha_expected);
  for (const auto& [k, v] : rp.items()) {
    if ((k != "qkv_proj" && k != "gate_up_proj") || !v.is_number_integer() || v.get<int64_t>() < l.r ||
        v.get<int64_t>() % l.r != 0)
      f.fail("rank_pattern", rank_expected);
    const double n = double(v.get<int64_t>() / l.r), want = l.alpha * (l.use_rslora ? std::sqrt(n) : n);
    const auto a = ap.find(k);
    const double got = a == ap.end() ? l.alpha : a->is_number() ? a->get<double>() : -1.0;
    if (!(std::abs(got - want) <= 1e-9 * want)) f.fail("alpha_pattern", alpha_expected);
    ranks[k] = v.get<int64_t>();
  }
  for (const auto& [k, v] : ap.items())
    if (!ranks.count(k)) f.fail("alpha_pattern", alpha_expected);
  return ranks;
}

/// The target module of an adapter tensor name "model.layers.<i>.<self_attn|mlp>.<m>.lora_<A|B>.weight",
/// or "" when `name` is not one.
std::string lora_module_of(const std::string& name) {
  if (name.rfind("model.layers.", 0) != 0) return "";
  if (!name.ends_with(".lora_A.weight") && !name.ends_with(".lora_B.weight")) return "";
  const std::string stem = name.substr(0, name.size() - std::string(".lora_A.weight").size());
  const size_t dot = stem.rfind('.');
  return dot == std::string::npos ? "" : stem.substr(dot + 1);
}

}  // namespace

PeftAdapter peft_adapter_from_config(const json& config, const std::string& where) {
  if (!config.is_object()) format_fail(where, "expected a JSON object");
  const JsonFields f(config, where, "", JsonFields::Error::runtime_error);
  PeftAdapter a;
  read_lora_fields(f, a);
  refuse_unsupported(f);
  if (f.has("ensure_weight_tying") && !f.at("ensure_weight_tying").is_null())
    a.ensure_weight_tying = f.boolean("ensure_weight_tying");
  if (f.has("base_model_name_or_path") && !f.at("base_model_name_or_path").is_null())
    a.base_model_name_or_path = f.string("base_model_name_or_path");
  return a;
}

PeftAdapter read_peft_adapter(const std::string& dir) {
  const fs::path d(dir);
  const std::string cfg_path = (d / kAdapterConfigFile).string();
  const std::string st_path = (d / kAdapterWeightsFile).string();
  std::error_code ec;
  if (!fs::is_directory(d, ec))
    format_fail(dir, "not a folder (expected a PEFT adapter folder with adapter_config.json)");
  if (!fs::exists(cfg_path, ec)) format_fail(cfg_path, "missing (not a PEFT adapter folder)");
  json cfg;
  try {
    // "<file>:<line>:<column>: invalid JSON: <reason>", as every JSON file's reader says it
    cfg = parse_json_text(read_json_file(cfg_path), cfg_path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  PeftAdapter a = peft_adapter_from_config(cfg, cfg_path);
  a.dir = dir;
  const std::map<std::string, int64_t> ranks =
      fused_ranks(JsonFields(cfg, cfg_path, "", JsonFields::Error::runtime_error), a.lora);
  if (!fs::exists(st_path, ec)) {
    if (fs::exists(d / "adapter_model.bin", ec))
      format_fail((d / "adapter_model.bin").string(),
                  "PyTorch pickle adapters are not read; save the adapter with safe_serialization=True "
                  "(adapter_model.safetensors)");
    format_fail(st_path, "missing");
  }
  const std::set<std::string> targets(a.lora.target_modules.begin(), a.lora.target_modules.end());
  const std::set<std::string> mts(a.lora.modules_to_save.begin(), a.lora.modules_to_save.end());
  SafetensorsFile f(st_path);
  for (const auto& e : f.entries()) {
    const std::string name = tensor_name_of_peft_key(e.name);
    auto bad = [&](const std::string& what) {
      format_fail(st_path, fmt::format("key '{}': {}", e.name, what));
    };
    if (name.empty()) bad("expected a name starting with 'base_model.model.'");
    if (name == kNorm) {
      if (!a.final_norm)
        bad(fmt::format("modules_to_save of {} does not name 'model.norm'", kAdapterConfigFile));
    } else if (name == kEmbed || name == kLmHead) {
      const std::string module = name == kEmbed ? "embed_tokens" : "lm_head";
      // with ensure_weight_tying PEFT saves both ends of a tied pair whichever one is named
      if (!mts.count(module) && !(a.ensure_weight_tying && !mts.empty()))
        bad(fmt::format("modules_to_save of {} does not name '{}'", kAdapterConfigFile, module));
    } else if (is_peft_expert_key(name)) {
      if (a.lora.target_parameters.empty())
        bad(fmt::format("an expert adapter, but {} has no target_parameters", kAdapterConfigFile));
    } else {
      const std::string m = lora_module_of(name);
      if (m.empty())
        bad("expected a LoRA tensor (...<module>.lora_A.weight / lora_B.weight) or a modules_to_save matrix "
            "(DoRA magnitudes, biases and other adapter types are not supported)");
      // Phi-3's fused modules: in target_modules as their parts, at their rank_pattern's rank
      const std::string part = m == "qkv_proj" ? "q_proj" : m == "gate_up_proj" ? "gate_proj" : m;
      if (!targets.count(part))
        bad(fmt::format("module '{}' is not in target_modules of {}", m, kAdapterConfigFile));
      const int64_t rank = ranks.count(m) ? ranks.at(m) : a.lora.r;
      const bool is_a = name.ends_with(".lora_A.weight");
      if (part != m && (e.shape.size() != 2 || e.shape[is_a ? 0 : 1] != rank))
        bad(fmt::format("expected rank {} ({} of {}), got shape [{}]", rank,
                        ranks.count(m) ? "rank_pattern" : "r", kAdapterConfigFile, fmt::join(e.shape, ", ")));
    }
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
      bad(fmt::format("expected F32, F16 or BF16, got {}", e.dtype));
    a.tensors[name] = f.read_f32(e);
  }
  expert_tensors_from_peft(a.lora, a.tensors, st_path);
  return a;
}

bool peft_adapter_unties(const PeftAdapter& a, const ModelConfig& base) {
  if (!base.tie_word_embeddings || a.ensure_weight_tying) return false;
  const auto e = a.tensors.find(kEmbed), h = a.tensors.find(kLmHead);
  const bool has_e = e != a.tensors.end(), has_h = h != a.tensors.end();
  if (has_e != has_h) return true;
  if (!has_e) return false;
  return e->second.shape != h->second.shape || e->second.data != h->second.data;
}

void untie_embeddings(LoadedModel& m) {
  if (!m.config.tie_word_embeddings) return;
  m.config.tie_word_embeddings = false;
  m.tensors[kLmHead] = m.tensors.at(kEmbed);
}

void load_peft_adapter(const PeftAdapter& a, const ModelLayout& layout,
                       std::vector<std::vector<float>>& group_data) {
  if (!layout.lora) throw std::invalid_argument("load_peft_adapter: the layout has no LoRA adapters");
  if (group_data.size() != layout.groups.size())
    throw std::invalid_argument(fmt::format("load_peft_adapter: {} group buffers for {} groups",
                                            group_data.size(), layout.groups.size()));
  const std::string cfg_path = (fs::path(a.dir) / kAdapterConfigFile).string();
  const std::string st_path = (fs::path(a.dir) / kAdapterWeightsFile).string();
  const LoraConfig& want = *layout.lora;
  const ModelConfig& c = layout.config;
  if (a.lora.r != want.r)
    format_fail(cfg_path, fmt::format("key 'r': expected {} (the run's lora.r), got {}", want.r, a.lora.r));
  if (a.lora.target_modules != adapted_modules(layout))
    format_fail(
        cfg_path,
        fmt::format("key 'target_modules': expected [{}] (the run's lora.target_modules), got [{}]",
                    fmt::join(adapted_modules(layout), ", "), fmt::join(a.lora.target_modules, ", ")));
  {
    std::vector<std::string> want_p, got_p;
    for (int p = 0; p < kExpertProjs; ++p) {
      if (lora_targets_experts(want, ExpertProj(p))) want_p.push_back(kExpertProjNames[size_t(p)]);
      if (lora_targets_experts(a.lora, ExpertProj(p))) got_p.push_back(kExpertProjNames[size_t(p)]);
    }
    if (want_p != got_p)
      format_fail(
          cfg_path,
          fmt::format("key 'target_parameters': expected [{}] (the run's lora.target_parameters), got [{}]",
                      fmt::join(want_p, ", "), fmt::join(got_p, ", ")));
  }
  const TrainedBase tb = trained_base(layout);
  const std::set<std::string> got(a.lora.modules_to_save.begin(), a.lora.modules_to_save.end());
  // a tied model trains its one matrix for either name (roundpipe/adapter.hpp)
  const bool same = c.tie_word_embeddings ? tb.embed == !got.empty()
                                          : tb.embed == bool(got.count("embed_tokens")) &&
                                                tb.head == bool(got.count("lm_head"));
  if (!same) {
    std::vector<std::string> want_names;
    for (const auto& m : tb.modules_to_save)
      if (m != "model.norm") want_names.push_back(m);
    format_fail(
        cfg_path,
        fmt::format(
            "key 'modules_to_save': expected [{}] (what the run trains besides the adapters), got [{}]",
            fmt::join(want_names, ", "), fmt::join(a.lora.modules_to_save, ", ")));
  }
  std::set<std::string> used;
  const std::map<std::string, HostTensor> regrouped = gpt_oss_gate_up(a.tensors, c);
  // Phi-3: the fused modules' adapters as ours, one per part (formats/phi3_hf.hpp)
  const std::map<std::string, HostTensor> parts = split_fused_adapters(a.tensors, c, want.r, st_path);
  auto copy = [&](const std::string& name, int g, const TensorSpec& t) {
    const HostTensor* src = nullptr;
    if (const auto it = regrouped.find(name); it != regrouped.end()) src = &it->second;
    else if (const auto jt = parts.find(name); jt != parts.end()) src = &jt->second;
    if (!src)
      format_fail(st_path, fmt::format("key '{}': missing (expected shape [{}])", peft_tensor_key(name),
                                       fmt::join(t.shape, ", ")));
    if (src->shape != t.shape)
      format_fail(st_path, fmt::format("key '{}': expected shape [{}], got [{}]", peft_tensor_key(name),
                                       fmt::join(t.shape, ", "), fmt::join(src->shape, ", ")));
    auto& buf = group_data[size_t(g)];
    if (int64_t(buf.size()) != layout.groups[size_t(g)].numel)
      throw std::invalid_argument(fmt::format("load_peft_adapter: group '{}' holds {} values, expected {}",
                                              layout.groups[size_t(g)].name, buf.size(),
                                              layout.groups[size_t(g)].numel));
    std::memcpy(buf.data() + t.offset, src->data.data(), size_t(t.numel()) * sizeof(float));
    used.insert(name);
  };
  for (const auto& [g, t] : adapter_tensors(layout)) copy(t->name, g, *t);
  if (c.tie_word_embeddings && peft_adapter_unties(a, c))
    format_fail(
        st_path,
        fmt::format("trains '{}' apart from '{}' of a model with tied embeddings (PEFT without "
                    "ensure_weight_tying unties them); build the run from untie_embeddings of the base model",
                    a.tensors.count(kLmHead) ? "lm_head" : "embed_tokens",
                    a.tensors.count(kLmHead) ? "embed_tokens" : "lm_head"));
  auto copy_named = [&](const std::string& file_name, const std::string& layout_name) {
    const auto [g, t] = find_tensor(layout, layout_name);
    if (!t) throw std::invalid_argument(fmt::format("load_peft_adapter: the layout has no {}", layout_name));
    copy(file_name, g, *t);
  };
  if (tb.embed && c.tie_word_embeddings) {
    const auto e = a.tensors.find(kEmbed), h = a.tensors.find(kLmHead);
    if (e != a.tensors.end() && h != a.tensors.end() && e->second.data != h->second.data)
      format_fail(
          st_path,
          fmt::format("keys '{}' and '{}' differ but the model ties its embeddings (build the run from "
                      "untie_embeddings of the base model)",
                      peft_tensor_key(kEmbed), peft_tensor_key(kLmHead)));
    copy_named(e != a.tensors.end() ? kEmbed : kLmHead, kEmbed);
    used.insert(kEmbed);
    used.insert(kLmHead);
  } else {
    if (tb.embed) copy_named(kEmbed, kEmbed);
    if (tb.head) copy_named(kLmHead, kLmHead);
  }
  if (a.tensors.count(kNorm)) {
    if (!tb.head)
      format_fail(st_path,
                  fmt::format("key '{}': the run does not train the final norm (its head group is frozen)",
                              peft_tensor_key(kNorm)));
    copy_named(kNorm, kNorm);  // PEFT-made adapters usually leave it out: the base norm stays
  }
  for (const auto& [name, t] : parts)
    if (!used.count(name))
      format_fail(st_path,
                  fmt::format("key '{}': not a tensor of the run's adapters (layout of {} decoder layers)",
                              peft_tensor_key(name), c.num_hidden_layers));
}

}  // namespace rp
