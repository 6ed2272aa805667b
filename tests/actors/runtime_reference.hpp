// Test support: a tiny random model and a plain sequential training loop over the same
// layers (no actors, no streams), with a textbook AdamW written here independently of
// optimizer/adamw.cpp. The runtime must reproduce it.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"
#include "model/layer.hpp"
#include "optimizer/adamw.hpp"

namespace rp::test {

/// ||a - b|| / ||b|| over the elements (relative error of a against the reference b).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

/// AdamW settings and learning rate of step t shared by the runtime tests (all options on).
inline AdamWOptions adam_opts() {
  AdamWOptions o;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  o.weight_decay = 0.01;
  return o;
}
inline double lr_at(int t) { return 1e-2 * (1.0 + 0.1 * t); }

inline ModelConfig tiny_config(bool qwen3, bool tied, int layers = 4) {
  ModelConfig c;
  c.architecture = qwen3 ? "qwen3" : "llama";
  c.vocab_size = 67;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  c.qk_norm = qwen3;
  c.max_position_embeddings = 256;
  return c;
}

/// tiny_config as a Qwen3-MoE: decoders 0, 2, 3 sparse (`experts` experts, top-2, expert FFN 16,
/// renormalised top-k), decoder 1 dense (mlp_only_layers); the load-balancing loss off.
inline ModelConfig tiny_moe_config(int64_t experts, bool tied) {
  ModelConfig c = tiny_config(true, tied, 4);
  c.architecture = "qwen3_moe";
  c.num_experts = experts;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  return c;
}

/// tiny_config as a GPT-OSS: every decoder sparse (4 experts, top-2, expert FFN 16, biased
/// router and experts, clamped SwiGLU), attention with biases and sinks, decoders 0 and 2
/// sliding (window 3), 1 and 3 full; the load-balancing loss on (coefficient 0.05).
inline ModelConfig tiny_gpt_oss_config() {
  ModelConfig c = tiny_config(false, false, 4);
  c.architecture = "gpt_oss";
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  c.attention_bias = true;
  c.attention_sinks = true;
  c.sliding_window = 3;
  c.layer_types = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  c.router_aux_loss_coef = 0.05;
  c.output_router_logits = true;
  return c;
}

inline std::vector<std::vector<float>> random_weights(const ModelLayout& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.08f);
  std::vector<std::vector<float>> w;
  for (auto& g : m.groups) {
    std::vector<float> v(g.numel);
    for (auto& t : g.tensors) {
      bool norm = t.shape.size() == 1;
      for (int64_t i = 0; i < t.numel(); ++i) v[t.offset + i] = norm ? 1.f + 0.1f * nd(rng) : nd(rng);
    }
    w.push_back(std::move(v));
  }
  return w;
}

/// The weights the devices compute with: a frozen group's values go through its storage form
/// (quantize_weights then dequantize_weights per tensor, the host twins of what the Session
/// stores and the devices dequantize); trainable groups are returned as given.
inline std::vector<std::vector<float>> computed_weights(const ModelLayout& m,
                                                        std::vector<std::vector<float>> w) {
  for (size_t g = 0; g < m.groups.size(); ++g) {
    if (!m.groups[g].frozen) continue;
    for (const TensorSpec& t : m.groups[g].tensors) {
      const int64_t cols = weight_format_cols(t.shape);
      std::vector<unsigned char> q(weight_format_bytes(t.format, t.numel(), cols));
      quantize_weights(t.format, w[g].data() + t.offset, q.data(), t.numel(), cols);
      dequantize_weights(t.format, q.data(), w[g].data() + t.offset, t.numel(), cols);
    }
  }
  return w;
}

/// ids/targets for `steps` steps of `n` tokens each (targets = next id, some ignored).
inline void random_tokens(int64_t vocab, int64_t n, uint64_t seed, std::vector<int32_t>& ids,
                          std::vector<int32_t>& targets) {
  std::mt19937_64 rng(seed);
  ids.resize(n);
  targets.resize(n);
  for (auto& x : ids) x = int32_t(rng() % vocab);
  for (int64_t i = 0; i < n; ++i) targets[i] = (rng() % 7 == 0) ? -100 : int32_t(rng() % vocab);
}

/// Textbook AdamW (Loshchilov & Hutter 2019, Alg. 2, torch.optim.AdamW form).
struct TextbookAdamW {
  std::vector<double> m, v;
  int64_t t = 0;
  void step(std::vector<float>& w, const std::vector<double>& g, const AdamWOptions& o, double lr) {
    if (m.empty()) m.assign(w.size(), 0), v.assign(w.size(), 0);
    ++t;
    const double bc1 = 1 - std::pow(o.beta1, double(t)), bc2 = 1 - std::pow(o.beta2, double(t));
    for (size_t i = 0; i < w.size(); ++i) {
      double wi = double(w[i]) * (1 - lr * o.weight_decay);
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      wi -= lr * (m[i] / bc1) / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
      w[i] = float(wi);
    }
  }
};

/// Runs layers 0..L+1 sequentially over `micro_batches` micro-batches of shape `s` with
/// weights `w`; returns the summed loss and target count, and the summed gradients. A frozen
/// group's layers get a null gradient pointer (its `grads` entry stays zero); give its weights
/// as computed_weights() returns them. Sparse (mixture-of-experts) models gather each
/// micro-batch's router statistics over its forward pass and, with the load-balancing loss on,
/// add coefficient x aux x target tokens to `loss` and its gradient (as transformers' loss,
/// mean CE + coefficient x aux, per micro-batch); `expert_tokens` (if given) receives the
/// assignments per expert summed over micro-batches and sparse layers.
inline void sequential_forward_backward(const ModelLayout& m, const std::vector<std::vector<float>>& w,
                                        const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                                        int64_t micro_batches, MicroBatchShape s,
                                        std::vector<std::vector<double>>& grads, double& loss, double& count,
                                        std::vector<double>* expert_tokens = nullptr) {
  auto ops = make_cpu_ops();
  const int L = m.num_layers();
  std::vector<std::unique_ptr<Layer>> layers;
  size_t scratch = 0;
  for (int l = 0; l < L; ++l) {
    layers.push_back(make_layer(m, l));
    scratch = std::max(scratch, layers.back()->scratch_bytes(s));
  }
  std::vector<char> scr(scratch + 256);
  const int64_t T = s.tokens(), H = m.config.hidden_size;
  const int64_t E = m.config.num_moe_layers() > 0 ? m.config.num_experts : 0;
  for (int64_t mb = 0; mb < micro_batches; ++mb) {
    std::vector<float> stats(size_t(2 * E), 0.f);
    double n_targets = 0;
    for (int64_t i = 0; i < T; ++i) n_targets += targets[size_t(mb * T + i)] >= 0;
    std::vector<std::vector<float>> x(L, std::vector<float>(T * H));
    std::vector<std::vector<float>> g32(m.groups.size());
    for (size_t g = 0; g < g32.size(); ++g) g32[g].assign(w[g].size(), 0.f);
    auto args = [&](int l) {
      LayerArgs a;
      a.ops = ops.get();
      a.shape = s;
      for (int g : m.groups_of(l)) {
        a.params.push_back(w[g].data());
        a.grads.push_back(m.groups[size_t(g)].frozen ? nullptr : g32[g].data());
      }
      a.scratch = scr.data();
      a.scratch_bytes = scratch;
      a.ids = ids.data() + mb * T;
      if (E > 0) a.moe_stats = stats.data();
      return a;
    };
    for (int l = 0; l < L - 1; ++l) {
      LayerArgs a = args(l);
      a.x = l ? x[l].data() : nullptr;
      std::vector<float>& y = (l + 1 < L) ? x[l + 1] : x[l];
      a.y = y.data();
      layers[l]->forward(a);
    }
    std::vector<float> dy(T * H), dx(T * H);
    float lossbuf[2] = {0, 0};
    LayerArgs ta = args(L - 1);
    ta.x = x[L - 1].data();
    ta.targets = targets.data() + mb * T;
    ta.loss = lossbuf;
    ta.dx = dy.data();
    layers[L - 1]->backward(ta);
    loss += lossbuf[0];
    count += lossbuf[1];
    if (E > 0) {
      const double rows = double(m.config.num_moe_layers()) * double(T);
      double aux = 0;
      for (int64_t e = 0; e < E; ++e)
        aux += double(stats[size_t(e)]) / rows * (double(stats[size_t(E + e)]) / rows);
      loss += m.config.aux_loss_coef() * double(E) * aux * n_targets;
      if (expert_tokens) {
        expert_tokens->resize(size_t(E), 0.0);
        for (int64_t e = 0; e < E; ++e) (*expert_tokens)[size_t(e)] += stats[size_t(e)];
      }
    }
    for (int l = L - 2; l >= 0; --l) {
      LayerArgs a = args(l);
      a.x = l ? x[l].data() : nullptr;
      a.dy = dy.data();
      a.moe_aux_scale = float(m.config.aux_loss_coef() * n_targets);
      a.dx = l ? dx.data() : nullptr;
      layers[l]->backward(a);
      std::swap(dx, dy);
    }
    for (size_t g = 0; g < g32.size(); ++g)
      for (size_t i = 0; i < g32[g].size(); ++i) grads[g][i] += g32[g][i];
  }
}

}  // namespace rp::test
