// A LoRA layout built in the test, following the shared contract of make_layout(config, lora)
// (roundpipe/model.hpp, ModelLayout::lora) exactly, so the adapter-file tests do not depend on
// the runtime's builder: groups 0..L+1 of make_layout(config), then "lora.<i>" = group L+2+i
// with "<module>.lora_A.weight" [r, in] and "<module>.lora_B.weight" [out, r] per target
// module in the base group's order (q, k, v, o, gate, up, down); base groups frozen but for
// modules_to_save (embed_tokens -> group 0; lm_head -> the head group, or group 0 when tied).
#pragma once
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "roundpipe/adapter.hpp"
#include "roundpipe/model.hpp"

namespace rp::test {

inline void add_tensor(ParamGroup& g, std::string name, std::vector<int64_t> shape) {
  TensorSpec t{std::move(name), std::move(shape), g.numel};
  g.numel += t.numel();
  g.tensors.push_back(std::move(t));
}

inline ModelLayout lora_test_layout(const ModelConfig& c, const LoraConfig& lora) {
  ModelLayout m = make_layout(c);
  m.lora = lora;
  const auto targets = lora_target_list(lora);
  const int L = int(c.num_hidden_layers);
  for (int i = 0; i < L; ++i) {
    ParamGroup g{fmt::format("lora.{}", i), {}, 0};
    for (const TensorSpec& t : m.groups[size_t(i + 1)].tensors) {
      const std::string stem = t.name.substr(0, t.name.size() - std::strlen(".weight"));
      const std::string module = stem.substr(stem.rfind('.') + 1);
      if (t.shape.size() != 2 || std::find(targets.begin(), targets.end(), module) == targets.end()) continue;
      add_tensor(g, stem + ".lora_A.weight", {lora.r, t.shape[1]});
      add_tensor(g, stem + ".lora_B.weight", {t.shape[0], lora.r});
    }
    m.groups.push_back(std::move(g));
  }
  const std::set<std::string> mts(lora.modules_to_save.begin(), lora.modules_to_save.end());
  std::set<int> trainable;
  if (mts.count("embed_tokens")) trainable.insert(0);
  if (mts.count("lm_head")) trainable.insert(c.tie_word_embeddings ? 0 : L + 1);
  for (int g = 0; g <= L + 1; ++g)
    if (!trainable.count(g)) freeze_group(m, g, lora.base_format);
  return m;
}

/// Copies `tensors` (HF names) into the base groups 0..L+1; other groups are sized and zero.
inline std::vector<std::vector<float>> base_groups(const ModelLayout& m,
                                                   const std::map<std::string, HostTensor>& tensors) {
  std::vector<std::vector<float>> g(m.groups.size());
  for (size_t i = 0; i < m.groups.size(); ++i) {
    g[i].assign(size_t(m.groups[i].numel), 0.0f);
    for (const TensorSpec& t : m.groups[i].tensors) {
      auto it = tensors.find(t.name);
      if (it != tensors.end())
        std::memcpy(g[i].data() + t.offset, it->second.data.data(), size_t(t.numel()) * 4);
    }
  }
  return g;
}

/// Random values (scale `s`) in every group of `m` from `first` on.
inline void randomise(std::vector<std::vector<float>>& g, size_t first, float s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, s);
  for (size_t i = first; i < g.size(); ++i)
    for (float& x : g[i]) x = n(rng);
}

inline std::vector<const float*> pointers(const std::vector<std::vector<float>>& g) {
  std::vector<const float*> p;
  for (const auto& v : g) p.push_back(v.data());
  return p;
}

}  // namespace rp::test
