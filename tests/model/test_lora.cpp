// LoRA in the layout and the decoder layers: groups, names, shapes and frozen flags of
// make_layout(config, lora); its one-line validation errors; PEFT-like initial values; a
// decoder with adapters against the plain decoder with merged weights W' = W + s B A (forward
// y, backward dx, base gradients = dW', and dA = s B^T dW', dB = s dW' A^T); a frozen base
// (null base gradient); dropout against finite differences with its mask fixed by
// LayerArgs::dropout_id; MLP chunking; scratch accounting.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "model/lora_linear.hpp"
#include "roundpipe/adapter.hpp"
#include "tests/model/test_lora_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

LoraConfig all_linear(double dropout = 0, bool rslora = false) {
  LoraConfig l;
  l.r = 3;
  l.alpha = 5;
  l.dropout = dropout;
  l.target_modules = {"all-linear"};
  l.use_rslora = rslora;
  return l;
}
LoraConfig some_modules() {  // q, v and down only, rsLoRA
  LoraConfig l;
  l.r = 4;
  l.alpha = 6;
  l.target_modules = {"q_proj", "v_proj", "down_proj"};
  l.use_rslora = true;
  return l;
}

// ---- layout -------------------------------------------------------------------------

TEST(LoraLayout, GroupsNamesShapesAndFrozenBase) {
  const ModelConfig c = tiny_config({true, false, "default"});  // qwen3, untied
  const ModelLayout m = make_layout(c, some_modules());
  const ModelLayout plain = make_layout(c);
  const int L = int(c.num_hidden_layers);
  ASSERT_EQ(m.groups.size(), size_t(2 * L + 2));
  ASSERT_TRUE(m.lora.has_value());
  for (int g = 0; g <= L + 1; ++g) {  // base groups: same tensors and offsets, frozen, bf16 matrices
    EXPECT_EQ(m.groups[size_t(g)].name, plain.groups[size_t(g)].name);
    EXPECT_EQ(m.groups[size_t(g)].numel, plain.groups[size_t(g)].numel);
    EXPECT_TRUE(m.groups[size_t(g)].frozen) << g;
    EXPECT_GT(m.groups[size_t(g)].storage_bytes, 0);
    for (auto& t : m.groups[size_t(g)].tensors)
      EXPECT_EQ(t.format, t.shape.size() == 2 ? WeightFormat::bf16 : WeightFormat::f32) << t.name;
  }
  const int64_t H = 32, Q = 4 * 8, K = 2 * 8, F = 48, r = 4;
  for (int i = 0; i < L; ++i) {
    const ParamGroup& g = m.groups[size_t(L + 2 + i)];
    EXPECT_EQ(g.name, fmt::format("lora.{}", i));
    EXPECT_FALSE(g.frozen);
    const std::string p = fmt::format("model.layers.{}.", i);
    const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
        {p + "self_attn.q_proj.lora_A.weight", {r, H}}, {p + "self_attn.q_proj.lora_B.weight", {Q, r}},
        {p + "self_attn.v_proj.lora_A.weight", {r, H}}, {p + "self_attn.v_proj.lora_B.weight", {K, r}},
        {p + "mlp.down_proj.lora_A.weight", {r, F}},    {p + "mlp.down_proj.lora_B.weight", {H, r}}};
    ASSERT_EQ(g.tensors.size(), want.size());
    int64_t off = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(g.tensors[k].name, want[k].first);
      EXPECT_EQ(g.tensors[k].shape, want[k].second) << want[k].first;
      EXPECT_EQ(g.tensors[k].offset, off);
      off += g.tensors[k].numel();
    }
    EXPECT_EQ(g.numel, off);
  }
  // all-linear: seven modules, A before B, in the base order
  const ModelLayout a = make_layout(c, all_linear());
  std::vector<std::string> names;
  for (auto& t : a.groups[size_t(L + 2)].tensors) names.push_back(t.name);
  ASSERT_EQ(names.size(), 14u);
  EXPECT_EQ(names[0], "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(names[7], "model.layers.0.self_attn.o_proj.lora_B.weight");
  EXPECT_EQ(names[13], "model.layers.0.mlp.down_proj.lora_B.weight");
}

// A plain 16-bit base stores each group's compute copy first (its matrices at offset * 2) and
// its f32 vectors behind it, so a device computing in that type uploads the prefix as it is
// (direct_bytes); every other pairing of storage and compute type has no direct prefix.
TEST(LoraLayout, SixteenBitBaseStartsWithItsComputeCopy) {
  const ModelConfig c = tiny_config({true, false, "default"});  // embedding, 2 decoders, tail
  ModelLayout m = make_layout(c), o = make_layout(c);
  freeze_group(m, 1, WeightFormat::bf16);
  freeze_group(m, 2, WeightFormat::f16);
  freeze_group(o, 1, WeightFormat::q8_0);
  freeze_group(o, 2, WeightFormat::f32);
  for (int g : {1, 2}) {
    const ParamGroup& grp = m.groups[size_t(g)];
    const WeightFormat base = g == 1 ? WeightFormat::bf16 : WeightFormat::f16;
    int64_t vectors = 0, behind = grp.numel * 2;
    for (const TensorSpec& t : grp.tensors) {
      if (t.shape.size() == 2) {
        EXPECT_EQ(t.format, base) << t.name;
        EXPECT_EQ(t.byte_offset, t.offset * 2) << t.name;
      } else {
        EXPECT_EQ(t.format, WeightFormat::f32) << t.name;
        EXPECT_EQ(t.byte_offset, behind) << t.name;  // packed after the compute copy, in order
        behind += t.numel() * 4;
        ++vectors;
      }
    }
    EXPECT_GT(vectors, 0);  // norms: the group has a staged part
    EXPECT_EQ(grp.storage_bytes, behind);
    EXPECT_EQ(grp.direct_bytes(g == 1 ? DType::bf16 : DType::f16), grp.numel * 2);
    EXPECT_EQ(grp.direct_bytes(g == 1 ? DType::f16 : DType::bf16), 0);  // another 16-bit type converts
    EXPECT_EQ(grp.direct_bytes(DType::f32), 0);
  }
  EXPECT_EQ(o.groups[1].direct_bytes(DType::bf16), 0);  // quantized: all of it is staged
  EXPECT_EQ(o.groups[1].direct_bytes(DType::f32), 0);
  EXPECT_EQ(o.groups[2].direct_bytes(DType::f32), o.groups[2].numel * 4);
  EXPECT_EQ(o.groups[2].storage_bytes, o.groups[2].numel * 4);  // nothing staged
  EXPECT_EQ(o.groups[2].direct_bytes(DType::bf16), 0);
  EXPECT_EQ(m.groups[0].direct_bytes(DType::f32), 0);  // trainable
  ParamGroup moved = m.groups[1];                      // a 16-bit tensor out of its compute slot: no prefix
  for (TensorSpec& t : moved.tensors)
    if (t.shape.size() == 2) {
      t.byte_offset += 2;
      break;
    }
  EXPECT_EQ(moved.direct_bytes(DType::bf16), 0);
}

TEST(LoraLayout, GroupsOfUploadsAndAdapterGroup) {
  const ModelLayout m = make_layout(tiny_config({false, true, "default"}), all_linear());  // tied
  const int L = 2;
  EXPECT_EQ(m.num_layers(), L + 2);
  EXPECT_EQ(m.groups_of(0), (std::vector<int>{0}));
  EXPECT_EQ(m.groups_of(1), (std::vector<int>{1, L + 2}));
  EXPECT_EQ(m.groups_of(2), (std::vector<int>{2, L + 3}));
  EXPECT_EQ(m.groups_of(L + 1), (std::vector<int>{L + 1, 0}));
  EXPECT_EQ(m.adapter_group(0), -1);
  EXPECT_EQ(m.adapter_group(1), L + 2);
  EXPECT_EQ(m.adapter_group(L + 1), -1);
  EXPECT_EQ(m.groups_of(std::vector<int>{0, 1, 2, 3}), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(m.groups_uploaded({1, 2}, true), (std::vector<int>{1, 2, 4, 5}));
  EXPECT_EQ(m.groups_uploaded({0, 1}, true), (std::vector<int>{1, 4}));
  EXPECT_EQ(m.groups_uploaded({0, 1}, false), (std::vector<int>{0, 1, 4}));
  // every group is read by some layer
  std::set<int> all;
  for (int l = 0; l < m.num_layers(); ++l)
    for (int g : m.groups_of(l)) all.insert(g);
  EXPECT_EQ(all.size(), m.groups.size());
}

// An fp8 base: every frozen matrix in fp8 at 1 byte per weight plus a 4-byte scale per row
// (output feature), 1-D weights f32, tensors packed back to back; what the host keeps, the
// stages upload and the planner counts (storage_bytes).
TEST(LoraLayout, Fp8BaseIsOneBytePerWeightPlusRowScales) {
  LoraConfig l = all_linear();
  l.base_format = WeightFormat::fp8;
  const ModelLayout m = make_layout(tiny_config({true, false, "default"}), l);
  int frozen = 0;
  for (const ParamGroup& g : m.groups) {
    if (!g.frozen) continue;
    ++frozen;
    int64_t bytes = 0;
    for (const TensorSpec& t : g.tensors) {
      EXPECT_EQ(t.byte_offset, bytes) << t.name;
      if (t.shape.size() == 2) {
        EXPECT_EQ(t.format, WeightFormat::fp8) << t.name;
        bytes += t.numel() + 4 * t.shape[0];
      } else {
        EXPECT_EQ(t.format, WeightFormat::f32) << t.name;
        bytes += 4 * t.numel();
      }
    }
    EXPECT_EQ(g.storage_bytes, bytes) << g.name;
    EXPECT_EQ(g.direct_bytes(DType::bf16), 0) << g.name;  // all of it staged and dequantized
  }
  EXPECT_EQ(frozen, int(m.config.num_hidden_layers) + 2);  // embedding, decoders, tail
}

TEST(LoraLayout, ModulesToSaveStayTrainable) {
  const int L = 2;
  for (bool tied : {false, true}) {
    const ModelConfig c = tiny_config({false, tied, "default"});
    LoraConfig l = all_linear();
    l.base_format = WeightFormat::q8_0;
    l.modules_to_save = {"embed_tokens"};
    ModelLayout m = make_layout(c, l);
    EXPECT_FALSE(m.groups[0].frozen);
    EXPECT_TRUE(m.groups[1].frozen);
    EXPECT_TRUE(m.groups[size_t(L + 1)].frozen);
    EXPECT_EQ(m.groups[1].tensors[1].format, WeightFormat::q8_0);
    l.modules_to_save = {"lm_head"};
    m = make_layout(c, l);
    EXPECT_EQ(m.groups[0].frozen, !tied) << "tied: the LM head is the embedding";
    EXPECT_EQ(m.groups[size_t(L + 1)].frozen, tied);
  }
}

TEST(LoraLayout, ValidationNamesTheField) {
  const ModelConfig c = tiny_config({});
  auto error = [&](LoraConfig l) -> std::string {
    try {
      make_layout(c, l);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  LoraConfig l = all_linear();
  l.r = 0;
  EXPECT_EQ(error(l), "lora.r: expected >= 1, got 0");
  l = all_linear();
  l.alpha = 0;
  EXPECT_NE(error(l).find("lora.alpha: expected a finite value > 0"), std::string::npos) << error(l);
  l.alpha = NAN;
  EXPECT_NE(error(l).find("lora.alpha"), std::string::npos);
  for (double d : {-0.1, 1.0}) {
    l = all_linear(d);
    EXPECT_NE(error(l).find("lora.dropout: expected 0 <= dropout < 1"), std::string::npos) << error(l);
  }
  l = all_linear();
  l.target_modules = {"q_proj", "qkv_proj"};
  EXPECT_NE(error(l).find("lora.target_modules: unknown module 'qkv_proj' (expected q_proj, k_proj"),
            std::string::npos)
      << error(l);
  l.target_modules = {};
  EXPECT_NE(error(l).find("lora.target_modules: expected at least one"), std::string::npos);
  l = all_linear();
  l.modules_to_save = {"norm"};
  EXPECT_EQ(error(l), "lora.modules_to_save: unknown module 'norm' (expected embed_tokens or lm_head)");
  EXPECT_EQ(error(all_linear(0.1)), "no error");
}

TEST(LoraLayout, ScalingIsAlphaOverRankOrOverItsRoot) {
  LoraConfig l = all_linear();
  EXPECT_DOUBLE_EQ(l.scaling(), 5.0 / 3.0);
  l.use_rslora = true;
  EXPECT_DOUBLE_EQ(l.scaling(), 5.0 / std::sqrt(3.0));
}

TEST(LoraInit, KaimingUniformAAndZeroBDeterministicFromSeed) {
  const ModelConfig c = tiny_config({});
  LoraConfig l = all_linear();
  l.r = 16;
  l.seed = 5;
  const ModelLayout m = make_layout(c, l);
  const int g = m.adapter_group(1);
  const std::vector<float> w = lora_initial_group(m, g);
  ASSERT_EQ(int64_t(w.size()), m.groups[size_t(g)].numel);
  for (auto& t : m.groups[size_t(g)].tensors) {
    const bool is_a = t.name.find("lora_A") != std::string::npos;
    double s = 0, s2 = 0, mx = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = w[size_t(t.offset + i)];
      s += v;
      s2 += v * v;
      mx = std::max(mx, std::abs(v));
    }
    if (!is_a) {
      EXPECT_EQ(mx, 0.0) << t.name;
      continue;
    }
    const double bound = 1.0 / std::sqrt(double(t.shape[1])), n = double(t.numel());
    EXPECT_LE(mx, bound) << t.name;
    EXPECT_GT(mx, 0.9 * bound) << t.name;
    EXPECT_NEAR(s / n, 0.0, 4 * bound / std::sqrt(3 * n)) << t.name;
    EXPECT_NEAR(s2 / n, bound * bound / 3, 0.25 * bound * bound / 3) << t.name;  // U(-b, b): variance b^2/3
  }
  EXPECT_EQ(lora_initial_group(m, g), w);                   // deterministic
  EXPECT_NE(lora_initial_group(m, m.adapter_group(2)), w);  // layers differ
  l.seed = 6;
  EXPECT_NE(lora_initial_group(make_layout(c, l), g), w);  // seeds differ
  EXPECT_THROW(lora_initial_group(m, 1), std::invalid_argument);
  EXPECT_THROW(lora_initial_group(make_layout(c), 1), std::invalid_argument);
}

// ---- the decoder with adapters vs the merged weights --------------------------------

struct Case {
  TinyOpts opts;
  LoraConfig lora;
  std::string name;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class LoraLayer : public ::testing::TestWithParam<Case> {};

constexpr MicroBatchShape kShape{2, 5};

double rel_part(const float* a, const float* b, int64_t n) {
  return ref::rel_err(VecF(a, a + n), VecF(b, b + n));
}

TEST_P(LoraLayer, ForwardEqualsMergedWeights) {
  LoraTiny t(GetParam().opts, GetParam().lora);
  std::vector<VecF> merged = t.merged();
  const int64_t T = kShape.tokens(), H = t.c.hidden_size;
  VecF x = ref::randn(size_t(T * H), 5);
  for (int l = 1; l <= t.L(); ++l) {
    auto la = make_layer(t.lay, l), pl = make_layer(t.plain, l);
    VecF y = ref::nan_vec(x.size()), yp = ref::nan_vec(x.size());
    std::vector<float> s1, s2;
    LayerArgs a = t.args(t.lay, *la, l, kShape, t.params, nullptr, s1);
    a.x = x.data();
    a.y = y.data();
    la->forward(a);
    LayerArgs b = t.args(t.plain, *pl, l, kShape, merged, nullptr, s2);
    b.x = x.data();
    b.y = yp.data();
    pl->forward(b);
    EXPECT_LT(ref::rel_err(y, yp), 1e-5) << "layer " << l;
    // the adapters matter: with B = 0 the output is the base's
    VecF base_y = ref::nan_vec(x.size());
    std::vector<VecF> base = t.params;
    b = t.args(t.plain, *pl, l, kShape, base, nullptr, s2);
    b.x = x.data();
    b.y = base_y.data();
    pl->forward(b);
    EXPECT_GT(ref::rel_err(y, base_y), 1e-2) << "layer " << l;
  }
}

TEST_P(LoraLayer, BackwardMatchesMergedWeights) {
  LoraTiny t(GetParam().opts, GetParam().lora);
  std::vector<VecF> merged = t.merged();
  const int64_t T = kShape.tokens(), H = t.c.hidden_size;
  VecF x = ref::randn(size_t(T * H), 5), dy = ref::randn(size_t(T * H), 6);
  for (int l = 1; l <= t.L(); ++l) {
    auto la = make_layer(t.lay, l), pl = make_layer(t.plain, l);
    std::vector<float> s1, s2;
    auto g = zeros_like(t.params), gp = zeros_like(merged);
    VecF dx = ref::nan_vec(x.size()), dxp = ref::nan_vec(x.size());
    LayerArgs a = t.args(t.lay, *la, l, kShape, t.params, &g, s1);
    a.x = x.data();
    a.dy = dy.data();
    a.dx = dx.data();
    la->backward(a);
    LayerArgs b = t.args(t.plain, *pl, l, kShape, merged, &gp, s2);
    b.x = x.data();
    b.dy = dy.data();
    b.dx = dxp.data();
    pl->backward(b);
    EXPECT_LT(ref::rel_err(dx, dxp), 1e-5) << "dx, layer " << l;
    // base gradients: dL/dW = dL/dW'
    EXPECT_LT(ref::rel_err(g[size_t(l)], gp[size_t(l)]), 1e-5) << "base gradients, layer " << l;
    const int ag = t.lay.adapter_group(l);
    const float s = t.s();
    int adapted = 0;
    for (int k = 0; k < kLoraModules; ++k) {
      if (!lora_targets(t.lc, LoraModule(k))) continue;
      ++adapted;
      const std::string p = fmt::format("layers.{}.{}.", l - 1, lora_module_path(LoraModule(k)));
      const TensorSpec& w = t.tensor(l, lora_module_path(LoraModule(k)) + ".weight");
      const TensorSpec &ta = t.tensor(ag, p + "lora_A.weight"), &tb = t.tensor(ag, p + "lora_B.weight");
      const int64_t out = w.shape[0], in = w.shape[1], r = t.lc.r;
      const float* dW = gp[size_t(l)].data() + w.offset;
      const float* A = t.params[size_t(ag)].data() + ta.offset;
      const float* B = t.params[size_t(ag)].data() + tb.offset;
      VecF dA(size_t(r * in), 0.f), dB(size_t(out * r), 0.f);
      for (int64_t i = 0; i < out; ++i)
        for (int64_t q = 0; q < r; ++q)
          for (int64_t j = 0; j < in; ++j) {
            dA[size_t(q * in + j)] += s * B[i * r + q] * dW[i * in + j];
            dB[size_t(i * r + q)] += s * dW[i * in + j] * A[q * in + j];
          }
      EXPECT_LT(rel_part(g[size_t(ag)].data() + ta.offset, dA.data(), r * in), 1e-5) << p << "lora_A";
      EXPECT_LT(rel_part(g[size_t(ag)].data() + tb.offset, dB.data(), out * r), 1e-5) << p << "lora_B";
    }
    EXPECT_GT(adapted, 0);
    // frozen base: a null base gradient gives the same dx and adapter gradients
    auto g2 = zeros_like(t.params);
    VecF dx2 = ref::nan_vec(x.size());
    LayerArgs c = t.args(t.lay, *la, l, kShape, t.params, &g2, s1);
    c.grads[0] = nullptr;
    c.x = x.data();
    c.dy = dy.data();
    c.dx = dx2.data();
    la->backward(c);
    EXPECT_EQ(dx2, dx) << "layer " << l;
    EXPECT_EQ(g2[size_t(ag)], g[size_t(ag)]) << "layer " << l;
    for (float v : g2[size_t(l)]) ASSERT_EQ(v, 0.f);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, LoraLayer,
    ::testing::Values(Case{{false, false, "default"}, all_linear(), "llama_all_linear"},
                      Case{{true, true, "default"}, all_linear(0, true), "qwen3_all_rslora"},
                      Case{{false, true, "llama3"}, some_modules(), "llama_some"},
                      Case{{true, false, "default"}, some_modules(), "qwen3_some"}),
    [](const auto& info) { return info.param.name; });

// ---- dropout ------------------------------------------------------------------------

struct DropoutRun {
  LoraTiny t;
  int layer = 1;
  std::unique_ptr<Layer> dec;
  MicroBatchShape sh{2, 6};
  VecF x, r;
  explicit DropoutRun(LayerOptions o = {}, double p = 0.4)
      : t({true, false, "default"}, all_linear(p)), dec(make_layer(t.lay, layer, o)) {
    x = ref::randn(size_t(sh.tokens() * t.c.hidden_size), 21);
    r = ref::randn(x.size(), 22);
  }
  VecF forward(int64_t id) {
    VecF y = ref::nan_vec(x.size());
    std::vector<float> s;
    LayerArgs a = t.args(t.lay, *dec, layer, sh, t.params, nullptr, s);
    a.x = x.data();
    a.y = y.data();
    a.dropout_id = id;
    dec->forward(a);
    return y;
  }
  std::vector<VecF> backward(int64_t id, VecF& dx) {
    auto g = zeros_like(t.params);
    dx = ref::nan_vec(x.size());
    std::vector<float> s;
    LayerArgs a = t.args(t.lay, *dec, layer, sh, t.params, &g, s);
    a.grads[0] = nullptr;
    a.x = x.data();
    a.dy = r.data();
    a.dx = dx.data();
    a.dropout_id = id;
    dec->backward(a);
    return g;
  }
};

TEST(LoraDropout, MasksFollowTheIdAndEvaluationHasNone) {
  DropoutRun d;
  const VecF y7 = d.forward(7);
  // the same id draws the same masks (a mask that differs moves the output by ~1e-1; the CPU
  // GEMMs' sums may round differently, ~1e-7, where the heap hands the two calls buffers of
  // other alignments, as after other tests in the same process)
  EXPECT_LT(ref::rel_err(d.forward(7), y7), 1e-6);
  EXPECT_GT(ref::rel_err(d.forward(8), y7), 1e-3);  // another micro-batch, other masks
  // without an id (evaluation) the adapters see x: equal to a model without dropout (whose
  // q/k/v and gate/up adapters run as one GEMM each: other sums, the same values to rounding)
  DropoutRun plain({}, 0.0);
  EXPECT_LT(ref::rel_err(d.forward(-1), plain.forward(-1)), 1e-6);
  EXPECT_GT(ref::rel_err(y7, plain.forward(-1)), 1e-3);
  VecF dx;
  EXPECT_THROW(d.backward(-1, dx), std::invalid_argument);
}

TEST(LoraDropout, GradientsMatchFiniteDifferencesWithTheMaskFixed) {
  DropoutRun d;
  const int64_t id = 3;
  VecF dx;
  auto g = d.backward(id, dx);
  auto f = [&] { return dotf(d.forward(id), d.r); };
  fd_check(f, d.x.data(), int64_t(d.x.size()), dx.data(), 40, 2e-2, "dx with dropout");
  const int ag = d.t.lay.adapter_group(d.layer);
  for (auto& t : d.t.lay.groups[size_t(ag)].tensors)
    fd_check(f, d.t.params[size_t(ag)].data() + t.offset, t.numel(), g[size_t(ag)].data() + t.offset, 12,
             2e-2, t.name);
}

TEST(LoraDropout, MlpChunksDrawTheSameMasks) {
  DropoutRun whole, chunked(LayerOptions{3, false});
  EXPECT_LT(ref::rel_err(chunked.forward(5), whole.forward(5)), 1e-6);
  VecF dx1, dx2;
  auto g1 = whole.backward(5, dx1), g2 = chunked.backward(5, dx2);
  EXPECT_LT(ref::rel_err(dx2, dx1), 1e-6);
  const int ag = whole.t.lay.adapter_group(1);
  EXPECT_LT(ref::rel_err(g2[size_t(ag)], g1[size_t(ag)]), 1e-5);
}

TEST(LoraLayer, ScratchAccountsTheAdapters) {
  const ModelConfig c = tiny_config({});
  auto bytes = [&](const ModelLayout& m, bool backward) {
    return make_layer(m, 1)->scratch_bytes({2, 8}, DType::f32, backward);
  };
  const ModelLayout plain = make_layout(c), lora = make_layout(c, all_linear()),
                    drop = make_layout(c, all_linear(0.1));
  const int64_t T = 16, H = c.hidden_size, r = all_linear().r;
  const auto at_least = [](int64_t b) { return size_t(std::max<int64_t>(0, b - int64_t(kScratchAlign))); };
  for (bool bw : {false, true}) {
    // with dropout: ax [T, r] and the dropped-out input [T, >= H]; without: ax [T, 3r] and the
    // stacked A [3r, H] of the adapters that run as one (and its fp32 gradient, backward)
    EXPECT_GE(bytes(drop, bw), bytes(plain, bw) + at_least(T * r * 4) + at_least(T * H * 4)) << bw;
    EXPECT_GE(bytes(lora, bw), bytes(plain, bw) + at_least(T * 3 * r * 4) + at_least(3 * r * H * 4) +
                                   (bw ? at_least(3 * r * H * 4) : 0))
        << bw;
  }
  // the adapter buffers scale with the rank: ax [T, 3r] and u [7, T, r], each rounded up to kScratchAlign
  LoraConfig big = all_linear();
  big.r = 64;
  EXPECT_GE(bytes(make_layout(c, big), true), bytes(lora, true) + 2 * (16 * 64 * 4 - kScratchAlign));
}

}  // namespace
}  // namespace rp

namespace rp {
namespace {
using namespace rp::test;

TEST(LoraMerge, MergedWeightsAreTheBasePlusScaledProduct) {
  LoraConfig l;
  l.r = 2;
  l.alpha = 3;
  l.target_modules = {"k_proj", "up_proj"};
  LoraTiny t({true, true, "default"}, l);
  std::vector<const float*> ptrs;
  for (auto& p : t.params) ptrs.push_back(p.data());
  const auto merged = merge_adapters(t.lay, ptrs).groups;
  const auto want = t.merged();
  ASSERT_EQ(merged.size(), want.size());
  for (size_t g = 0; g < want.size(); ++g) EXPECT_LT(ref::rel_err(merged[g], want[g]), 1e-7) << g;
  EXPECT_NE(merged[1], t.params[1]);  // k_proj and up_proj changed
  EXPECT_EQ(merged[0], t.params[0]);
  ptrs.pop_back();
  EXPECT_THROW(merge_adapters(t.lay, ptrs), std::invalid_argument);
  EXPECT_THROW(merge_adapters(t.plain, {}), std::invalid_argument);
}

}  // namespace
}  // namespace rp
