// Backward of every CPU op vs central finite differences of an independent double
// precision reference forward (tests/kernels/ref_ops.hpp), through the scalar
// f = sum(y * r) for a random r (so dy = r). Accumulating outputs start non-zero.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp {
namespace {

using namespace rp::ref;

constexpr double kTol = 1e-4;  // fp32 analytic gradient vs double finite differences

VecF minus(const VecF& a, const VecF& b) {
  VecF d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

TEST(CpuOpsGrad, Linear) {
  auto ops = make_cpu_ops();
  const int64_t M = 7, K = 11, N = 5;
  VecF x = randn(size_t(M * K), 1), w = randn(size_t(N * K), 2), r = randn(size_t(M * N), 3);
  VecF dx = nan_vec(x.size()), dw0 = randn(w.size(), 4), dw = dw0;
  ops->linear_bwd_input(r.data(), w.data(), dx.data(), M, K, N, false);
  ops->linear_bwd_weight(r.data(), x.data(), dw.data(), M, K, N);
  check_grad([&](const VecD& xx) { return dot(linear(xx, to_d(w), M, K, N), r); }, to_d(x), dx, 1000, kTol,
             "linear dx");
  check_grad([&](const VecD& ww) { return dot(linear(to_d(x), ww, M, K, N), r); }, to_d(w), minus(dw, dw0),
             1000, kTol, "linear dw");
}

TEST(CpuOpsGrad, Embedding) {
  auto ops = make_cpu_ops();
  const int64_t T = 9, H = 4, V = 6;
  std::vector<int32_t> ids = {0, 3, 3, 5, 1, 0, 3, 2, 5};
  VecF table = randn(size_t(V * H), 5), r = randn(size_t(T * H), 6), g = nan_vec(table.size());
  ops->fill(DType::f32, g.data(), V * H, 0.f);
  ops->embedding_bwd(ids.data(), r.data(), g.data(), T, H, V, -1);
  auto f = [&](const VecD& tb) {
    double s = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) s += tb[size_t(ids[size_t(t)] * H + j)] * r[size_t(t * H + j)];
    return s;
  };
  check_grad(f, to_d(table), g, 1000, kTol, "embedding dtable");
}

TEST(CpuOpsGrad, RMSNorm) {
  auto ops = make_cpu_ops();
  const int64_t R = 6, n = 10;
  const float eps = 1e-5f;
  VecF x = randn(size_t(R * n), 7, 2.0f), w = randn(size_t(n), 8), r = randn(size_t(R * n), 9);
  VecF dx = nan_vec(x.size()), dw0 = randn(w.size(), 10), dw = dw0;
  ops->rmsnorm_bwd(x.data(), w.data(), r.data(), dx.data(), dw.data(), R, n, eps, false);
  check_grad([&](const VecD& xx) { return dot(rmsnorm(xx, to_d(w), R, n, eps), r); }, to_d(x), dx, 1000, kTol,
             "rmsnorm dx");
  check_grad([&](const VecD& ww) { return dot(rmsnorm(to_d(x), ww, R, n, eps), r); }, to_d(w), minus(dw, dw0),
             1000, kTol, "rmsnorm dw");
  // accumulate_dx adds onto what is there
  VecF base = randn(x.size(), 11), dxa = base, dw2 = dw0;
  ops->rmsnorm_bwd(x.data(), w.data(), r.data(), dxa.data(), dw2.data(), R, n, eps, true);
  EXPECT_LT(rel_err(minus(dxa, base), dx), 1e-6);
}

// A frozen norm weight (dw null): the same dx, and no weight gradient anywhere.
TEST(CpuOpsGrad, RMSNormWithoutWeightGradient) {
  auto ops = make_cpu_ops();
  const int64_t R = 5, n = 12;
  const float eps = 1e-5f;
  VecF x = randn(size_t(R * n), 21, 2.0f), w = randn(size_t(n), 22), r = randn(size_t(R * n), 23);
  VecF dx = nan_vec(x.size()), dw = randn(w.size(), 24), dx_frozen = nan_vec(x.size());
  ops->rmsnorm_bwd(x.data(), w.data(), r.data(), dx.data(), dw.data(), R, n, eps, false);
  ops->rmsnorm_bwd(x.data(), w.data(), r.data(), dx_frozen.data(), nullptr, R, n, eps, false);
  for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx_frozen[i], dx[i]) << i;
  VecF base = randn(x.size(), 25), acc = base;
  ops->rmsnorm_bwd(x.data(), w.data(), r.data(), acc.data(), nullptr, R, n, eps, true);
  EXPECT_LT(rel_err(minus(acc, base), dx), 1e-6);
}

TEST(CpuOpsGrad, RoPE) {
  auto ops = make_cpu_ops();
  const int64_t S = 2, L = 6, heads = 2, D = 8;
  RopeParams p;
  p.head_dim = D;
  RopeTable tab = rope_frequencies(p);
  const float scale = 1.2f;
  VecF x = randn(size_t(S * L * heads * D), 12), r = randn(x.size(), 13), dx = r;
  ops->rope_bwd(dx.data(), S, L, heads, D, tab.inv_freq.data(), scale);
  check_grad([&](const VecD& xx) { return dot(rope(xx, S, L, heads, D, tab.inv_freq, scale), r); }, to_d(x),
             dx, 1000, kTol, "rope dx");
}

TEST(CpuOpsGrad, RoPEPartialRotary) {  // rotary_dim 6 of 10: the pass-through gets dx' as is
  auto ops = make_cpu_ops();
  const int64_t S = 2, L = 5, heads = 2, D = 10, R = 6;
  RopeParams p;
  p.head_dim = R;
  RopeTable tab = rope_frequencies(p);
  const float scale = 0.9f;
  VecF x = randn(size_t(S * L * heads * D), 14), r = randn(x.size(), 15), dx = r;
  ops->rope_bwd(dx.data(), S, L, heads, D, tab.inv_freq.data(), scale, R);
  check_grad([&](const VecD& xx) { return dot(rope(xx, S, L, heads, D, tab.inv_freq, scale, R), r); },
             to_d(x), dx, 1000, kTol, "partial rope dx");
}

TEST(CpuOpsGrad, SwiGLU) {
  auto ops = make_cpu_ops();
  const int64_t n = 50;
  VecF g = randn(size_t(n), 14, 3.0f), u = randn(size_t(n), 15), r = randn(size_t(n), 16);
  VecF dg = nan_vec(size_t(n)), du = nan_vec(size_t(n));
  ops->swiglu_bwd(g.data(), u.data(), r.data(), dg.data(), du.data(), n);
  check_grad([&](const VecD& gg) { return dot(swiglu(gg, to_d(u)), r); }, to_d(g), dg, 1000, kTol,
             "swiglu dg");
  check_grad([&](const VecD& uu) { return dot(swiglu(to_d(g), uu), r); }, to_d(u), du, 1000, kTol,
             "swiglu du");
}

TEST(CpuOpsGrad, GeGLU) {
  auto ops = make_cpu_ops();
  const int64_t n = 50;
  VecF g = randn(size_t(n), 17, 3.0f), u = randn(size_t(n), 18), r = randn(size_t(n), 19);
  VecF dg = nan_vec(size_t(n)), du = nan_vec(size_t(n));
  ops->geglu_bwd(g.data(), u.data(), r.data(), dg.data(), du.data(), n);
  check_grad([&](const VecD& gg) { return dot(geglu(gg, to_d(u)), r); }, to_d(g), dg, 1000, kTol, "geglu dg");
  check_grad([&](const VecD& uu) { return dot(geglu(to_d(g), uu), r); }, to_d(u), du, 1000, kTol, "geglu du");
}

// Gemma's RMSNorm (w_offset 1): the gradients of x * rsqrt(..) * (1 + w).
TEST(CpuOpsGrad, RMSNormWeightOffset) {
  auto ops = make_cpu_ops();
  const int64_t R = 4, n = 9;
  const float eps = 1e-6f;
  VecF x = randn(size_t(R * n), 26, 2.0f), w = randn(size_t(n), 27, 0.3f), r = randn(size_t(R * n), 28);
  VecF dx = nan_vec(x.size()), dw0 = randn(w.size(), 29), dw = dw0;
  ops->rmsnorm_bwd(x.data(), w.data(), r.data(), dx.data(), dw.data(), R, n, eps, false, 1.0f);
  auto plus1 = [](VecD v) {
    for (auto& e : v) e += 1.0;
    return v;
  };
  check_grad([&](const VecD& xx) { return dot(rmsnorm(xx, plus1(to_d(w)), R, n, eps), r); }, to_d(x), dx,
             1000, kTol, "gemma rmsnorm dx");
  check_grad([&](const VecD& ww) { return dot(rmsnorm(to_d(x), plus1(ww), R, n, eps), r); }, to_d(w),
             minus(dw, dw0), 1000, kTol, "gemma rmsnorm dw");
}

struct AttnDims {
  int64_t S, L, nq, nkv, D;
};
class AttentionGrad : public ::testing::TestWithParam<AttnDims> {};

TEST_P(AttentionGrad, MatchesFiniteDifferences) {
  auto [S, L, nq, nkv, D] = GetParam();
  auto ops = make_cpu_ops();
  const int64_t T = S * L;
  VecF q = randn(size_t(T * nq * D), 17), k = randn(size_t(T * nkv * D), 18),
       v = randn(size_t(T * nkv * D), 19), r = randn(q.size(), 20);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<char> scratch(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  VecF o = nan_vec(q.size()), lse = nan_vec(size_t(S * nq * L));
  ops->attention_fwd(q.data(), k.data(), v.data(), o.data(), lse.data(), S, L, nq, nkv, D, scale,
                     scratch.data());
  VecF dq = nan_vec(q.size()), dk = nan_vec(k.size()), dv = nan_vec(v.size());
  ops->attention_bwd(q.data(), k.data(), v.data(), o.data(), lse.data(), r.data(), dq.data(), dk.data(),
                     dv.data(), S, L, nq, nkv, D, scale, scratch.data());
  auto f = [&](const VecD& qq, const VecD& kk, const VecD& vv) {
    return dot(attention(qq, kk, vv, S, L, nq, nkv, D, scale), r);
  };
  const size_t ns = 120;
  check_grad([&](const VecD& x) { return f(x, to_d(k), to_d(v)); }, to_d(q), dq, ns, kTol, "attn dq");
  check_grad([&](const VecD& x) { return f(to_d(q), x, to_d(v)); }, to_d(k), dk, ns, kTol, "attn dk");
  check_grad([&](const VecD& x) { return f(to_d(q), to_d(k), x); }, to_d(v), dv, ns, kTol, "attn dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGrad,
                         ::testing::Values(AttnDims{2, 5, 4, 2, 4}, AttnDims{1, 67, 2, 1, 4},
                                           AttnDims{2, 3, 3, 3, 2}));

TEST(CpuOpsGrad, LmHeadCrossEntropy) {
  auto ops = make_cpu_ops();
  const int64_t T = 11, H = 6, V = 13;
  VecF h = randn(size_t(T * H), 21), w = randn(size_t(V * H), 22);
  std::vector<int32_t> tg = {3, -100, 0, 12, 5, 5, -1, 7, 1, 2, 9};
  std::vector<char> scratch(Ops::lm_head_ce_scratch_bytes(T, H, V));
  VecF dh = nan_vec(h.size()), dw0 = randn(w.size(), 23), dw = dw0;
  float loss[2];
  ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss, dh.data(), dw.data(),
                             scratch.data());
  check_grad([&](const VecD& x) { return cross_entropy(x, to_d(w), tg, T, H, V).first; }, to_d(h), dh, 1000,
             kTol, "ce dh");
  check_grad([&](const VecD& x) { return cross_entropy(to_d(h), x, tg, T, H, V).first; }, to_d(w),
             minus(dw, dw0), 1000, kTol, "ce dw");
}

}  // namespace
}  // namespace rp
