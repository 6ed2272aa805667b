// Per-expert LoRA adapters (LoraConfig::target_parameters) on the sparse MLP block of a tiny
// Qwen3-MoE (layer 0 sparse, layer 1 dense): layout names and shapes, the spec checks, and the
// decoder with expert adapters against the plain decoder whose stacked expert weights hold the
// merged W_e + s B_e A_e (forward y; backward dx, and dA_e = s B_e^T dW_e, dB_e = s dW_e A_e^T
// from the merged layer's expert weight gradients dW_e), with the base frozen or not.
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "model/lora.hpp"
#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

ModelConfig tiny_moe() {
  ModelConfig c = tiny_config(TinyOpts{true, false, "default"});
  c.architecture = "qwen3_moe";
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  return c;
}

LoraConfig experts_lora(std::vector<std::string> params, std::vector<std::string> modules = {"q_proj"}) {
  LoraConfig l;
  l.r = 3;
  l.alpha = 5;
  l.target_modules = std::move(modules);
  l.target_parameters = std::move(params);
  return l;
}

TEST(LoraExperts, LayoutNamesAndShapes) {
  const ModelConfig c = tiny_moe();
  const ModelLayout m = make_layout(c, experts_lora({"mlp.experts.gate_up_proj", "down_proj"}));
  const ParamGroup& g0 = m.groups[size_t(m.adapter_group(1))];
  const int64_t E = 4, H = 32, Fe = 12, r = 3;
  auto shape = [&](const ParamGroup& g, const std::string& n) {
    const int i = g.find(n);
    return i < 0 ? std::vector<int64_t>{} : g.tensors[size_t(i)].shape;
  };
  const std::string p = "model.layers.0.mlp.experts.";
  EXPECT_EQ(shape(g0, p + "gate_up_proj.lora_A.weight"), (std::vector<int64_t>{E, r, H}));
  EXPECT_EQ(shape(g0, p + "gate_proj.lora_B.weight"), (std::vector<int64_t>{E, Fe, r}));
  EXPECT_EQ(shape(g0, p + "up_proj.lora_B.weight"), (std::vector<int64_t>{E, Fe, r}));
  EXPECT_EQ(shape(g0, p + "down_proj.lora_A.weight"), (std::vector<int64_t>{E, r, Fe}));
  EXPECT_EQ(shape(g0, p + "down_proj.lora_B.weight"), (std::vector<int64_t>{E, H, r}));
  EXPECT_EQ(g0.tensors.size(), 2u + 5u);  // q_proj's A, B and the experts'
  // the dense layer has no experts: only q_proj
  EXPECT_EQ(m.groups[size_t(m.adapter_group(2))].tensors.size(), 2u);
  // only down_proj: no gate/up tensors
  const ModelLayout d = make_layout(c, experts_lora({"down_proj"}, {}));
  EXPECT_EQ(d.groups[size_t(d.adapter_group(1))].tensors.size(), 2u);
  EXPECT_TRUE(d.groups[size_t(d.adapter_group(2))].tensors.empty());
  // initial A is U(-1/sqrt(in), 1/sqrt(in)) with in the last dimension, B zero
  const std::vector<float> w = lora_initial_group(m, m.adapter_group(1));
  const TensorSpec& a = g0.tensors[size_t(g0.find(p + "down_proj.lora_A.weight"))];
  float amax = 0;
  for (int64_t i = 0; i < a.numel(); ++i) amax = std::max(amax, std::abs(w[size_t(a.offset + i)]));
  EXPECT_LE(amax, 1.0f / std::sqrt(float(Fe)));
  EXPECT_GT(amax, 0.5f / std::sqrt(float(Fe)));
  const TensorSpec& b = g0.tensors[size_t(g0.find(p + "down_proj.lora_B.weight"))];
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(w[size_t(b.offset + i)], 0.f);
}

TEST(LoraExperts, ValidationNamesTheField) {
  const ModelConfig c = tiny_moe();
  auto msg = [&](const LoraConfig& l, const ModelConfig& cfg) {
    try {
      make_layout(cfg, l);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg(experts_lora({"mlp.experts.up_proj"}), c).find("lora.target_parameters: unknown parameter"),
            std::string::npos);
  LoraConfig drop = experts_lora({"down_proj"});
  drop.dropout = 0.1;
  EXPECT_NE(msg(drop, c).find("lora.dropout: expected 0 with lora.target_parameters"), std::string::npos);
  ModelConfig dense = tiny_config(TinyOpts{true, false, "default"});
  EXPECT_NE(msg(experts_lora({"down_proj"}), dense).find("no mixture-of-experts layer"), std::string::npos);
  // experts alone need no target_modules; neither at all is refused
  EXPECT_EQ(msg(experts_lora({"down_proj"}, {}), c), "");
  EXPECT_NE(msg(experts_lora({}, {}), c).find("lora.target_modules"), std::string::npos);
}

// The model with expert adapters (random base, random nonzero A and B) and the plain model
// whose stacked expert weights hold W_e + s B_e A_e.
struct ExpertTiny {
  ModelConfig c = tiny_moe();
  LoraConfig lc;
  ModelLayout lay, plain;
  std::vector<VecF> params;
  std::unique_ptr<Ops> ops = make_cpu_ops();
  explicit ExpertTiny(const LoraConfig& l) : lc(l), lay(make_layout(c, l)), plain(make_layout(c)) {
    std::mt19937 g(7);
    std::normal_distribution<float> n(0.f, 1.f);
    for (size_t gi = 0; gi < lay.groups.size(); ++gi) {
      VecF p(size_t(lay.groups[gi].numel));
      for (auto& t : lay.groups[gi].tensors) {
        const bool norm = t.shape.size() == 1;
        const float sd = gi >= plain.groups.size() ? 0.3f : norm ? 0.1f : 0.2f;
        for (int64_t i = 0; i < t.numel(); ++i) p[size_t(t.offset + i)] = (norm ? 1.f : 0.f) + sd * n(g);
      }
      params.push_back(std::move(p));
    }
  }
  float s() const { return float(lc.scaling()); }
  const TensorSpec& t(int gi, const std::string& name) const {
    const ParamGroup& g = lay.groups[size_t(gi)];
    const int i = g.find(name);
    if (i < 0) throw std::runtime_error("no tensor " + name);
    return g.tensors[size_t(i)];
  }
  // (base weight of expert e, A, B, rows of B used, first row of B) for each adapted projection
  struct Proj {
    std::string w, a, b;
    int64_t out, in;
  };
  std::vector<Proj> projs(int layer) const {
    const std::string p = fmt::format("model.layers.{}.mlp.experts.", layer - 1);
    std::vector<Proj> out;
    const int64_t H = c.hidden_size, Fe = c.moe_intermediate_size;
    if (lora_targets_experts(lc, ExpertProj::gate_up)) {
      out.push_back({"gate_proj", p + "gate_up_proj.lora_A.weight", p + "gate_proj.lora_B.weight", Fe, H});
      out.push_back({"up_proj", p + "gate_up_proj.lora_A.weight", p + "up_proj.lora_B.weight", Fe, H});
    }
    if (lora_targets_experts(lc, ExpertProj::down))
      out.push_back({"down_proj", p + "down_proj.lora_A.weight", p + "down_proj.lora_B.weight", H, Fe});
    return out;
  }
  std::vector<VecF> merged() const {
    std::vector<VecF> m(params.begin(), params.begin() + int64_t(plain.groups.size()));
    const int layer = 1, ag = lay.adapter_group(layer);
    const int64_t r = lc.r;
    for (const Proj& pr : projs(layer))
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const TensorSpec& w = t(layer, fmt::format("model.layers.0.mlp.experts.{}.{}.weight", e, pr.w));
        const float* A = params[size_t(ag)].data() + t(ag, pr.a).offset + e * r * pr.in;
        const float* B = params[size_t(ag)].data() + t(ag, pr.b).offset + e * pr.out * r;
        for (int64_t i = 0; i < pr.out; ++i)
          for (int64_t j = 0; j < pr.in; ++j) {
            double acc = 0;
            for (int64_t q = 0; q < r; ++q) acc += double(B[i * r + q]) * A[q * pr.in + j];
            m[size_t(layer)][size_t(w.offset + i * pr.in + j)] += float(s() * acc);
          }
      }
    return m;
  }
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

std::vector<VecF> zeros(const std::vector<VecF>& v) {
  std::vector<VecF> z;
  for (auto& x : v) z.emplace_back(x.size(), 0.0f);
  return z;
}

class LoraExpertLayer : public ::testing::TestWithParam<std::vector<std::string>> {};

constexpr MicroBatchShape kShape{2, 5};

TEST_P(LoraExpertLayer, ForwardEqualsMergedExperts) {
  ExpertTiny t(experts_lora(GetParam(), {}));
  std::vector<VecF> merged = t.merged(), base = t.params;
  const int64_t T = kShape.tokens(), H = t.c.hidden_size;
  VecF x = ref::randn(size_t(T * H), 5);
  auto la = make_layer(t.lay, 1), pl = make_layer(t.plain, 1);
  VecF y = ref::nan_vec(x.size()), yp = ref::nan_vec(x.size()), yb = ref::nan_vec(x.size());
  std::vector<float> s1, s2;
  LayerArgs a = t.args(t.lay, *la, 1, kShape, t.params, nullptr, s1);
  a.x = x.data();
  a.y = y.data();
  la->forward(a);
  LayerArgs b = t.args(t.plain, *pl, 1, kShape, merged, nullptr, s2);
  b.x = x.data();
  b.y = yp.data();
  pl->forward(b);
  EXPECT_LT(ref::rel_err(y, yp), 1e-5);
  b = t.args(t.plain, *pl, 1, kShape, base, nullptr, s2);
  b.x = x.data();
  b.y = yb.data();
  pl->forward(b);
  EXPECT_GT(ref::rel_err(y, yb), 1e-3);  // the adapters change the output
  // MLP chunks of 3 tokens (routing and the adapters per chunk) give the same output
  LayerOptions o;
  o.mlp_chunk_tokens = 3;
  auto lc = make_layer(t.lay, 1, o);
  VecF yc = ref::nan_vec(x.size());
  LayerArgs c = t.args(t.lay, *lc, 1, kShape, t.params, nullptr, s1);
  c.x = x.data();
  c.y = yc.data();
  lc->forward(c);
  EXPECT_LT(ref::rel_err(yc, y), 1e-6);
}

TEST_P(LoraExpertLayer, BackwardMatchesMergedExperts) {
  ExpertTiny t(experts_lora(GetParam(), {}));
  std::vector<VecF> merged = t.merged();
  const int64_t T = kShape.tokens(), H = t.c.hidden_size, r = t.lc.r;
  VecF x = ref::randn(size_t(T * H), 5), dy = ref::randn(size_t(T * H), 6);
  auto la = make_layer(t.lay, 1), pl = make_layer(t.plain, 1);
  std::vector<float> s1, s2;
  auto g = zeros(t.params), gp = zeros(merged);
  VecF dx = ref::nan_vec(x.size()), dxp = ref::nan_vec(x.size());
  LayerArgs a = t.args(t.lay, *la, 1, kShape, t.params, &g, s1);
  a.x = x.data();
  a.dy = dy.data();
  a.dx = dx.data();
  la->backward(a);
  LayerArgs b = t.args(t.plain, *pl, 1, kShape, merged, &gp, s2);
  b.x = x.data();
  b.dy = dy.data();
  b.dx = dxp.data();
  pl->backward(b);
  EXPECT_LT(ref::rel_err(dx, dxp), 1e-5);
  EXPECT_LT(ref::rel_err(g[1], gp[1]), 1e-5);  // the base's gradients are the merged layer's
  const int ag = t.lay.adapter_group(1);
  const float s = t.s();
  // expected adapter gradients, summed over the projections sharing a tensor (gate/up's A)
  VecF want(g[size_t(ag)].size(), 0.f);
  for (const auto& pr : t.projs(1))
    for (int64_t e = 0; e < t.c.num_experts; ++e) {
      const TensorSpec& w = t.t(1, fmt::format("model.layers.0.mlp.experts.{}.{}.weight", e, pr.w));
      const int64_t ao = t.t(ag, pr.a).offset + e * r * pr.in, bo = t.t(ag, pr.b).offset + e * pr.out * r;
      const float* dW = gp[1].data() + w.offset;
      const float* A = t.params[size_t(ag)].data() + ao;
      const float* B = t.params[size_t(ag)].data() + bo;
      for (int64_t i = 0; i < pr.out; ++i)
        for (int64_t q = 0; q < r; ++q)
          for (int64_t j = 0; j < pr.in; ++j) {
            want[size_t(ao + q * pr.in + j)] += s * B[i * r + q] * dW[i * pr.in + j];
            want[size_t(bo + i * r + q)] += s * dW[i * pr.in + j] * A[q * pr.in + j];
          }
    }
  for (const auto& ts : t.lay.groups[size_t(ag)].tensors) {
    const VecF got(g[size_t(ag)].begin() + ts.offset, g[size_t(ag)].begin() + ts.offset + ts.numel());
    const VecF exp(want.begin() + ts.offset, want.begin() + ts.offset + ts.numel());
    EXPECT_LT(ref::rel_err(got, exp), 1e-5) << ts.name;
    float mx = 0;
    for (float v : exp) mx = std::max(mx, std::abs(v));
    EXPECT_GT(mx, 1e-4f) << ts.name;  // each tensor is reached
  }
  // frozen base: the same dx and adapter gradients, nothing for the base
  auto g2 = zeros(t.params);
  VecF dx2 = ref::nan_vec(x.size());
  LayerArgs c = t.args(t.lay, *la, 1, kShape, t.params, &g2, s1);
  c.grads[0] = nullptr;
  c.x = x.data();
  c.dy = dy.data();
  c.dx = dx2.data();
  la->backward(c);
  EXPECT_EQ(dx2, dx);
  EXPECT_EQ(g2[size_t(ag)], g[size_t(ag)]);
  for (float v : g2[1]) ASSERT_EQ(v, 0.f);
}

INSTANTIATE_TEST_SUITE_P(
    Targets, LoraExpertLayer,
    ::testing::Values(std::vector<std::string>{"mlp.experts.gate_up_proj", "mlp.experts.down_proj"},
                      std::vector<std::string>{"gate_up_proj"}, std::vector<std::string>{"down_proj"}),
    [](const auto& info) { return info.param.size() == 2 ? std::string("both") : info.param[0]; });

}  // namespace
}  // namespace rp
