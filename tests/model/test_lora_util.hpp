// Helpers of the LoRA layer tests: a tiny model with adapters (random base, random nonzero
// A and B) beside the plain model whose linears hold the merged weights W + s * B A.
#pragma once
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "model/lora.hpp"
#include "tests/model/test_layer_util.hpp"

namespace rp::test {

struct LoraTiny {
  ModelConfig c;
  LoraConfig lc;
  ModelLayout lay, plain;    // with adapters; without (same base groups)
  std::vector<VecF> params;  // per group of lay
  std::unique_ptr<Ops> ops = make_cpu_ops();

  LoraTiny(const TinyOpts& o, const LoraConfig& l, uint32_t seed = 1)
      : c(tiny_config(o)), lc(l), lay(make_layout(c, l)), plain(make_layout(c)) {
    TinyModel base(o, seed);  // its random base weights
    params = base.params;
    std::mt19937 g(seed + 100);
    std::normal_distribution<float> n(0.f, 1.f);
    for (size_t gi = plain.groups.size(); gi < lay.groups.size(); ++gi) {
      VecF p(size_t(lay.groups[gi].numel));
      for (auto& t : lay.groups[gi].tensors)
        for (int64_t i = 0; i < t.numel(); ++i) p[size_t(t.offset + i)] = 0.3f * n(g);
      params.push_back(std::move(p));
    }
  }
  float s() const { return float(lc.scaling()); }
  int L() const { return int(c.num_hidden_layers); }
  /// The tensor of group gi named "...<suffix>".
  const TensorSpec& tensor(int gi, const std::string& suffix) const {
    for (auto& t : lay.groups[size_t(gi)].tensors)
      if (t.name.size() >= suffix.size() &&
          t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return t;
    throw std::runtime_error("no tensor " + suffix);
  }
  /// Groups of `plain` with W' = W + s * B A for every adapted linear.
  std::vector<VecF> merged() const {
    std::vector<VecF> m(params.begin(), params.begin() + int64_t(plain.groups.size()));
    for (int layer = 1; layer <= L(); ++layer)
      for (int k = 0; k < kLoraModules; ++k) {
        if (!lora_targets(lc, LoraModule(k))) continue;
        const std::string p = lora_module_path(LoraModule(k));
        const TensorSpec& w = tensor(layer, p + ".weight");
        const int ag = lay.adapter_group(layer);
        const TensorSpec &ta = tensor(ag, fmt::format("layers.{}.{}.lora_A.weight", layer - 1, p)),
                         &tb = tensor(ag, fmt::format("layers.{}.{}.lora_B.weight", layer - 1, p));
        const int64_t out = w.shape[0], in = w.shape[1], r = lc.r;
        for (int64_t i = 0; i < out; ++i)
          for (int64_t j = 0; j < in; ++j) {
            double acc = 0;
            for (int64_t q = 0; q < r; ++q)
              acc += double(params[size_t(ag)][size_t(tb.offset + i * r + q)]) *
                     params[size_t(ag)][size_t(ta.offset + q * in + j)];
            m[size_t(layer)][size_t(w.offset + i * in + j)] += float(s() * acc);
          }
      }
    return m;
  }
  /// LayerArgs for compute layer l of layout m with parameter buffers `ps` (and gradients).
  LayerArgs args(const ModelLayout& m, const Layer& layer, int l, MicroBatchShape sh, std::vector<VecF>& ps,
                 std::vector<VecF>* grads, std::vector<float>& scratch) {
    LayerArgs a;
    a.ops = ops.get();
    a.shape = sh;
    for (int gi : m.groups_of(l)) {
      a.params.push_back(ps[size_t(gi)].data());
      if (grads) a.grads.push_back((*grads)[size_t(gi)].data());
    }
    const size_t bytes = layer.scratch_bytes(sh);
    scratch.assign(bytes / 4 + 1, std::nanf(""));
    a.scratch = scratch.data();
    a.scratch_bytes = bytes;
    return a;
  }
};

inline std::vector<VecF> zeros_like(const std::vector<VecF>& v) {
  std::vector<VecF> z;
  for (auto& x : v) z.emplace_back(x.size(), 0.0f);
  return z;
}

}  // namespace rp::test
