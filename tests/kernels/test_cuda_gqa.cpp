// Grouped-query attention backward on the CUDA backend: the expand / group-sum kernels of the
// expanded cuDNN path against their CPU twins (tests/kernels/ref_ops.hpp), and the forced-
// cuDNN attention (forward + backward) against the CPU backend for 1, 2, 4, 8 and 16 query
// heads per KV head, including scratch sizes that force several passes.
// Skipped when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp {
namespace {

using namespace rp::cudatest;
using ref::randn;

// ---- expand / group-sum kernels vs the CPU twins -----------------------------------------

struct ExpandCase {
  int64_t T, nkv, h0, hc, r, D;
  int64_t offset;  // elements added to every pointer (1: unaligned, the one-element path)
};
class CudaGqaExpand : public CudaOpsTest, public ::testing::WithParamInterface<ExpandCase> {
 protected:
  void check(DType t) {
#ifdef RP_HAVE_CUDA
    const auto [T, nkv, h0, hc, r, D, off] = GetParam();
    const int64_t n = T * nkv * D, ne = T * hc * D;
    VecF k = randn(size_t(n + off), 201), v = randn(size_t(n + off), 202);
    DT kd = upload(k, t), vd = upload(v, t), ke = poisoned(ne + off, t), ve = poisoned(ne + off, t);
    const size_t o = size_t(off) * dtype_size(t);
    auto at = [&](const DT& x) { return static_cast<void*>(static_cast<char*>(x.get()) + o); };
    run([&](Ops& op) { cuda::gqa_expand_kv(op, at(kd), at(vd), at(ke), at(ve), T, nkv, h0, hc, r, D); });
    auto tail = [&](const VecF& x) { return VecF(x.begin() + off, x.end()); };
    EXPECT_EQ(tail(download(ke)), ref::gqa_expand(tail(k), T, nkv, h0, hc, r, D));  // bit copies
    EXPECT_EQ(tail(download(ve)), ref::gqa_expand(tail(v), T, nkv, h0, hc, r, D));
#else
    (void)t;
#endif
  }
};
TEST_P(CudaGqaExpand, MatchesCpuTwinBf16) { check(DType::bf16); }
TEST_P(CudaGqaExpand, MatchesCpuTwinF16) { check(DType::f16); }
INSTANTIATE_TEST_SUITE_P(Passes, CudaGqaExpand,
                         ::testing::Values(ExpandCase{37, 4, 4, 6, 3, 128, 0},    // straddles KV heads 1..3
                                           ExpandCase{50, 2, 0, 16, 8, 64, 0},    // every head, ratio 8
                                           ExpandCase{9, 8, 120, 8, 16, 128, 0},  // part of the last KV head
                                           ExpandCase{33, 3, 1, 4, 4, 6, 0},    // D*2 = 12 bytes: one element
                                           ExpandCase{21, 4, 2, 5, 2, 128, 1},  // unaligned pointers
                                           ExpandCase{0, 4, 0, 16, 4, 128, 0}));  // no tokens

struct SumCase {
  int64_t T, G, m, D;
  int64_t heads, head0;  // out holds `heads` heads per token; the sums go to head0..head0+G-1
  DType in_t, out_t;
  bool accumulate;
  int64_t offset;  // elements added to every pointer
};
class CudaGqaGroupSum : public CudaOpsTest, public ::testing::WithParamInterface<SumCase> {};
TEST_P(CudaGqaGroupSum, MatchesCpuTwin) {
#ifdef RP_HAVE_CUDA
  const auto [T, G, m, D, heads, head0, in_t, out_t, acc, off] = GetParam();
  const int64_t ni = T * G * m * D, no = T * heads * D;
  VecF ik = randn(size_t(ni + off), 211), iv = randn(size_t(ni + off), 212);
  VecF ok0 = randn(size_t(no + off), 213), ov0 = randn(size_t(no + off), 214);
  DT ikd = upload(ik, in_t), ivd = upload(iv, in_t);
  DT okd = acc ? upload(ok0, out_t) : poisoned(no + off, out_t);
  DT ovd = acc ? upload(ov0, out_t) : poisoned(no + off, out_t);
  auto at = [&](const DT& x, int64_t elems) {
    return static_cast<void*>(static_cast<char*>(x.get()) + size_t(elems) * dtype_size(x.t));
  };
  run([&](Ops& op) {
    cuda::gqa_group_sum(op, in_t, at(ikd, off), at(ivd, off), out_t, at(okd, off + head0 * D),
                        at(ovd, off + head0 * D), heads * D, T, G, m, D, acc);
  });
  const double tol = out_t == DType::f32 ? 1e-6 : 4e-3;
  for (int pass = 0; pass < 2; ++pass) {
    const VecF got = download(pass == 0 ? okd : ovd), &in = pass == 0 ? ik : iv,
               &init = pass == 0 ? ok0 : ov0;
    const ref::VecD sum = ref::gqa_group_sum(VecF(in.begin() + off, in.end()), T, G, m, D);
    VecF got_in, want_in;
    size_t outside = 0, unchanged = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const size_t i = size_t(off + (t * heads + h) * D + d);
          if (h >= head0 && h < head0 + G) {
            got_in.push_back(got[i]);
            want_in.push_back(float(sum[size_t((t * G + h - head0) * D + d)] + (acc ? init[i] : 0.f)));
          } else {
            ++outside;
            unchanged += (acc ? got[i] == init[i] : std::isnan(got[i])) ? 1 : 0;
          }
        }
    EXPECT_TRUE(close(got_in, want_in, tol, pass == 0 ? "k sums" : "v sums"));
    EXPECT_EQ(unchanged, outside) << "heads outside the sums were written";
  }
#endif
}
constexpr DType kB = DType::bf16, kH = DType::f16, kF = DType::f32;
INSTANTIATE_TEST_SUITE_P(
    Groups, CudaGqaGroupSum,
    ::testing::Values(SumCase{37, 2, 3, 128, 4, 1, kB, kB, false, 0},   // KV heads 1, 2 of 4
                      SumCase{50, 1, 16, 64, 2, 1, kH, kH, false, 0},   // ratio 16, f16
                      SumCase{29, 1, 5, 128, 1, 0, kB, kF, false, 0},   // into fp32 accumulators
                      SumCase{29, 1, 3, 128, 1, 0, kB, kF, true, 0},    // ... and onto them
                      SumCase{29, 1, 1, 128, 3, 2, kF, kB, false, 0},   // accumulator -> storage
                      SumCase{31, 2, 4, 6, 3, 0, kB, kB, false, 0},     // D = 6: one element
                      SumCase{23, 2, 2, 128, 2, 0, kB, kB, true, 1},    // unaligned, +=
                      SumCase{0, 2, 2, 128, 2, 0, kB, kB, false, 0}));  // no tokens

TEST_F(CudaOpsTest, GqaKernelsRejectBadHeads) {
#ifdef RP_HAVE_CUDA
  DT a = poisoned(64, DType::bf16), b = poisoned(64, DType::bf16);
  // query heads 3..4 of 2 KV heads x 2
  EXPECT_THROW(cuda::gqa_expand_kv(ops(), a.get(), a.get(), b.get(), b.get(), 1, 2, 3, 2, 2, 8),
               std::invalid_argument);
  EXPECT_THROW(cuda::gqa_group_sum(ops(), DType::bf16, a.get(), a.get(), DType::bf16, b.get(), b.get(), 8, 1,
                                   0, 2, 8, false),
               std::invalid_argument);
  EXPECT_THROW(cuda::gqa_group_sum(ops(), DType::bf16, a.get(), a.get(), DType::bf16, b.get(), b.get(), 8, 1,
                                   2, 1, 8, false),  // out rows shorter than G*D
               std::invalid_argument);
#endif
}

// ---- forced cuDNN attention vs the CPU twin, every GQA ratio ---------------------------------

struct GqaShape {
  int64_t S, L, nq, nkv, D;
  int gqa = 0;  // cuda::set_attention_gqa: 0 auto, 2 expand (1 native: the probe's business)
};
class CudaGqaAttention : public CudaAttentionTest, public ::testing::WithParamInterface<GqaShape> {};

TEST_P(CudaGqaAttention, ForcedCudnnMatchesCpu) {
  const auto [S, L, nq, nkv, D, gqa] = GetParam();
  if (skip_without_cudnn(4))
    GTEST_SKIP() << "this build has no cuDNN attention (scripts/setup.sh fetches cudnn-frontend)";
  gqa_mode = gqa;
  Run g = run_attention(S, L, nq, nkv, D, 301, 4);
  expect_matches_cpu(g, S, L, nq, nkv, D);
  EXPECT_GE(g.bwd_passes, 1) << "cuDNN did not run the backward";
  if (nq == nkv || (nq <= 2 * nkv && gqa == 0)) {
    EXPECT_EQ(g.bwd_passes, 1);  // one graph
  }
}
INSTANTIATE_TEST_SUITE_P(
    Ratios, CudaGqaAttention,
    ::testing::Values(GqaShape{1, 256, 4, 4, 128},                              // ratio 1
                      GqaShape{2, 200, 2, 2, 64}, GqaShape{2, 200, 4, 2, 128},  // ratio 2: native graph
                      GqaShape{1, 333, 4, 2, 64},
                      GqaShape{2, 200, 4, 2, 128, 2},  // ratio 2 through the expanded path
                      GqaShape{1, 256, 8, 2, 128},     // ratio 4: expanded path
                      GqaShape{2, 200, 4, 1, 128}, GqaShape{2, 333, 8, 2, 64}, GqaShape{1, 100, 4, 1, 64},
                      GqaShape{1, 384, 8, 1, 128},  // ratio 8
                      GqaShape{2, 200, 16, 2, 128}, GqaShape{1, 333, 8, 1, 64},
                      GqaShape{1, 256, 16, 1, 128},  // ratio 16
                      GqaShape{2, 200, 32, 2, 64}, GqaShape{1, 777, 16, 1, 128}));

// A smaller scratch means more, smaller passes: 5 KV heads of 4 query heads give passes of
// 20, 12 (+8), 8 (+8+4), 4, then parts of one KV head (2 + 2, then 1 each) with fp32
// accumulators. Every size that runs matches the CPU twin, the pass count never falls as the
// scratch shrinks, and a scratch below one query head's pass makes the automatic mode fall
// back to our kernels (still correct).
TEST_F(CudaAttentionTest, ScratchSizeSetsThePasses) {
  if (skip_without_cudnn(4)) GTEST_SKIP() << "this build has no cuDNN attention";
  const int64_t S = 2, L = 200, nq = 20, nkv = 5, D = 64;
  const size_t full = Ops::attention_scratch_bytes(S, L, nq, nkv, D);
  gqa_mode = 0;  // automatic: expanded at ratio 4
  int64_t last = 0, most = 0, split = 0;
  for (double f : {1.0, 0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05}) {
    scratch_bytes = size_t(double(full) * f);
    SCOPED_TRACE(::testing::Message() << "scratch " << scratch_bytes << " of " << full);
    Run g = run_attention(S, L, nq, nkv, D, 311, 0);
    expect_matches_cpu(g, S, L, nq, nkv, D);
    if (g.bwd_passes == 0) continue;  // fell back to our kernels
    EXPECT_GE(g.bwd_passes, last);
    last = g.bwd_passes;
    most = std::max(most, g.bwd_passes);
    split += g.bwd_passes > nkv ? 1 : 0;
  }
  EXPECT_GE(most, 3) << "the scratch sizes never forced three passes";
  EXPECT_GE(split, 1) << "no scratch size split a KV head over passes";
  scratch_bytes = 16 << 10;  // less than a pass of one query head: our kernels run
  Run g = run_attention(S, L, nq, nkv, D, 312, 0);
  expect_matches_cpu(g, S, L, nq, nkv, D);
  EXPECT_EQ(g.bwd_passes, 0);
}

}  // namespace
}  // namespace rp
