// CPU ops vs naive scalar references (tests/kernels/ref_ops.hpp). Every output is
// poisoned with NaN first so elements an op forgets to write show up.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "kernels/ops.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp {
namespace {

using namespace rp::ref;

TEST(CpuOps, Dtypes) {
  auto ops = make_cpu_ops();
  EXPECT_EQ(ops->dtype(), DType::f32);
  EXPECT_EQ(ops->grad_dtype(), DType::f32);
  EXPECT_EQ(ops->num_threads(), 1);
  ops->set_num_threads(3);
  EXPECT_EQ(ops->num_threads(), 3);
}

TEST(CpuOps, MemoryHelpers) {
  auto ops = make_cpu_ops();
  const int64_t n = 1000;
  VecF a = randn(n, 1), b = randn(n, 2), y = nan_vec(n);
  ops->fill(DType::f32, y.data(), n, 2.5f);
  for (float v : y) ASSERT_EQ(v, 2.5f);
  y = nan_vec(n);
  ops->copy(DType::f32, y.data(), a.data(), n);
  EXPECT_EQ(y, a);
  y = nan_vec(n);
  ops->add(a.data(), b.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(y[size_t(i)], a[size_t(i)] + b[size_t(i)]);
  VecF acc = a;
  ops->add_into(DType::f32, acc.data(), DType::f32, b.data(), n, 0.5f);
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(acc[size_t(i)], a[size_t(i)] + 0.5f * b[size_t(i)]);
  // casts: f32 -> bf16 -> f32 keeps 8 mantissa bits; f16 keeps 11
  std::vector<uint16_t> h(size_t(n), 0xffff);
  VecF back = nan_vec(n);
  ops->cast(DType::bf16, h.data(), DType::f32, a.data(), n);
  ops->cast(DType::f32, back.data(), DType::bf16, h.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[size_t(i)], f32_to_bf16(a[size_t(i)]));
    ASSERT_NEAR(back[size_t(i)], a[size_t(i)], std::abs(a[size_t(i)]) * 4e-3 + 1e-30);
  }
  ops->cast(DType::f16, h.data(), DType::f32, a.data(), n);
  ops->cast(DType::f32, back.data(), DType::f16, h.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(back[size_t(i)], a[size_t(i)], std::abs(a[size_t(i)]) * 1e-3 + 1e-4);
  // add_into a bf16 source into an f32 accumulator
  VecF acc2(size_t(n), 1.0f);
  ops->add_into(DType::f32, acc2.data(), DType::f16, h.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(acc2[size_t(i)], 1.0f + a[size_t(i)], 2e-3 + std::abs(a[size_t(i)]) * 1e-3);
  std::vector<int32_t> ids(10, -7);
  ops->fill(DType::i32, ids.data(), 10, 3.0f);
  for (int v : ids) EXPECT_EQ(v, 3);
  EXPECT_THROW(ops->fill(DType::f32, y.data(), -1, 0.f), std::invalid_argument);
}

struct LinDims {
  int64_t M, K, N;
  int threads;
};
class LinearTest : public ::testing::TestWithParam<LinDims> {};

TEST_P(LinearTest, MatchesNaive) {
  auto [M, K, N, th] = GetParam();
  auto ops = make_cpu_ops(th);
  VecF x = randn(size_t(M * K), 11), w = randn(size_t(N * K), 12), dy = randn(size_t(M * N), 13);
  VecF y = nan_vec(size_t(M * N));
  ops->linear_fwd(x.data(), w.data(), y.data(), M, K, N);
  EXPECT_LT(rel_err(y, linear(to_d(x), to_d(w), M, K, N)), 1e-6);

  // dx = dy W : the reference is linear(dy, W^T)
  VecD wt(size_t(K * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wt[size_t(k * N + n)] = w[size_t(n * K + k)];
  VecD dx_ref = linear(to_d(dy), wt, M, N, K);
  VecF dx = nan_vec(size_t(M * K));
  ops->linear_bwd_input(dy.data(), w.data(), dx.data(), M, K, N, false);
  EXPECT_LT(rel_err(dx, dx_ref), 1e-6);
  VecF dx0 = randn(size_t(M * K), 14), dxa = dx0;
  ops->linear_bwd_input(dy.data(), w.data(), dxa.data(), M, K, N, true);
  for (size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] += dx0[i];
  EXPECT_LT(rel_err(dxa, dx_ref), 1e-6);
  // onto a residual: y = r + x W^T (r and y distinct; the same tensor is refused)
  const VecF r = randn(size_t(M * N), 16);
  VecF yr = nan_vec(size_t(M * N));
  ops->linear_fwd_residual(x.data(), w.data(), r.data(), yr.data(), M, K, N);
  VecD yr_ref = linear(to_d(x), to_d(w), M, K, N);
  for (size_t i = 0; i < yr_ref.size(); ++i) yr_ref[i] += r[i];
  EXPECT_LT(rel_err(yr, yr_ref), 1e-6);
  VecF same = r;
  EXPECT_THROW(ops->linear_fwd_residual(x.data(), w.data(), same.data(), same.data(), M, K, N),
               std::invalid_argument);
  // alpha scales the product only, not what it is added to
  const float alpha = -0.375f;
  VecF ys = nan_vec(size_t(M * N));
  ops->linear_fwd(x.data(), w.data(), ys.data(), M, K, N, alpha);
  VecD ys_ref = linear(to_d(x), to_d(w), M, K, N);
  for (double& v : ys_ref) v *= alpha;
  EXPECT_LT(rel_err(ys, ys_ref), 1e-6);
  VecD dxs_ref = linear(to_d(dy), wt, M, N, K);
  VecF dxs = nan_vec(size_t(M * K));
  ops->linear_bwd_input(dy.data(), w.data(), dxs.data(), M, K, N, false, alpha);
  for (double& v : dxs_ref) v *= alpha;
  EXPECT_LT(rel_err(dxs, dxs_ref), 1e-6);
  VecF dxsa = dx0;
  ops->linear_bwd_input(dy.data(), w.data(), dxsa.data(), M, K, N, true, alpha);
  for (size_t i = 0; i < dxs_ref.size(); ++i) dxs_ref[i] += dx0[i];
  EXPECT_LT(rel_err(dxsa, dxs_ref), 1e-6);

  // dW += dy^T x : reference linear(dy^T, x^T)
  VecD dyt(size_t(N * M)), xt(size_t(K * M));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) dyt[size_t(n * M + m)] = dy[size_t(m * N + n)];
    for (int64_t k = 0; k < K; ++k) xt[size_t(k * M + m)] = x[size_t(m * K + k)];
  }
  VecD dw_ref = linear(dyt, xt, N, M, K);
  VecF dw0 = randn(size_t(N * K), 15), dw = dw0;
  ops->linear_bwd_weight(dy.data(), x.data(), dw.data(), M, K, N);
  for (size_t i = 0; i < dw_ref.size(); ++i) dw_ref[i] += dw0[i];
  EXPECT_LT(rel_err(dw, dw_ref), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(LinDims{1, 1, 1, 1}, LinDims{37, 53, 29, 1},
                                           LinDims{5, 64, 300, 1}, LinDims{300, 40, 17, 3},
                                           LinDims{7, 33, 301, 2}, LinDims{130, 70, 90, 2}));

TEST(CpuOps, Embedding) {
  auto ops = make_cpu_ops();
  const int64_t T = 23, H = 9, V = 11;
  VecF table = randn(size_t(V * H), 21), dy = randn(size_t(T * H), 22);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7) % V);  // repeats
  VecF y = nan_vec(size_t(T * H));
  ops->embedding_fwd(ids.data(), table.data(), y.data(), T, H, V);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j) ASSERT_EQ(y[size_t(t * H + j)], table[size_t(ids[size_t(t)] * H + j)]);
  VecF g0 = randn(size_t(V * H), 23), g = g0;
  ops->embedding_bwd(ids.data(), dy.data(), g.data(), T, H, V, -1);
  VecD ref = to_d(g0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j) ref[size_t(ids[size_t(t)] * H + j)] += dy[size_t(t * H + j)];
  EXPECT_LT(rel_err(g, ref), 1e-6);
  ids[3] = int32_t(V);
  EXPECT_THROW(ops->embedding_fwd(ids.data(), table.data(), y.data(), T, H, V), std::out_of_range);
  ids[3] = -1;
  EXPECT_THROW(ops->embedding_bwd(ids.data(), dy.data(), g.data(), T, H, V, -1), std::out_of_range);
}

// nn.Embedding(padding_idx=p): the lookup of id p adds nothing to row p; every other id
// scatters as before, and ids are range-checked whatever padding_idx is.
TEST(CpuOps, EmbeddingBackwardSkipsThePaddingRow) {
  auto ops = make_cpu_ops();
  const int64_t T = 19, H = 7, V = 10, pad = 4;
  VecF dy = randn(size_t(T * H), 41);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 3) % V);
  ids[0] = ids[5] = ids[18] = int32_t(pad);  // pad == eos in the data: first, inside, last
  VecF g0 = randn(size_t(V * H), 42), g = g0;
  ops->embedding_bwd(ids.data(), dy.data(), g.data(), T, H, V, pad);
  VecD ref = to_d(g0);
  for (int64_t t = 0; t < T; ++t)
    if (ids[size_t(t)] != pad)
      for (int64_t j = 0; j < H; ++j) ref[size_t(ids[size_t(t)] * H + j)] += dy[size_t(t * H + j)];
  EXPECT_LT(rel_err(g, ref), 1e-6);
  for (int64_t j = 0; j < H; ++j) ASSERT_EQ(g[size_t(pad * H + j)], g0[size_t(pad * H + j)]) << j;
  // -1: no padding row; the pad id scatters like any other
  VecF all = g0;
  ops->embedding_bwd(ids.data(), dy.data(), all.data(), T, H, V, -1);
  EXPECT_NE(VecF(all.begin() + pad * H, all.begin() + (pad + 1) * H),
            VecF(g0.begin() + pad * H, g0.begin() + (pad + 1) * H));
  ids[7] = int32_t(V);
  EXPECT_THROW(ops->embedding_bwd(ids.data(), dy.data(), g.data(), T, H, V, pad), std::out_of_range);
  ids[7] = 1;
  EXPECT_THROW(ops->embedding_bwd(ids.data(), dy.data(), g.data(), T, H, V, V), std::exception);
}

TEST(CpuOps, RMSNorm) {
  auto ops = make_cpu_ops();
  const int64_t R = 13, n = 48;
  VecF x = randn(size_t(R * n), 31, 3.0f), w = randn(size_t(n), 32);
  VecF y = nan_vec(size_t(R * n));
  ops->rmsnorm_fwd(x.data(), w.data(), y.data(), R, n, 1e-5f);
  EXPECT_LT(rel_err(y, rmsnorm(to_d(x), to_d(w), R, n, 1e-5)), 1e-6);
  // eps matters for tiny rows
  VecF xs(size_t(n), 1e-3f), ys = nan_vec(size_t(n)), ones(size_t(n), 1.0f);
  ops->rmsnorm_fwd(xs.data(), ones.data(), ys.data(), 1, n, 1e-6f);
  EXPECT_NEAR(ys[0], 1e-3 / std::sqrt(1e-6 + 1e-6), 1e-5);
}

// Gemma's RMSNorm: x * rsqrt(..) * (1 + w) = LLaMA's with the weight 1 + w.
TEST(CpuOps, RMSNormWeightOffset) {
  auto ops = make_cpu_ops();
  const int64_t R = 7, n = 40;
  VecF x = randn(size_t(R * n), 33, 3.0f), w = randn(size_t(n), 34, 0.2f), y = nan_vec(size_t(R * n));
  VecD w1 = to_d(w);
  for (auto& v : w1) v += 1.0;
  ops->rmsnorm_fwd(x.data(), w.data(), y.data(), R, n, 1e-6f, 1.0f);
  EXPECT_LT(rel_err(y, rmsnorm(to_d(x), w1, R, n, 1e-6)), 1e-6);
  EXPECT_GT(rel_err(y, rmsnorm(to_d(x), to_d(w), R, n, 1e-6)), 0.5);  // the offset is applied
}

TEST(CpuOps, RoPE) {
  auto ops = make_cpu_ops();
  const int64_t S = 2, L = 19, heads = 3, D = 16;
  RopeParams p;
  p.head_dim = D;
  p.theta = 500.0;
  RopeTable tab = rope_frequencies(p);
  for (float scale : {1.0f, 1.3f}) {
    VecF x = randn(size_t(S * L * heads * D), 41), y = x;
    ops->rope_fwd(y.data(), S, L, heads, D, tab.inv_freq.data(), scale);
    EXPECT_LT(rel_err(y, rope(to_d(x), S, L, heads, D, tab.inv_freq, scale)), 2e-6);
  }
  // position restarts per sequence: sequence 1 rotated like sequence 0
  VecF x = randn(size_t(L * heads * D), 42), xx(x);
  xx.insert(xx.end(), x.begin(), x.end());
  ops->rope_fwd(xx.data(), 2, L, heads, D, tab.inv_freq.data(), 1.0f);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(xx[i], xx[i + x.size()]);
  EXPECT_THROW(ops->rope_fwd(xx.data(), 1, L, heads, 15, tab.inv_freq.data(), 1.f), std::invalid_argument);
}

// Partial rotary (Phi-4-mini): only the first R features of each head rotate, with the
// frequencies of an R-wide rotary; the others stay bit for bit. R/2 even and odd.
TEST(CpuOps, RoPEPartialRotary) {
  auto ops = make_cpu_ops();
  const int64_t S = 2, L = 13, heads = 3, D = 16;
  for (int64_t R : {12, 6}) {
    RopeParams p;
    p.head_dim = R;
    p.theta = 10000.0;
    const RopeTable tab = rope_frequencies(p);
    ASSERT_EQ(tab.inv_freq.size(), size_t(R / 2));
    const VecF x = randn(size_t(S * L * heads * D), 43);
    VecF y = x;
    ops->rope_fwd(y.data(), S, L, heads, D, tab.inv_freq.data(), 1.1f, R);
    EXPECT_LT(rel_err(y, rope(to_d(x), S, L, heads, D, tab.inv_freq, 1.1, R)), 2e-6) << R;
    for (int64_t r = 0; r < S * L * heads; ++r)
      for (int64_t j = R; j < D; ++j) ASSERT_EQ(y[size_t(r * D + j)], x[size_t(r * D + j)]) << R;
    EXPECT_GT(rel_err(y, x), 0.1);  // the first R did rotate
    // the same positions through rope_fwd_at, then the transpose undoes it (scale 1)
    std::vector<int32_t> pos;
    for (int64_t t = 0; t < S * L; ++t) pos.push_back(int32_t(t % L));
    VecF z = x, u = x;
    ops->rope_fwd_at(z.data(), pos.data(), S * L, heads, D, tab.inv_freq.data(), 1.1f, R);
    EXPECT_EQ(z, y);
    ops->rope_fwd(u.data(), S, L, heads, D, tab.inv_freq.data(), 1.f, R);
    ops->rope_bwd(u.data(), S, L, heads, D, tab.inv_freq.data(), 1.f, R);
    EXPECT_LT(rel_err(u, x), 1e-6);
  }
  VecF x = randn(size_t(L * heads * D), 44);
  const VecF inv(8, 0.5f);
  for (int64_t R : {7, 18, -2})
    EXPECT_THROW(ops->rope_fwd(x.data(), 1, L, heads, D, inv.data(), 1.f, R), std::invalid_argument) << R;
  const int32_t pos[1] = {0};
  EXPECT_THROW(ops->rope_bwd_at(x.data(), pos, 1, heads, D, inv.data(), 1.f, 18), std::invalid_argument);
}

struct AttnDims {
  int64_t S, L, nq, nkv, D;
};
class AttentionTest : public ::testing::TestWithParam<AttnDims> {};

TEST_P(AttentionTest, ForwardMatchesNaive) {
  auto [S, L, nq, nkv, D] = GetParam();
  auto ops = make_cpu_ops();
  const int64_t T = S * L;
  VecF q = randn(size_t(T * nq * D), 51), k = randn(size_t(T * nkv * D), 52),
       v = randn(size_t(T * nkv * D), 53);
  const float scale = 1.0f / std::sqrt(float(D));
  VecF o = nan_vec(q.size()), lse = nan_vec(size_t(S * nq * L));
  std::vector<char> scratch(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  ops->attention_fwd(q.data(), k.data(), v.data(), o.data(), lse.data(), S, L, nq, nkv, D, scale,
                     scratch.data());
  VecD lse_ref;
  VecD o_ref = attention(to_d(q), to_d(k), to_d(v), S, L, nq, nkv, D, scale, &lse_ref);
  EXPECT_LT(rel_err(o, o_ref), 2e-6);
  EXPECT_LT(rel_err(lse, lse_ref), 2e-6);
  VecF o2 = nan_vec(q.size());  // lse may be null
  ops->attention_fwd(q.data(), k.data(), v.data(), o2.data(), nullptr, S, L, nq, nkv, D, scale,
                     scratch.data());
  EXPECT_EQ(o2, o);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnDims{1, 1, 1, 1, 4}, AttnDims{2, 9, 4, 2, 8},
                                           AttnDims{2, 70, 6, 2, 8},  // crosses 64-row blocks
                                           AttnDims{1, 130, 3, 3, 16}, AttnDims{3, 5, 4, 1, 2}));

TEST(CpuOps, SwiGLU) {
  auto ops = make_cpu_ops();
  const int64_t n = 3000;
  VecF g = randn(size_t(n), 61, 3.0f), u = randn(size_t(n), 62), h = nan_vec(size_t(n));
  ops->swiglu_fwd(g.data(), u.data(), h.data(), n);
  EXPECT_LT(rel_err(h, swiglu(to_d(g), to_d(u))), 1e-6);
}

TEST(CpuOps, GeGLU) {
  auto ops = make_cpu_ops();
  const int64_t n = 3000;
  VecF g = randn(size_t(n), 63, 3.0f), u = randn(size_t(n), 64), h = nan_vec(size_t(n));
  ops->geglu_fwd(g.data(), u.data(), h.data(), n);
  EXPECT_LT(rel_err(h, geglu(to_d(g), to_d(u))), 1e-6);
}

TEST(CpuOps, ChunkedCrossEntropyEqualsUnchunked) {
  for (int th : {1, 2}) {
    auto ops = make_cpu_ops(th);
    const int64_t T = 2 * Ops::kCeChunk + 37, H = 24, V = 101;  // 3 chunks
    VecF h = randn(size_t(T * H), 71), w = randn(size_t(V * H), 72, 0.5f);
    std::vector<int32_t> tg(static_cast<size_t>(T));
    std::mt19937 gen(73);
    for (auto& t : tg) t = int32_t(gen() % V);
    for (int64_t t = 0; t < T; t += 5) tg[size_t(t)] = -100;  // ignored
    for (int64_t t = 140; t < 200; ++t) tg[size_t(t)] = -1;   // ignored run across a chunk
    auto [sum_ref, cnt_ref] = cross_entropy(to_d(h), to_d(w), tg, T, H, V);
    std::vector<char> scratch(Ops::lm_head_ce_scratch_bytes(T, H, V));
    float loss[2] = {NAN, NAN};
    ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss, nullptr, nullptr,
                               scratch.data());
    EXPECT_NEAR(loss[0], sum_ref, 1e-5 * std::abs(sum_ref));
    EXPECT_EQ(loss[1], float(cnt_ref));
    // with gradients: same loss; dh rows of ignored tokens are 0; dw accumulates
    VecF dh = nan_vec(size_t(T * H)), dw0 = randn(size_t(V * H), 74), dw = dw0;
    float loss2[2] = {NAN, NAN};
    ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss2, dh.data(), dw.data(),
                               scratch.data());
    EXPECT_NEAR(loss2[0], sum_ref, 1e-5 * std::abs(sum_ref));
    EXPECT_EQ(loss2[1], float(cnt_ref));
    // naive gradients: dz = softmax - onehot; dh = dz W; dw = dz^T h
    VecD z = linear(to_d(h), to_d(w), T, H, V), dh_ref(size_t(T * H), 0.0), dw_ref = to_d(dw0);
    for (int64_t t = 0; t < T; ++t) {
      if (tg[size_t(t)] < 0) continue;
      double mx = -1e300, s = 0;
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, z[size_t(t * V + j)]);
      for (int64_t j = 0; j < V; ++j) s += std::exp(z[size_t(t * V + j)] - mx);
      for (int64_t j = 0; j < V; ++j) {
        double dz = std::exp(z[size_t(t * V + j)] - mx) / s - (j == tg[size_t(t)] ? 1.0 : 0.0);
        for (int64_t e = 0; e < H; ++e) {
          dh_ref[size_t(t * H + e)] += dz * w[size_t(j * H + e)];
          dw_ref[size_t(j * H + e)] += dz * h[size_t(t * H + e)];
        }
      }
    }
    EXPECT_LT(rel_err(dh, dh_ref), 1e-5);
    EXPECT_LT(rel_err(dw, dw_ref), 1e-5);
    for (int64_t e = 0; e < H; ++e) EXPECT_EQ(dh[size_t(150 * H + e)], 0.0f);
  }
}

// Loss scaling: the gradients are those of S * loss (a power of two scales every fp32 product
// exactly), the loss itself is not scaled, a bad scale is refused before anything is written.
TEST(CpuOps, CrossEntropyLossScaleMultipliesOnlyTheGradients) {
  auto ops = make_cpu_ops();
  const int64_t T = Ops::kCeChunk + 9, H = 16, V = 53;
  VecF h = randn(size_t(T * H), 75), w = randn(size_t(V * H), 76, 0.5f);
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = t % 6 == 0 ? -100 : int32_t((t * 37 + 5) % V);
  std::vector<char> scratch(Ops::lm_head_ce_scratch_bytes(T, H, V));
  auto run = [&](float S, VecF& dh, VecF& dw, float* loss) {
    dh = nan_vec(size_t(T * H));
    dw.assign(size_t(V * H), 0.f);
    ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss, dh.data(), dw.data(),
                               scratch.data(), S);
  };
  VecF dh1, dw1, dhS, dwS, dh3, dw3;
  float l1[2], lS[2], l3[2];
  run(1.f, dh1, dw1, l1);
  run(1024.f, dhS, dwS, lS);
  EXPECT_EQ(lS[0], l1[0]);
  EXPECT_EQ(lS[1], l1[1]);
  double moved = 0;
  for (size_t i = 0; i < dh1.size(); ++i) ASSERT_EQ(dhS[i], 1024.f * dh1[i]) << i;
  for (size_t i = 0; i < dw1.size(); ++i) {
    ASSERT_EQ(dwS[i], 1024.f * dw1[i]) << i;
    moved += std::abs(dw1[i]);
  }
  EXPECT_GT(moved, 0.0);
  run(3.f, dh3, dw3, l3);  // not a power of two: equal within fp32 rounding
  VecD dh1x3 = to_d(dh1), dw1x3 = to_d(dw1);
  for (auto& x : dh1x3) x *= 3;
  for (auto& x : dw1x3) x *= 3;
  EXPECT_LT(rel_err(dh3, dh1x3), 1e-6);
  EXPECT_LT(rel_err(dw3, dw1x3), 1e-6);
  for (float bad : {0.f, -1.f, INFINITY, NAN}) {
    VecF dh = nan_vec(size_t(T * H));
    float loss[2] = {NAN, NAN};
    EXPECT_THROW(ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss, dh.data(), nullptr,
                                            scratch.data(), bad),
                 std::invalid_argument)
        << bad;
    EXPECT_TRUE(std::isnan(loss[0]) && std::isnan(dh[0])) << "written before the check, scale " << bad;
  }
}

TEST(CpuOps, CrossEntropyEdgeCases) {
  auto ops = make_cpu_ops();
  const int64_t T = 4, H = 3, V = 5;
  VecF h = randn(size_t(T * H), 81), w = randn(size_t(V * H), 82);
  std::vector<int32_t> tg(static_cast<size_t>(T), -1);
  std::vector<char> scratch(Ops::lm_head_ce_scratch_bytes(T, H, V));
  float loss[2] = {NAN, NAN};
  VecF dh = nan_vec(size_t(T * H));
  ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss, dh.data(), nullptr,
                             scratch.data());
  EXPECT_EQ(loss[0], 0.0f);
  EXPECT_EQ(loss[1], 0.0f);
  for (float d : dh) EXPECT_EQ(d, 0.0f);
  tg[2] = int32_t(V);
  EXPECT_THROW(ops->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, loss, nullptr, nullptr,
                                          scratch.data()),
               std::out_of_range);
  // large logits do not overflow (max subtraction)
  VecF hb(size_t(H), 100.0f), wb(size_t(V * H));
  for (int64_t j = 0; j < V; ++j)
    for (int64_t e = 0; e < H; ++e) wb[size_t(j * H + e)] = float(j);
  int32_t t1 = 0;
  ops->lm_head_cross_entropy(hb.data(), wb.data(), &t1, 1, H, V, loss, nullptr, nullptr, scratch.data());
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_NEAR(loss[0], 1200.0, 1e-2);  // logits 0,300,..,1200: lse ~ 1200, target 0
}

}  // namespace
}  // namespace rp
