// Layer forward vs a naive double-precision composition of the reference ops written
// from HF modeling_llama.py / modeling_qwen3.py; causality and per-sequence positions.
#include <gtest/gtest.h>

#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

VecD slice(const VecF& p, const TensorSpec& t) {
  return VecD(p.begin() + t.offset, p.begin() + t.offset + t.numel());
}
VecD add(const VecD& a, const VecD& b) {
  VecD y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

// HF LlamaDecoderLayer.forward / Qwen3DecoderLayer.forward, spelled out.
VecD reference_decoder(const TinyModel& m, int layer, const VecF& x, MicroBatchShape s) {
  const ModelConfig& c = m.layout.config;
  const int64_t T = s.tokens(), H = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  const VecF& p = m.params[size_t(layer)];
  auto W = [&](const std::string& name) { return slice(p, m.tensor(layer, name)); };
  const VecD xd = ref::to_d(x);
  VecD xn = ref::rmsnorm(xd, W("input_layernorm.weight"), T, H, c.rms_norm_eps);
  VecD q = ref::linear(xn, W("q_proj.weight"), T, H, nq * D);
  VecD k = ref::linear(xn, W("k_proj.weight"), T, H, nkv * D);
  VecD v = ref::linear(xn, W("v_proj.weight"), T, H, nkv * D);
  if (c.qk_norm) {  // Qwen3: q_norm/k_norm over head_dim, before RoPE
    q = ref::rmsnorm(q, W("q_norm.weight"), T * nq, D, c.rms_norm_eps);
    k = ref::rmsnorm(k, W("k_norm.weight"), T * nkv, D, c.rms_norm_eps);
  }
  RopeTable rt = rope_frequencies(rope_params(c, 0));
  q = ref::rope(q, s.n_seq, s.seq_len, nq, D, rt.inv_freq, rt.attention_scaling);
  k = ref::rope(k, s.n_seq, s.seq_len, nkv, D, rt.inv_freq, rt.attention_scaling);
  VecD o = ref::attention(q, k, v, s.n_seq, s.seq_len, nq, nkv, D, 1.0 / std::sqrt(double(D)));
  VecD h1 = add(xd, ref::linear(o, W("o_proj.weight"), T, nq * D, H));
  VecD hn = ref::rmsnorm(h1, W("post_attention_layernorm.weight"), T, H, c.rms_norm_eps);
  VecD mm = ref::swiglu(ref::linear(hn, W("gate_proj.weight"), T, H, F),
                        ref::linear(hn, W("up_proj.weight"), T, H, F));
  return add(h1, ref::linear(mm, W("down_proj.weight"), T, F, H));
}

class LayerForward : public ::testing::TestWithParam<TinyOpts> {};

TEST_P(LayerForward, DecoderMatchesReference) {
  TinyModel m(GetParam());
  const MicroBatchShape s{3, 7};
  const int64_t T = s.tokens(), H = m.layout.config.hidden_size;
  VecF x = ref::randn(size_t(T * H), 21);
  for (int layer : {1, 2}) {
    VecF y = ref::nan_vec(size_t(T * H));
    std::vector<float> scratch;
    LayerArgs a = m.args(layer, s, nullptr, scratch);
    a.x = x.data();
    a.y = y.data();
    m.layers[size_t(layer)]->forward(a);
    EXPECT_LT(ref::rel_err(y, reference_decoder(m, layer, x, s)), 1e-5) << "layer " << layer;
  }
}

TEST_P(LayerForward, EmbeddingAndTailMatchReference) {
  TinyModel m(GetParam());
  const ModelConfig& c = m.layout.config;
  const MicroBatchShape s{2, 9};
  const int64_t T = s.tokens(), H = c.hidden_size, V = c.vocab_size;
  auto ids = random_ids(T, V, 22);
  VecF y = ref::nan_vec(size_t(T * H));
  std::vector<float> scratch;
  LayerArgs e = m.args(0, s, nullptr, scratch);
  e.ids = ids.data();
  e.y = y.data();
  m.layers[0]->forward(e);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j)
      ASSERT_EQ(y[size_t(t * H + j)], m.params[0][size_t(ids[size_t(t)] * H + j)]);

  auto tg = random_ids(T, V, 23);
  tg[2] = -100;
  float loss[2] = {NAN, NAN};
  const int tl = m.tail();
  LayerArgs ta = m.args(tl, s, nullptr, scratch);
  ta.x = y.data();
  ta.targets = tg.data();
  ta.loss = loss;
  m.layers[size_t(tl)]->forward(ta);
  const int head = int(m.layout.groups.size()) - 1;
  VecD hn = ref::rmsnorm(ref::to_d(y), slice(m.params[size_t(head)], m.tensor(head, "model.norm.weight")), T,
                         H, c.rms_norm_eps);
  VecD w = c.tie_word_embeddings ? slice(m.params[0], m.tensor(0, "embed_tokens.weight"))
                                 : slice(m.params[size_t(head)], m.tensor(head, "lm_head.weight"));
  auto [sum, cnt] = ref::cross_entropy(hn, w, tg, T, H, V);
  EXPECT_NEAR(loss[0], sum, 1e-5 * std::abs(sum));
  EXPECT_EQ(loss[1], float(cnt));
}

VecF run_decoder(TinyModel& m, int layer, const VecF& x, MicroBatchShape s) {
  VecF y = ref::nan_vec(x.size());
  std::vector<float> scratch;
  LayerArgs a = m.args(layer, s, nullptr, scratch);
  a.x = x.data();
  a.y = y.data();
  m.layers[size_t(layer)]->forward(a);
  return y;
}

// Tokens [0, upto) of sequence `seq` are equal (to 1e-6) in a and b; returns the largest
// difference over tokens [upto, L) of that sequence.
double compare_seq(const VecF& a, const VecF& b, int64_t seq, int64_t L, int64_t H, int64_t upto) {
  for (int64_t t = 0; t < upto; ++t)
    for (int64_t j = 0; j < H; ++j) {
      size_t i = size_t((seq * L + t) * H + j);
      EXPECT_NEAR(a[i], b[i], 1e-6) << "seq " << seq << " token " << t;
    }
  double later = 0;
  for (int64_t t = upto; t < L; ++t)
    for (int64_t j = 0; j < H; ++j) {
      size_t i = size_t((seq * L + t) * H + j);
      later = std::max(later, double(std::abs(a[i] - b[i])));
    }
  return later;
}

TEST_P(LayerForward, AttentionIsCausalPerSequence) {
  TinyModel m(GetParam());
  const MicroBatchShape s{2, 8};
  const int64_t L = s.seq_len, H = m.layout.config.hidden_size;
  VecF x = ref::randn(size_t(s.tokens() * H), 31);
  VecF y0 = run_decoder(m, 1, x, s);
  // change token 5 of sequence 0: tokens 0..4 of seq 0 and all of seq 1 unchanged
  VecF x1 = x;
  for (int64_t j = 0; j < H; ++j) x1[size_t(5 * H + j)] += 1.0f;
  VecF y1 = run_decoder(m, 1, x1, s);
  EXPECT_GT(compare_seq(y0, y1, 0, L, H, 5), 1e-3);  // token 5 (and later) did change
  EXPECT_EQ(compare_seq(y0, y1, 1, L, H, L), 0.0);
  // change token 0 of sequence 1: sequence 0 unchanged, all of sequence 1 changes
  VecF x2 = x;
  for (int64_t j = 0; j < H; ++j) x2[size_t((L + 0) * H + j)] -= 1.0f;
  VecF y2 = run_decoder(m, 1, x2, s);
  compare_seq(y0, y2, 0, L, H, L);
  for (int64_t t = 0; t < L; ++t) {
    double d = 0;
    for (int64_t j = 0; j < H; ++j)
      d = std::max(d, double(std::abs(y0[size_t((L + t) * H + j)] - y2[size_t((L + t) * H + j)])));
    EXPECT_GT(d, 1e-4) << "token " << t << " of sequence 1 must see token 0";
  }
}

TEST_P(LayerForward, PositionsRestartPerSequence) {
  TinyModel m(GetParam());
  const MicroBatchShape one{1, 6}, two{2, 6};
  const int64_t H = m.layout.config.hidden_size, n = one.tokens() * H;
  VecF x = ref::randn(size_t(n), 41), xx = x;
  xx.insert(xx.end(), x.begin(), x.end());
  VecF y = run_decoder(m, 2, x, one), yy = run_decoder(m, 2, xx, two);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(yy[size_t(i)], y[size_t(i)], 1e-5);
    ASSERT_NEAR(yy[size_t(n + i)], y[size_t(i)], 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, LayerForward,
                         ::testing::Values(TinyOpts{false, false, "default"}, TinyOpts{false, true, "llama3"},
                                           TinyOpts{true, false, "yarn"}, TinyOpts{true, true, "linear"}),
                         [](const auto& info) { return opts_name(info.param); });

}  // namespace
}  // namespace rp
