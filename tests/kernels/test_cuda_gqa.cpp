// Grouped-query attention backward on the CUDA backend: the expand / group-sum kernels of the
// expanded cuDNN path against their CPU twins (tests/kernels/ref_ops.hpp), and the forced-
// cuDNN attention (forward + backward) against the CPU backend for 1, 2, 4, 8 and 16 query
// heads per KV head, including scratch sizes that force several KV-head chunks.
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

struct ChunkCase {
  int64_t T, nkv, g0, gc, r, D;
  int64_t offset;  // elements added to every pointer (1: unaligned, the one-element path)
};

class CudaGqaKernels : public CudaOpsTest, public ::testing::WithParamInterface<ChunkCase> {
 protected:
  void check(DType t) {
#ifdef RP_HAVE_CUDA
    const auto [T, nkv, g0, gc, r, D, off] = GetParam();
    const int64_t n = T * nkv * D, ne = T * gc * r * D;
    VecF k = randn(size_t(n + off), 201), v = randn(size_t(n + off), 202);
    VecF dke = randn(size_t(ne + off), 203), dve = randn(size_t(ne + off), 204);
    DT kd = upload(k, t), vd = upload(v, t), dked = upload(dke, t), dved = upload(dve, t);
    DT ke = poisoned(ne + off, t), ve = poisoned(ne + off, t);
    DT dk = poisoned(n + off, t), dv = poisoned(n + off, t);
    const size_t es = dtype_size(t), o = size_t(off) * es;
    auto at = [&](const DT& x) { return static_cast<void*>(static_cast<char*>(x.get()) + o); };
    run([&](Ops& op) {
      cuda::gqa_expand_kv(op, at(kd), at(vd), at(ke), at(ve), T, nkv, g0, gc, r, D);
      cuda::gqa_group_sum(op, at(dked), at(dved), at(dk), at(dv), T, nkv, g0, gc, r, D);
    });
    auto tail = [&](const VecF& x) { return VecF(x.begin() + off, x.end()); };
    // expand: bit copies
    EXPECT_EQ(tail(download(ke)), ref::gqa_expand(tail(k), T, nkv, g0, gc, r, D));
    EXPECT_EQ(tail(download(ve)), ref::gqa_expand(tail(v), T, nkv, g0, gc, r, D));
    // group sum: the chunk's heads within a rounding of the fp32 sum; the others untouched
    for (int pass = 0; pass < 2; ++pass) {
      const VecF got = tail(download(pass == 0 ? dk : dv));
      const ref::VecD want = ref::gqa_group_sum(tail(pass == 0 ? dke : dve), T, gc, r, D);
      VecF in_chunk;
      size_t untouched = 0, outside = 0;
      for (int64_t tk = 0; tk < T; ++tk)
        for (int64_t g = 0; g < nkv; ++g)
          for (int64_t d = 0; d < D; ++d) {
            const float x = got[size_t((tk * nkv + g) * D + d)];
            if (g >= g0 && g < g0 + gc) {
              in_chunk.push_back(x);
            } else {
              ++outside;
              untouched += std::isnan(x) ? 1 : 0;
            }
          }
      EXPECT_TRUE(close(in_chunk, VecF(want.begin(), want.end()), 4e-3, pass == 0 ? "dk" : "dv"));
      EXPECT_EQ(untouched, outside) << "heads outside the chunk were written";
    }
#else
    (void)t;
#endif
  }
};

TEST_P(CudaGqaKernels, MatchCpuTwinBf16) { check(DType::bf16); }
TEST_P(CudaGqaKernels, MatchCpuTwinF16) { check(DType::f16); }
INSTANTIATE_TEST_SUITE_P(
    Chunks, CudaGqaKernels,
    ::testing::Values(ChunkCase{37, 4, 1, 2, 3, 128, 0},  // 16-byte vectors, middle chunk
                      ChunkCase{50, 2, 0, 2, 8, 64, 0},   // every head, ratio 8
                      ChunkCase{9, 8, 7, 1, 16, 128, 0},  // last head, ratio 16
                      ChunkCase{33, 3, 1, 1, 4, 6, 0},    // D*2 = 12 bytes: one element per thread
                      ChunkCase{21, 4, 2, 2, 2, 128, 1},  // unaligned pointers
                      ChunkCase{0, 4, 0, 4, 4, 128, 0})); // no tokens

TEST_F(CudaOpsTest, GqaKernelsRejectABadChunk) {
#ifdef RP_HAVE_CUDA
  DT a = poisoned(64, DType::bf16), b = poisoned(64, DType::bf16);
  EXPECT_THROW(cuda::gqa_expand_kv(ops(), a.get(), a.get(), b.get(), b.get(), 1, 2, 1, 2, 1, 8),
               std::invalid_argument);
  EXPECT_THROW(cuda::gqa_group_sum(ops(), a.get(), a.get(), b.get(), b.get(), 1, 2, 0, 0, 1, 8),
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
    ::testing::Values(GqaShape{1, 256, 4, 4, 128},     // ratio 1
                      GqaShape{2, 200, 2, 2, 64},
                      GqaShape{2, 200, 4, 2, 128},     // ratio 2: native graph
                      GqaShape{1, 333, 4, 2, 64},
                      GqaShape{2, 200, 4, 2, 128, 2},  // ratio 2 through the expanded path
                      GqaShape{1, 256, 8, 2, 128},     // ratio 4: expanded path
                      GqaShape{2, 200, 4, 1, 128},
                      GqaShape{2, 333, 8, 2, 64},
                      GqaShape{1, 100, 4, 1, 64},
                      GqaShape{1, 384, 8, 1, 128},     // ratio 8
                      GqaShape{2, 200, 16, 2, 128},
                      GqaShape{1, 333, 8, 1, 64},
                      GqaShape{1, 256, 16, 1, 128},    // ratio 16
                      GqaShape{2, 200, 32, 2, 64},
                      GqaShape{1, 777, 16, 1, 128}));

// A smaller scratch means more, smaller KV-head chunks (5 KV heads: uneven chunks such as
// 3 + 2 or 2 + 2 + 1 show up along the way); every size that runs matches the CPU twin, the
// chunk count never falls as the scratch shrinks, and a scratch below one KV head's needs
// makes the automatic mode fall back to our kernels (still correct).
TEST_F(CudaAttentionTest, ScratchSizeSetsTheKvChunks) {
  if (skip_without_cudnn(4)) GTEST_SKIP() << "this build has no cuDNN attention";
  const int64_t S = 2, L = 200, nq = 20, nkv = 5, D = 64;
  const size_t full = Ops::attention_scratch_bytes(S, L, nq, nkv, D);
  int64_t last = 0, most = 0;
  for (double f : {1.0, 0.7, 0.5, 0.35, 0.25, 0.15}) {
    scratch_limit = size_t(double(full) * f);
    SCOPED_TRACE(::testing::Message() << "scratch limit " << scratch_limit << " of " << full);
    Run g = run_attention(S, L, nq, nkv, D, 311, 0);
    expect_matches_cpu(g, S, L, nq, nkv, D);
    if (g.bwd_passes == 0) continue;  // fell back to our kernels
    EXPECT_GE(g.bwd_passes, last);
    last = g.bwd_passes;
    most = std::max(most, g.bwd_passes);
  }
  EXPECT_GE(most, 3) << "the scratch limits never forced three chunks";
  scratch_limit = 16 << 10;  // less than one KV head: automatic mode runs our kernels
  Run g = run_attention(S, L, nq, nkv, D, 312, 0);
  expect_matches_cpu(g, S, L, nq, nkv, D);
  EXPECT_EQ(g.bwd_passes, 0);
}

}  // namespace
}  // namespace rp
