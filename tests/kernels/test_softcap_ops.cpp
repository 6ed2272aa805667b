// Gemma 2's logit soft-capping on the CPU backend (kernels/ops.hpp: AttentionVariant::softcap,
// lm_head_cross_entropy's softcap) against naive double-precision references written here, as
// transformers' Gemma2 computes them: attention scores s = q k^T * scale, s = cap * tanh(s / cap),
// then the mask and the softmax (eager_attention_forward); final logits z = cap * tanh(z / cap)
// before the cross-entropy (Gemma2ForCausalLM.forward). Gradients by central differences of the
// references; decoding against the last rows of the full pass; bad caps refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp {
namespace {

using ref::VecD;
using ref::VecF;
using VecI = std::vector<int32_t>;

struct Shape {
  int64_t S, L, nq, nkv, D;
};

// Dense reference (ref::attention_variant): o [T,nq,D], lse [S,nq,L] of the capped scores (a causal
// window of `window` keys when > 0, the example of pos when given).
using RefOut = ref::VariantOut;
RefOut ref_attention(const VecD& q, const VecD& k, const VecD& v, const Shape& sh, int64_t window,
                     const VecI* pos, double scale, double cap) {
  const auto [S, L, nq, nkv, D] = sh;
  return ref::attention_variant(q, k, v, S, L, nq, nkv, D, scale, window, pos, nullptr, cap);
}

struct Case {
  int64_t window;
  bool packed;
  int64_t ratio;
  float cap;
};

void run_case(const Case& c) {
  auto ops = make_cpu_ops();
  const Shape sh{2, 12, 4, 4 / c.ratio, 8};
  const auto [S, L, nq, nkv, D] = sh;
  const float scale = 0.5f;
  SCOPED_TRACE(::testing::Message() << "window " << c.window << " packed " << c.packed << " ratio " << c.ratio
                                    << " cap " << c.cap);
  // scores of a few units, so a cap of 1..2 bends them well into the tanh
  VecF q = ref::randn(size_t(S * L * nq * D), 41, 1.5f), k = ref::randn(size_t(S * L * nkv * D), 42, 1.5f);
  VecF v = ref::randn(size_t(S * L * nkv * D), 43), dout = ref::randn(size_t(S * L * nq * D), 44);
  VecI pos;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < L; ++t) pos.push_back(int32_t(t < 5 ? t : t - 5));
  Ops::AttentionVariant var;
  var.window = c.window;
  var.pos = c.packed ? pos.data() : nullptr;
  var.softcap = c.cap;
  VecF o = ref::nan_vec(q.size()), lse = ref::nan_vec(size_t(S * nq * L));
  std::vector<char> scratch(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  ops->attention_fwd_v(q.data(), k.data(), v.data(), o.data(), lse.data(), S, L, nq, nkv, D, scale, var,
                       scratch.data());
  const VecI* pp = c.packed ? &pos : nullptr;
  const VecD qd = ref::to_d(q), kd = ref::to_d(k), vd = ref::to_d(v);
  const RefOut r = ref_attention(qd, kd, vd, sh, c.window, pp, scale, c.cap);
  EXPECT_LT(ref::rel_err(o, r.o), 1e-5);
  EXPECT_LT(ref::rel_err(lse, r.lse), 1e-5);
  if (c.cap < 10) {  // the cap matters here: the uncapped reference is far away
    EXPECT_GT(ref::rel_err(o, ref_attention(qd, kd, vd, sh, c.window, pp, scale, 0.0).o), 1e-2);
  }

  VecF dq = ref::nan_vec(q.size()), dk = ref::nan_vec(k.size()), dv = ref::nan_vec(v.size());
  ops->attention_bwd_v(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                       dv.data(), S, L, nq, nkv, D, scale, var, scratch.data());
  auto loss = [&](const VecD& q_, const VecD& k_, const VecD& v_) {
    return ref::dot(ref_attention(q_, k_, v_, sh, c.window, pp, scale, c.cap).o, dout);
  };
  ref::check_grad([&](const VecD& x) { return loss(x, kd, vd); }, qd, dq, 40, 1e-4, "dq");
  ref::check_grad([&](const VecD& x) { return loss(qd, x, vd); }, kd, dk, 40, 1e-4, "dk");
  ref::check_grad([&](const VecD& x) { return loss(qd, kd, x); }, vd, dv, 40, 1e-4, "dv");
}

}  // namespace

TEST(SoftcapOps, AttentionMatchesADenseReference) {
  for (float cap : {1.0f, 2.5f})
    for (int64_t window : {0, 4})
      for (bool packed : {false, true}) run_case({window, packed, window == 4 ? 2 : 1, cap});
  run_case({0, false, 4, 50.0f});  // Gemma 2's published cap (almost linear on these scores)
}

// Decoding over a cache with a cap: the last n rows of attention_fwd_v with the same variant.
TEST(SoftcapOps, DecodeEqualsTheLastRowsOfTheFullPass) {
  auto ops = make_cpu_ops();
  const int64_t L = 20, nq = 4, nkv = 2, D = 8, past = 15, n = L - past;
  VecF q = ref::randn(size_t(L * nq * D), 51, 1.5f), k = ref::randn(size_t(L * nkv * D), 52, 1.5f);
  VecF v = ref::randn(size_t(L * nkv * D), 53);
  std::vector<char> scratch(Ops::attention_scratch_bytes(1, L, nq, nkv, D));
  for (int64_t window : {0, 6}) {
    Ops::AttentionVariant var;
    var.window = window;
    var.softcap = 1.5f;
    VecF o = ref::nan_vec(q.size()), od = ref::nan_vec(size_t(n * nq * D));
    ops->attention_fwd_v(q.data(), k.data(), v.data(), o.data(), nullptr, 1, L, nq, nkv, D, 0.4f, var,
                         scratch.data());
    const VecF qn(q.begin() + past * nq * D, q.end());
    ops->attention_decode_v(qn.data(), k.data(), v.data(), od.data(), past, n, nq, nkv, D, 0.4f, var);
    const VecF want(o.begin() + past * nq * D, o.end());
    EXPECT_LT(ref::rel_err(od, ref::to_d(want)), 1e-6) << "window " << window;
  }
}

// A cap of 0 is the plain op; negative or non-finite caps are refused before anything is written.
TEST(SoftcapOps, ZeroIsThePlainOpAndBadCapsAreRefused) {
  auto ops = make_cpu_ops();
  const int64_t S = 1, L = 9, nq = 2, nkv = 1, D = 8;
  VecF q = ref::randn(size_t(L * nq * D), 61), k = ref::randn(size_t(L * nkv * D), 62),
       v = ref::randn(size_t(L * nkv * D), 63);
  std::vector<char> scratch(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  VecF o1 = ref::nan_vec(q.size()), o2 = ref::nan_vec(q.size());
  ops->attention_fwd(q.data(), k.data(), v.data(), o1.data(), nullptr, S, L, nq, nkv, D, 0.3f,
                     scratch.data());
  ops->attention_fwd_v(q.data(), k.data(), v.data(), o2.data(), nullptr, S, L, nq, nkv, D, 0.3f, {},
                       scratch.data());
  EXPECT_EQ(o1, o2);
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Ops::AttentionVariant var;
    var.softcap = bad;
    EXPECT_THROW(ops->attention_fwd_v(q.data(), k.data(), v.data(), o2.data(), nullptr, S, L, nq, nkv, D,
                                      0.3f, var, scratch.data()),
                 std::invalid_argument);
    EXPECT_THROW(
        ops->attention_decode_v(q.data(), k.data(), v.data(), o2.data(), 0, L, nq, nkv, D, 0.3f, var),
        std::invalid_argument);
    float loss[2];
    const int32_t tg = 0;
    EXPECT_THROW(ops->lm_head_cross_entropy(q.data(), k.data(), &tg, 1, D, 1, loss, nullptr, nullptr,
                                            scratch.data(), 1.0f, bad),
                 std::invalid_argument);
  }
}

namespace {
// sum over targets >= 0 of logsumexp(zc) - zc[target], zc = cap * tanh(h W^T / cap)
double ref_capped_ce(const VecD& h, const VecD& w, const VecI& tg, int64_t T, int64_t H, int64_t V,
                     double cap) {
  const VecD z = ref::linear(h, w, T, H, V);
  double sum = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (tg[size_t(t)] < 0) continue;
    VecD zc(static_cast<size_t>(V));
    for (int64_t j = 0; j < V; ++j) zc[size_t(j)] = cap * std::tanh(z[size_t(t * V + j)] / cap);
    const double m = *std::max_element(zc.begin(), zc.end());
    double s = 0;
    for (double x : zc) s += std::exp(x - m);
    sum += m + std::log(s) - zc[size_t(tg[size_t(t)])];
  }
  return sum;
}
}  // namespace

// Loss of the capped logits and dh / dW through the tanh, over more tokens than one chunk
// (kCeChunk) with ignored ones, loss scaling on; dW accumulates.
TEST(SoftcapOps, CrossEntropyMatchesADenseReference) {
  auto ops = make_cpu_ops(2);
  const int64_t T = Ops::kCeChunk + 37, H = 12, V = 29;
  const float cap = 2.0f, ls = 4.0f;
  VecF h = ref::randn(size_t(T * H), 71), w = ref::randn(size_t(V * H), 72, 0.8f);
  VecI tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = t % 5 == 2 ? -100 : int32_t((t * 7 + 3) % V);
  VecF dh = ref::nan_vec(h.size()), dw(w.size(), 0.5f);
  float loss[2] = {NAN, NAN};
  std::vector<char> scratch(Ops::lm_head_ce_scratch_bytes(T, H, V));
  ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss, dh.data(), dw.data(),
                             scratch.data(), ls, cap);
  const VecD hd = ref::to_d(h), wd = ref::to_d(w);
  const double want = ref_capped_ce(hd, wd, tg, T, H, V, cap);
  EXPECT_NEAR(loss[0], want, 1e-5 * std::abs(want));
  EXPECT_EQ(loss[1], float(std::count_if(tg.begin(), tg.end(), [](int32_t x) { return x >= 0; })));
  EXPECT_GT(std::abs(ref::cross_entropy(hd, wd, tg, T, H, V).first - want), 1e-2 * std::abs(want));
  VecF dh1(dh.size()), dw1(dw.size());
  for (size_t i = 0; i < dh.size(); ++i) dh1[i] = dh[i] / ls;
  for (size_t i = 0; i < dw.size(); ++i) dw1[i] = (dw[i] - 0.5f) / ls;
  ref::check_grad([&](const VecD& x) { return ref_capped_ce(x, wd, tg, T, H, V, cap); }, hd, dh1, 60, 1e-4,
                  "dh");
  ref::check_grad([&](const VecD& x) { return ref_capped_ce(hd, x, tg, T, H, V, cap); }, wd, dw1, 60, 1e-4,
                  "dw");
  // the loss alone (no gradients) is the same sum
  float loss2[2];
  ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss2, nullptr, nullptr, scratch.data(),
                             1.0f, cap);
  EXPECT_FLOAT_EQ(loss2[0], loss[0]);
}

}  // namespace rp
