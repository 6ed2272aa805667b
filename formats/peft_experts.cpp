// The experts' LoRA adapters in PEFT's form (formats/peft_experts.hpp).
#include "formats/peft_experts.hpp"

#include <algorithm>
#include <regex>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/error_text.hpp"
#include "model/lora.hpp"

namespace rp {

namespace {

// "model.layers.<i>.mlp.experts." plus "base_layer." for the inner wrapper
std::string peft_stem(const LoraConfig& l, int64_t decoder, ExpertProj p) {
  const bool nested = p == ExpertProj::gate_up && lora_targets_experts(l, ExpertProj::down);
  return fmt::format("model.layers.{}.mlp.experts.{}", decoder, nested ? "base_layer." : "");
}

// PEFT's lora_B [*, r*E] rows row0, row0 + step, ... from ours [E, out, r]
void put_b(const float* ours, int64_t E, int64_t out, int64_t r, int64_t row0, int64_t step, float* peft) {
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t q = 0; q < r; ++q)
        peft[(row0 + o * step) * r * E + q * E + e] = ours[(e * out + o) * r + q];
}
// ours [E, out, r] from PEFT's lora_B rows [row0, row0 + out) of [*, r*E]
std::vector<float> get_b(const float* peft, int64_t E, int64_t out, int64_t r, int64_t row0) {
  std::vector<float> v(size_t(E * out * r));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t q = 0; q < r; ++q) v[size_t((e * out + o) * r + q)] = peft[(row0 + o) * r * E + q * E + e];
  return v;
}

}  // namespace

std::map<std::string, HostTensor> gpt_oss_gate_up(const std::map<std::string, HostTensor>& tensors,
                                                  const ModelConfig& c) {
  std::map<std::string, HostTensor> out;
  if (!c.gpt_oss()) return out;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string stem = fmt::format("model.layers.{}.mlp.experts.", i);
    const auto g = tensors.find(stem + "gate_proj.lora_B.weight"),
               u = tensors.find(stem + "up_proj.lora_B.weight");
    if (g == tensors.end() || u == tensors.end() || g->second.shape != u->second.shape ||
        g->second.shape.size() != 3)
      continue;
    const int64_t E = g->second.shape[0], Fe = g->second.shape[1], r = g->second.shape[2];
    HostTensor gate{g->second.shape, std::vector<float>(g->second.data.size())}, up = gate;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t p = 0; p < 2 * Fe; ++p) {  // PEFT's row p, split as gate rows first, then up rows
        const float* src = p < Fe ? &g->second.data[size_t((e * Fe + p) * r)]
                                  : &u->second.data[size_t((e * Fe + p - Fe) * r)];
        std::copy_n(src, r, (p % 2 == 0 ? gate : up).data.data() + (e * Fe + p / 2) * r);
      }
    out[g->first] = std::move(gate);
    out[u->first] = std::move(up);
  }
  return out;
}

bool is_peft_expert_key(const std::string& name) {
  static const std::regex re(R"(model\.layers\.\d+\.mlp\.experts\.(base_layer\.)?lora_[AB]\.weight)");
  return std::regex_match(name, re);
}

std::map<std::string, HostTensor> peft_expert_tensors(const ModelLayout& layout, int64_t decoder,
                                                      const float* group) {
  std::map<std::string, HostTensor> out;
  const ModelConfig& c = layout.config;
  if (!layout.lora || !c.is_moe_layer(decoder)) return out;
  const LoraConfig& l = *layout.lora;
  const ParamGroup& g = layout.groups.at(size_t(layout.adapter_group(int(decoder) + 1)));
  const int64_t E = c.num_experts, r = l.r;
  auto tensor = [&](const std::string& name) -> const float* {
    const int i = g.find(name);
    if (i < 0)
      throw std::invalid_argument(fmt::format("peft_expert_tensors: group '{}' lacks {}", g.name, name));
    return group + g.tensors[size_t(i)].offset;
  };
  for (int p = 0; p < kExpertProjs; ++p) {
    if (!lora_targets_experts(l, ExpertProj(p))) continue;
    const auto specs = expert_lora_tensors(c, decoder, ExpertProj(p), r);
    const std::string stem = peft_stem(l, decoder, ExpertProj(p));
    const auto& a_shape = specs[0].second;  // [E, r, in]
    const float* a = tensor(specs[0].first);
    HostTensor ta{{E * r, a_shape[2]}, std::vector<float>(a, a + E * r * a_shape[2])};
    int64_t rows = 0;
    for (size_t k = 1; k < specs.size(); ++k) rows += specs[k].second[1];
    HostTensor tb{{rows, r * E}, std::vector<float>(size_t(rows * r * E))};
    // gate rows, then up rows (or down's); GPT-OSS interleaves gate and up
    const bool interleaved = c.gpt_oss() && specs.size() == 3;
    int64_t row0 = 0;
    for (size_t k = 1; k < specs.size(); ++k) {
      const int64_t o = specs[k].second[1];
      put_b(tensor(specs[k].first), E, o, r, interleaved ? int64_t(k - 1) : row0, interleaved ? 2 : 1,
            tb.data.data());
      row0 += o;
    }
    out[stem + "lora_A.weight"] = std::move(ta);
    out[stem + "lora_B.weight"] = std::move(tb);
  }
  return out;
}

void expert_tensors_from_peft(const LoraConfig& l, std::map<std::string, HostTensor>& tensors,
                              const std::string& where) {
  static const std::regex re(R"(model\.layers\.(\d+)\.mlp\.experts\.(base_layer\.)?lora_([AB])\.weight)");
  std::map<std::string, HostTensor> converted;
  for (auto it = tensors.begin(); it != tensors.end();) {
    std::smatch m;
    if (!std::regex_match(it->first, m, re)) {
      ++it;
      continue;
    }
    auto bad = [&](const std::string& what) {
      throw std::runtime_error(
          one_line(fmt::format("{}: key 'base_model.model.{}': {}", where, it->first, what)));
    };
    const bool inner = m[2].matched, is_a = m[3] == "A";
    const bool gu = lora_targets_experts(l, ExpertProj::gate_up),
               down = lora_targets_experts(l, ExpertProj::down);
    // the nesting of PEFT's wrappers (formats/peft_experts.hpp)
    ExpertProj p;
    if (inner) {
      if (!(gu && down))
        bad("a nested expert wrapper, but target_parameters does not name both gate_up_proj and down_proj");
      p = ExpertProj::gate_up;
    } else if (gu && down) {
      p = ExpertProj::down;
    } else if (gu || down) {
      p = gu ? ExpertProj::gate_up : ExpertProj::down;
    } else {
      bad("an expert adapter, but target_parameters names no expert parameter");
    }
    const std::string stem = fmt::format("model.layers.{}.mlp.experts.", m[1].str());
    const HostTensor& t = it->second;
    const int64_t r = l.r;
    if (t.shape.size() != 2) bad(fmt::format("expected 2 dimensions, got [{}]", fmt::join(t.shape, ", ")));
    if (is_a) {
      if (t.shape[0] % r != 0)
        bad(fmt::format("expected [E*r, in] with r = {}, got [{}]", r, fmt::join(t.shape, ", ")));
      const int64_t E = t.shape[0] / r;
      converted[stem + (p == ExpertProj::gate_up ? "gate_up_proj" : "down_proj") + ".lora_A.weight"] =
          HostTensor{{E, r, t.shape[1]}, t.data};
    } else {
      if (t.shape[1] % r != 0 || (p == ExpertProj::gate_up && t.shape[0] % 2 != 0))
        bad(fmt::format("expected [out, r*E] with r = {}{}, got [{}]", r,
                        p == ExpertProj::gate_up ? " and out even" : "", fmt::join(t.shape, ", ")));
      const int64_t E = t.shape[1] / r;
      if (p == ExpertProj::gate_up) {
        const int64_t Fe = t.shape[0] / 2;
        converted[stem + "gate_proj.lora_B.weight"] =
            HostTensor{{E, Fe, r}, get_b(t.data.data(), E, Fe, r, 0)};
        converted[stem + "up_proj.lora_B.weight"] =
            HostTensor{{E, Fe, r}, get_b(t.data.data(), E, Fe, r, Fe)};
      } else {
        converted[stem + "down_proj.lora_B.weight"] =
            HostTensor{{E, t.shape[0], r}, get_b(t.data.data(), E, t.shape[0], r, 0)};
      }
    }
    it = tensors.erase(it);
  }
  for (auto& [k, v] : converted) tensors[k] = std::move(v);
}

}  // namespace rp
