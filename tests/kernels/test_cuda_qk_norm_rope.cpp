// The per-head q/k norm followed by RoPE (Ops::qk_norm_rope_fwd / _bwd) on the CUDA backend:
// its one pass over the rows against the separate norm and RoPE kernels (y and dx bit for bit,
// dw to fp32 summation order, dy left as it was) and against the CPU twin (the two calls on
// fp32), at head_dim 64, 128 and 256, odd head counts, packed positions and Gemma's weight
// offset; shapes the one pass does not take (partial rotary, head_dim 96, a misaligned row)
// still match the CPU. Skipped, saying so, without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops.hpp"
#include "tests/kernels/test_cuda_fixtures.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace rp::cudatest {
namespace {

using ref::randn;
constexpr double kTol = 1e-2;  // bf16 budget (8 mantissa bits)

struct QkCase {
  int64_t D, R, heads;
  bool packed;
  float w_offset;
  int64_t misalign = 0;  // elements the rows start past a 16-byte boundary
};

std::string name(const QkCase& c) {
  return "D=" + std::to_string(c.D) + " R=" + std::to_string(c.R) + " heads=" + std::to_string(c.heads) +
         (c.packed ? " packed" : "") + (c.w_offset != 0 ? " w_offset=1" : "") +
         (c.misalign ? " misaligned" : "");
}

// Element i of a and b hold the same bits (a downloaded bf16 is exact in float).
::testing::AssertionResult same_bits(const VecF& a, const VecF& b, const std::string& what) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0)
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

VecF tail(const VecF& v, int64_t skip) { return VecF(v.begin() + skip, v.end()); }

class CudaQkNormRope : public CudaOpsTest {
 protected:
  struct Out {
    VecF y, dx, dw, dy_after;
  };
  // fwd and bwd on the GPU, one pass (fused) or the separate kernels, from the same inputs
  Out gpu(const QkCase& c, bool fused, VecF& x, VecF& w, VecF& dy, std::vector<int32_t>& pos,
          RopeTable& tab) {
#ifdef RP_HAVE_CUDA
    cuda::set_qk_norm_rope_fused(ops(), fused);
#endif
    const int64_t m = c.misalign, n = int64_t(x.size());
    DT xd = upload(x, ct()), wd = upload(w, ct()), dyd = upload(dy, ct()), pd = upload_i32(pos);
    DT y = poisoned(n, ct()), dx = poisoned(n, ct());
    VecF zero(size_t(c.D), 0.f);
    DT dw = upload(zero, DType::f32);
    Ops::QkNormRope s = shape(c, tab);
    s.pos = c.packed ? pd.as<int32_t>() : nullptr;
    auto at = [&](const DT& d) { return static_cast<char*>(d.get()) + m * dtype_size(ct()); };
    run([&](Ops& o) {
      o.qk_norm_rope_fwd(at(xd), wd.get(), at(y), s);
      o.qk_norm_rope_bwd(at(xd), wd.get(), at(dyd), at(dx), dw.get(), s);
    });
    return {tail(download(y), m), tail(download(dx), m), download(dw), tail(download(dyd), m)};
  }
  Ops::QkNormRope shape(const QkCase& c, const RopeTable& tab) const {
    Ops::QkNormRope s;
    s.n_seq = kSeqs;
    s.seq_len = kLen;
    s.heads = c.heads;
    s.head_dim = c.D;
    s.eps = 1e-6f;
    s.w_offset = c.w_offset;
    s.inv_freq = tab.inv_freq.data();
    s.rope_scale = 1.1f;
    s.rotary_dim = c.R == c.D ? 0 : c.R;
    return s;
  }
  void check(const QkCase& c) {
    RopeParams p;
    p.theta = 1e6;
    p.head_dim = c.R;
    RopeTable tab = rope_frequencies(p);
    const int64_t rows = kSeqs * kLen * c.heads, n = rows * c.D + c.misalign;
    VecF x = randn(size_t(n), 51, 2.f), w = randn(size_t(c.D), 52, 0.5f), dy = randn(size_t(n), 53);
    std::vector<int32_t> pos;
    for (int64_t t = 0; t < kSeqs * kLen; ++t) pos.push_back(int32_t((t * 5) % 23));  // examples restart
    const Out one = gpu(c, true, x, w, dy, pos, tab), sep = gpu(c, false, x, w, dy, pos, tab);
    const std::string what = name(c);
    EXPECT_TRUE(same_bits(one.y, sep.y, what + " y"));
    EXPECT_TRUE(same_bits(one.dx, sep.dx, what + " dx"));
    EXPECT_TRUE(close(one.dw, sep.dw, 1e-5, (what + " dw").c_str()));
    // the one pass leaves dy; the separate kernels rotate it back in place
    const bool one_pass = (c.D == 64 || c.D == 128 || c.D == 256) && c.R == c.D && c.misalign == 0;
    if (one_pass) {
      EXPECT_TRUE(same_bits(one.dy_after, tail(dy, c.misalign), what + " dy left as it was"));
      EXPECT_FALSE(same_bits(sep.dy_after, one.dy_after, what));  // the switch took effect
    } else {
      EXPECT_TRUE(same_bits(one.dy_after, sep.dy_after, what + " dy rotated back"));
    }
    // the CPU twin: the two calls on fp32 copies of the rounded inputs
    VecF cx = tail(x, c.misalign), cdy = tail(dy, c.misalign), ry(cx.size()), rdx(cx.size()),
         rdw(size_t(c.D));
    Ops::QkNormRope s = shape(c, tab);
    s.pos = c.packed ? pos.data() : nullptr;
    cpu_->qk_norm_rope_fwd(cx.data(), w.data(), ry.data(), s);
    cpu_->qk_norm_rope_bwd(cx.data(), w.data(), cdy.data(), rdx.data(), rdw.data(), s);
    EXPECT_TRUE(close(one.y, ry, kTol, (what + " y vs CPU").c_str()));
    EXPECT_TRUE(close(one.dx, rdx, kTol, (what + " dx vs CPU").c_str()));
    EXPECT_TRUE(close(one.dw, rdw, kTol, (what + " dw vs CPU").c_str()));
  }
  static constexpr int64_t kSeqs = 2, kLen = 37;
};

TEST_F(CudaQkNormRope, OnePassEqualsTheSeparateKernelsAndTheCpu) {
  for (int64_t D : {64, 128, 256})
    for (int64_t heads : {3, 8})
      for (bool packed : {false, true}) check({D, D, heads, packed, 0.f});
  check({128, 128, 5, false, 1.f});  // Gemma 3: one rounding of x r (1 + w)
  check({256, 256, 4, true, 1.f});
}

// Shapes the one pass refuses run the separate kernels, through Ops' defaults.
TEST_F(CudaQkNormRope, OtherShapesTakeTheSeparateKernels) {
  check({128, 96, 3, false, 0.f});      // partial rotary
  check({96, 96, 2, true, 0.f});        // head_dim 96
  check({128, 128, 3, false, 0.f, 1});  // rows 2 bytes past a 16-byte boundary
}

// Odd lengths of the one pass: more tokens than a grid's warps, one head, a single token.
TEST_F(CudaQkNormRope, TokenCountsAroundTheGrid) {
#ifdef RP_HAVE_CUDA
  RopeParams p;
  p.theta = 1e4;
  p.head_dim = 128;
  RopeTable tab = rope_frequencies(p);
  for (auto [S, L, heads] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {1, 9000, 1}, {3, 2, 17}}) {
    const int64_t n = S * L * heads * 128;
    VecF x = randn(size_t(n), 61), w = randn(size_t(128), 62), dy = randn(size_t(n), 63);
    Ops::QkNormRope s;
    s.n_seq = S;
    s.seq_len = L;
    s.heads = heads;
    s.head_dim = 128;
    s.inv_freq = tab.inv_freq.data();
    VecF got[2][2];
    for (bool fused : {false, true}) {
      cuda::set_qk_norm_rope_fused(ops(), fused);
      VecF xc = x, wc = w, dyc = dy;
      DT xd = upload(xc, ct()), wd = upload(wc, ct()), dyd = upload(dyc, ct());
      DT y = poisoned(n, ct()), dx = poisoned(n, ct());
      run([&](Ops& o) {
        o.qk_norm_rope_fwd(xd.get(), wd.get(), y.get(), s);
        o.qk_norm_rope_bwd(xd.get(), wd.get(), dyd.get(), dx.get(), nullptr, s);
      });
      got[fused][0] = download(y);
      got[fused][1] = download(dx);
    }
    const std::string what = std::to_string(S) + "x" + std::to_string(L) + " heads " + std::to_string(heads);
    EXPECT_TRUE(same_bits(got[1][0], got[0][0], what + " y"));
    EXPECT_TRUE(same_bits(got[1][1], got[0][1], what + " dx (frozen norm)"));
  }
#endif
}

}  // namespace

#ifdef RP_HAVE_CUDA
// The switch's environment form: one line naming the variable and what it accepts.
TEST(CudaQkNormRopeSwitch, ParsesItsVariable) {
  EXPECT_TRUE(cuda::parse_qk_norm_rope(nullptr));
  EXPECT_TRUE(cuda::parse_qk_norm_rope(""));
  EXPECT_TRUE(cuda::parse_qk_norm_rope("fused"));
  EXPECT_FALSE(cuda::parse_qk_norm_rope("separate"));
  try {
    cuda::parse_qk_norm_rope("off");
    ADD_FAILURE() << "accepted 'off'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RP_CUDA_QK_NORM_ROPE='off': expected fused or separate"),
              std::string::npos)
        << e.what();
  }
}
#endif

}  // namespace rp::cudatest
