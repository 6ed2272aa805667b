// The padded expert layout on the CPU backend (kernels/moe_buckets.hpp, Ops::moe_pad,
// kernels/cpu/cpu_moe.cpp): the bucketing rule's bounds on uniform, skewed and single-expert
// routings; moe_pad's layout against the unpadded sort (each assignment at its unpadded place
// within its expert's padded segment, pad tokens -1); the gather's zero pad rows,
// moe_zero_pad_rows, and the grouped linears on the padded layout equal to the unpadded ones
// at the real rows (zero at the pads, weight gradients unchanged).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/moe_buckets.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp {
namespace {

using ref::VecF;
using VecI = std::vector<int32_t>;

// T*k assignments: expert of (t, j) drawn with weights growing by `skew` per expert, the k
// experts of a token distinct.
VecI routing(int64_t T, int64_t E, int64_t k, double skew, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<double> wts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) wts[size_t(e)] = 1.0 + skew * double(e);
  VecI idx;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> left = wts;
    for (int64_t j = 0; j < k; ++j) {
      std::discrete_distribution<int32_t> d(left.begin(), left.end());
      const int32_t e = d(g);
      left[size_t(e)] = 0;
      idx.push_back(e);
    }
  }
  return idx;
}

struct Sorted {
  VecI off, off_host, row, token;
};
Sorted sort(Ops& ops, const VecI& idx, int64_t T, int64_t E, int64_t k, int64_t rows) {
  Sorted s{VecI(size_t(E + 1)), VecI(size_t(E + 1)), VecI(size_t(T * k)), VecI(size_t(rows), -7)};
  ops.moe_sort(idx.data(), s.off.data(), s.off_host.data(), s.row.data(), s.token.data(), T, E, k);
  return s;
}

// The routing idx sorted as it is (u) and sorted into buffers of padded_rows_bound rows, then
// padded (p, its rows Rp).
struct PaddedSort {
  Sorted u, p;
  int64_t cap = 0, Rp = 0;
};
PaddedSort padded_sort(Ops& ops, const VecI& idx, int64_t T, int64_t E, int64_t k) {
  PaddedSort s{sort(ops, idx, T, E, k, T * k), {}, padded_rows_bound(T * k, kExpertPadFraction), 0};
  s.p = sort(ops, idx, T, E, k, s.cap);
  Sorted& p = s.p;
  s.Rp =
      ops.moe_pad(idx.data(), p.off.data(), p.off_host.data(), p.row.data(), p.token.data(), T, E, k, s.cap);
  return s;
}

TEST(MoePad, BucketsKeepTheirPaddingBound) {
  for (double skew : {0.0, 0.3, 5.0}) {
    for (uint32_t seed : {1u, 2u}) {
      const int64_t T = 300, E = 64, k = 8;
      VecI idx = routing(T, E, k, skew, seed);
      auto ops = make_cpu_ops(1);
      Sorted s = sort(*ops, idx, T, E, k, T * k);
      const auto buckets = bucket_experts(s.off_host, kExpertPadFraction);
      EXPECT_EQ(check_buckets(s.off_host, buckets, kExpertPadFraction), "") << "skew " << skew;
      const VecI p = padded_offsets(s.off_host, kExpertPadFraction);
      EXPECT_LE(p[size_t(E)], padded_rows_bound(T * k, kExpertPadFraction));
      EXPECT_GE(p[size_t(E)], T * k);
      for (int64_t e = 0; e < E; ++e) {
        const int32_t n = s.off_host[size_t(e + 1)] - s.off_host[size_t(e)];
        const int32_t seg = p[size_t(e + 1)] - p[size_t(e)];
        EXPECT_GE(seg, n) << "expert " << e;
        EXPECT_EQ(seg == 0, n == 0) << "expert " << e;
      }
    }
  }
  // every expert equal: no padding at all; one expert with all rows: one bucket
  EXPECT_EQ(padded_offsets({0, 5, 10, 15}, kExpertPadFraction), (VecI{0, 5, 10, 15}));
  EXPECT_EQ(padded_offsets({0, 0, 9, 9}, kExpertPadFraction), (VecI{0, 0, 9, 9}));
  // 100 and 95 share a bucket (5 of 200 rows are padding), 50 does not
  EXPECT_EQ(padded_offsets({0, 95, 195, 245}, kExpertPadFraction), (VecI{0, 100, 200, 250}));
}

// What a planner expects of the bucketing: the rule applied to counts spread evenly between the
// least and most used shares. Equal counts make one bucket; a wider spread never fewer buckets.
TEST(MoePad, ExpectedBucketCountIsTheRuleOnAnEvenSpread) {
  EXPECT_EQ(expected_bucket_count(0, 128), 0);
  EXPECT_EQ(expected_bucket_count(1000, 0), 0);
  EXPECT_EQ(expected_bucket_count(32768, 128, 1.0, 1.0), 1);
  // one token's 8 routed rows over 128 experts: one row each, which the rule puts in one bucket
  EXPECT_EQ(expected_bucket_count(8, 128),
            int64_t(bucket_experts({0, 1, 2, 3, 4, 5, 6, 7, 8}, kExpertPadFraction).size()));
  EXPECT_EQ(expected_bucket_count(8, 128), 1);
  // the spread built here: 4 experts of 100 rows each at shares 0.5, 0.8, 1.1, 1.4 -> 50, 80, 110, 140
  EXPECT_EQ(expected_bucket_count(400, 4, 0.5, 1.4),
            int64_t(bucket_experts({0, 50, 130, 240, 380}, kExpertPadFraction).size()));
  EXPECT_EQ(expected_bucket_count(400, 4, 0.5, 1.4), 4);  // no two within 6% of each other
  int64_t last = 0;
  for (double most : {1.0, 1.2, 1.55, 2.0, 4.0}) {
    const int64_t n = expected_bucket_count(32768, 128, 0.54, most);
    EXPECT_GE(n, last) << "most " << most;
    last = n;
  }
  // huge micro-batches: the same spread, the same buckets, no overflow
  EXPECT_EQ(expected_bucket_count(1e15, 128), expected_bucket_count(1e8, 128));
  // at the defaults every bucket holds several experts and there are several buckets
  const int64_t n = expected_bucket_count(32768, 128);
  EXPECT_GT(n, 3);
  EXPECT_LT(n, 40);
}

TEST(MoePad, LayoutKeepsEachAssignmentInItsExpertsSegment) {
  const int64_t T = 97, E = 16, k = 4;
  const VecI idx = routing(T, E, k, 0.5, 7);
  auto ops = make_cpu_ops(1);
  const auto [u, p, cap, Rp] = padded_sort(*ops, idx, T, E, k);
  EXPECT_EQ(p.off_host, padded_offsets(u.off_host, kExpertPadFraction));
  EXPECT_EQ(p.off, p.off_host) << "device offsets are the padded ones too";
  EXPECT_EQ(Rp, p.off_host[size_t(E)]);
  EXPECT_GT(Rp, T * k) << "this routing needs padding (else the test checks nothing)";
  for (int64_t a = 0; a < T * k; ++a) {
    const int32_t e = idx[size_t(a)];
    EXPECT_EQ(p.row[size_t(a)] - p.off_host[size_t(e)], u.row[size_t(a)] - u.off_host[size_t(e)]) << a;
    EXPECT_EQ(p.token[size_t(p.row[size_t(a)])], a / k);
  }
  EXPECT_EQ(std::count(p.token.begin(), p.token.begin() + Rp, -1), Rp - T * k);
  Sorted q = sort(*ops, idx, T, E, k, cap);
  EXPECT_THROW(
      ops->moe_pad(idx.data(), q.off.data(), q.off_host.data(), q.row.data(), q.token.data(), T, E, k, T * k),
      std::invalid_argument);
  EXPECT_EQ(q.off_host, u.off_host) << "a refused pad changes nothing";
}

TEST(MoePad, PadRowsAreZeroAndGroupedLinearsMatchTheUnpaddedLayout) {
  const int64_t T = 61, E = 8, k = 2, K = 12, N = 10;
  const VecI idx = routing(T, E, k, 1.0, 11);
  auto ops = make_cpu_ops(2);
  const auto [u, p, cap, Rp] = padded_sort(*ops, idx, T, E, k);
  ASSERT_GT(Rp, T * k);
  const VecF x = ref::randn(size_t(T * K), 1), w = ref::randn(size_t(E * N * K), 2, 0.2f);
  const VecF dy_tok = ref::randn(size_t(T * N), 3);
  VecF xu(size_t(T * k * K)), xp(size_t(Rp * K), 9.f);
  ops->gather_rows(x.data(), u.token.data(), xu.data(), T * k, K);
  ops->gather_rows(x.data(), p.token.data(), xp.data(), Rp, K);
  // dys as combine's backward leaves it: real rows written, pad rows stale until zeroed
  VecF wts(size_t(T * k), 0.5f), dwu(size_t(T * k)), dwp(size_t(T * k));
  VecF dyu(size_t(T * k * N)), dyp(size_t(Rp * N), 3.f);
  ops->moe_combine_bwd(dy_tok.data(), VecF(size_t(T * k * N)).data(), wts.data(), u.row.data(), dyu.data(),
                       dwu.data(), T, k, N);
  ops->moe_combine_bwd(dy_tok.data(), VecF(size_t(Rp * N)).data(), wts.data(), p.row.data(), dyp.data(),
                       dwp.data(), T, k, N);
  ops->moe_zero_pad_rows(dyp.data(), p.token.data(), Rp, N);
  for (int64_t r = 0; r < Rp; ++r) {
    if (p.token[size_t(r)] >= 0) continue;
    for (int64_t c = 0; c < K; ++c) ASSERT_EQ(xp[size_t(r * K + c)], 0.f) << "gathered pad row " << r;
    for (int64_t c = 0; c < N; ++c) ASSERT_EQ(dyp[size_t(r * N + c)], 0.f) << "zeroed pad row " << r;
  }
  VecF yu(size_t(T * k * N)), yp(size_t(Rp * N), 5.f), dxu(size_t(T * k * K)), dxp(size_t(Rp * K), 5.f);
  VecF dwgu(size_t(E * N * K), 0.f), dwgp(size_t(E * N * K), 0.f);
  ops->grouped_linear_fwd(xu.data(), w.data(), yu.data(), u.off_host.data(), E, K, N);
  ops->grouped_linear_fwd(xp.data(), w.data(), yp.data(), p.off_host.data(), E, K, N);
  ops->grouped_linear_bwd_input(dyu.data(), w.data(), dxu.data(), u.off_host.data(), E, K, N, false);
  ops->grouped_linear_bwd_input(dyp.data(), w.data(), dxp.data(), p.off_host.data(), E, K, N, false);
  ops->grouped_linear_bwd_weight(dyu.data(), xu.data(), dwgu.data(), u.off_host.data(), E, K, N);
  ops->grouped_linear_bwd_weight(dyp.data(), xp.data(), dwgp.data(), p.off_host.data(), E, K, N);
  // the real rows in assignment order (Eigen's GEMM may block a longer segment differently:
  // equal up to fp32 rounding)
  VecF yu_a, yp_a, dxu_a, dxp_a;
  for (int64_t a = 0; a < T * k; ++a) {
    const int64_t ru = u.row[size_t(a)], rp_ = p.row[size_t(a)];
    yu_a.insert(yu_a.end(), yu.begin() + ru * N, yu.begin() + (ru + 1) * N);
    yp_a.insert(yp_a.end(), yp.begin() + rp_ * N, yp.begin() + (rp_ + 1) * N);
    dxu_a.insert(dxu_a.end(), dxu.begin() + ru * K, dxu.begin() + (ru + 1) * K);
    dxp_a.insert(dxp_a.end(), dxp.begin() + rp_ * K, dxp.begin() + (rp_ + 1) * K);
  }
  EXPECT_LT(ref::rel_err(yp_a, yu_a), 1e-6) << "y at the real rows";
  EXPECT_LT(ref::rel_err(dxp_a, dxu_a), 1e-6) << "dx at the real rows";
  for (int64_t r = 0; r < Rp; ++r)
    if (p.token[size_t(r)] < 0) {
      for (int64_t c = 0; c < N; ++c) ASSERT_EQ(yp[size_t(r * N + c)], 0.f) << "y of pad row " << r;
      for (int64_t c = 0; c < K; ++c) ASSERT_EQ(dxp[size_t(r * K + c)], 0.f) << "dx of pad row " << r;
    }
  EXPECT_LT(ref::rel_err(dwgp, dwgu), 1e-6) << "dW padded vs unpadded";
}

}  // namespace
}  // namespace rp
