// The CUDA mixture-of-experts ops (kernels/cuda/cuda_moe.cu, cuda_moe.cpp) against their CPU
// twins (kernels/cpu/cpu_moe.cpp) on the same inputs rounded to the device dtype (bf16 and
// f16), at a small shape (E=8, k=2, rows of 36: the unvectorised paths) and at a
// Qwen3-30B-A3B-like one (E=128, k=8, T=512, H=256, F=96), each with experts that receive
// no tokens; the grouped linears in the three modes (per-expert loop, cuBLAS grouped GEMM, side streams),
// the device set to ExpertGemm::grouped (its default, bucketed, is test_cuda_moe_pad.cpp's);
// reruns bit-identical; a bad expert index reported by the stream. Outputs are NaN-poisoned
// first. Skipped when no CUDA device is visible.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/ops.hpp"
#include "tests/kernels/test_cuda_fixtures.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace rp {
namespace {

using namespace rp::cudatest;
using ref::randn;
using VecI = std::vector<int32_t>;

struct MoeCase {
  DType dt;
  int64_t T, E, k, H, F;
};

class CudaMoe : public CudaOpsTest, public ::testing::WithParamInterface<MoeCase> {
 protected:
  DType dtype() const override { return GetParam().dt; }
  void SetUp() override {
    CudaOpsTest::SetUp();
    if (dev_) ops().set_expert_gemm(ExpertGemm::grouped);  // else the bucketed batches replace every mode
  }
  double tol() const { return GetParam().dt == DType::bf16 ? 1e-2 : 2e-3; }  // one rounding of the output

  // Router logits with experts 3 and E-3 never chosen (their logits far below the rest).
  VecF logits(uint32_t seed) {
    const auto c = GetParam();
    VecF z = randn(size_t(c.T * c.E), seed, 2.f);
    for (int64_t t = 0; t < c.T; ++t) z[size_t(t * c.E + 3)] = z[size_t(t * c.E + c.E - 3)] = -40.f;
    return z;
  }
  VecI ints(const DT& d) {
    VecF f = download(d);
    return VecI(f.begin(), f.end());
  }
  // The CPU twin's routing and grouping of the logits (rounded to the device dtype).
  struct Cpu {
    VecF probs, w, stats;
    VecI idx, off, row, token;
  };
  Cpu cpu_route(const VecF& z, bool norm, const VecF& stats0) {
    const auto c = GetParam();
    Cpu r{VecF(size_t(c.T * c.E)), VecF(size_t(c.T * c.k)), stats0,
          VecI(size_t(c.T * c.k)), VecI(size_t(c.E + 1)),   VecI(size_t(c.T * c.k)),
          VecI(size_t(c.T * c.k))};
    cpu_->moe_route(z.data(), r.probs.data(), r.idx.data(), r.w.data(), r.stats.data(), c.T, c.E, c.k, norm);
    VecI off_h(size_t(c.E + 1));
    cpu_->moe_sort(r.idx.data(), r.off.data(), off_h.data(), r.row.data(), r.token.data(), c.T, c.E, c.k);
    return r;
  }
  void set_mode(Ops& o, int mode) {
#ifdef RP_HAVE_CUDA
    cuda::set_grouped_gemm(o, mode);
#else
    (void)o, (void)mode;
#endif
  }
};

TEST_P(CudaMoe, RouteSortMatchCpu) {
  const auto c = GetParam();
  for (bool norm : {false, true}) {
    VecF z = logits(1 + norm);
    DT zd = upload(z, c.dt);  // z now holds the device's rounded values
    VecF stats0 = randn(size_t(2 * c.E), 3);
    for (int64_t e = 0; e < c.E; ++e) stats0[size_t(e)] = float(e % 5);  // counts so far: integers
    Cpu r = cpu_route(z, norm, stats0);
    DT probs = poisoned(c.T * c.E, DType::f32), w = poisoned(c.T * c.k, DType::f32);
    DT idx = poisoned(c.T * c.k, DType::i32), stats = upload(stats0, DType::f32);
    DT off = poisoned(c.E + 1, DType::i32), row = poisoned(c.T * c.k, DType::i32);
    DT token = poisoned(c.T * c.k, DType::i32);
    VecI off_h(size_t(c.E + 1), -1);
    run([&](Ops& o) {
      o.moe_route(zd.get(), probs.as<float>(), idx.as<int32_t>(), w.as<float>(), stats.as<float>(), c.T, c.E,
                  c.k, norm);
      o.moe_sort(idx.as<int32_t>(), off.as<int32_t>(), off_h.data(), row.as<int32_t>(), token.as<int32_t>(),
                 c.T, c.E, c.k);
    });
    EXPECT_EQ(ints(idx), r.idx) << "norm " << norm;
    EXPECT_TRUE(close(download(probs), r.probs, 1e-5, "probs"));
    EXPECT_TRUE(close(download(w), r.w, 1e-5, "topk_w"));
    VecF s = download(stats);
    for (int64_t e = 0; e < c.E; ++e) ASSERT_EQ(s[size_t(e)], r.stats[size_t(e)]) << "count of expert " << e;
    EXPECT_EQ(s[3], stats0[3]) << "expert 3 must get no tokens";
    EXPECT_TRUE(
        close(VecF(s.begin() + c.E, s.end()), VecF(r.stats.begin() + c.E, r.stats.end()), 1e-5, "psum"));
    EXPECT_EQ(off_h, r.off);
    EXPECT_EQ(ints(off), r.off);
    EXPECT_EQ(ints(row), r.row);
    EXPECT_EQ(ints(token), r.token);
    EXPECT_EQ(r.off[4], r.off[3]);
  }
}

// The sort in two halves with the gather of the sorted rows queued between them (as MoeBlock
// runs it): the host offsets after the wait, the device results and the gathered rows equal
// the CPU twin's, run after run (the mapped offsets are rewritten each time).
TEST_P(CudaMoe, SortLaunchGatherWaitMatchesCpu) {
  const auto c = GetParam();
  const int64_t R = c.T * c.k, H = c.H;
  for (uint32_t seed : {21u, 22u}) {
    VecF z = logits(seed);
    DT zd = upload(z, c.dt);
    Cpu r = cpu_route(z, true, VecF(size_t(2 * c.E), 0.f));
    VecF x = randn(size_t(c.T * H), seed + 100);
    DT xd = upload(x, c.dt), xs = poisoned(R * H, c.dt);
    DT probs = poisoned(c.T * c.E, DType::f32), w = poisoned(R, DType::f32), idx = poisoned(R, DType::i32);
    DT off = poisoned(c.E + 1, DType::i32), row = poisoned(R, DType::i32), token = poisoned(R, DType::i32);
    VecI off_h(size_t(c.E + 1), -1);
    run([&](Ops& o) {
      o.moe_route(zd.get(), probs.as<float>(), idx.as<int32_t>(), w.as<float>(), nullptr, c.T, c.E, c.k,
                  true);
      o.moe_sort_launch(idx.as<int32_t>(), off.as<int32_t>(), off_h.data(), row.as<int32_t>(),
                        token.as<int32_t>(), c.T, c.E, c.k);
      o.gather_rows(xd.get(), token.as<int32_t>(), xs.get(), R, H);
      o.moe_sort_wait(off_h.data(), c.E);
      EXPECT_EQ(off_h, r.off) << "host offsets after the wait, seed " << seed;
    });
    VecF rxs(size_t(R * H));
    cpu_->gather_rows(x.data(), r.token.data(), rxs.data(), R, H);
    EXPECT_EQ(ints(off), r.off);
    EXPECT_EQ(ints(row), r.row);
    EXPECT_EQ(ints(token), r.token);
    EXPECT_EQ(download(xs), rxs) << "rows gathered between launch and wait";
  }
}

TEST_P(CudaMoe, RouteBackwardMatchesCpu) {
  const auto c = GetParam();
  VecF z = logits(4);
  upload(z, c.dt);
  Cpu r = cpu_route(z, true, VecF(size_t(2 * c.E), 0.f));
  VecF g = randn(size_t(c.T * c.k), 5), counts(r.stats.begin(), r.stats.begin() + c.E);
  DT pd = upload(r.probs, DType::f32), idd = upload_i32(r.idx), gd = upload(g, DType::f32);
  DT cd = upload(counts, DType::f32);
  for (bool norm : {false, true})
    for (bool aux : {false, true}) {
      DT dz = poisoned(c.T * c.E, c.dt);
      run([&](Ops& o) {
        o.moe_route_bwd(pd.as<float>(), idd.as<int32_t>(), gd.as<float>(), aux ? cd.as<float>() : nullptr,
                        0.01f, dz.get(), c.T, c.E, c.k, norm);
      });
      VecF ref(size_t(c.T * c.E));
      cpu_->moe_route_bwd(r.probs.data(), r.idx.data(), g.data(), aux ? counts.data() : nullptr, 0.01f,
                          ref.data(), c.T, c.E, c.k, norm);
      EXPECT_TRUE(close(download(dz), ref, tol(), norm ? "dlogits (norm)" : "dlogits")) << "aux " << aux;
    }
}

TEST_P(CudaMoe, GatherCombineMatchCpu) {
  const auto c = GetParam();
  const int64_t R = c.T * c.k, H = c.H;
  Cpu r = cpu_route(logits(6), false, VecF(size_t(2 * c.E), 0.f));
  VecF x = randn(size_t(c.T * H), 7), ys = randn(size_t(R * H), 8), dy = randn(size_t(c.T * H), 9);
  VecF y0 = randn(size_t(c.T * H), 10), w = randn(size_t(R), 11), dxs = randn(size_t(R * H), 12);
  DT xd = upload(x, c.dt), ysd = upload(ys, c.dt), dyd = upload(dy, c.dt), wd = upload(w, DType::f32);
  DT dxsd = upload(dxs, c.dt), rowd = upload_i32(r.row), tokd = upload_i32(r.token);
  DT xs = poisoned(R * H, c.dt), y = poisoned(c.T * H, c.dt), ya = upload(y0, c.dt);
  DT dys = poisoned(R * H, c.dt), dw = poisoned(R, DType::f32), dx = poisoned(c.T * H, c.dt);
  DT dxa = upload(y0, c.dt);
  run([&](Ops& o) {
    o.gather_rows(xd.get(), tokd.as<int32_t>(), xs.get(), R, H);
    o.moe_combine(ysd.get(), wd.as<float>(), rowd.as<int32_t>(), y.get(), c.T, c.k, H, false);
    o.moe_combine(ysd.get(), wd.as<float>(), rowd.as<int32_t>(), ya.get(), c.T, c.k, H, true);
    o.moe_combine_bwd(dyd.get(), ysd.get(), wd.as<float>(), rowd.as<int32_t>(), dys.get(), dw.as<float>(),
                      c.T, c.k, H);
    o.moe_gather_bwd(dxsd.get(), rowd.as<int32_t>(), dx.get(), c.T, c.k, H, false);
    o.moe_gather_bwd(dxsd.get(), rowd.as<int32_t>(), dxa.get(), c.T, c.k, H, true);
  });
  VecF rxs(size_t(R * H)), ry(size_t(c.T * H)), rya = y0, rdys(size_t(R * H)), rdw(static_cast<size_t>(R));
  VecF rdx(size_t(c.T * H)), rdxa = y0;
  cpu_->gather_rows(x.data(), r.token.data(), rxs.data(), R, H);
  cpu_->moe_combine(ys.data(), w.data(), r.row.data(), ry.data(), c.T, c.k, H, false);
  cpu_->moe_combine(ys.data(), w.data(), r.row.data(), rya.data(), c.T, c.k, H, true);
  cpu_->moe_combine_bwd(dy.data(), ys.data(), w.data(), r.row.data(), rdys.data(), rdw.data(), c.T, c.k, H);
  cpu_->moe_gather_bwd(dxs.data(), r.row.data(), rdx.data(), c.T, c.k, H, false);
  cpu_->moe_gather_bwd(dxs.data(), r.row.data(), rdxa.data(), c.T, c.k, H, true);
  EXPECT_EQ(download(xs), rxs);  // bit copies
  EXPECT_TRUE(close(download(y), ry, tol(), "combine"));
  EXPECT_TRUE(close(download(ya), rya, tol(), "combine +="));
  EXPECT_TRUE(close(download(dys), rdys, tol(), "combine dys"));
  EXPECT_TRUE(close(download(dw), rdw, 1e-5, "combine dw"));
  EXPECT_TRUE(close(download(dx), rdx, tol(), "gather_bwd"));
  EXPECT_TRUE(close(download(dxa), rdxa, tol(), "gather_bwd +="));
}

TEST_P(CudaMoe, GroupedLinearsMatchCpuInEveryMode) {
  const auto c = GetParam();
  Cpu r = cpu_route(logits(13), false, VecF(size_t(2 * c.E), 0.f));
  const int64_t R = c.T * c.k, E = c.E;
  ASSERT_EQ(r.off[4] - r.off[3], 0);
  for (auto [K, N] : {std::pair{c.H, c.F}, std::pair{c.F, c.H}}) {  // gate/up, then down
    VecF x = randn(size_t(R * K), 14), w = randn(size_t(E * N * K), 15, 0.05f), dy = randn(size_t(R * N), 16);
    VecF dx0 = randn(size_t(R * K), 17), dw0 = randn(size_t(E * N * K), 18);
    DT xd = upload(x, c.dt), wd = upload(w, c.dt), dyd = upload(dy, c.dt);
    VecF ry(size_t(R * N)), rdx(size_t(R * K)), rdxa = dx0, rdw = dw0;
    upload(rdxa, c.dt);  // the device's rounded start of the accumulating dx
    const VecF dx_start = rdxa;
    cpu_->grouped_linear_fwd(x.data(), w.data(), ry.data(), r.off.data(), E, K, N);
    VecF y0 = randn(size_t(R * N), 19);
    upload(y0, c.dt);  // rounded to the device dtype: the start of the accumulating y
    VecF rya = y0;
    cpu_->grouped_linear_fwd_add(x.data(), w.data(), rya.data(), r.off.data(), E, K, N, 0.75f);
    cpu_->grouped_linear_bwd_input(dy.data(), w.data(), rdx.data(), r.off.data(), E, K, N, false);
    cpu_->grouped_linear_bwd_input(dy.data(), w.data(), rdxa.data(), r.off.data(), E, K, N, true);
    cpu_->grouped_linear_bwd_weight(dy.data(), x.data(), rdw.data(), r.off.data(), E, K, N);
    for (int mode : {0, 1, 2}) {
      VecF start = dx_start;
      DT y = poisoned(R * N, c.dt), dx = poisoned(R * K, c.dt), dxa = upload(start, c.dt);
      VecF ystart = y0;
      DT ya = upload(ystart, c.dt);
      DT dw = upload(dw0, DType::f32);
      run([&](Ops& o) {
        set_mode(o, mode);
        o.grouped_linear_fwd(xd.get(), wd.get(), y.get(), r.off.data(), E, K, N);
        o.grouped_linear_fwd_add(xd.get(), wd.get(), ya.get(), r.off.data(), E, K, N, 0.75f);
        o.grouped_linear_bwd_input(dyd.get(), wd.get(), dx.get(), r.off.data(), E, K, N, false);
        o.grouped_linear_bwd_input(dyd.get(), wd.get(), dxa.get(), r.off.data(), E, K, N, true);
        o.grouped_linear_bwd_weight(dyd.get(), xd.get(), dw.get(), r.off.data(), E, K, N);
      });
      const std::string m = std::string(mode == 0   ? "loop"
                                        : mode == 1 ? "grouped"
                                                    : "streams") +
                            " K=" + std::to_string(K);
      EXPECT_TRUE(close(download(y), ry, tol(), ("y " + m).c_str()));
      EXPECT_TRUE(close(download(ya), rya, tol(), ("y += " + m).c_str()));
      EXPECT_TRUE(close(download(dx), rdx, tol(), ("dx " + m).c_str()));
      EXPECT_TRUE(close(download(dxa), rdxa, tol(), ("dx += " + m).c_str()));
      VecF gdw = download(dw);
      EXPECT_TRUE(close(gdw, rdw, 1e-4, ("dw += " + m).c_str()));
      for (int64_t i = 3 * N * K; i < 4 * N * K; ++i)
        ASSERT_EQ(gdw[size_t(i)], dw0[size_t(i)])
            << "expert 3 has no rows: its dw must not change (" << m << ")";
    }
  }
}

// Weight gradients of low-rank shapes (per-expert LoRA: one side of dW is the rank) run as
// one launch of our tensor-core kernel in the grouped mode; they match the CPU twin, rerun
// bit-identically and leave experts without rows alone. The kernel is also forced onto the
// block's full shapes (several 64 x 64 tiles per expert) and checked the same way.
TEST_P(CudaMoe, LowRankWeightGradientsMatchCpuInOneLaunch) {
#ifdef RP_HAVE_CUDA
  const auto c = GetParam();
  Cpu r = cpu_route(logits(23), false, VecF(size_t(2 * c.E), 0.f));
  const int64_t R = c.T * c.k, E = c.E;
  ASSERT_EQ(r.off[4] - r.off[3], 0);
  struct Shape {
    int64_t K, N, kernel_max;
  };
  const Shape shapes[] = {{c.H, 8, 64},  {8, c.F, 64},  {c.F, 32, 64},         {32, c.H, 64},
                          {c.H, 12, 64}, {13, c.F, 64}, {c.H, c.F, INT64_MAX}, {c.F, c.H, INT64_MAX}};
  for (const Shape& s : shapes) {
    const std::string m = "K=" + std::to_string(s.K) + " N=" + std::to_string(s.N);
    VecF x = randn(size_t(R * s.K), 24), dy = randn(size_t(R * s.N), 25),
         dw0 = randn(size_t(E * s.N * s.K), 26);
    DT xd = upload(x, c.dt), dyd = upload(dy, c.dt);
    VecF rdw = dw0;
    cpu_->grouped_linear_bwd_weight(download(dyd).data(), download(xd).data(), rdw.data(), r.off.data(), E,
                                    s.K, s.N);
    std::vector<VecF> got;
    for (int rep = 0; rep < 2; ++rep) {
      DT dw = upload(dw0, DType::f32);
      run([&](Ops& o) {
        set_mode(o, 1);
        cuda::set_grouped_wgrad_kernel_max(o, s.kernel_max);
        o.grouped_linear_bwd_weight(dyd.get(), xd.get(), dw.get(), r.off.data(), E, s.K, s.N);
        cuda::set_grouped_wgrad_kernel_max(o, 64);
      });
      got.push_back(download(dw));
    }
    EXPECT_TRUE(close(got[0], rdw, 1e-4, ("dw += " + m).c_str()));
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
        << "rerun differs: " << m;
    for (int64_t i = 3 * s.N * s.K; i < 4 * s.N * s.K; ++i)
      ASSERT_EQ(got[0][size_t(i)], dw0[size_t(i)])
          << "expert 3 has no rows: its dw must not change (" << m << ")";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Products whose inner dimension is low (per-expert LoRA: a B's forward with K = r, the input
// gradient through an A with N = r) run as one launch of our tensor-core kernel in the grouped
// mode: forward (output not read), forward added with a scale, input gradient written and
// accumulated match the CPU twin and cuBLAS's grouped call, and rerun bit-identically. The
// shapes cover ranks that are not a multiple of 16, outputs wider than one column tile, and
// output widths that are not a multiple of 8 (the kernel's element-wise path).
TEST_P(CudaMoe, LowRankProductsMatchCpuInOneLaunch) {
#ifdef RP_HAVE_CUDA
  const auto c = GetParam();
  Cpu r = cpu_route(logits(27), false, VecF(size_t(2 * c.E), 0.f));
  const int64_t R = c.T * c.k, E = c.E;
  const std::pair<int64_t, int64_t> shapes[] = {{8, c.F}, {13, c.F}, {32, c.H},
                                                {c.H, 8}, {c.F, 32}, {c.H, 12}};
  for (auto [K, N] : shapes) {
    const std::string m = "K=" + std::to_string(K) + " N=" + std::to_string(N);
    VecF x = randn(size_t(R * K), 28), w = randn(size_t(E * N * K), 29, 0.2f), dy = randn(size_t(R * N), 30);
    VecF y0 = randn(size_t(R * N), 31), dx0 = randn(size_t(R * K), 32);
    DT xd = upload(x, c.dt), wd = upload(w, c.dt), dyd = upload(dy, c.dt);
    upload(y0, c.dt);  // rounded to the device dtype: the starts of the accumulating outputs
    upload(dx0, c.dt);
    const VecF xr = download(xd), wr = download(wd), dyr = download(dyd);
    VecF ry(size_t(R * N)), rya = y0, rdx(size_t(R * K)), rdxa = dx0;
    cpu_->grouped_linear_fwd(xr.data(), wr.data(), ry.data(), r.off.data(), E, K, N);
    cpu_->grouped_linear_fwd_add(xr.data(), wr.data(), rya.data(), r.off.data(), E, K, N, 0.75f);
    cpu_->grouped_linear_bwd_input(dyr.data(), wr.data(), rdx.data(), r.off.data(), E, K, N, false);
    cpu_->grouped_linear_bwd_input(dyr.data(), wr.data(), rdxa.data(), r.off.data(), E, K, N, true);
    std::vector<std::array<VecF, 4>> got;
    for (bool kernel : {true, true, false}) {  // the kernel twice, then cuBLAS's grouped call
      DT y = poisoned(R * N, c.dt), ya = upload(y0, c.dt), dx = poisoned(R * K, c.dt),
         dxa = upload(dx0, c.dt);
      run([&](Ops& o) {
        set_mode(o, 1);
        cuda::set_grouped_lowrank_kernel(o, kernel);
        o.grouped_linear_fwd(xd.get(), wd.get(), y.get(), r.off.data(), E, K, N);
        o.grouped_linear_fwd_add(xd.get(), wd.get(), ya.get(), r.off.data(), E, K, N, 0.75f);
        o.grouped_linear_bwd_input(dyd.get(), wd.get(), dx.get(), r.off.data(), E, K, N, false);
        o.grouped_linear_bwd_input(dyd.get(), wd.get(), dxa.get(), r.off.data(), E, K, N, true);
        cuda::set_grouped_lowrank_kernel(o, true);
      });
      got.push_back({download(y), download(ya), download(dx), download(dxa)});
    }
    const char* what[] = {"y", "y +=", "dx", "dx +="};
    const VecF* ref[] = {&ry, &rya, &rdx, &rdxa};
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(close(got[0][size_t(i)], *ref[i], tol(), (std::string(what[i]) + " kernel " + m).c_str()));
      EXPECT_TRUE(close(got[2][size_t(i)], *ref[i], tol(), (std::string(what[i]) + " cuBLAS " + m).c_str()));
      EXPECT_EQ(std::memcmp(got[0][size_t(i)].data(), got[1][size_t(i)].data(), got[0][size_t(i)].size() * 4),
                0)
          << "rerun differs: " << what[i] << " " << m;
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Two runs of the whole block's ops on the same inputs give the same bits.
TEST_P(CudaMoe, RerunsAreBitIdentical) {
  const auto c = GetParam();
  const int64_t R = c.T * c.k, H = c.H, F = c.F, E = c.E;
  VecF z = logits(20), x = randn(size_t(c.T * H), 21), w = randn(size_t(E * F * H), 22, 0.05f);
  VecF dy = randn(size_t(c.T * H), 23), g = randn(size_t(c.T * c.k), 24);
  DT zd = upload(z, c.dt), xd = upload(x, c.dt), wd = upload(w, c.dt), dyd = upload(dy, c.dt);
  DT gd = upload(g, DType::f32);
  auto once = [&](int mode) {
    DT probs = poisoned(c.T * E, DType::f32), tw = poisoned(R, DType::f32), idx = poisoned(R, DType::i32);
    DT stats = poisoned(2 * E, DType::f32), off = poisoned(E + 1, DType::i32), row = poisoned(R, DType::i32);
    DT token = poisoned(R, DType::i32), xs = poisoned(R * H, c.dt), hs = poisoned(R * F, c.dt);
    DT ys = poisoned(R * H, c.dt), y = poisoned(c.T * H, c.dt), dys = poisoned(R * H, c.dt);
    DT dw = poisoned(R, DType::f32), dz = poisoned(c.T * E, c.dt), dW = poisoned(E * F * H, DType::f32);
    VecI off_h(size_t(E + 1));
    run([&](Ops& o) {
      set_mode(o, mode);
      o.fill(DType::f32, stats.get(), 2 * E, 0.f);
      o.fill(DType::f32, dW.get(), E * F * H, 0.f);
      o.moe_route(zd.get(), probs.as<float>(), idx.as<int32_t>(), tw.as<float>(), stats.as<float>(), c.T, E,
                  c.k, true);
      o.moe_sort(idx.as<int32_t>(), off.as<int32_t>(), off_h.data(), row.as<int32_t>(), token.as<int32_t>(),
                 c.T, E, c.k);
      o.gather_rows(xd.get(), token.as<int32_t>(), xs.get(), R, H);
      o.grouped_linear_fwd(xs.get(), wd.get(), hs.get(), off_h.data(), E, H, F);  // up
      o.grouped_linear_bwd_input(hs.get(), wd.get(), ys.get(), off_h.data(), E, H, F,
                                 false);  // W^T back to H
      o.moe_combine(ys.get(), tw.as<float>(), row.as<int32_t>(), y.get(), c.T, c.k, H, false);
      o.moe_combine_bwd(dyd.get(), ys.get(), tw.as<float>(), row.as<int32_t>(), dys.get(), dw.as<float>(),
                        c.T, c.k, H);
      o.grouped_linear_bwd_weight(hs.get(), xs.get(), dW.get(), off_h.data(), E, H, F);
      o.moe_route_bwd(probs.as<float>(), idx.as<int32_t>(), gd.as<float>(), stats.as<float>(), 0.01f,
                      dz.get(), c.T, E, c.k, true);
    });
    std::vector<VecF> out;
    for (const DT* d :
         {&probs, &tw, &idx, &stats, &off, &row, &token, &xs, &hs, &ys, &y, &dys, &dw, &dz, &dW})
      out.push_back(download(*d));
    return out;
  };
  for (int mode : {0, 1, 2}) {
    const std::vector<VecF> a = once(mode), b = once(mode);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].size(), b[i].size());
      EXPECT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)))
          << "output " << i << " differs between runs (mode " << mode << ")";
      for (float v : a[i])
        ASSERT_FALSE(std::isnan(v)) << "output " << i << " not written (mode " << mode << ")";
    }
  }
}

TEST_P(CudaMoe, BadExpertIndexIsReported) {
  const auto c = GetParam();
  VecI idx(size_t(c.T * c.k));
  for (size_t a = 0; a < idx.size(); ++a) idx[a] = int32_t(a % size_t(c.E));
  idx[idx.size() / 2] = int32_t(c.E);
  DT idd = upload_i32(idx), off = alloc(c.E + 1, DType::i32), row = alloc(c.T * c.k, DType::i32);
  DT token = alloc(c.T * c.k, DType::i32);
  VecI off_h(size_t(c.E + 1));
  cs().launch([&] {
    ops().moe_sort(idd.as<int32_t>(), off.as<int32_t>(), off_h.data(), row.as<int32_t>(), token.as<int32_t>(),
                   c.T, c.E, c.k);
  });
  const std::string err = sync_err();
  EXPECT_NE(err.find("moe_sort: expert index outside"), std::string::npos) << err;
  EXPECT_EQ(off_h[size_t(c.E)], int32_t(c.T * c.k));  // still a valid grouping
  EXPECT_TRUE(sync_err().empty()) << "the error is reported once";
}

#ifdef RP_HAVE_CUDA
TEST(CudaMoeKnobs, GroupedGemmVariable) {           // needs no device
  EXPECT_EQ(cuda::parse_grouped_gemm(nullptr), 1);  // the default: grouped
  EXPECT_EQ(cuda::parse_grouped_gemm(""), 1);       // the default: grouped
  EXPECT_EQ(cuda::parse_grouped_gemm("streams"), 2);
  EXPECT_EQ(cuda::parse_grouped_gemm("grouped"), 1);
  EXPECT_EQ(cuda::parse_grouped_gemm("loop"), 0);
  EXPECT_THROW(cuda::parse_grouped_gemm("Loop"), std::invalid_argument);
}

TEST(CudaMoeKnobs, BucketedLtVariable) {          // needs no device
  EXPECT_TRUE(cuda::parse_bucketed_lt(nullptr));  // the default: cuBLASLt's batches
  EXPECT_TRUE(cuda::parse_bucketed_lt(""));
  EXPECT_TRUE(cuda::parse_bucketed_lt("1"));
  EXPECT_FALSE(cuda::parse_bucketed_lt("0"));
  for (const char* bad : {"junk", "true", "01", " 1"}) {
    try {
      cuda::parse_bucketed_lt(bad);
      ADD_FAILURE() << bad << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("RP_CUDA_BUCKETED_LT='{}': expected 1 (cuBLASLt's batches) or 0", bad));
    }
  }
}

TEST(CudaMoeKnobs, BucketedStreamsVariable) {           // needs no device
  EXPECT_EQ(cuda::parse_bucketed_streams(nullptr), 4);  // the default: the compute stream and 3 side streams
  EXPECT_EQ(cuda::parse_bucketed_streams(""), 4);
  for (int n = 1; n <= 4; ++n) EXPECT_EQ(cuda::parse_bucketed_streams(std::to_string(n).c_str()), n);
  for (const char* bad : {"0", "5", "junk", "2 ", "-1", "12"}) {
    try {
      cuda::parse_bucketed_streams(bad);
      ADD_FAILURE() << bad << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("RP_CUDA_BUCKETED_STREAMS='{}': expected 1, 2, 3 or 4", bad));
    }
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMoe,
    ::testing::Values(MoeCase{DType::bf16, 37, 8, 2, 36, 20}, MoeCase{DType::f16, 37, 8, 2, 36, 20},
                      MoeCase{DType::bf16, 512, 128, 8, 256, 96}, MoeCase{DType::f16, 512, 128, 8, 256, 96},
                      // about 150 rows per expert: several row chunks of the weight-gradient kernel
                      MoeCase{DType::bf16, 512, 8, 2, 256, 96}),
    [](const auto& info) {
      const MoeCase& c = info.param;
      return std::string(c.dt == DType::bf16 ? "bf16" : "f16") + "_E" + std::to_string(c.E) + "_T" +
             std::to_string(c.T);
    });

}  // namespace
}  // namespace rp
