// The padded expert layout on CUDA (kernels/cuda/cuda_moe_pad.cu, cuda_moe_bucketed.cpp)
// against the CPU twin (kernels/cpu/cpu_moe.cpp) at a Qwen3-30B-A3B-like shape (E=128, k=8,
// T=512, skewed routing, so the layout has padding): moe_sort + moe_pad's offsets, rows and
// tokens equal the CPU's, the gather writes zero pad rows, moe_zero_pad_rows zeroes exactly the
// pads, and the grouped linears as bucketed batched GEMMs (ExpertGemm::bucketed) match the CPU
// on the padded layout in both bf16 and f16, the same in both modes, bit for bit, through
// cuBLASLt's pointer-array batches (on one stream or spread over four) and through
// cublasGemmBatchedEx (an odd width, which the batches refuse, matches the CPU through the
// grouped path). Outputs are NaN-poisoned first. Skipped when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/moe_buckets.hpp"
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

constexpr int64_t kT = 512, kE = 128, kK = 8, kH = 256, kF = 96;

class CudaMoePad : public CudaOpsTest, public ::testing::WithParamInterface<DType> {
 protected:
  DType dtype() const override { return GetParam(); }
  double tol() const { return GetParam() == DType::bf16 ? 1e-2 : 2e-3; }
  VecI ints(const DT& d) {
    VecF f = download(d);
    return VecI(f.begin(), f.end());
  }
  // Distinct experts per token, expert e drawn with weight 1 + e / 16; never 3.
  static VecI routing() {
    std::mt19937 g(5);
    std::vector<double> wts(static_cast<size_t>(kE));
    for (int64_t e = 0; e < kE; ++e) wts[size_t(e)] = e == 3 ? 0.0 : 1.0 + double(e) / 16;
    VecI idx;
    for (int64_t t = 0; t < kT; ++t) {
      std::vector<double> left = wts;
      for (int64_t j = 0; j < kK; ++j) {
        std::discrete_distribution<int32_t> d(left.begin(), left.end());
        const int32_t e = d(g);
        left[size_t(e)] = 0;
        idx.push_back(e);
      }
    }
    return idx;
  }
  struct Layout {
    VecI idx, off, off_h, row, token;
    int64_t rows = 0;
  };
  Layout cpu_layout() {
    const int64_t cap = padded_rows_bound(kT * kK, kExpertPadFraction);
    Layout l{routing(), VecI(size_t(kE + 1)), VecI(size_t(kE + 1)), VecI(size_t(kT * kK)), VecI(size_t(cap))};
    cpu_->moe_sort(l.idx.data(), l.off.data(), l.off_h.data(), l.row.data(), l.token.data(), kT, kE, kK);
    l.rows = cpu_->moe_pad(l.idx.data(), l.off.data(), l.off_h.data(), l.row.data(), l.token.data(), kT, kE,
                           kK, cap);
    l.token.resize(size_t(l.rows));
    return l;
  }
};

TEST_P(CudaMoePad, PadGatherAndZeroMatchCpu) {
  const DType dt = GetParam();
  const Layout r = cpu_layout();
  ASSERT_GT(r.rows, kT * kK) << "the routing needs padding";
  const int64_t cap = padded_rows_bound(kT * kK, kExpertPadFraction), Rp = r.rows;
  VecF x = randn(size_t(kT * kH), 7), z = randn(size_t(Rp * kH), 8);
  DT xd = upload(x, dt), zd = upload(z, dt), idx = upload_i32(r.idx);
  DT off = poisoned(kE + 1, DType::i32), row = poisoned(kT * kK, DType::i32),
     token = poisoned(cap, DType::i32);
  DT xs = poisoned(Rp * kH, dt);
  VecI off_h(size_t(kE + 1), -1);
  int64_t got_rows = 0;
  run([&](Ops& o) {
    o.moe_sort(idx.as<int32_t>(), off.as<int32_t>(), off_h.data(), row.as<int32_t>(), token.as<int32_t>(), kT,
               kE, kK);
    got_rows = o.moe_pad(idx.as<int32_t>(), off.as<int32_t>(), off_h.data(), row.as<int32_t>(),
                         token.as<int32_t>(), kT, kE, kK, cap);
    o.gather_rows(xd.get(), token.as<int32_t>(), xs.get(), Rp, kH);
    o.moe_zero_pad_rows(zd.get(), token.as<int32_t>(), Rp, kH);
  });
  EXPECT_EQ(got_rows, Rp);
  EXPECT_EQ(off_h, r.off_h);
  EXPECT_EQ(ints(off), r.off);
  EXPECT_EQ(ints(row), r.row);
  VecI tok = ints(token);
  tok.resize(size_t(Rp));
  EXPECT_EQ(tok, r.token);
  VecF rxs(size_t(Rp * kH), 5.f), rz = z;
  cpu_->gather_rows(x.data(), r.token.data(), rxs.data(), Rp, kH);
  cpu_->moe_zero_pad_rows(rz.data(), r.token.data(), Rp, kH);
  EXPECT_EQ(download(xs), rxs) << "bit copies, zero pad rows";
  EXPECT_EQ(download(zd), rz) << "exactly the pad rows zeroed";
}

TEST_P(CudaMoePad, BucketedGroupedLinearsMatchCpu) {
#ifdef RP_HAVE_CUDA
  const DType dt = GetParam();
  const Layout r = cpu_layout();
  const int64_t Rp = r.rows, E = kE;
  // gate/up, down, and an odd width (rows of 26 bytes: not batched, the grouped way instead)
  for (auto [K, N] : {std::pair{kH, kF}, std::pair{kF, kH}, std::pair{kH, int64_t(13)}}) {
    VecF x = randn(size_t(Rp * K), 14), w = randn(size_t(E * N * K), 15, 0.05f),
         dy = randn(size_t(Rp * N), 16);
    for (int64_t q = 0; q < Rp; ++q)
      if (r.token[size_t(q)] < 0) {  // the padded layout's inputs: pad rows zero
        std::fill(x.begin() + q * K, x.begin() + (q + 1) * K, 0.f);
        std::fill(dy.begin() + q * N, dy.begin() + (q + 1) * N, 0.f);
      }
    VecF y0 = randn(size_t(Rp * N), 19), dx0 = randn(size_t(Rp * K), 17), dw0 = randn(size_t(E * N * K), 18);
    DT xd = upload(x, dt), wd = upload(w, dt), dyd = upload(dy, dt);
    upload(y0, dt), upload(dx0, dt);  // rounded: the starts of the accumulating outputs
    VecF ry(size_t(Rp * N)), rya = y0, rdx(size_t(Rp * K)), rdxa = dx0, rdw = dw0;
    cpu_->grouped_linear_fwd(x.data(), w.data(), ry.data(), r.off_h.data(), E, K, N);
    cpu_->grouped_linear_fwd_add(x.data(), w.data(), rya.data(), r.off_h.data(), E, K, N, 0.75f);
    cpu_->grouped_linear_bwd_input(dy.data(), w.data(), rdx.data(), r.off_h.data(), E, K, N, false);
    cpu_->grouped_linear_bwd_input(dy.data(), w.data(), rdxa.data(), r.off_h.data(), E, K, N, true);
    cpu_->grouped_linear_bwd_weight(dy.data(), x.data(), rdw.data(), r.off_h.data(), E, K, N);
    std::vector<VecF> first;
    // rep 0: mode 1, cuBLASLt's batches; rep 1: mode 0, the same; rep 2: cublasGemmBatchedEx;
    // rep 3: cuBLASLt's batches spread over 4 streams
    for (int rep = 0; rep < 4; ++rep) {
      std::pair<int64_t, int64_t> before, after;
      DT y = poisoned(Rp * N, dt), ya = upload(y0, dt), dx = poisoned(Rp * K, dt), dxa = upload(dx0, dt);
      DT dw = upload(dw0, DType::f32);
      run([&](Ops& o) {
        before = cuda::bucketed_batches(o);
        o.set_expert_gemm(ExpertGemm::bucketed);
        cuda::set_grouped_gemm(o, rep == 1 ? 0 : 1);  // the batches replace both modes' GEMMs
        cuda::set_bucketed_lt(o, rep != 2);
        cuda::set_bucketed_streams(o, rep == 3 ? 4 : 1);
        o.grouped_linear_fwd(xd.get(), wd.get(), y.get(), r.off_h.data(), E, K, N);
        o.grouped_linear_fwd_add(xd.get(), wd.get(), ya.get(), r.off_h.data(), E, K, N, 0.75f);
        o.grouped_linear_bwd_input(dyd.get(), wd.get(), dx.get(), r.off_h.data(), E, K, N, false);
        o.grouped_linear_bwd_input(dyd.get(), wd.get(), dxa.get(), r.off_h.data(), E, K, N, true);
        o.grouped_linear_bwd_weight(dyd.get(), xd.get(), dw.get(), r.off_h.data(), E, K, N);
        o.set_expert_gemm(ExpertGemm::grouped);
        cuda::set_grouped_gemm(o, 1);
        cuda::set_bucketed_lt(o, true);
        cuda::set_bucketed_streams(o, 1);
        after = cuda::bucketed_batches(o);
      });
      const std::string m = "K=" + std::to_string(K) + " rep " + std::to_string(rep);
      if (N % 8 == 0) {  // which way the batches went
        const int64_t lt = after.first - before.first, legacy = after.second - before.second;
        if (rep == 2)
          EXPECT_TRUE(lt == 0 && legacy > 0) << m << ": " << lt << " cuBLASLt, " << legacy << " legacy";
        else EXPECT_GT(lt, 0) << m << ": cuBLASLt took none of the batches (" << legacy << " went legacy)";
      }
      VecF got[] = {download(y), download(ya), download(dx), download(dxa), download(dw)};
      EXPECT_TRUE(close(got[0], ry, tol(), ("y " + m).c_str()));
      EXPECT_TRUE(close(got[1], rya, tol(), ("y += " + m).c_str()));
      EXPECT_TRUE(close(got[2], rdx, tol(), ("dx " + m).c_str()));
      EXPECT_TRUE(close(got[3], rdxa, tol(), ("dx += " + m).c_str()));
      EXPECT_TRUE(close(got[4], rdw, 1e-4, ("dw += " + m).c_str()));
      for (int64_t i = 3 * N * K; i < 4 * N * K; ++i)
        ASSERT_EQ(got[4][size_t(i)], dw0[size_t(i)]) << "expert 3 has no rows: its dw must not change";
      if (rep == 0) {
        first.assign(std::begin(got), std::end(got) - 1);
      } else if (rep != 2 && N % 8 == 0) {  // the same kernels, disjoint outputs (an odd width's
                                            // rank-sized products take mode 1's kernels instead)
        for (size_t i = 0; i < first.size(); ++i) {
          EXPECT_EQ(std::memcmp(first[i].data(), got[i].data(), first[i].size() * sizeof(float)), 0)
              << "output " << i << " differs from rep 0's: " << m;
        }
      }
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaMoePad, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) {
                           return std::string(info.param == DType::bf16 ? "bf16" : "f16");
                         });

}  // namespace
}  // namespace rp
