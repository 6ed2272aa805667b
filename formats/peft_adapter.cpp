// PEFT adapter folders (roundpipe/adapter.hpp): the names of their tensors and modules, what a
// LoRA layout adapts and trains (formats/peft_adapter_impl.hpp), and the export:
// adapter_config.json and adapter_model.safetensors written from the runtime's parameter groups.
// Reading them back: formats/peft_adapter_read.cpp.
#include "roundpipe/adapter.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "base/atomic_file.hpp"
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

constexpr const char* kPrefix = "base_model.model.";

std::set<std::string> normalised_modules_to_save(const LoraConfig& l) {
  std::set<std::string> s;
  for (const auto& m : l.modules_to_save) {
    const std::string n = module_to_save_name(m);
    if (n.empty() || n == "norm")
      throw std::invalid_argument(fmt::format(
          "lora.modules_to_save: expected \"embed_tokens\" or \"lm_head\", got \"{}\"", one_line(m)));
    s.insert(n);
  }
  return s;
}

}  // namespace

std::string module_to_save_name(const std::string& s) {
  if (s == "embed_tokens" || s == "model.embed_tokens") return "embed_tokens";
  if (s == "lm_head") return "lm_head";
  if (s == "norm" || s == "model.norm") return "norm";
  return "";
}

std::vector<std::pair<int, const TensorSpec*>> adapter_tensors(const ModelLayout& layout) {
  std::vector<std::pair<int, const TensorSpec*>> out;
  for (int l = 1; l <= int(layout.config.num_hidden_layers); ++l) {
    const int g = layout.adapter_group(l);
    if (g < 0 || size_t(g) >= layout.groups.size())
      throw std::invalid_argument(fmt::format("layout: no adapter group for decoder layer {}", l));
    for (const TensorSpec& t : layout.groups[size_t(g)].tensors) out.push_back({g, &t});
  }
  return out;
}

std::pair<int, const TensorSpec*> find_tensor(const ModelLayout& layout, const std::string& name) {
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const int i = layout.groups[g].find(name);
    if (i >= 0) return {int(g), &layout.groups[g].tensors[size_t(i)]};
  }
  return {-1, nullptr};
}

std::string peft_tensor_key(const std::string& name) { return kPrefix + name; }

std::string tensor_name_of_peft_key(const std::string& key) {
  const std::string p = kPrefix;
  return key.rfind(p, 0) == 0 ? key.substr(p.size()) : std::string();
}

std::vector<std::string> lora_target_list(const LoraConfig& lora) {
  std::set<std::string> want;
  for (const auto& m : lora.target_modules) {
    if (m == "all-linear") {
      want.insert(kLinears.begin(), kLinears.end());
    } else if (std::find(kLinears.begin(), kLinears.end(), m) != kLinears.end()) {
      want.insert(m);
    } else {
      throw std::invalid_argument(
          fmt::format("lora.target_modules: expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                      "down_proj or all-linear, "
                      "got \"{}\"",
                      one_line(m)));
    }
  }
  std::vector<std::string> out;
  for (const auto& m : kLinears)
    if (want.count(m)) out.push_back(m);
  return out;
}

TrainedBase trained_base(const ModelLayout& layout) {
  if (!layout.lora) throw std::invalid_argument("the layout has no LoRA adapters");
  const size_t head = size_t(layout.config.num_hidden_layers + 1);
  if (layout.groups.size() <= head) throw std::invalid_argument("the layout has no head group");
  TrainedBase t;
  t.embed = !layout.groups[0].frozen;
  t.head = !layout.groups[head].frozen;
  if (layout.config.tie_word_embeddings) {
    // PEFT's ensure_weight_tying ties either name to the embedding (roundpipe/adapter.hpp)
    const auto named = normalised_modules_to_save(*layout.lora);
    if (t.embed && (named.count("embed_tokens") || named.empty()))
      t.modules_to_save.push_back("embed_tokens");
    if (t.embed && named.count("lm_head")) t.modules_to_save.push_back("lm_head");
  } else {
    if (t.embed) t.modules_to_save.push_back("embed_tokens");
    if (t.head) t.modules_to_save.push_back("lm_head");
  }
  if (t.head) t.modules_to_save.push_back("model.norm");
  return t;
}

std::vector<std::string> adapted_modules(const ModelLayout& layout) {
  const ModelConfig& c = layout.config;
  const bool dense_mlp = c.num_moe_layers() < c.num_hidden_layers;
  std::vector<std::string> out;
  for (const std::string& m : lora_target_list(*layout.lora))
    if (dense_mlp || !(m == "gate_proj" || m == "up_proj" || m == "down_proj")) out.push_back(m);
  return out;
}

namespace {

/// target_modules as written: attention names as they are; the MLP names of a model with
/// mixture-of-experts layers as the full paths of its dense layers' modules, since PEFT matches
/// a bare "gate_proj" against the experts too (transformers 4's per-expert linears, or through
/// its conversion onto transformers 5's stacked experts) and would adapt what the run did not
/// train. null when only the experts carry adapters.
json target_modules_json(const ModelLayout& layout) {
  const ModelConfig& c = layout.config;
  json out = json::array();
  for (const std::string& m : adapted_modules(layout)) {
    const bool mlp = m == "gate_proj" || m == "up_proj" || m == "down_proj";
    if (!mlp || c.num_moe_layers() == 0) {
      const std::string name = peft_module_name(c, m);  // Phi-3: qkv_proj, gate_up_proj once
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
      continue;
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      if (!c.is_moe_layer(i)) out.push_back(fmt::format("model.layers.{}.mlp.{}", i, m));
  }
  return out.empty() ? json(nullptr) : out;
}

}  // namespace

json peft_adapter_config(const ModelLayout& layout, const std::string& base_model_name_or_path) {
  const TrainedBase tb = trained_base(layout);
  const LoraConfig& lora = *layout.lora;
  json j = json::object();
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] =
      base_model_name_or_path.empty() ? json(nullptr) : json(base_model_name_or_path);
  j["r"] = lora.r;
  if (lora.alpha == std::floor(lora.alpha) && std::abs(lora.alpha) < 1e15)
    j["lora_alpha"] = int64_t(lora.alpha);
  else j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  j["target_modules"] = target_modules_json(layout);
  if (lora_has_expert_targets(
          lora)) {  // PEFT's ParamWrapper on the stacked experts (formats/peft_experts.hpp)
    json tp = json::array();
    for (int p = 0; p < kExpertProjs; ++p)
      if (lora_targets_experts(lora, ExpertProj(p))) tp.push_back(kExpertProjNames[size_t(p)]);
    j["target_parameters"] = tp;
  }
  j["use_rslora"] = lora.use_rslora;
  j["modules_to_save"] = tb.modules_to_save.empty() ? json(nullptr) : json(tb.modules_to_save);
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["use_dora"] = false;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = json::object();
  j["alpha_pattern"] = json::object();
  const FusedAdapters fused = fused_adapters(layout, {});  // Phi-3: rank n r keeps our scaling
  for (const auto& [m, rank] : fused.rank_pattern) j["rank_pattern"][m] = rank;
  for (const auto& [m, alpha] : fused.alpha_pattern) j["alpha_pattern"][m] = alpha;
  // the runtime trains one matrix for both ends of a tied model (see roundpipe/adapter.hpp)
  if (layout.config.tie_word_embeddings && tb.embed) j["ensure_weight_tying"] = true;
  return j;
}

void write_peft_adapter(const std::string& dir, const ModelLayout& layout,
                        const std::vector<const float*>& group_data,
                        const std::string& base_model_name_or_path, DType dtype) {
  if (!layout.lora) throw std::invalid_argument("write_peft_adapter: the layout has no LoRA adapters");
  if (group_data.size() != layout.groups.size())
    throw std::invalid_argument(fmt::format("write_peft_adapter: {} group buffers for {} groups",
                                            group_data.size(), layout.groups.size()));
  const ModelConfig& c = layout.config;
  std::vector<TensorRef> refs;
  auto add = [&](const std::string& name, const std::string& stored_as) {
    const auto [g, t] = find_tensor(layout, stored_as);
    if (!t) throw std::invalid_argument(fmt::format("write_peft_adapter: the layout has no {}", stored_as));
    if (!group_data[size_t(g)])
      throw std::invalid_argument(
          fmt::format("write_peft_adapter: no data for group '{}'", layout.groups[size_t(g)].name));
    refs.push_back({peft_tensor_key(name), t->shape, group_data[size_t(g)] + t->offset});
  };
  // Phi-3: q/k/v (gate/up) as one adapter of PEFT's fused module (formats/phi3_hf.hpp)
  const FusedAdapters fused = fused_adapters(layout, group_data);
  const std::set<std::string> replaced(fused.replaced.begin(), fused.replaced.end());
  for (const auto& [g, t] : adapter_tensors(layout))
    if (t->name.find(".mlp.experts.") == std::string::npos && !replaced.count(t->name)) add(t->name, t->name);
  for (const auto& [name, t] : fused.tensors) refs.push_back({peft_tensor_key(name), t.shape, t.data.data()});
  std::vector<std::map<std::string, HostTensor>> experts;  // PEFT's layout of the expert adapters
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const int g = layout.adapter_group(int(i) + 1);
    if (!group_data[size_t(g)] || !c.is_moe_layer(i) || !lora_has_expert_targets(*layout.lora)) continue;
    experts.push_back(peft_expert_tensors(layout, i, group_data[size_t(g)]));
    for (const auto& [name, t] : experts.back())
      refs.push_back({peft_tensor_key(name), t.shape, t.data.data()});
  }
  const TrainedBase tb = trained_base(layout);
  if (tb.embed) add(kEmbed, kEmbed);
  // tied: the one matrix under both keys (roundpipe/adapter.hpp)
  if (tb.embed && c.tie_word_embeddings) add(kLmHead, kEmbed);
  if (tb.head && !c.tie_word_embeddings) add(kLmHead, kLmHead);
  if (tb.head) add(kNorm, kNorm);
  save_safetensors((fs::path(dir) / kAdapterWeightsFile).string(), refs, dtype);
  const std::string cfg_path = (fs::path(dir) / kAdapterConfigFile).string();
  const std::string text = peft_adapter_config(layout, base_model_name_or_path).dump(2) + "\n";
  write_file_atomically(cfg_path, [&](std::ostream& os) { os << text; });
}

void save_peft_adapter(const std::string& dir, const ModelLayout& layout,
                       const std::vector<const float*>& group_data,
                       const std::string& base_model_name_or_path, DType dtype,
                       const std::function<void(const std::string& tmp_dir)>& extra) {
  replace_folder(dir, [&](const std::string& tmp) {
    write_peft_adapter(tmp, layout, group_data, base_model_name_or_path, dtype);
    if (extra) extra(tmp);
  });
}

}  // namespace rp
