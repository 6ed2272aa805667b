// CUDA ops vs their CPU twins (kernels/cpu) on the same inputs: the CPU computes in fp32
// from the bf16-rounded inputs; outputs are poisoned with NaN first; errors are relative
// ||out-ref||/||ref|| within a bf16 budget. Skipped when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kernels/ops.hpp"
#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp {
namespace {

using namespace rp::cudatest;
using ref::randn;

constexpr double kTol = 1e-2;  // bf16 budget (8 mantissa bits)

TEST_F(CudaOpsTest, Dtypes) {
  EXPECT_EQ(ops().dtype(), DType::bf16);
  EXPECT_EQ(ops().grad_dtype(), DType::f32);
  EXPECT_EQ(dev().compute_dtype(), DType::bf16);
  EXPECT_NE(dev().name().find("cuda:0"), std::string::npos) << dev().name();
}

TEST_F(CudaOpsTest, MemoryHelpers) {
  const int64_t n = 100003;  // odd: vector body + scalar tail
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
    DT x = poisoned(n, t);
    run([&](Ops& o) { o.fill(t, x.get(), n, 3.0f); });
    for (float v : download(x)) ASSERT_EQ(v, 3.0f) << dtype_name(t);
  }
  VecF a = randn(size_t(n), 1), b = randn(size_t(n), 2);
  // cast f32 -> bf16 is round-to-nearest-even exactly as the host's f32_to_bf16
  DT af = upload(a, DType::f32);
  for (DType t : {DType::bf16, DType::f16}) {
    DT h = poisoned(n, t), back = poisoned(n, DType::f32);
    run([&](Ops& o) {
      o.cast(t, h.get(), DType::f32, af.get(), n);
      o.cast(DType::f32, back.get(), t, h.get(), n);
    });
    VecF got = download(back);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], round_to(t, a[size_t(i)])) << i;
  }
  // copy, add, add_into (f32 accumulator += alpha * bf16)
  VecF a16 = a, b16 = b;
  DT x = upload(a16, DType::bf16), y = upload(b16, DType::bf16), z = poisoned(n, DType::bf16);
  DT c = poisoned(n, DType::bf16);
  run([&](Ops& o) {
    o.copy(DType::bf16, c.get(), x.get(), n);
    o.add(x.get(), y.get(), z.get(), n);
  });
  EXPECT_EQ(download(c), a16);
  VecF refz(size_t(n), {});
  for (int64_t i = 0; i < n; ++i) refz[size_t(i)] = a16[size_t(i)] + b16[size_t(i)];
  EXPECT_TRUE(close(download(z), refz, 4e-3, "add"));
  run([&](Ops& o) { o.add(x.get(), y.get(), x.get(), n); });  // y may alias a
  EXPECT_TRUE(close(download(x), refz, 4e-3, "add in place"));
  VecF acc = randn(size_t(n), 3);
  DT accd = upload(acc, DType::f32);
  run([&](Ops& o) { o.add_into(DType::f32, accd.get(), DType::bf16, y.get(), n, 0.5f); });
  VecF refa(size_t(n), {});
  for (int64_t i = 0; i < n; ++i) refa[size_t(i)] = acc[size_t(i)] + 0.5f * b16[size_t(i)];
  EXPECT_TRUE(close(download(accd), refa, 1e-6, "add_into"));
  // misaligned (odd offsets) take the scalar path
  run([&](Ops& o) {
    o.add_into(DType::f32, accd.as<float>() + 1, DType::f32, af.as<float>() + 3, n - 3, 1.0f);
  });
  VecF g = download(accd);
  for (int64_t i = 0; i + 3 < n; i += 997)
    ASSERT_NEAR(g[size_t(i + 1)], refa[size_t(i + 1)] + a[size_t(i + 3)], 1e-5);
  EXPECT_THROW(ops().fill(DType::f32, x.get(), -1, 0.f), std::invalid_argument);
}

struct LinShape {
  int64_t M, K, N;
};
class CudaLinear : public CudaOpsTest, public ::testing::WithParamInterface<LinShape> {};

TEST_P(CudaLinear, MatchesCpu) {
  const auto [M, K, N] = GetParam();
  VecF x = randn(size_t(M * K), 11), w = randn(size_t(N * K), 12, 0.05f), dy = randn(size_t(M * N), 13);
  DT xd = upload(x, DType::bf16), wd = upload(w, DType::bf16), dyd = upload(dy, DType::bf16);
  VecF dx0 = randn(size_t(M * K), 14), dw0 = randn(size_t(N * K), 15);
  DT y = poisoned(M * N, DType::bf16), dx = poisoned(M * K, DType::bf16);
  DT dxa = upload(dx0, DType::bf16), dw = upload(dw0, DType::f32);
  run([&](Ops& o) {
    o.linear_fwd(xd.get(), wd.get(), y.get(), M, K, N);
    o.linear_bwd_input(dyd.get(), wd.get(), dx.get(), M, K, N, false);
    o.linear_bwd_input(dyd.get(), wd.get(), dxa.get(), M, K, N, true);
    o.linear_bwd_weight(dyd.get(), xd.get(), dw.get(), M, K, N);
  });
  VecF ry(size_t(M * N), {}), rdx(size_t(M * K), {}), rdxa = dx0, rdw = dw0;
  cpu_->linear_fwd(x.data(), w.data(), ry.data(), M, K, N);
  cpu_->linear_bwd_input(dy.data(), w.data(), rdx.data(), M, K, N, false);
  cpu_->linear_bwd_input(dy.data(), w.data(), rdxa.data(), M, K, N, true);
  cpu_->linear_bwd_weight(dy.data(), x.data(), rdw.data(), M, K, N);
  EXPECT_TRUE(close(download(y), ry, kTol, "y"));
  EXPECT_TRUE(close(download(dx), rdx, kTol, "dx"));
  EXPECT_TRUE(close(download(dxa), rdxa, kTol, "dx +="));
  EXPECT_TRUE(close(download(dw), rdw, 1e-4, "dw +="));  // fp32 accumulator, exact products
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaLinear,
                         ::testing::Values(LinShape{37, 72, 50}, LinShape{256, 512, 384}, LinShape{1, 8, 3},
                                           LinShape{300, 2048, 1024}));

TEST_F(CudaOpsTest, Embedding) {
  const int64_t T = 257, H = 96, V = 50;
  std::vector<int32_t> ids(size_t(T), {});
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7 + 3) % V);  // repeats
  VecF table = randn(size_t(V * H), 21), dy = randn(size_t(T * H), 22), dt0 = randn(size_t(V * H), 23);
  DT idd = upload_i32(ids), tab = upload(table, DType::bf16), dyd = upload(dy, DType::bf16);
  DT y = poisoned(T * H, DType::bf16), dtab = upload(dt0, DType::f32);
  run([&](Ops& o) {
    o.embedding_fwd(idd.as<int32_t>(), tab.get(), y.get(), T, H, V);
    o.embedding_bwd(idd.as<int32_t>(), dyd.get(), dtab.get(), T, H, V, -1);
  });
  VecF ry(size_t(T * H), {}), rdt = dt0;
  cpu_->embedding_fwd(ids.data(), table.data(), ry.data(), T, H, V);
  cpu_->embedding_bwd(ids.data(), dy.data(), rdt.data(), T, H, V, -1);
  EXPECT_EQ(download(y), ry);
  EXPECT_TRUE(close(download(dtab), rdt, 1e-6, "dtable"));
  // a padding row (pad == eos in the data) gets nothing, as on the CPU
  const int32_t pad = ids[10];
  DT dpad = upload(dt0, DType::f32);
  run([&](Ops& o) { o.embedding_bwd(idd.as<int32_t>(), dyd.get(), dpad.get(), T, H, V, pad); });
  VecF rpad = dt0;
  cpu_->embedding_bwd(ids.data(), dy.data(), rpad.data(), T, H, V, pad);
  EXPECT_TRUE(close(download(dpad), rpad, 1e-6, "dtable with a padding row"));
  const VecF padded = download(dpad);
  for (int64_t j = 0; j < H; ++j) ASSERT_EQ(padded[size_t(pad * H + j)], dt0[size_t(pad * H + j)]) << j;
  // an id out of range is reported by the next then() and its row is zero
  ids[5] = int32_t(V);
  DT bad = upload_i32(ids);
  cs().launch([&] { ops().embedding_fwd(bad.as<int32_t>(), tab.get(), y.get(), T, H, V); });
  std::string err = sync_err();
  EXPECT_NE(err.find("token id"), std::string::npos) << err;
  EXPECT_TRUE(sync_err().empty());  // reported once
  VecF got = download(y);
  for (int64_t j = 0; j < H; ++j) ASSERT_EQ(got[size_t(5 * H + j)], 0.f);
}

struct NormShape {
  int64_t R, n;
};
class CudaRMSNorm : public CudaOpsTest, public ::testing::WithParamInterface<NormShape> {};

TEST_P(CudaRMSNorm, MatchesCpu) {
  const auto [R, n] = GetParam();
  const float eps = 1e-6f;
  VecF x = randn(size_t(R * n), 31, 2.0f), w = randn(size_t(n), 32, 0.5f), dy = randn(size_t(R * n), 33);
  for (auto& v : w) v += 1.0f;
  VecF dx0 = randn(size_t(R * n), 34), dw0 = randn(size_t(n), 35);
  DT xd = upload(x, DType::bf16), wd = upload(w, DType::bf16), dyd = upload(dy, DType::bf16);
  DT y = poisoned(R * n, DType::bf16), dx = poisoned(R * n, DType::bf16);
  DT dxa = upload(dx0, DType::bf16), dw = upload(dw0, DType::f32), dw2 = upload(dw0, DType::f32);
  run([&](Ops& o) {
    o.rmsnorm_fwd(xd.get(), wd.get(), y.get(), R, n, eps);
    o.rmsnorm_bwd(xd.get(), wd.get(), dyd.get(), dx.get(), dw.get(), R, n, eps, false);
    o.rmsnorm_bwd(xd.get(), wd.get(), dyd.get(), dxa.get(), dw2.get(), R, n, eps, true);
  });
  VecF ry(size_t(R * n), {}), rdx(size_t(R * n), {}), rdxa = dx0, rdw = dw0, rdw2 = dw0;
  cpu_->rmsnorm_fwd(x.data(), w.data(), ry.data(), R, n, eps);
  cpu_->rmsnorm_bwd(x.data(), w.data(), dy.data(), rdx.data(), rdw.data(), R, n, eps, false);
  cpu_->rmsnorm_bwd(x.data(), w.data(), dy.data(), rdxa.data(), rdw2.data(), R, n, eps, true);
  EXPECT_TRUE(close(download(y), ry, kTol, "y"));
  EXPECT_TRUE(close(download(dx), rdx, kTol, "dx"));
  EXPECT_TRUE(close(download(dxa), rdxa, kTol, "dx +="));
  EXPECT_TRUE(close(download(dw), rdw, 1e-4, "dw"));
  EXPECT_TRUE(close(download(dw2), rdw2, 1e-4, "dw (2)"));
  // a frozen norm weight (dw null): the same dx as the CPU twin's without dw
  DT dxf = poisoned(R * n, DType::bf16);
  run([&](Ops& o) { o.rmsnorm_bwd(xd.get(), wd.get(), dyd.get(), dxf.get(), nullptr, R, n, eps, false); });
  VecF rdxf(size_t(R * n), {});
  cpu_->rmsnorm_bwd(x.data(), w.data(), dy.data(), rdxf.data(), nullptr, R, n, eps, false);
  EXPECT_TRUE(close(download(dxf), rdxf, kTol, "dx without dw"));
}
// Gemma's RMSNorm (w_offset 1, one rounding of x * r * (1 + w)) against the CPU twin.
TEST_P(CudaRMSNorm, WeightOffsetMatchesCpu) {
  const auto [R, n] = GetParam();
  const float eps = 1e-6f;
  VecF x = randn(size_t(R * n), 36, 2.0f), w = randn(size_t(n), 37, 0.3f), dy = randn(size_t(R * n), 38);
  VecF dw0 = randn(size_t(n), 39);
  DT xd = upload(x, DType::bf16), wd = upload(w, DType::bf16), dyd = upload(dy, DType::bf16);
  DT y = poisoned(R * n, DType::bf16), dx = poisoned(R * n, DType::bf16), dw = upload(dw0, DType::f32);
  run([&](Ops& o) {
    o.rmsnorm_fwd(xd.get(), wd.get(), y.get(), R, n, eps, 1.0f);
    o.rmsnorm_bwd(xd.get(), wd.get(), dyd.get(), dx.get(), dw.get(), R, n, eps, false, 1.0f);
  });
  VecF ry(size_t(R * n), {}), rdx(size_t(R * n), {}), rdw = dw0;
  cpu_->rmsnorm_fwd(x.data(), w.data(), ry.data(), R, n, eps, 1.0f);
  cpu_->rmsnorm_bwd(x.data(), w.data(), dy.data(), rdx.data(), rdw.data(), R, n, eps, false, 1.0f);
  EXPECT_TRUE(close(download(y), ry, kTol, "y"));
  EXPECT_TRUE(close(download(dx), rdx, kTol, "dx"));
  EXPECT_TRUE(close(download(dw), rdw, 1e-4, "dw"));
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaRMSNorm,
                         ::testing::Values(NormShape{64, 2048}, NormShape{1000, 128}, NormShape{40, 5120},
                                           NormShape{33, 100}, NormShape{5, 7}, NormShape{17, 2560},
                                           NormShape{9, 4096}, NormShape{3, 4104}, NormShape{11, 512},
                                           NormShape{5, 3072}));

TEST_F(CudaOpsTest, RoPE) {
  for (const char* type : {"default", "yarn"}) {
    RopeParams p;
    p.type = type;
    p.theta = 1e6;
    p.head_dim = 128;
    p.factor = 4.0;
    p.original_max_position_embeddings = 4096;
    RopeTable tab = rope_frequencies(p);
    const int64_t S = 2, L = 700, heads = 3, D = 128, n = S * L * heads * D;  // paired path
    VecF x = randn(size_t(n), 41);
    DT xd = upload(x, DType::bf16), gd = upload(x, DType::bf16);
    VecF rx = x, rg = x;
    run([&](Ops& o) {
      o.rope_fwd(xd.get(), S, L, heads, D, tab.inv_freq.data(), tab.attention_scaling);
      o.rope_bwd(gd.get(), S, L, heads, D, tab.inv_freq.data(), tab.attention_scaling);
    });
    cpu_->rope_fwd(rx.data(), S, L, heads, D, tab.inv_freq.data(), tab.attention_scaling);
    cpu_->rope_bwd(rg.data(), S, L, heads, D, tab.inv_freq.data(), tab.attention_scaling);
    EXPECT_TRUE(close(download(xd), rx, kTol, type));
    EXPECT_TRUE(close(download(gd), rg, kTol, type));
  }
}

// Partial rotary (Phi-4-mini's 96 of 128; 6 of 16 on the one-element path): fwd/bwd and
// the positioned twins against the CPU, the pass-through features included.
TEST_F(CudaOpsTest, RoPEPartialRotary) {
  for (auto [D, R] : {std::pair<int64_t, int64_t>{128, 96}, {16, 6}}) {
    RopeParams p;
    p.theta = 10000;
    p.head_dim = R;
    const RopeTable tab = rope_frequencies(p);
    const int64_t S = 2, L = 67, heads = 3, n = S * L * heads * D;
    const std::string what = "D=" + std::to_string(D) + " R=" + std::to_string(R);
    VecF x = randn(size_t(n), 45);
    std::vector<int32_t> pos;
    for (int64_t t = 0; t < S * L; ++t) pos.push_back(int32_t((t * 7) % 31));
    DT xd = upload(x, DType::bf16), gd = upload(x, DType::bf16), ad = upload(x, DType::bf16),
       bd = upload(x, DType::bf16), pd = upload_i32(pos);
    VecF rx = x, rg = x, ra = x, rb = x;
    run([&](Ops& o) {
      o.rope_fwd(xd.get(), S, L, heads, D, tab.inv_freq.data(), 1.2f, R);
      o.rope_bwd(gd.get(), S, L, heads, D, tab.inv_freq.data(), 1.2f, R);
      o.rope_fwd_at(ad.get(), pd.as<int32_t>(), S * L, heads, D, tab.inv_freq.data(), 1.2f, R);
      o.rope_bwd_at(bd.get(), pd.as<int32_t>(), S * L, heads, D, tab.inv_freq.data(), 1.2f, R);
    });
    cpu_->rope_fwd(rx.data(), S, L, heads, D, tab.inv_freq.data(), 1.2f, R);
    cpu_->rope_bwd(rg.data(), S, L, heads, D, tab.inv_freq.data(), 1.2f, R);
    cpu_->rope_fwd_at(ra.data(), pos.data(), S * L, heads, D, tab.inv_freq.data(), 1.2f, R);
    cpu_->rope_bwd_at(rb.data(), pos.data(), S * L, heads, D, tab.inv_freq.data(), 1.2f, R);
    EXPECT_TRUE(close(download(xd), rx, kTol, (what + " fwd").c_str()));
    EXPECT_TRUE(close(download(gd), rg, kTol, (what + " bwd").c_str()));
    EXPECT_TRUE(close(download(ad), ra, kTol, (what + " fwd_at").c_str()));
    EXPECT_TRUE(close(download(bd), rb, kTol, (what + " bwd_at").c_str()));
  }
}

TEST_F(CudaOpsTest, RoPEOddHalf) {  // D/2 odd: the one-element-per-thread path
  RopeParams p;
  p.theta = 10000;
  p.head_dim = 6;
  RopeTable tab = rope_frequencies(p);
  const int64_t S = 3, L = 41, heads = 5, D = 6, n = S * L * heads * D;
  VecF x = randn(size_t(n), 42);
  DT xd = upload(x, DType::bf16);
  VecF rx = x;
  run([&](Ops& o) { o.rope_fwd(xd.get(), S, L, heads, D, tab.inv_freq.data(), tab.attention_scaling); });
  cpu_->rope_fwd(rx.data(), S, L, heads, D, tab.inv_freq.data(), tab.attention_scaling);
  EXPECT_TRUE(close(download(xd), rx, kTol, "rope D=6"));
}

TEST_F(CudaOpsTest, SwiGLU) {
  const int64_t n = 6144 * 3 + 5;
  VecF g = randn(size_t(n), 51, 2.0f), u = randn(size_t(n), 52), dh = randn(size_t(n), 53);
  DT gd = upload(g, DType::bf16), ud = upload(u, DType::bf16), dhd = upload(dh, DType::bf16);
  DT h = poisoned(n, DType::bf16), dg = poisoned(n, DType::bf16), du = poisoned(n, DType::bf16);
  run([&](Ops& o) {
    o.swiglu_fwd(gd.get(), ud.get(), h.get(), n);
    o.swiglu_bwd(gd.get(), ud.get(), dhd.get(), dg.get(), du.get(), n);
  });
  VecF rh(size_t(n), {}), rdg(size_t(n), {}), rdu(size_t(n), {});
  cpu_->swiglu_fwd(g.data(), u.data(), rh.data(), n);
  cpu_->swiglu_bwd(g.data(), u.data(), dh.data(), rdg.data(), rdu.data(), n);
  EXPECT_TRUE(close(download(h), rh, kTol, "h"));
  EXPECT_TRUE(close(download(dg), rdg, kTol, "dg"));
  EXPECT_TRUE(close(download(du), rdu, kTol, "du"));
}

TEST_F(CudaOpsTest, GeGLU) {
  const int64_t n = 6144 * 3 + 5;
  VecF g = randn(size_t(n), 54, 2.0f), u = randn(size_t(n), 55), dh = randn(size_t(n), 56);
  DT gd = upload(g, DType::bf16), ud = upload(u, DType::bf16), dhd = upload(dh, DType::bf16);
  DT h = poisoned(n, DType::bf16), dg = poisoned(n, DType::bf16), du = poisoned(n, DType::bf16);
  run([&](Ops& o) {
    o.geglu_fwd(gd.get(), ud.get(), h.get(), n);
    o.geglu_bwd(gd.get(), ud.get(), dhd.get(), dg.get(), du.get(), n);
  });
  VecF rh(size_t(n), {}), rdg(size_t(n), {}), rdu(size_t(n), {});
  cpu_->geglu_fwd(g.data(), u.data(), rh.data(), n);
  cpu_->geglu_bwd(g.data(), u.data(), dh.data(), rdg.data(), rdu.data(), n);
  EXPECT_TRUE(close(download(h), rh, kTol, "h"));
  EXPECT_TRUE(close(download(dg), rdg, kTol, "dg"));
  EXPECT_TRUE(close(download(du), rdu, kTol, "du"));
}

// ---- attention ----------------------------------------------------------------------------

struct AttnShape {
  int64_t S, L, nq, nkv, D;
  int impl;           // forward (cuda_backend.hpp): 0 auto, 1 simple, 2/3 flash, 4 cuDNN
  int bwd_impl = -1;  // backward; -1 = same as the forward (others: mixed pairs share lse)
};
class CudaAttention : public CudaAttentionTest, public ::testing::WithParamInterface<AttnShape> {};

TEST_P(CudaAttention, MatchesCpu) {
  const auto [S, L, nq, nkv, D, impl, bwd_impl] = GetParam();
  if (skip_without_cudnn(impl, bwd_impl))
    GTEST_SKIP() << "this build has no cuDNN attention (scripts/setup.sh fetches cudnn-frontend)";
  Run g = run_attention(S, L, nq, nkv, D, 61, impl, bwd_impl);
  expect_matches_cpu(g, S, L, nq, nkv, D);
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttnShape{2, 200, 4, 2, 128, 0},  // flash, GQA 2, ragged last tile
                                           AttnShape{1, 130, 2, 1, 64, 0},   // flash D=64
                                           AttnShape{1, 64, 2, 2, 128, 0},   // one tile exactly
                                           AttnShape{3, 17, 4, 1, 128, 0},   // shorter than a tile
                                           AttnShape{1, 1024, 2, 1, 128, 0},  // many tiles
                                           AttnShape{2, 200, 4, 2, 128, 1},   // simple kernels
                                           AttnShape{2, 77, 6, 2, 32, 0},     // D=32 -> simple kernels
                                           AttnShape{1, 50, 3, 3, 48, 0},     // D=48, MHA
                                           AttnShape{2, 200, 4, 2, 128, 2},   // flash config 2 (4-warp fwd)
                                           AttnShape{1, 130, 2, 1, 64, 2}, AttnShape{1, 1024, 2, 1, 128, 2},
                                           AttnShape{3, 17, 4, 1, 128, 2},
                                           AttnShape{2, 330, 8, 2, 128, 3},  // flash config 3, GQA 4
                                           AttnShape{2, 150, 4, 2, 256, 3},  // flash D=256 (narrow only)
                                           AttnShape{1, 70, 2, 1, 256, 2}, AttnShape{1, 257, 2, 2, 64, 3},
                                           AttnShape{2, 200, 4, 2, 128, 4},  // cuDNN flash attention (forced)
                                           AttnShape{1, 130, 2, 1, 64, 4}, AttnShape{1, 64, 2, 2, 128, 4},
                                           AttnShape{3, 17, 4, 2, 128, 4}, AttnShape{1, 1024, 2, 1, 128, 4},
                                           AttnShape{2, 330, 8, 4, 128, 4},
                                           AttnShape{2, 330, 8, 2, 128, 4, 3},  // cuDNN forward, our backward
                                           AttnShape{2, 330, 8, 4, 128, 3, 4},  // our forward, cuDNN backward
                                           AttnShape{1, 200, 4, 2, 128, 4, 1},
                                           // automatic with 4 query heads per KV head: cuDNN forward, cuDNN's
                                           // expanded GQA backward (test_cuda_gqa.cpp covers every ratio)
                                           AttnShape{3, 17, 4, 1, 128, 0}, AttnShape{2, 330, 8, 2, 128, 0}));

// Forcing cuDNN (impl 4) on a shape it refuses is a DeviceError that says why, not a
// silent fallback: head_dim 36 (cuDNN needs a multiple of 8), and an expanded GQA backward
// whose scratch (capped) holds not even a pass of one query head.
TEST_F(CudaOpsTest, ForcedCudnnRefusalNamesTheReason) {
#ifdef RP_HAVE_CUDA
  if (!cuda::cudnn_attention_available()) GTEST_SKIP() << "this build has no cuDNN attention";
  auto forced = [&](int64_t D, int64_t nq, int64_t nkv, size_t limit, bool backward) {
    const int64_t S = 1, L = 64, T = S * L;
    VecF hq = randn(size_t(T * nq * D), 81), hk = randn(size_t(T * nkv * D), 82),
         hv = randn(size_t(T * nkv * D), 83);
    DT q = upload(hq, DType::bf16), k = upload(hk, DType::bf16), v = upload(hv, DType::bf16);
    DT o = poisoned(T * nq * D, DType::bf16);
    DT lse = poisoned(S * nq * L, DType::f32), dq = poisoned(T * nq * D, DType::bf16);
    DT dk = poisoned(T * nkv * D, DType::bf16), dv = poisoned(T * nkv * D, DType::bf16);
    DeviceBuffer scratch(dev(), Ops::attention_scratch_bytes(S, L, nq, nkv, D));
    std::string what;
    run([&](Ops& op) {
      cuda::set_attention_impl(op, 4);
      try {
        op.attention_fwd(q.get(), k.get(), v.get(), o.get(), lse.as<float>(), S, L, nq, nkv, D, 0.1f,
                         scratch.get());
        cuda::set_attention_scratch_bytes(op, limit);
        if (backward)
          op.attention_bwd(q.get(), k.get(), v.get(), o.get(), lse.as<float>(), o.get(), dq.get(), dk.get(),
                           dv.get(), S, L, nq, nkv, D, 0.1f, scratch.get());
      } catch (const DeviceError& e) {
        what = e.what();
      }
      cuda::set_attention_scratch_bytes(op, 0);
      cuda::set_attention_impl(op, 0);
    });
    return what;
  };
  std::string what = forced(36, 2, 1, 0, false);
  EXPECT_NE(what.find("cuDNN refused"), std::string::npos) << what;
  EXPECT_NE(what.find("forward"), std::string::npos) << what;
  what = forced(128, 4, 1, 16 << 10, true);  // ratio 4: the expanded path, 16 KiB of scratch
  EXPECT_NE(what.find("cuDNN refused"), std::string::npos) << what;
  EXPECT_NE(what.find("a pass of one query head needs"), std::string::npos) << what;
#endif
}

// Flash (ours: impl 3; cuDNN: impl 4) vs a double-precision reference on sampled rows at
// 64K tokens (memory linear in L).
class CudaAttention64K : public CudaAttentionTest, public ::testing::WithParamInterface<int> {};
INSTANTIATE_TEST_SUITE_P(Impl, CudaAttention64K, ::testing::Values(3, 4));
TEST_P(CudaAttention64K, MatchesDoubleReferenceOnSampledRows) {
  if (skip_without_cudnn(GetParam()))
    GTEST_SKIP() << "this build has no cuDNN attention (scripts/setup.sh fetches cudnn-frontend)";
  const int64_t S = 1, L = 65536, nq = 2, nkv = 1, D = 128;
  const float scale = float(1.0 / std::sqrt(double(D)));
  Run g = run_attention(S, L, nq, nkv, D, 71, GetParam());
  const VecF &q = g.q, &k = g.k, &v = g.v, &dout = g.dout;
  DT &o = g.o, &lse = g.lse, &dq = g.dq, &dk = g.dk, &dv = g.dv;
  VecF go = download(o), gl = download(lse), gq = download(dq), gk = download(dk), gv = download(dv);
  for (float x : go) ASSERT_FALSE(std::isnan(x));
  for (float x : gk) ASSERT_FALSE(std::isnan(x));
  auto dotd = [&](const float* a, const float* b) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(a[d]) * double(b[d]);
    return s;
  };
  // Di from the GPU's o (checked on samples below)
  std::vector<double> Di(size_t(nq * L), {});
  for (int64_t h = 0; h < nq; ++h)
    for (int64_t t = 0; t < L; ++t)
      Di[size_t(h * L + t)] = dotd(&go[size_t((t * nq + h) * D)], &dout[size_t((t * nq + h) * D)]);
  VecF so, ro, sq, rq, sk, rk, sv, rv;
  const int64_t rows[] = {0, 1, 63, 64, 4097, 30000, 65534, 65535};
  for (int64_t t : rows)
    for (int64_t h = 0; h < nq; ++h) {
      const float* qt = &q[size_t((t * nq + h) * D)];
      std::vector<double> p(size_t(t + 1));
      double m = -1e300;
      for (int64_t j = 0; j <= t; ++j) m = std::max(m, p[size_t(j)] = scale * dotd(qt, &k[size_t(j * D)]));
      double sum = 0;
      for (auto& x : p) sum += (x = std::exp(x - m));
      std::vector<double> orow(size_t(D), 0.0), dq_row(size_t(D), 0.0);
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t d = 0; d < D; ++d) orow[size_t(d)] += p[size_t(j)] / sum * v[size_t(j * D + d)];
      const double di = Di[size_t(h * L + t)];
      for (int64_t j = 0; j <= t; ++j) {
        const double pj = p[size_t(j)] / sum;
        const double ds = pj * (dotd(&dout[size_t((t * nq + h) * D)], &v[size_t(j * D)]) - di);
        for (int64_t d = 0; d < D; ++d) dq_row[size_t(d)] += scale * ds * k[size_t(j * D + d)];
      }
      EXPECT_NEAR(gl[size_t(h * L + t)], m + std::log(sum), 1e-3) << t;
      for (int64_t d = 0; d < D; ++d) {
        so.push_back(go[size_t((t * nq + h) * D + d)]);
        ro.push_back(float(orow[size_t(d)]));
        sq.push_back(gq[size_t((t * nq + h) * D + d)]);
        rq.push_back(float(dq_row[size_t(d)]));
      }
    }
  for (int64_t j : {int64_t(0), int64_t(5), int64_t(32767), int64_t(65472), int64_t(65535)}) {
    std::vector<double> dkr(size_t(D), 0.0), dvr(size_t(D), 0.0);
    for (int64_t h = 0; h < nq; ++h)
      for (int64_t t = j; t < L; ++t) {
        const float* qt = &q[size_t((t * nq + h) * D)];
        const float* gt = &dout[size_t((t * nq + h) * D)];
        const double pj = std::exp(scale * dotd(qt, &k[size_t(j * D)]) - gl[size_t(h * L + t)]);
        const double ds = pj * (dotd(gt, &v[size_t(j * D)]) - Di[size_t(h * L + t)]);
        for (int64_t d = 0; d < D; ++d) {
          dvr[size_t(d)] += pj * gt[d];
          dkr[size_t(d)] += scale * ds * qt[d];
        }
      }
    for (int64_t d = 0; d < D; ++d) {
      sk.push_back(gk[size_t(j * D + d)]);
      rk.push_back(float(dkr[size_t(d)]));
      sv.push_back(gv[size_t(j * D + d)]);
      rv.push_back(float(dvr[size_t(d)]));
    }
  }
  EXPECT_TRUE(close(so, ro, kTol, "o rows"));
  EXPECT_TRUE(close(sq, rq, 3e-2, "dq rows"));
  EXPECT_TRUE(close(sk, rk, 3e-2, "dk rows"));
  EXPECT_TRUE(close(sv, rv, 2e-2, "dv rows"));
}

// ---- LM head + cross-entropy -----------------------------------------------------------------

struct CeShape {
  int64_t T, H, V;
};
class CudaLmHead : public CudaOpsTest, public ::testing::WithParamInterface<CeShape> {};

TEST_P(CudaLmHead, MatchesCpu) {
  const auto [T, H, V] = GetParam();
  VecF h = randn(size_t(T * H), 81), w = randn(size_t(V * H), 82, 0.1f),
       dw0 = randn(size_t(V * H), 83, 0.01f);
  std::vector<int32_t> tg(size_t(T), {});
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = (t % 7 == 3) ? -100 : int32_t((t * 131 + 7) % V);
  DT hd = upload(h, DType::bf16), wd = upload(w, DType::bf16), tgd = upload_i32(tg);
  DT loss = poisoned(2, DType::f32), loss2 = poisoned(2, DType::f32), dh = poisoned(T * H, DType::bf16);
  DT dw = upload(dw0, DType::f32);
  DeviceBuffer scratch(dev(), Ops::lm_head_ce_scratch_bytes(T, H, V));
  run([&](Ops& o) {
    o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss2.as<float>(), nullptr,
                            nullptr, scratch.get());
    o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss.as<float>(), dh.get(),
                            dw.get(), scratch.get());
  });
  VecF rloss(2), rdh(size_t(T * H), {}), rdw = dw0;
  std::vector<char> cs(Ops::lm_head_ce_scratch_bytes(T, H, V));
  cpu_->lm_head_cross_entropy(h.data(), w.data(), tg.data(), T, H, V, rloss.data(), rdh.data(), rdw.data(),
                              cs.data());
  VecF gl = download(loss), gl2 = download(loss2);
  EXPECT_EQ(gl[1], rloss[1]);
  EXPECT_EQ(gl2[1], rloss[1]);
  EXPECT_NEAR(gl[0], rloss[0], 2e-3 * std::abs(rloss[0]));
  EXPECT_NEAR(gl2[0], gl[0], 1e-6 * std::abs(rloss[0]));
  EXPECT_TRUE(close(download(dh), rdh, kTol, "dh"));
  VecF gdw = download(dw);
  VecF inc(gdw.size()), rinc(gdw.size());
  for (size_t i = 0; i < gdw.size(); ++i) {
    inc[i] = gdw[i] - dw0[i];
    rinc[i] = rdw[i] - dw0[i];
  }
  EXPECT_TRUE(close(inc, rinc, kTol, "dw increment"));
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaLmHead,
                         ::testing::Values(CeShape{300, 64, 1000},    // 2 chunks, vector path
                                           CeShape{37, 48, 1001},     // odd vocab: scalar path
                                           CeShape{1100, 256, 4096},  // several chunks
                                           CeShape{0, 16, 32}));      // no tokens

// Loss scaling on the device: the scale is the fp32 alpha of the dh / dW GEMMs, so with a power
// of two dh (bf16) and dW (fp32) are exactly S times the unscaled ones and the loss is unscaled.
TEST_F(CudaOpsTest, LmHeadLossScaleMultipliesOnlyTheGradients) {
  const int64_t T = 300, H = 64, V = 1000;
  VecF h = randn(size_t(T * H), 85), w = randn(size_t(V * H), 86, 0.1f), zero(size_t(V * H), 0.f);
  std::vector<int32_t> tg(size_t(T), {});
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = (t % 7 == 3) ? -100 : int32_t((t * 131 + 7) % V);
  DT hd = upload(h, DType::bf16), wd = upload(w, DType::bf16), tgd = upload_i32(tg);
  DT l1 = poisoned(2, DType::f32), lS = poisoned(2, DType::f32);
  DT dh1 = poisoned(T * H, DType::bf16), dhS = poisoned(T * H, DType::bf16);
  DT dw1 = upload(zero, DType::f32), dwS = upload(zero, DType::f32);
  DeviceBuffer scratch(dev(), Ops::lm_head_ce_scratch_bytes(T, H, V));
  run([&](Ops& o) {
    o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, l1.as<float>(), dh1.get(),
                            dw1.get(), scratch.get());
    o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, lS.as<float>(), dhS.get(),
                            dwS.get(), scratch.get(), 1024.f);
  });
  VecF a = download(l1), b = download(lS);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  VecF g1 = download(dh1), gS = download(dhS), w1 = download(dw1), wS = download(dwS);
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_EQ(gS[i], 1024.f * g1[i]) << "dh " << i;
  for (size_t i = 0; i < w1.size(); ++i) ASSERT_EQ(wS[i], 1024.f * w1[i]) << "dw " << i;
  float loss[2];
  EXPECT_THROW(ops().lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss, nullptr,
                                           nullptr, scratch.get(), 0.f),
               std::invalid_argument);
}

// fp16: a scale too large overflows in the fp16 dh (what makes the step skip), a moderate one
// does not and gives S times the unscaled gradient.
class CudaF16Test : public CudaOpsTest {
 protected:
  DType dtype() const override { return DType::f16; }
};
TEST_F(CudaF16Test, LmHeadLossScaleOverflowsOnlyWhenTooLarge) {
  const int64_t T = 64, H = 32, V = 256;
  VecF h = randn(size_t(T * H), 87), w = randn(size_t(V * H), 88, 0.5f), zero(size_t(V * H), 0.f);
  std::vector<int32_t> tg(size_t(T), {});
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = int32_t((t * 17 + 3) % V);
  DT hd = upload(h, DType::f16), wd = upload(w, DType::f16), tgd = upload_i32(tg);
  DT loss = poisoned(2, DType::f32), dh1 = poisoned(T * H, DType::f16), dh8 = poisoned(T * H, DType::f16),
     dhbig = poisoned(T * H, DType::f16);
  DT dw = upload(zero, DType::f32);
  DeviceBuffer scratch(dev(), Ops::lm_head_ce_scratch_bytes(T, H, V));
  run([&](Ops& o) {
    o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss.as<float>(), dh1.get(),
                            nullptr, scratch.get(), 1.f);
    o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss.as<float>(), dh8.get(),
                            nullptr, scratch.get(), 8.f);
    o.lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss.as<float>(), dhbig.get(),
                            dw.get(), scratch.get(), 1e9f);
  });
  VecF g1 = download(dh1), g8 = download(dh8), gb = download(dhbig);
  size_t inf = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    ASSERT_TRUE(std::isfinite(g8[i])) << i;
    if (std::abs(g1[i]) >= 6.2e-5f) {  // fp16 normals scale exactly
      ASSERT_EQ(g8[i], 8.f * g1[i]) << i;
    }
    inf += std::isinf(gb[i]) ? 1 : 0;
  }
  EXPECT_GT(inf, 0u) << "a scale of 1e9 must overflow fp16 (max 65504)";
}

TEST_F(CudaOpsTest, LmHeadBadTargetIsReported) {
  const int64_t T = 20, H = 16, V = 64;
  VecF h = randn(size_t(T * H), 91), w = randn(size_t(V * H), 92);
  std::vector<int32_t> tg(size_t(T), 1);
  tg[7] = int32_t(V);
  DT hd = upload(h, DType::bf16), wd = upload(w, DType::bf16), tgd = upload_i32(tg);
  DT loss = poisoned(2, DType::f32);
  DeviceBuffer scratch(dev(), Ops::lm_head_ce_scratch_bytes(T, H, V));
  cs().launch([&] {
    ops().lm_head_cross_entropy(hd.get(), wd.get(), tgd.as<int32_t>(), T, H, V, loss.as<float>(), nullptr,
                                nullptr, scratch.get());
  });
  std::string err = sync_err();
  EXPECT_NE(err.find("target"), std::string::npos) << err;
  EXPECT_EQ(download(loss)[1], float(T - 1));
}

// fp16 storage: a smoke test of the second dtype on the main ops.
class CudaOpsF16 : public CudaOpsTest {
 protected:
  DType dtype() const override { return DType::f16; }
};

TEST_F(CudaOpsF16, LinearAttentionLmHead) {
  EXPECT_EQ(ops().dtype(), DType::f16);
  const int64_t M = 96, K = 128, N = 64;
  VecF x = randn(size_t(M * K), 101), w = randn(size_t(N * K), 102, 0.05f);
  DT xd = upload(x, DType::f16), wd = upload(w, DType::f16), y = poisoned(M * N, DType::f16);
  run([&](Ops& o) { o.linear_fwd(xd.get(), wd.get(), y.get(), M, K, N); });
  VecF ry(size_t(M * N), {});
  cpu_->linear_fwd(x.data(), w.data(), ry.data(), M, K, N);
  EXPECT_TRUE(close(download(y), ry, 2e-3, "f16 linear"));
  const int64_t S = 1, L = 150, nq = 2, nkv = 1, D = 128;
  const float scale = float(1.0 / std::sqrt(double(D)));
  VecF q = randn(size_t(L * nq * D), 103), k = randn(size_t(L * D), 104), v = randn(size_t(L * D), 105);
  VecF dout = randn(size_t(L * nq * D), 106);
  DT qd = upload(q, DType::f16), kd = upload(k, DType::f16), vd = upload(v, DType::f16),
     dod = upload(dout, DType::f16);
  DT o = poisoned(L * nq * D, DType::f16), lse = poisoned(nq * L, DType::f32);
  DT dq = poisoned(L * nq * D, DType::f16), dk = poisoned(L * D, DType::f16),
     dv = poisoned(L * D, DType::f16);
  DeviceBuffer scratch(dev(), Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  run([&](Ops& op) {
    op.attention_fwd(qd.get(), kd.get(), vd.get(), o.get(), lse.as<float>(), S, L, nq, nkv, D, scale,
                     scratch.get());
    op.attention_bwd(qd.get(), kd.get(), vd.get(), o.get(), lse.as<float>(), dod.get(), dq.get(), dk.get(),
                     dv.get(), S, L, nq, nkv, D, scale, scratch.get());
  });
  VecF ro(o.n), rl(lse.n), rdq(q.size()), rdk(k.size()), rdv(v.size());
  std::vector<char> cs(Ops::attention_scratch_bytes(S, L, nq, nkv, D));
  cpu_->attention_fwd(q.data(), k.data(), v.data(), ro.data(), rl.data(), S, L, nq, nkv, D, scale, cs.data());
  VecF go = download(o);
  cpu_->attention_bwd(q.data(), k.data(), v.data(), go.data(), rl.data(), dout.data(), rdq.data(), rdk.data(),
                      rdv.data(), S, L, nq, nkv, D, scale, cs.data());
  EXPECT_TRUE(close(go, ro, 3e-3, "f16 o"));
  EXPECT_TRUE(close(download(dq), rdq, 5e-3, "f16 dq"));
  EXPECT_TRUE(close(download(dk), rdk, 5e-3, "f16 dk"));
  EXPECT_TRUE(close(download(dv), rdv, 3e-3, "f16 dv"));
}

}  // namespace
}  // namespace rp
