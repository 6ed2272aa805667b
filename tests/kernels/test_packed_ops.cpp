// The packed-sequence ops (RoPE at positions, attention restricted to each example) and the
// KV-cache attention of the CPU backend, against the per-sequence ops they generalise:
// packing examples into one sequence must give exactly what each example gives alone.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp {
namespace {
using VecF = std::vector<float>;
const std::vector<float> kInv = {1.0f, 0.1f, 0.01f, 0.001f};  // D = 8

// Positions of examples of these lengths packed one after another (restarting at 0).
std::vector<int32_t> positions_of(const std::vector<int64_t>& lens) {
  std::vector<int32_t> p;
  for (int64_t n : lens)
    for (int64_t t = 0; t < n; ++t) p.push_back(int32_t(t));
  return p;
}

// Rows [r0, r0+n) of a [rows, width] array.
VecF rows(const VecF& a, int64_t r0, int64_t n, int64_t width) {
  return VecF(a.begin() + r0 * width, a.begin() + (r0 + n) * width);
}

void expect_near(const VecF& a, const VecF& b, float tol, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << what << " element " << i;
}
}  // namespace

TEST(PackedOps, RopeAtPositionsEqualsRopeOfEachSequence) {
  auto ops = make_cpu_ops();
  const int64_t S = 2, L = 5, heads = 3, D = 8;
  VecF x = ref::randn(size_t(S * L * heads * D), 1), y = x;
  std::vector<int32_t> pos;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < L; ++t) pos.push_back(int32_t(t));
  ops->rope_fwd(x.data(), S, L, heads, D, kInv.data(), 1.5f);
  ops->rope_fwd_at(y.data(), pos.data(), S * L, heads, D, kInv.data(), 1.5f);
  EXPECT_EQ(x, y);
  ops->rope_bwd(x.data(), S, L, heads, D, kInv.data(), 1.5f);
  ops->rope_bwd_at(y.data(), pos.data(), S * L, heads, D, kInv.data(), 1.5f);
  EXPECT_EQ(x, y);
  pos[3] = -1;
  EXPECT_THROW(ops->rope_fwd_at(y.data(), pos.data(), S * L, heads, D, kInv.data(), 1.f),
               std::invalid_argument);
}

// Three examples (5, 7, 4 tokens) packed into one sequence of 16 with their positions give
// the outputs, lse and gradients of attention_fwd/bwd run on each example alone.
TEST(PackedOps, PackedAttentionEqualsEachExampleAlone) {
  auto ops = make_cpu_ops();
  const std::vector<int64_t> lens = {5, 7, 4};
  const int64_t L = 16, nq = 4, nkv = 2, D = 8;
  const float scale = 0.35f;
  const auto pos = positions_of(lens);
  VecF q = ref::randn(size_t(L * nq * D), 11), k = ref::randn(size_t(L * nkv * D), 12);
  VecF v = ref::randn(size_t(L * nkv * D), 13), dout = ref::randn(size_t(L * nq * D), 14);
  VecF o(q.size()), lse(size_t(nq * L)), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<char> scratch(Ops::attention_scratch_bytes(1, L, nq, nkv, D));
  ops->attention_fwd_packed(q.data(), k.data(), v.data(), o.data(), lse.data(), pos.data(), 1, L, nq, nkv, D,
                            scale, scratch.data());
  ops->attention_bwd_packed(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), pos.data(),
                            dq.data(), dk.data(), dv.data(), 1, L, nq, nkv, D, scale, scratch.data());
  int64_t r0 = 0;
  for (int64_t n : lens) {
    VecF eq = rows(q, r0, n, nq * D), ek = rows(k, r0, n, nkv * D), ev = rows(v, r0, n, nkv * D);
    VecF edo = rows(dout, r0, n, nq * D);
    VecF eo(eq.size()), elo(size_t(nq * n)), edq(eq.size()), edk(ek.size()), edv(ev.size());
    std::vector<char> es(Ops::attention_scratch_bytes(1, n, nq, nkv, D));
    ops->attention_fwd(eq.data(), ek.data(), ev.data(), eo.data(), elo.data(), 1, n, nq, nkv, D, scale,
                       es.data());
    ops->attention_bwd(eq.data(), ek.data(), ev.data(), eo.data(), elo.data(), edo.data(), edq.data(),
                       edk.data(), edv.data(), 1, n, nq, nkv, D, scale, es.data());
    expect_near(rows(o, r0, n, nq * D), eo, 1e-5f, "o");
    for (int64_t h = 0; h < nq; ++h)
      for (int64_t t = 0; t < n; ++t) ASSERT_NEAR(lse[size_t(h * L + r0 + t)], elo[size_t(h * n + t)], 1e-5f);
    expect_near(rows(dq, r0, n, nq * D), edq, 1e-5f, "dq");
    expect_near(rows(dk, r0, n, nkv * D), edk, 1e-5f, "dk");
    expect_near(rows(dv, r0, n, nkv * D), edv, 1e-5f, "dv");
    r0 += n;
  }
  // positions t in every sequence: the plain causal attention
  std::vector<int32_t> causal(static_cast<size_t>(L));
  std::iota(causal.begin(), causal.end(), 0);
  VecF o2(o.size()), o3(o.size());
  ops->attention_fwd_packed(q.data(), k.data(), v.data(), o2.data(), nullptr, causal.data(), 1, L, nq, nkv, D,
                            scale, scratch.data());
  ops->attention_fwd(q.data(), k.data(), v.data(), o3.data(), nullptr, 1, L, nq, nkv, D, scale,
                     scratch.data());
  expect_near(o2, o3, 1e-5f, "causal");
  causal[4] = 5;  // a position beyond its index
  EXPECT_THROW(ops->attention_fwd_packed(q.data(), k.data(), v.data(), o2.data(), nullptr, causal.data(), 1,
                                         L, nq, nkv, D, scale, scratch.data()),
               std::invalid_argument);
}

// Decoding with a KV cache: the last n rows of causal attention over past + n tokens.
TEST(PackedOps, DecodeOverACacheEqualsTheLastRowsOfCausalAttention) {
  auto ops = make_cpu_ops();
  const int64_t past = 9, n = 3, L = past + n, nq = 6, nkv = 2, D = 8;
  VecF q = ref::randn(size_t(L * nq * D), 21), k = ref::randn(size_t(L * nkv * D), 22);
  VecF v = ref::randn(size_t(L * nkv * D), 23), o(q.size());
  std::vector<char> scratch(Ops::attention_scratch_bytes(1, L, nq, nkv, D));
  ops->attention_fwd(q.data(), k.data(), v.data(), o.data(), nullptr, 1, L, nq, nkv, D, 0.3f, scratch.data());
  VecF qn = rows(q, past, n, nq * D), od(qn.size());
  ops->attention_decode(qn.data(), k.data(), v.data(), od.data(), past, n, nq, nkv, D, 0.3f);
  expect_near(od, rows(o, past, n, nq * D), 1e-5f, "decode");
}

}  // namespace rp
