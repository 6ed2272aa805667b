// The CPU backend's mixture-of-experts ops (kernels/cpu/cpu_moe.cpp) against naive
// double-precision references written here: routing on hand-built and random logits, the
// load-balancing statistics, the sort's invariants (offsets, permutation, stability), the
// gathers and combines with their backward passes (formulas and adjoint identities), the
// router backward against central differences, and the grouped linears against per-expert
// loops (with experts that have no rows). Outputs are NaN-poisoned before each call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp {
namespace {

using ref::VecD;
using ref::VecF;
using VecI = std::vector<int32_t>;

VecD softmax_row(const double* z, int64_t E) {
  VecD p(static_cast<size_t>(E));
  const double mx = *std::max_element(z, z + E);
  double s = 0;
  for (int64_t e = 0; e < E; ++e) s += (p[size_t(e)] = std::exp(z[e] - mx));
  for (auto& v : p) v /= s;
  return p;
}

// Experts of token t by (p descending, index ascending), first k.
VecI naive_topk(const VecD& p, int64_t k) {
  VecI order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  order.resize(size_t(k));
  return order;
}

struct Routed {
  VecF probs, w, stats;
  VecI idx;
};
Routed route(Ops& ops, const VecF& logits, int64_t T, int64_t E, int64_t k, bool norm, VecF stats0 = {}) {
  Routed r{ref::nan_vec(size_t(T * E)), ref::nan_vec(size_t(T * k)), stats0, VecI(size_t(T * k), -7)};
  ops.moe_route(logits.data(), r.probs.data(), r.idx.data(), r.w.data(),
                r.stats.empty() ? nullptr : r.stats.data(), T, E, k, norm);
  return r;
}

TEST(MoeOps, RouteHandBuiltLogits) {
  auto ops = make_cpu_ops(1);
  const int64_t T = 3, E = 5, k = 2;
  // token 0: experts 1 and 3 tie for first (lower index first); token 1: distinct values;
  // token 2: all equal (experts 0, 1)
  const VecF z = {0, 2, 1, 2, -1, 3, 1, 4, 1, 5, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  const VecI want = {1, 3, 4, 2, 0, 1};
  for (bool norm : {false, true}) {
    const VecF stats0 = {1, 2, 0, 4, 5, 0.5f, 0.25f, 0, 1, 2};
    Routed r = route(*ops, z, T, E, k, norm, stats0);
    EXPECT_EQ(r.idx, want) << "norm " << norm;
    VecD pref, wref(size_t(T * k)), sref(stats0.begin(), stats0.end());
    for (int64_t t = 0; t < T; ++t) {
      VecD zd(z.begin() + t * E, z.begin() + (t + 1) * E);
      VecD p = softmax_row(zd.data(), E);
      pref.insert(pref.end(), p.begin(), p.end());
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += p[size_t(want[size_t(t * k + j)])];
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = want[size_t(t * k + j)];
        wref[size_t(t * k + j)] = norm ? p[size_t(e)] / s : p[size_t(e)];
        sref[size_t(e)] += 1;
      }
      for (int64_t e = 0; e < E; ++e) sref[size_t(E + e)] += p[size_t(e)];
    }
    EXPECT_LT(ref::rel_err(r.probs, pref), 1e-6);
    EXPECT_LT(ref::rel_err(r.w, wref), 1e-6);
    EXPECT_LT(ref::rel_err(r.stats, sref), 1e-6);
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(r.stats[size_t(e)], float(sref[size_t(e)])) << "count of " << e;
    if (norm) {
      EXPECT_FLOAT_EQ(r.w[0], 0.5f);  // the tie splits evenly
      EXPECT_FLOAT_EQ(r.w[4], 0.5f);
    }
  }
  VecF p(size_t(T * E)), w(size_t(T * 6));
  VecI idx(size_t(T * 6));
  EXPECT_THROW(ops->moe_route(z.data(), p.data(), idx.data(), w.data(), nullptr, T, E, 0, false),
               std::invalid_argument);
  EXPECT_THROW(ops->moe_route(z.data(), p.data(), idx.data(), w.data(), nullptr, T, E, 6, false),
               std::invalid_argument);
}

TEST(MoeOps, RouteRandomMatchesNaive) {
  auto ops = make_cpu_ops(1);
  const int64_t T = 40, E = 16, k = 4;
  const VecF z = ref::randn(size_t(T * E), 3, 2.f);
  Routed r = route(*ops, z, T, E, k, true);
  for (int64_t t = 0; t < T; ++t) {
    VecD zd(z.begin() + t * E, z.begin() + (t + 1) * E);
    VecD p = softmax_row(zd.data(), E);
    VecI want = naive_topk(p, k);
    EXPECT_EQ(VecI(r.idx.begin() + t * k, r.idx.begin() + (t + 1) * k), want) << "token " << t;
    double s = 0;
    for (int32_t e : want) s += p[size_t(e)];
    for (int64_t j = 0; j < k; ++j) EXPECT_NEAR(r.w[size_t(t * k + j)], p[size_t(want[size_t(j)])] / s, 1e-6);
  }
}

// L(z) = sum_{t,j} g[t,j] w[t,j](z) + aux * sum_e counts[e] sum_t p[t,e](z), the experts held
// at those chosen at z0; moe_route_bwd must give dL/dz.
TEST(MoeOps, RouteBackwardMatchesFiniteDifferences) {
  auto ops = make_cpu_ops(1);
  const int64_t T = 6, E = 9, k = 3;
  const VecF z = ref::randn(size_t(T * E), 5, 1.5f), g = ref::randn(size_t(T * k), 6);
  const VecF counts = {3, 0, 1, 5, 2, 2, 0, 4, 1};
  const float aux = 0.37f;
  for (bool norm : {false, true}) {
    for (bool with_aux : {false, true}) {
      Routed r = route(*ops, z, T, E, k, norm);
      VecF dz = ref::nan_vec(size_t(T * E));
      ops->moe_route_bwd(r.probs.data(), r.idx.data(), g.data(), with_aux ? counts.data() : nullptr, aux,
                         dz.data(), T, E, k, norm);
      auto loss = [&](const VecD& zz) {
        double L = 0;
        for (int64_t t = 0; t < T; ++t) {
          VecD p = softmax_row(zz.data() + t * E, E);
          double s = 0;
          for (int64_t j = 0; j < k; ++j) s += p[size_t(r.idx[size_t(t * k + j)])];
          for (int64_t j = 0; j < k; ++j) {
            const double w = p[size_t(r.idx[size_t(t * k + j)])];
            L += g[size_t(t * k + j)] * (norm ? w / s : w);
          }
          if (with_aux)
            for (int64_t e = 0; e < E; ++e) L += aux * counts[size_t(e)] * p[size_t(e)];
        }
        return L;
      };
      ref::check_grad(loss, ref::to_d(z), dz, size_t(T * E), 1e-4, norm ? "dlogits (norm)" : "dlogits");
    }
  }
}

TEST(MoeOps, SortGroupsStablyByExpert) {
  auto ops = make_cpu_ops(1);
  const int64_t T = 50, k = 3, E = 7, R = T * k;
  VecI idx(static_cast<size_t>(R));
  for (int64_t a = 0; a < R; ++a) idx[size_t(a)] = int32_t((a * 5 + a / 7) % 6);  // expert 6 has no rows
  for (int64_t a = 0; a < R; a += 11) idx[size_t(a)] = 4 == idx[size_t(a)] ? 0 : idx[size_t(a)];
  VecI off(size_t(E + 1), -9), off_h(size_t(E + 1), -9), row(size_t(R), -9), token(size_t(R), -9);
  ops->moe_sort(idx.data(), off.data(), off_h.data(), row.data(), token.data(), T, E, k);
  EXPECT_EQ(off, off_h);
  VecI count(size_t(E), 0);
  for (int32_t e : idx) ++count[size_t(e)];
  EXPECT_EQ(count[6], 0);
  ASSERT_EQ(off[0], 0);
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(off[size_t(e + 1)] - off[size_t(e)], count[size_t(e)]) << e;
  VecI seen(size_t(R), 0);
  VecI last(size_t(E), -1);  // last sorted row of each expert, to check stability
  for (int64_t a = 0; a < R; ++a) {
    const int32_t r = row[size_t(a)], e = idx[size_t(a)];
    ASSERT_TRUE(r >= 0 && r < R) << a;
    ++seen[size_t(r)];
    EXPECT_TRUE(r >= off[size_t(e)] && r < off[size_t(e + 1)]) << "assignment " << a << " outside its expert";
    EXPECT_GT(r, last[size_t(e)]) << "unstable at " << a;
    last[size_t(e)] = r;
    EXPECT_EQ(token[size_t(r)], a / k);
  }
  for (int32_t s : seen) ASSERT_EQ(s, 1) << "row is not a permutation";
  idx[3] = int32_t(E);
  EXPECT_THROW(ops->moe_sort(idx.data(), off.data(), off_h.data(), row.data(), token.data(), T, E, k),
               std::invalid_argument);
  EXPECT_THROW(ops->moe_sort(idx.data(), off.data(), off_h.data(), row.data(), token.data(), T, 0, k),
               std::invalid_argument);
  EXPECT_THROW(ops->moe_sort(idx.data(), off.data(), off_h.data(), row.data(), token.data(), T, E, 0),
               std::invalid_argument);
}

// A routing of T tokens to k of E experts (distinct per token) and its sort.
struct Grouping {
  VecI idx, off, row, token;
};
Grouping grouping(Ops& ops, int64_t T, int64_t E, int64_t k, uint32_t seed) {
  Grouping g;
  Routed r = route(ops, ref::randn(size_t(T * E), seed), T, E, k, false);
  g.idx = r.idx;
  g.off.assign(size_t(E + 1), 0);
  VecI off_h(size_t(E + 1));
  g.row.assign(size_t(T * k), 0);
  g.token.assign(size_t(T * k), 0);
  ops.moe_sort(g.idx.data(), g.off.data(), off_h.data(), g.row.data(), g.token.data(), T, E, k);
  return g;
}

TEST(MoeOps, GatherAndCombineForward) {
  auto ops = make_cpu_ops(1);
  const int64_t T = 21, E = 6, k = 2, H = 13, R = T * k;
  Grouping gr = grouping(*ops, T, E, k, 9);
  const VecF x = ref::randn(size_t(T * H), 10), ys = ref::randn(size_t(R * H), 11),
             w = ref::randn(size_t(R), 12);
  VecF xs = ref::nan_vec(size_t(R * H));
  ops->gather_rows(x.data(), gr.token.data(), xs.data(), R, H);
  for (int64_t a = 0; a < R; ++a)
    for (int64_t c = 0; c < H; ++c)
      ASSERT_EQ(xs[size_t(gr.row[size_t(a)] * H + c)], x[size_t((a / k) * H + c)]) << a << "," << c;
  const VecF y0 = ref::randn(size_t(T * H), 13);
  for (bool acc : {false, true}) {
    VecF y = acc ? y0 : ref::nan_vec(size_t(T * H));
    ops->moe_combine(ys.data(), w.data(), gr.row.data(), y.data(), T, k, H, acc);
    VecD want(size_t(T * H));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < H; ++c) {
        double s = acc ? y0[size_t(t * H + c)] : 0.0;
        for (int64_t j = 0; j < k; ++j)
          s += double(w[size_t(t * k + j)]) * ys[size_t(gr.row[size_t(t * k + j)] * H + c)];
        want[size_t(t * H + c)] = s;
      }
    EXPECT_LT(ref::rel_err(y, want), 1e-6) << "accumulate " << acc;
  }
}

// Adjoint identities: moe_combine is linear in ys for fixed w and in w for fixed ys, so
// <dy, combine(δys, w)> = <dys, δys> and <dy, combine(ys, δw)> = <dw, δw>; moe_gather_bwd
// is the transpose of gather_rows: <dxs, gather(x)> = <gather_bwd(dxs), x>.
TEST(MoeOps, CombineAndGatherBackwardAreAdjoints) {
  auto ops = make_cpu_ops(1);
  const int64_t T = 17, E = 5, k = 3, H = 11, R = T * k;
  Grouping gr = grouping(*ops, T, E, k, 21);
  const VecF ys = ref::randn(size_t(R * H), 22), w = ref::randn(size_t(R), 23),
             dy = ref::randn(size_t(T * H), 24);
  VecF dys = ref::nan_vec(size_t(R * H)), dw = ref::nan_vec(size_t(R));
  ops->moe_combine_bwd(dy.data(), ys.data(), w.data(), gr.row.data(), dys.data(), dw.data(), T, k, H);
  const VecF dys_in = ref::randn(size_t(R * H), 25), dw_in = ref::randn(size_t(R), 26);
  VecF y1(size_t(T * H)), y2(size_t(T * H));
  ops->moe_combine(dys_in.data(), w.data(), gr.row.data(), y1.data(), T, k, H, false);
  ops->moe_combine(ys.data(), dw_in.data(), gr.row.data(), y2.data(), T, k, H, false);
  auto dotf = [](const VecF& a, const VecF& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
    return s;
  };
  const double l1 = dotf(dy, y1), r1 = dotf(dys, dys_in), l2 = dotf(dy, y2), r2 = dotf(dw, dw_in);
  EXPECT_NEAR(l1, r1, 1e-4 * (std::abs(l1) + 1)) << "ys adjoint";
  EXPECT_NEAR(l2, r2, 1e-4 * (std::abs(l2) + 1)) << "w adjoint";
  const VecF x = ref::randn(size_t(T * H), 27), dxs = ref::randn(size_t(R * H), 28),
             dx0 = ref::randn(size_t(T * H), 29);
  VecF xs(size_t(R * H)), dx = ref::nan_vec(size_t(T * H)), dxa = dx0;
  ops->gather_rows(x.data(), gr.token.data(), xs.data(), R, H);
  ops->moe_gather_bwd(dxs.data(), gr.row.data(), dx.data(), T, k, H, false);
  ops->moe_gather_bwd(dxs.data(), gr.row.data(), dxa.data(), T, k, H, true);
  const double l3 = dotf(dxs, xs), r3 = dotf(dx, x);
  EXPECT_NEAR(l3, r3, 1e-4 * (std::abs(l3) + 1)) << "gather adjoint";
  for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dxa[i], dx0[i] + dx[i], 1e-5) << "accumulate " << i;
}

// Grouped linears against per-expert naive loops; experts 1 and E-1 have no rows.
TEST(MoeOps, GroupedLinearsMatchPerExpertLoops) {
  auto ops = make_cpu_ops(2);
  const int64_t E = 5, K = 7, N = 6;
  const VecI off = {0, 4, 4, 9, 12, 12};
  const int64_t R = off[size_t(E)];
  const VecF x = ref::randn(size_t(R * K), 31), w = ref::randn(size_t(E * N * K), 32),
             dy = ref::randn(size_t(R * N), 33);
  auto expert_of = [&](int64_t r) {
    int64_t e = 0;
    while (off[size_t(e + 1)] <= r) ++e;
    return e;
  };
  VecF y = ref::nan_vec(size_t(R * N));
  ops->grouped_linear_fwd(x.data(), w.data(), y.data(), off.data(), E, K, N);
  VecD yr(size_t(R * N), 0), dxr(size_t(R * K), 0);
  for (int64_t r = 0; r < R; ++r) {
    const float* we = w.data() + expert_of(r) * N * K;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < K; ++c) {
        yr[size_t(r * N + n)] += double(x[size_t(r * K + c)]) * we[n * K + c];
        dxr[size_t(r * K + c)] += double(dy[size_t(r * N + n)]) * we[n * K + c];
      }
  }
  EXPECT_LT(ref::rel_err(y, yr), 1e-6);
  // y0 + alpha x W_e^T, added in place
  const VecF y0 = ref::randn(size_t(R * N), 36);
  VecF ya = y0;
  ops->grouped_linear_fwd_add(x.data(), w.data(), ya.data(), off.data(), E, K, N, -0.25f);
  VecD yar(size_t(R * N));
  for (size_t i = 0; i < yar.size(); ++i) yar[i] = double(y0[i]) - 0.25 * yr[i];
  EXPECT_LT(ref::rel_err(ya, yar), 1e-6);
  VecF dx = ref::nan_vec(size_t(R * K)), dx0 = ref::randn(size_t(R * K), 34), dxa = dx0;
  ops->grouped_linear_bwd_input(dy.data(), w.data(), dx.data(), off.data(), E, K, N, false);
  ops->grouped_linear_bwd_input(dy.data(), w.data(), dxa.data(), off.data(), E, K, N, true);
  EXPECT_LT(ref::rel_err(dx, dxr), 1e-6);
  VecD dxar(dxr);
  for (size_t i = 0; i < dxar.size(); ++i) dxar[i] += dx0[i];
  EXPECT_LT(ref::rel_err(dxa, dxar), 1e-6);
  const VecF dw0 = ref::randn(size_t(E * N * K), 35);
  VecF dw = dw0;
  ops->grouped_linear_bwd_weight(dy.data(), x.data(), dw.data(), off.data(), E, K, N);
  VecD dwr(dw0.begin(), dw0.end());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < K; ++c)
        dwr[size_t(expert_of(r) * N * K + n * K + c)] += double(dy[size_t(r * N + n)]) * x[size_t(r * K + c)];
  EXPECT_LT(ref::rel_err(dw, dwr), 1e-6);
  for (int64_t e : {int64_t(1), E - 1})
    for (int64_t i = 0; i < N * K; ++i) ASSERT_EQ(dw[size_t(e * N * K + i)], dw0[size_t(e * N * K + i)]) << e;
  const VecI bad0 = {1, 4, 4, 9, 12, 12}, bad_order = {0, 4, 3, 9, 12, 12};
  EXPECT_THROW(ops->grouped_linear_fwd(x.data(), w.data(), y.data(), bad0.data(), E, K, N),
               std::invalid_argument);
  EXPECT_THROW(ops->grouped_linear_fwd(x.data(), w.data(), y.data(), bad_order.data(), E, K, N),
               std::invalid_argument);
}

}  // namespace
}  // namespace rp
