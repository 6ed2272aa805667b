// Helpers for the layer tests: tiny configs, random parameters, LayerArgs plumbing on
// the CPU ops (no Device needed; buffers are std::vectors).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
#include "model/layer.hpp"
#include "model/layers.hpp"
#include "model/layout.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp::test {

using ref::VecD;
using ref::VecF;

struct TinyOpts {
  bool qwen3 = false;
  bool tied = false;
  std::string rope = "default";
  int64_t pad_token_id = -1;  ///< config.json's pad_token_id (-1: none)
};

inline std::string opts_name(const TinyOpts& o) {
  return std::string(o.qwen3 ? "qwen3" : "llama") + (o.tied ? "_tied" : "_untied") + "_" + o.rope;
}

/// hidden 32, 4 heads / 2 kv heads, head_dim 8, ffn 48, vocab 67, 2 layers.
inline ModelConfig tiny_config(const TinyOpts& o) {
  ModelConfig c;
  c.architecture = o.qwen3 ? "qwen3" : "llama";
  c.vocab_size = 67;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100.0;  // small base: positions 0..7 rotate noticeably
  c.tie_word_embeddings = o.tied;
  c.pad_token_id = o.pad_token_id;
  c.qk_norm = o.qwen3;
  c.max_position_embeddings = 64;
  c.rope_scaling.type = o.rope;
  if (o.rope == "yarn") {
    c.rope_scaling.factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 16;
  } else if (o.rope == "llama3") {
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.original_max_position_embeddings = 16;
  } else if (o.rope == "linear") {
    c.rope_scaling.factor = 2.0;
  } else if (o.rope == "longrope") {  // factor derived: 64 / 16
    c.rope_scaling.factor = 0.0;
    c.rope_scaling.original_max_position_embeddings = 16;
    c.rope_scaling.short_factor = {1.0, 1.5, 2.5, 4.0};
    c.rope_scaling.long_factor = {1.5, 3.0, 6.0, 11.0};
  }
  return c;
}

/// A model's parameters in host vectors (one per group) and its layers.
struct TinyModel {
  ModelLayout layout;
  std::vector<VecF> params;
  std::vector<std::unique_ptr<Layer>> layers;
  std::unique_ptr<Ops> ops = make_cpu_ops();

  explicit TinyModel(const TinyOpts& o, uint32_t seed = 1) : layout(make_layout(tiny_config(o))) {
    std::mt19937 g(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    for (auto& grp : layout.groups) {
      VecF p(size_t(grp.numel));
      for (auto& t : grp.tensors) {
        const bool norm = t.shape.size() == 1;
        const float sd = norm ? 0.1f : 1.0f / std::sqrt(float(t.shape[1]));
        for (int64_t i = 0; i < t.numel(); ++i) p[size_t(t.offset + i)] = norm ? 1.0f + sd * n(g) : sd * n(g);
      }
      params.push_back(std::move(p));
    }
    for (int l = 0; l < layout.num_layers(); ++l) layers.push_back(make_layer(layout, l));
  }
  int tail() const { return layout.num_layers() - 1; }
  /// Zeroed gradient buffers, one per group.
  std::vector<VecF> zero_grads() const {
    std::vector<VecF> gr;
    for (auto& p : params) gr.emplace_back(p.size(), 0.0f);
    return gr;
  }
  /// LayerArgs for `layer` reading params (and grads if given); scratch sized and
  /// poisoned with NaN.
  LayerArgs args(int layer, MicroBatchShape s, std::vector<VecF>* grads, std::vector<float>& scratch) {
    LayerArgs a;
    a.ops = ops.get();
    a.shape = s;
    for (int gi : layout.groups_of(layer)) {
      a.params.push_back(params[size_t(gi)].data());
      if (grads) a.grads.push_back((*grads)[size_t(gi)].data());
    }
    size_t bytes = layers[size_t(layer)]->scratch_bytes(s);
    scratch.assign(bytes / 4 + 1, std::nanf(""));
    a.scratch = scratch.data();
    a.scratch_bytes = bytes;
    return a;
  }
  /// The whole model's forward and backward over `ids` and `targets` (-100: none), adding every
  /// gradient into `grads` (one buffer per group); `before_embedding`, when given, runs once the
  /// backward has reached the embedding and before the embedding's own backward. Returns the
  /// loss sum.
  float backward(MicroBatchShape s, const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                 std::vector<VecF>& grads, const std::function<void()>& before_embedding = {}) {
    const int64_t T = s.tokens(), H = layout.config.hidden_size;
    const int L = tail();
    std::vector<VecF> acts(size_t(L), VecF(size_t(T * H)));  // input of layer l+1
    std::vector<float> scratch;
    LayerArgs e = args(0, s, nullptr, scratch);
    e.ids = ids.data();
    e.y = acts[0].data();
    layers[0]->forward(e);
    for (int l = 1; l < L; ++l) {
      LayerArgs d = args(l, s, nullptr, scratch);
      d.x = acts[size_t(l - 1)].data();
      d.y = acts[size_t(l)].data();
      layers[size_t(l)]->forward(d);
    }
    VecF g(size_t(T * H)), g2(size_t(T * H));
    float lo[2];
    LayerArgs t = args(L, s, &grads, scratch);
    t.x = acts[size_t(L - 1)].data();
    t.targets = targets.data();
    t.loss = lo;
    t.dx = g.data();
    layers[size_t(L)]->backward(t);
    for (int l = L - 1; l >= 1; --l) {
      LayerArgs d = args(l, s, &grads, scratch);
      d.x = acts[size_t(l - 1)].data();
      d.dy = g.data();
      d.dx = g2.data();
      layers[size_t(l)]->backward(d);
      std::swap(g, g2);
    }
    if (before_embedding) before_embedding();
    LayerArgs eb = args(0, s, &grads, scratch);
    eb.ids = ids.data();
    eb.dy = g.data();
    layers[0]->backward(eb);
    return lo[0];
  }
  const TensorSpec& tensor(int group, const std::string& suffix) const {
    for (auto& t : layout.groups[size_t(group)].tensors)
      if (t.name.size() >= suffix.size() &&
          t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return t;
    throw std::runtime_error("no tensor " + suffix);
  }
};

inline std::vector<int32_t> random_ids(int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> v(static_cast<size_t>(T));
  for (auto& x : v) x = int32_t(g() % uint32_t(V));
  return v;
}

inline double dotf(const VecF& a, const VecF& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

/// Central differences in fp32 of f at sampled coordinates of `x` (perturbed in place,
/// restored), vs analytic gradient `g` (same indexing, offset `g_off`). Relative error
/// of the sampled vectors must stay below tol.
inline void fd_check(const std::function<double()>& f, float* x, int64_t n, const float* g, int samples,
                     double tol, const std::string& what, uint32_t seed = 3, float h = 1e-2f) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> d(0, n - 1);
  VecF a;
  VecD num;
  for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
    int64_t i = n <= samples ? s : d(gen);
    const float x0 = x[i];
    x[i] = x0 + h;
    double fp = f();
    x[i] = x0 - h;
    double fm = f();
    x[i] = x0;
    num.push_back((fp - fm) / (2.0 * double(h)));
    a.push_back(g[i]);
  }
  double e = ref::rel_err(a, num);
  EXPECT_LT(e, tol) << what << ": relative error " << e;
}

}  // namespace rp::test
