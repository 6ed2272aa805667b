// The CPU backend's GPT-OSS ops (kernels/cpu/cpu_gptoss.cpp) against naive double-precision
// references written here: attention with a sliding window and sink logits as HF's
// eager_attention_forward computes it (dense scores, additive mask, one sink column appended,
// softmax, sink column dropped), its gradients (including dsinks) by central differences, the
// default variant against the plain ops, decoding with a window against the last rows of the
// full pass; the per-expert bias and the clamped SwiGLU (gradients at the clamp bounds as
// torch.clamp's backward: 0 at x == bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
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

// Dense reference (ref::attention_variant): for each sequence/head a [L, L+1] logit matrix (key
// columns, then the sink), -inf where masked, softmax over the row. o [T,nq,D], lse [S,nq,L].
using RefOut = ref::VariantOut;
RefOut ref_attention(const VecD& q, const VecD& k, const VecD& v, const VecD* sinks, const Shape& sh,
                     int64_t window, const VecI* pos, double scale) {
  const auto [S, L, nq, nkv, D] = sh;
  return ref::attention_variant(q, k, v, S, L, nq, nkv, D, scale, window, pos, sinks, 0.0);
}

VecI packed_positions(const std::vector<int64_t>& lens, int64_t S) {
  VecI p;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t n : lens)
      for (int64_t t = 0; t < n; ++t) p.push_back(int32_t(t));
  return p;
}

struct Case {
  int64_t window;
  bool sinks, packed;
  int64_t ratio;
};

void run_case(const Case& c) {
  auto ops = make_cpu_ops();
  const Shape sh{2, 12, 8, 8 / c.ratio, 8};
  const auto [S, L, nq, nkv, D] = sh;
  const float scale = 0.4f;
  SCOPED_TRACE(::testing::Message() << "window " << c.window << " sinks " << c.sinks << " packed " << c.packed
                                    << " ratio " << c.ratio);
  VecF q = ref::randn(size_t(S * L * nq * D), 31), k = ref::randn(size_t(S * L * nkv * D), 32);
  VecF v = ref::randn(size_t(S * L * nkv * D), 33), dout = ref::randn(size_t(S * L * nq * D), 34);
  VecF sinks = ref::randn(size_t(nq), 35, 1.5f);
  const VecI pos = packed_positions({5, 7}, S);
  Ops::AttentionVariant var;
  var.window = c.window;
  var.sinks = c.sinks ? sinks.data() : nullptr;
  var.pos = c.packed ? pos.data() : nullptr;
  VecF o = ref::nan_vec(q.size()), lse = ref::nan_vec(size_t(S * nq * L));
  std::vector<char> scratch(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  ops->attention_fwd_v(q.data(), k.data(), v.data(), o.data(), lse.data(), S, L, nq, nkv, D, scale, var,
                       scratch.data());
  const VecD sd = ref::to_d(sinks);
  const VecI* pp = c.packed ? &pos : nullptr;
  const VecD* sp = c.sinks ? &sd : nullptr;
  const RefOut r = ref_attention(ref::to_d(q), ref::to_d(k), ref::to_d(v), sp, sh, c.window, pp, scale);
  EXPECT_LT(ref::rel_err(o, r.o), 1e-5);
  EXPECT_LT(ref::rel_err(lse, r.lse), 1e-5);

  VecF dq = ref::nan_vec(q.size()), dk = ref::nan_vec(k.size()), dv = ref::nan_vec(v.size());
  VecF dsinks(size_t(nq), 0.25f);  // accumulated into
  var.dsinks = c.sinks ? dsinks.data() : nullptr;
  ops->attention_bwd_v(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                       dv.data(), S, L, nq, nkv, D, scale, var, scratch.data());
  const VecD qd = ref::to_d(q), kd = ref::to_d(k), vd = ref::to_d(v);
  auto loss = [&](const VecD& q_, const VecD& k_, const VecD& v_, const VecD* s_) {
    return ref::dot(ref_attention(q_, k_, v_, s_, sh, c.window, pp, scale).o, dout);
  };
  ref::check_grad([&](const VecD& x) { return loss(x, kd, vd, sp); }, qd, dq, 40, 1e-4, "dq");
  ref::check_grad([&](const VecD& x) { return loss(qd, x, vd, sp); }, kd, dk, 40, 1e-4, "dk");
  ref::check_grad([&](const VecD& x) { return loss(qd, kd, x, sp); }, vd, dv, 40, 1e-4, "dv");
  if (c.sinks) {
    VecF grown(dsinks.size());
    for (size_t i = 0; i < grown.size(); ++i) grown[i] = dsinks[i] - 0.25f;
    ref::check_grad([&](const VecD& x) { return loss(qd, kd, vd, &x); }, sd, grown, 100, 1e-4, "dsinks");
  }
}

}  // namespace

TEST(GptOssOps, AttentionVariantsMatchADenseReferenceWithMaskAndSinkColumn) {
  for (int64_t window : {0, 1, 2, 3, 11, 128})  // 11 = L-1, 128 > L
    for (bool sinks : {false, true})
      for (bool packed : {false, true}) run_case({window, sinks, packed, 2});
  for (int64_t ratio : {1, 4, 8}) run_case({3, true, true, ratio});
}

// With the default variant every *_v op equals its plain counterpart (bit for bit: the
// plain ops run); a window >= L without sinks equals it up to rounding.
TEST(GptOssOps, DefaultVariantEqualsThePlainOps) {
  auto ops = make_cpu_ops();
  const int64_t S = 2, L = 9, nq = 4, nkv = 2, D = 8;
  VecF q = ref::randn(size_t(S * L * nq * D), 41), k = ref::randn(size_t(S * L * nkv * D), 42);
  VecF v = ref::randn(size_t(S * L * nkv * D), 43), dout = ref::randn(size_t(S * L * nq * D), 44);
  const VecI pos = packed_positions({4, 5}, S);
  std::vector<char> scratch(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  for (bool packed : {false, true})
    for (int64_t window : {0, 100}) {
      SCOPED_TRACE(::testing::Message() << "packed " << packed << " window " << window);
      Ops::AttentionVariant var;
      var.window = window;
      var.pos = packed ? pos.data() : nullptr;
      VecF o1(q.size()), o2(q.size()), l1(size_t(S * nq * L)), l2(l1.size());
      VecF dq1(q.size()), dq2(q.size()), dk1(k.size()), dk2(k.size()), dv1(v.size()), dv2(v.size());
      if (packed) {
        ops->attention_fwd_packed(q.data(), k.data(), v.data(), o1.data(), l1.data(), pos.data(), S, L, nq,
                                  nkv, D, 0.3f, scratch.data());
        ops->attention_bwd_packed(q.data(), k.data(), v.data(), o1.data(), l1.data(), dout.data(), pos.data(),
                                  dq1.data(), dk1.data(), dv1.data(), S, L, nq, nkv, D, 0.3f, scratch.data());
      } else {
        ops->attention_fwd(q.data(), k.data(), v.data(), o1.data(), l1.data(), S, L, nq, nkv, D, 0.3f,
                           scratch.data());
        ops->attention_bwd(q.data(), k.data(), v.data(), o1.data(), l1.data(), dout.data(), dq1.data(),
                           dk1.data(), dv1.data(), S, L, nq, nkv, D, 0.3f, scratch.data());
      }
      ops->attention_fwd_v(q.data(), k.data(), v.data(), o2.data(), l2.data(), S, L, nq, nkv, D, 0.3f, var,
                           scratch.data());
      ops->attention_bwd_v(q.data(), k.data(), v.data(), o2.data(), l2.data(), dout.data(), dq2.data(),
                           dk2.data(), dv2.data(), S, L, nq, nkv, D, 0.3f, var, scratch.data());
      const double tol = window == 0 ? 0.0 : 1e-5;
      EXPECT_LE(ref::rel_err(o2, o1), tol);
      EXPECT_LE(ref::rel_err(l2, l1), tol);
      EXPECT_LE(ref::rel_err(dq2, dq1), tol);
      EXPECT_LE(ref::rel_err(dk2, dk1), tol);
      EXPECT_LE(ref::rel_err(dv2, dv1), tol);
    }
  // decode
  const int64_t past = 6, n = 3;
  VecF qn(q.begin() + past * nq * D, q.begin() + (past + n) * nq * D), d1(qn.size()), d2(qn.size());
  ops->attention_decode(qn.data(), k.data(), v.data(), d1.data(), past, n, nq, nkv, D, 0.3f);
  ops->attention_decode_v(qn.data(), k.data(), v.data(), d2.data(), past, n, nq, nkv, D, 0.3f, {});
  EXPECT_LE(ref::rel_err(d2, d1), 1e-6);
}

// Decoding with a window and sinks over a cache: the last n rows of attention_fwd_v.
TEST(GptOssOps, DecodeWithWindowAndSinksEqualsTheLastRowsOfTheFullPass) {
  auto ops = make_cpu_ops();
  const int64_t past = 10, n = 3, L = past + n, nq = 8, nkv = 2, D = 8;
  VecF q = ref::randn(size_t(L * nq * D), 51), k = ref::randn(size_t(L * nkv * D), 52);
  VecF v = ref::randn(size_t(L * nkv * D), 53), sinks = ref::randn(size_t(nq), 54);
  std::vector<char> scratch(Ops::attention_scratch_bytes(1, L, nq, nkv, D));
  for (int64_t window : {1, 4, 100}) {
    Ops::AttentionVariant var;
    var.window = window;
    var.sinks = sinks.data();
    VecF o(q.size());
    ops->attention_fwd_v(q.data(), k.data(), v.data(), o.data(), nullptr, 1, L, nq, nkv, D, 0.3f, var,
                         scratch.data());
    VecF qn(q.begin() + past * nq * D, q.end()), od = ref::nan_vec(qn.size());
    ops->attention_decode_v(qn.data(), k.data(), v.data(), od.data(), past, n, nq, nkv, D, 0.3f, var);
    EXPECT_LT(ref::rel_err(od, VecF(o.begin() + past * nq * D, o.end())), 1e-6) << "window " << window;
  }
  const VecI some_pos(size_t(n), 0);
  Ops::AttentionVariant bad;
  bad.pos = some_pos.data();
  EXPECT_THROW(
      ops->attention_decode_v(q.data(), k.data(), v.data(), q.data(), past, n, nq, nkv, D, 0.3f, bad),
      std::invalid_argument);
}

TEST(GptOssOps, GroupedBiasAddsEachGroupsRowAndSumsItsGradient) {
  auto ops = make_cpu_ops();
  const int64_t E = 4, N = 5;
  const VecI off = {0, 3, 3, 7, 8};  // expert 1 has no rows
  const int64_t R = off[size_t(E)];
  VecF y = ref::randn(size_t(R * N), 61), b = ref::randn(size_t(E * N), 62), y0 = y;
  ops->grouped_bias_fwd(y.data(), b.data(), off.data(), E, N);
  for (int64_t r = 0; r < R; ++r) {
    int64_t e = 0;
    while (!(r >= off[size_t(e)] && r < off[size_t(e + 1)])) ++e;
    for (int64_t c = 0; c < N; ++c)
      ASSERT_FLOAT_EQ(y[size_t(r * N + c)], y0[size_t(r * N + c)] + b[size_t(e * N + c)]);
  }
  VecF dy = ref::randn(size_t(R * N), 63), db(size_t(E * N), 1.0f);
  ops->grouped_bias_bwd(dy.data(), db.data(), off.data(), E, N);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t c = 0; c < N; ++c) {
      double s = 1.0;
      for (int32_t r = off[size_t(e)]; r < off[size_t(e + 1)]; ++r) s += dy[size_t(r * N + c)];
      EXPECT_NEAR(db[size_t(e * N + c)], s, 1e-5);
    }
  // E = 1: a plain linear bias
  VecF x = ref::randn(size_t(3 * N), 64), x0 = x;
  const VecI one = {0, 3};
  ops->grouped_bias_fwd(x.data(), b.data(), one.data(), 1, N);
  for (int64_t i = 0; i < 3 * N; ++i) EXPECT_FLOAT_EQ(x[size_t(i)], x0[size_t(i)] + b[size_t(i % N)]);
  const VecI bad = {0, 4, 2};
  EXPECT_THROW(ops->grouped_bias_fwd(y.data(), b.data(), bad.data(), 2, N), std::invalid_argument);
}

// h = (clamp(u,-l,l) + 1) * min(g,l) * sigmoid(alpha*min(g,l)) (HF GptOssExperts._apply_gate).
TEST(GptOssOps, ClampedSwigluMatchesHfAndTorchClampGradients) {
  auto ops = make_cpu_ops();
  const float alpha = 1.702f, limit = 7.0f;
  VecF g = ref::randn(64, 71, 6.f), u = ref::randn(64, 72, 6.f);
  // the bounds themselves and beyond
  g[0] = limit, g[1] = -limit, g[2] = 9.f, g[3] = -9.f;
  u[0] = limit, u[1] = -limit, u[2] = 9.f, u[3] = -9.f;
  const int64_t n = int64_t(g.size());
  VecF h = ref::nan_vec(g.size());
  ops->swiglu_clamped_fwd(g.data(), u.data(), h.data(), n, alpha, limit);
  auto f = [&](double gi, double ui) {
    const double gc = std::min(gi, double(limit)), uc = std::max(-double(limit), std::min(ui, double(limit)));
    return (uc + 1) * gc / (1 + std::exp(-alpha * gc));
  };
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(h[size_t(i)], f(g[size_t(i)], u[size_t(i)]), 1e-5 * (1 + std::abs(h[size_t(i)])));
  VecF dh = ref::randn(64, 73), dg = ref::nan_vec(64), du = ref::nan_vec(64);
  ops->swiglu_clamped_bwd(g.data(), u.data(), dh.data(), dg.data(), du.data(), n, alpha, limit);
  // torch.clamp passes no gradient at the bound: g == limit, u == +-limit
  EXPECT_EQ(dg[0], 0.f);
  EXPECT_EQ(du[0], 0.f);
  EXPECT_EQ(du[1], 0.f);
  EXPECT_NE(dg[1], 0.f);  // g = -limit is not clamped (no lower bound on the gate)
  EXPECT_EQ(dg[2], 0.f);
  EXPECT_EQ(du[2], 0.f);
  EXPECT_EQ(du[3], 0.f);
  for (int64_t i = 4; i < n; ++i) {  // away from the bounds: central differences
    const double gi = g[size_t(i)], ui = u[size_t(i)], e = 1e-5;
    const double ng = (f(gi + e, ui) - f(gi - e, ui)) / (2 * e) * dh[size_t(i)];
    const double nu = (f(gi, ui + e) - f(gi, ui - e)) / (2 * e) * dh[size_t(i)];
    EXPECT_NEAR(dg[size_t(i)], ng, 1e-4 * (1 + std::abs(ng))) << i;
    EXPECT_NEAR(du[size_t(i)], nu, 1e-4 * (1 + std::abs(nu))) << i;
  }
}

}  // namespace rp
