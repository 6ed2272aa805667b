// make_layout with LoRA adapters, the checks of a LoraConfig and the adapters' initial values
// (model/lora.hpp).
#include "model/lora.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/dropout_hash.hpp"
#include "model/error_text.hpp"
#include "model/fused_projections.hpp"

namespace rp {

const std::array<const char*, kLoraModules> kLoraModuleNames = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                                "gate_proj", "up_proj", "down_proj"};

std::string lora_module_path(LoraModule m) {
  return std::string(int(m) < 4 ? "self_attn." : "mlp.") + kLoraModuleNames[size_t(m)];
}

std::array<int64_t, 2> lora_module_dims(const ModelConfig& c, LoraModule m) {
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  const int64_t Q = c.num_attention_heads * c.head_dim, K = c.num_key_value_heads * c.head_dim;
  switch (m) {
    case LoraModule::q: return {H, Q};
    case LoraModule::k:
    case LoraModule::v: return {H, K};
    case LoraModule::o: return {Q, H};
    case LoraModule::gate:
    case LoraModule::up: return {H, F};
    case LoraModule::down: return {F, H};
  }
  return {0, 0};
}

const std::array<const char*, kExpertProjs> kExpertProjNames = {"mlp.experts.gate_up_proj",
                                                                "mlp.experts.down_proj"};

namespace {
bool is_module_name(const std::string& s) {
  return std::find(kLoraModuleNames.begin(), kLoraModuleNames.end(), s) != kLoraModuleNames.end();
}
// ExpertProj of a target_parameters entry, or -1.
int expert_proj_of(const std::string& s) {
  for (int p = 0; p < kExpertProjs; ++p) {
    const std::string full = kExpertProjNames[size_t(p)];
    if (s == full || s == full.substr(std::string("mlp.experts.").size())) return p;
  }
  return -1;
}
}  // namespace

bool lora_targets_experts(const LoraConfig& l, ExpertProj p) {
  for (const std::string& t : l.target_parameters)
    if (expert_proj_of(t) == int(p)) return true;
  return false;
}

bool lora_has_expert_targets(const LoraConfig& l) {
  return lora_targets_experts(l, ExpertProj::gate_up) || lora_targets_experts(l, ExpertProj::down);
}

void check_lora_expert_targets(const ModelConfig& c, const LoraConfig& lora) {
  if (lora_has_expert_targets(lora) && c.num_moe_layers() == 0)
    throw std::invalid_argument(
        "lora.target_parameters: the model has no mixture-of-experts layer whose experts could take "
        "adapters");
}

void set_lora_targets(LoraConfig& l, const std::vector<std::string>& entries) {
  l.target_modules.clear();
  l.target_parameters.clear();
  for (std::string e : entries) {
    if (e.rfind("mlp.", 0) == 0 && e.rfind("mlp.experts", 0) == 0) e = e.substr(4);
    if (e == "experts") {
      l.target_parameters.assign(kExpertProjNames.begin(), kExpertProjNames.end());
    } else if (e.rfind("experts.", 0) == 0) {
      l.target_parameters.push_back("mlp." + e);
    } else {
      l.target_modules.push_back(e);
    }
  }
}

std::vector<std::pair<std::string, std::vector<int64_t>>> expert_lora_tensors(const ModelConfig& c,
                                                                              int64_t decoder, ExpertProj p,
                                                                              int64_t r) {
  const int64_t E = c.num_experts, H = c.hidden_size, Fe = c.moe_intermediate_size;
  const std::string s = fmt::format("model.layers.{}.mlp.experts.", decoder);
  if (p == ExpertProj::gate_up)
    return {{s + "gate_up_proj.lora_A.weight", {E, r, H}},
            {s + "gate_proj.lora_B.weight", {E, Fe, r}},
            {s + "up_proj.lora_B.weight", {E, Fe, r}}};
  return {{s + "down_proj.lora_A.weight", {E, r, Fe}}, {s + "down_proj.lora_B.weight", {E, H, r}}};
}

void validate_lora(const LoraConfig& l) {
  auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (l.r < 1) fail(fmt::format("lora.r: expected >= 1, got {}", l.r));
  if (!(l.alpha > 0) || !std::isfinite(l.alpha))
    fail(fmt::format("lora.alpha: expected a finite value > 0, got {}", l.alpha));
  if (!(l.dropout >= 0 && l.dropout < 1))
    fail(fmt::format("lora.dropout: expected 0 <= dropout < 1, got {}", l.dropout));
  if (l.target_modules.empty() && l.target_parameters.empty())
    fail("lora.target_modules: expected at least one module (or \"all-linear\"), got none");
  for (const std::string& t : l.target_parameters)
    if (expert_proj_of(t) < 0)
      fail(fmt::format("lora.target_parameters: unknown parameter '{}' (expected {})", one_line(t),
                       fmt::join(kExpertProjNames, " or ")));
  if (!l.target_parameters.empty() && l.dropout != 0)
    fail(fmt::format(
        "lora.dropout: expected 0 with lora.target_parameters (expert adapters take no dropout, as "
        "PEFT's ParamWrapper), got {}",
        l.dropout));
  for (const std::string& t : l.target_modules)
    if (t != "all-linear" && !is_module_name(t))
      fail(fmt::format("lora.target_modules: unknown module '{}' (expected {} or all-linear)", one_line(t),
                       fmt::join(kLoraModuleNames, ", ")));
  for (const std::string& t : l.modules_to_save)
    if (t != "embed_tokens" && t != "lm_head")
      fail(fmt::format("lora.modules_to_save: unknown module '{}' (expected embed_tokens or lm_head)",
                       one_line(t)));
}

bool lora_module_exists(const ModelConfig& c, int64_t decoder, LoraModule m) {
  return m < LoraModule::gate || !c.is_moe_layer(decoder);
}

bool lora_targets(const LoraConfig& l, LoraModule m) {
  for (const std::string& t : l.target_modules)
    if (t == "all-linear" || t == kLoraModuleNames[size_t(m)]) return true;
  return false;
}

ModelLayout make_layout(const ModelConfig& c, const LoraConfig& lora) {
  validate_lora(lora);
  ModelLayout m = make_layout(c);
  m.lora = lora;
  const int64_t L = c.num_hidden_layers;
  for (int64_t i = 0; i < L; ++i) {
    ParamGroup g{fmt::format("lora.{}", i), {}, 0};
    for (int k = 0; k < kLoraModules; ++k) {
      const auto mod = LoraModule(k);
      if (!lora_targets(lora, mod) || !lora_module_exists(c, i, mod)) continue;
      const auto [in, out] = lora_module_dims(c, mod);
      const std::string p = fmt::format("model.layers.{}.{}.", i, lora_module_path(mod));
      for (auto [name, shape] : {std::pair{p + "lora_A.weight", std::vector<int64_t>{lora.r, in}},
                                 std::pair{p + "lora_B.weight", std::vector<int64_t>{out, lora.r}}}) {
        TensorSpec t{name, shape, g.numel};
        g.numel += t.numel();
        g.tensors.push_back(std::move(t));
      }
    }
    for (int p = 0; p < kExpertProjs && c.is_moe_layer(i); ++p) {  // the experts' adapters follow
      if (!lora_targets_experts(lora, ExpertProj(p))) continue;
      for (auto& [name, shape] : expert_lora_tensors(c, i, ExpertProj(p), lora.r)) {
        TensorSpec t{name, shape, g.numel};
        g.numel += t.numel();
        g.tensors.push_back(std::move(t));
      }
    }
    m.groups.push_back(std::move(g));
  }
  // a named module that no layer has (gate_proj when every layer is sparse) would train nothing
  for (const std::string& t : lora.target_modules) {
    if (t == "all-linear") continue;
    bool found = false;
    for (int k = 0; k < kLoraModules && !found; ++k)
      if (t == kLoraModuleNames[size_t(k)])
        for (int64_t i = 0; i < L && !found; ++i) found = lora_module_exists(c, i, LoraModule(k));
    if (!found)
      throw std::invalid_argument(
          fmt::format("lora.target_modules: '{}' matches no linear of this model (every layer is a "
                      "mixture-of-experts layer, "
                      "whose experts take adapters through lora.target_parameters; target attention modules, "
                      "all-linear or "
                      "the experts)",
                      one_line(t)));
  }
  check_lora_expert_targets(c, lora);
  // Phi-3 (model/fused_projections.hpp): PEFT sees one module for q/k/v and one for gate/up
  for (const FusedProjection& f : fused_projections(c)) {
    int adapted = 0;
    for (const std::string& m : f.part_modules)
      for (int k = 0; k < kLoraModules; ++k)
        adapted += m == kLoraModuleNames[size_t(k)] && lora_targets(lora, LoraModule(k));
    if (adapted != 0 && adapted != int(f.part_modules.size()))
      throw std::invalid_argument(
          fmt::format("lora.target_modules: Phi-3 fuses {} into {} in its checkpoints and adapters; target "
                      "all of them or none",
                      fmt::join(f.part_modules, ", "), f.module));
  }
  // the base: frozen, but for modules_to_save (lm_head with tied embeddings is group 0)
  auto saved = [&](const char* name) {
    return std::find(lora.modules_to_save.begin(), lora.modules_to_save.end(), name) !=
           lora.modules_to_save.end();
  };
  const int head = int(L) + 1;
  std::vector<char> trainable(size_t(head) + 1, 0);
  if (saved("embed_tokens")) trainable[0] = 1;
  if (saved("lm_head")) trainable[c.tie_word_embeddings ? 0 : size_t(head)] = 1;
  for (int g = 0; g <= head; ++g)
    if (!trainable[size_t(g)]) freeze_group(m, g, lora.base_format);
  return m;
}

std::vector<float> lora_initial_group(const ModelLayout& m, int g) {
  if (!m.lora) throw std::invalid_argument("lora_initial_group: the layout has no LoRA adapters");
  const int L = int(m.config.num_hidden_layers);
  if (g < L + 2 || g > 2 * L + 1)
    throw std::invalid_argument(fmt::format(
        "lora_initial_group: group {} is not an adapter group (expected {}..{})", g, L + 2, 2 * L + 1));
  const ParamGroup& grp = m.groups[size_t(g)];
  std::vector<float> w(size_t(grp.numel), 0.0f);
  const uint64_t stream = mix64(m.lora->seed ^ mix64(0x4c6f5241u + uint64_t(g)));  // "LoRA"
  for (size_t ti = 0; ti < grp.tensors.size(); ++ti) {
    const TensorSpec& t = grp.tensors[ti];
    if (t.name.size() < 13 || t.name.compare(t.name.size() - 13, 13, "lora_A.weight") != 0)
      continue;                                                          // B = 0
    const float bound = float(1.0 / std::sqrt(double(t.shape.back())));  // 1/sqrt(in), experts' too
    for (int64_t i = 0; i < t.numel(); ++i)
      w[size_t(t.offset + i)] = bound * (2.0f * dropout_uniform(stream, ti, uint64_t(i)) - 1.0f);
  }
  return w;
}

}  // namespace rp
