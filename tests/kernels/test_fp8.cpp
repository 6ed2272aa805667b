// FP8 formats (kernels/fp8.hpp) against the OCP definition (tests/kernels/fp8_ref.hpp), and
// the CPU backend's FP8 ops (scales, quantization, the FP8 GEMM) against plain references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/fp8.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/fp8_ref.hpp"
#ifdef RP_HAVE_CUDA
#include <cuda_fp8.h>  // NVIDIA's host conversion, a second reference
#endif

namespace rp {
namespace {

using fp8ref::layout;
using fp8ref::spec_value;

class Fp8Format_ : public ::testing::TestWithParam<Fp8Format> {
 protected:
  Fp8Format f() const { return GetParam(); }
  uint8_t max_code() const { return layout(f()).max_code; }
  float max_value() const { return float(spec_value(f(), max_code())); }
};

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST_P(Fp8Format_, EveryCodeDecodesToItsSpecValue) {
  int nan = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = spec_value(f(), uint8_t(c));
    const float got = fp8::decode(f(), uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      ++nan;
      continue;
    }
    EXPECT_EQ(double(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), c >= 128) << "code " << c;  // -0 stays -0
  }
  // anchors stated in the OCP spec itself
  if (f() == Fp8Format::e4m3) {
    EXPECT_EQ(nan, 2);
    EXPECT_EQ(fp8::decode(f(), 0x7e), 448.f);
    EXPECT_EQ(fp8::decode(f(), 0x01), std::ldexp(1.f, -9));
    EXPECT_EQ(fp8::decode(f(), 0x08), std::ldexp(1.f, -6));
  } else {
    EXPECT_EQ(nan, 6);
    EXPECT_EQ(fp8::decode(f(), 0x7b), 57344.f);
    EXPECT_EQ(fp8::decode(f(), 0x01), std::ldexp(1.f, -16));
    EXPECT_EQ(fp8::decode(f(), 0x04), std::ldexp(1.f, -14));
    EXPECT_EQ(fp8::decode(f(), 0x7c), std::numeric_limits<float>::infinity());
    EXPECT_EQ(fp8::decode(f(), 0xfc), -std::numeric_limits<float>::infinity());
  }
  EXPECT_EQ(fp8::max_finite(f()), max_value());
}

TEST_P(Fp8Format_, FiniteCodesRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const double v = spec_value(f(), uint8_t(c));
    if (std::isnan(v) || std::isinf(v)) continue;
    EXPECT_EQ(int(fp8::encode(f(), float(v))), c) << "value " << v;
  }
}

// Every midpoint between adjacent codes (including 0 and the smallest subnormal, the largest
// subnormal and the smallest normal) rounds to the code with the even mantissa; one fp32 ulp
// either side rounds to the nearer code. Both signs.
TEST_P(Fp8Format_, MidpointsRoundToEven) {
  const std::vector<double> pos = fp8ref::positive_values(f());
  int ties = 0;
  for (size_t c = 0; c + 1 < pos.size(); ++c) {
    const double mid = (pos[c] + pos[c + 1]) / 2;
    const float m = float(mid);
    ASSERT_EQ(double(m), mid) << "midpoint not exact in fp32";
    const int even = c % 2 == 0 ? int(c) : int(c + 1);
    for (float sgn : {1.f, -1.f}) {
      const int s = sgn < 0 ? 0x80 : 0;
      EXPECT_EQ(int(fp8::encode(f(), sgn * m)), s | even) << "tie at " << sgn * m;
      EXPECT_EQ(int(fp8::encode(f(), sgn * std::nextafter(m, 0.f))), s | int(c)) << "below " << sgn * m;
      EXPECT_EQ(int(fp8::encode(f(), sgn * std::nextafter(m, 1e30f))), s | int(c + 1)) << "above " << sgn * m;
    }
    ++ties;
  }
  EXPECT_EQ(ties, int(max_code()));
}

TEST_P(Fp8Format_, SaturatesToTheLargestFiniteValue) {
  const float mx = max_value(), inf = std::numeric_limits<float>::infinity();
  // the next value the format would have (one more mantissa step), and the tie between them
  const float step = float(spec_value(f(), max_code()) - spec_value(f(), uint8_t(max_code() - 1)));
  const float beyond = mx + step, tie = mx + step / 2;
  for (float x : {mx, std::nextafter(mx, inf), tie, std::nextafter(tie, inf), beyond, beyond * 4,
                  std::numeric_limits<float>::max(), inf}) {
    EXPECT_EQ(int(fp8::encode(f(), x)), int(max_code())) << x;
    EXPECT_EQ(int(fp8::encode(f(), -x)), 0x80 | int(max_code())) << -x;
  }
  // just below the largest finite value's lower midpoint: the code below
  const float below = float((spec_value(f(), max_code()) + spec_value(f(), uint8_t(max_code() - 1))) / 2);
  EXPECT_EQ(int(fp8::encode(f(), std::nextafter(below, 0.f))), int(max_code()) - 1);
}

TEST_P(Fp8Format_, NanBecomesTheCanonicalNanCode) {
  for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu})
    EXPECT_EQ(int(fp8::encode(f(), from_bits(u))), 0x7f) << std::hex << u;
}

TEST_P(Fp8Format_, SubnormalsAndUnderflow) {
  const float unit = float(spec_value(f(), 0x01));  // the smallest subnormal
  const int subnormals = (1 << layout(f()).mant) - 1;
  for (int m = 1; m <= subnormals; ++m) {
    EXPECT_EQ(int(fp8::encode(f(), float(m) * unit)), m);
    EXPECT_EQ(int(fp8::encode(f(), -float(m) * unit)), 0x80 | m);
  }
  // at or below half the smallest subnormal: a zero of the input's sign
  for (float x : {unit / 2, unit / 4, std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), 1e-30f, 0.f}) {
    EXPECT_EQ(int(fp8::encode(f(), x)), 0x00) << x;
    EXPECT_EQ(int(fp8::encode(f(), -x)), 0x80) << -x;
  }
  EXPECT_EQ(int(fp8::encode(f(), std::nextafter(unit / 2, 1.f))), 0x01);
}

// A sweep over fp32 bit patterns (every 4093rd, both signs, all exponents) against the
// nearest-value search, and against NVIDIA's own host conversion where the toolkit is present.
TEST_P(Fp8Format_, SweepMatchesNearestValueSearch) {
  const std::vector<double> pos = fp8ref::positive_values(f());
  int64_t checked = 0, bad = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) {
    const float x = from_bits(uint32_t(u));
    const uint8_t got = fp8::encode(f(), x), want = fp8ref::ref_encode(f(), x, pos);
    if (got != want && ++bad <= 5)
      ADD_FAILURE() << "bits 0x" << std::hex << u << ": " << int(got) << " vs " << int(want);
#ifdef RP_HAVE_CUDA
    const uint8_t nv =
        __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f() == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
    if (got != nv && ++bad <= 5)
      ADD_FAILURE() << "bits 0x" << std::hex << u << ": " << int(got) << " vs NVIDIA's " << int(nv);
#endif
    ++checked;
  }
  EXPECT_EQ(bad, 0) << "of " << checked;
  EXPECT_GT(checked, 1000000);
}

TEST_P(Fp8Format_, ScaleFromAmax) {
  const float mx = max_value();
  EXPECT_EQ(fp8::scale_from_amax(mx, f()), 1.f);
  EXPECT_EQ(fp8::scale_from_amax(3.f, f()), 3.f / mx);
  EXPECT_EQ(fp8::scale_from_amax(0.f, f()), 1.f);
  EXPECT_EQ(fp8::scale_from_amax(std::numeric_limits<float>::infinity(), f()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp8::scale_from_amax(std::numeric_limits<float>::quiet_NaN(), f())));
  // an amax so small its scale underflows: the smallest subnormal, never 0
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(fp8::scale_from_amax(tiny, f()), tiny);
  EXPECT_EQ(fp8::quantize(f(), tiny, fp8::scale_from_amax(tiny, f())), fp8::encode(f(), 1.f));
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Format_, ::testing::Values(Fp8Format::e4m3, Fp8Format::e5m2),
                         [](const auto& i) { return std::string(fp8_format_name(i.param)); });

// ---- CPU ops ------------------------------------------------------------------------------

class CpuFp8Ops : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
};

float amax_plain(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

TEST_F(CpuFp8Ops, ScalesFromTheLargestMagnitude) {
  std::vector<float> x = fp8ref::normal_with_outliers(3001, 7);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    float s = std::numeric_limits<float>::quiet_NaN();
    ops->fp8_scale(x.data(), int64_t(x.size()), f, &s);
    EXPECT_EQ(s, amax_plain(x.data(), int64_t(x.size())) / fp8::max_finite(f));
    const int64_t rows = 3, cols = 1000;
    std::vector<float> rs(rows, std::numeric_limits<float>::quiet_NaN());
    ops->fp8_scale_rows(x.data(), rows, cols, f, rs.data());
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(rs[size_t(r)], amax_plain(x.data() + r * cols, cols) / fp8::max_finite(f)) << "row " << r;
  }
  std::vector<float> z(64, 0.f);
  float s = 0;
  ops->fp8_scale(z.data(), 64, Fp8Format::e4m3, &s);
  EXPECT_EQ(s, 1.f);
  z[5] = -std::numeric_limits<float>::infinity();
  ops->fp8_scale(z.data(), 64, Fp8Format::e4m3, &s);
  EXPECT_EQ(s, std::numeric_limits<float>::infinity());
  z[9] = std::numeric_limits<float>::quiet_NaN();
  ops->fp8_scale(z.data(), 64, Fp8Format::e4m3, &s);
  EXPECT_TRUE(std::isnan(s));
}

// The producers' scales (rmsnorm_fwd_fp8_scale, swiglu_fwd_fp8_scale, swiglu_bwd_fp8_scale): the output
// equals the plain op's and the scale is the largest |output| over the format's largest finite value.
TEST_F(CpuFp8Ops, ProducersScaleTheirOwnOutput) {
  const int64_t rows = 7, cols = 96, n = rows * cols;
  const std::vector<float> x = fp8ref::normal_with_outliers(size_t(n), 11),
                           u = fp8ref::normal_with_outliers(size_t(n), 12);
  std::vector<float> w(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(n)), y0(y), h(y), h0(y);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    float s = std::numeric_limits<float>::quiet_NaN(), t = s;
    ops->rmsnorm_fwd_fp8_scale(x.data(), w.data(), y.data(), rows, cols, 1e-6f, f, &s);
    ops->rmsnorm_fwd(x.data(), w.data(), y0.data(), rows, cols, 1e-6f);
    ops->swiglu_fwd_fp8_scale(x.data(), u.data(), h.data(), n, f, &t);
    ops->swiglu_fwd(x.data(), u.data(), h0.data(), n);
    EXPECT_EQ(y, y0);
    EXPECT_EQ(h, h0);
    EXPECT_EQ(s, amax_plain(y.data(), n) / fp8::max_finite(f));
    EXPECT_EQ(t, amax_plain(h.data(), n) / fp8::max_finite(f));
    EXPECT_GT(amax_plain(y.data(), n), 0.f);
    // SwiGLU's backward scales both of its outputs, each by its own largest magnitude
    const std::vector<float> dh = fp8ref::normal_with_outliers(size_t(n), 13);
    std::vector<float> dg(y.size()), du(y.size()), dg0(y.size()), du0(y.size());
    float sg = std::numeric_limits<float>::quiet_NaN(), su = sg;
    ops->swiglu_bwd_fp8_scale(x.data(), u.data(), dh.data(), dg.data(), du.data(), n, f, &sg, &su);
    ops->swiglu_bwd(x.data(), u.data(), dh.data(), dg0.data(), du0.data(), n);
    EXPECT_EQ(dg, dg0);
    EXPECT_EQ(du, du0);
    EXPECT_EQ(sg, amax_plain(dg.data(), n) / fp8::max_finite(f));
    EXPECT_EQ(su, amax_plain(du.data(), n) / fp8::max_finite(f));
    EXPECT_NE(amax_plain(dg.data(), n), amax_plain(du.data(), n)) << "the two scales are not told apart";
  }
}

TEST_F(CpuFp8Ops, QuantizesToTheNearestCode) {
  const std::vector<float> x = fp8ref::normal_with_outliers(4096, 8);
  const int64_t rows = 4, cols = 1024;
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const std::vector<double> pos = fp8ref::positive_values(f);
    float s = 0;
    ops->fp8_scale(x.data(), int64_t(x.size()), f, &s);
    std::vector<uint8_t> q(x.size(), 0xab);
    ops->fp8_quantize(x.data(), &s, q.data(), int64_t(x.size()), f);
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(int(q[i]), int(fp8ref::ref_encode(f, x[i] / s, pos))) << i;
      const double back = fp8ref::spec_value(f, q[i]) * s;
      err += (back - x[i]) * (back - x[i]);
      ref += double(x[i]) * x[i];
    }
    // e4m3 keeps 3 mantissa bits (relative step 1/8 .. 1/16), e5m2 2
    EXPECT_LT(std::sqrt(err / ref), f == Fp8Format::e4m3 ? 0.04 : 0.08) << fp8_format_name(f);
    std::vector<float> rs(rows);
    ops->fp8_scale_rows(x.data(), rows, cols, f, rs.data());
    std::vector<uint8_t> qr(x.size(), 0xab);
    ops->fp8_quantize_rows(x.data(), rs.data(), qr.data(), rows, cols, f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(int(qr[size_t(r * cols + c)]),
                  int(fp8ref::ref_encode(f, x[size_t(r * cols + c)] / rs[size_t(r)], pos)));
  }
}

// Codes of x^T, and the input gradient dx = dy W as the FP8 GEMM of dy's codes (e5m2, a
// gradient's range) with W^T's codes.
TEST_F(CpuFp8Ops, TransposedCodesFeedTheInputGradient) {
  const int64_t rows = 48, cols = 80, M = 16;  // W [out = rows, in = cols], dy [M, out]
  const std::vector<float> w = fp8ref::normal_with_outliers(size_t(rows * cols), 21);
  const std::vector<float> dy = fp8ref::normal_with_outliers(size_t(M * rows), 22);
  const std::vector<double> pos = fp8ref::positive_values(Fp8Format::e4m3);
  float sw = 0, sd = 0;
  ops->fp8_scale(w.data(), rows * cols, Fp8Format::e4m3, &sw);
  ops->fp8_scale(dy.data(), M * rows, Fp8Format::e5m2, &sd);
  std::vector<uint8_t> wt(size_t(rows * cols), 0xab), qd(size_t(M * rows));
  ops->fp8_quantize_transposed(w.data(), &sw, wt.data(), rows, cols, Fp8Format::e4m3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(int(wt[size_t(c * rows + r)]),
                int(fp8ref::ref_encode(Fp8Format::e4m3, w[size_t(r * cols + c)] / sw, pos)));
  ops->fp8_quantize(dy.data(), &sd, qd.data(), M * rows, Fp8Format::e5m2);
  std::vector<float> dx(size_t(M * cols), std::numeric_limits<float>::quiet_NaN());
  ops->gemm_fp8(qd.data(), Fp8Format::e5m2, &sd, wt.data(), Fp8Format::e4m3, &sw, dx.data(), M, rows, cols,
                false);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0, mag = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const double p = spec_value(Fp8Format::e5m2, qd[size_t(m * rows + r)]) * sd *
                         spec_value(Fp8Format::e4m3, wt[size_t(c * rows + r)]) * sw;
        sum += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(dx[size_t(m * cols + c)], sum, 1e-5 * mag) << m << "," << c;
    }
}

// A weight gradient dW [out, in] += dy^T x from the padded transposed codes of dy [n, out] and
// x [n, in]: the padding holds zero codes, every real code is x's own, and the sum added to
// the fp32 gradient is the decoded product over the n real tokens only.
TEST_F(CpuFp8Ops, PaddedTransposedCodesFeedTheWeightGradient) {
  const int64_t n = 37, in = 32, out = 24, ld = 48;  // n padded to a multiple of 16
  const std::vector<float> x = fp8ref::normal_with_outliers(size_t(n * in), 31);
  const std::vector<float> dy = fp8ref::normal_with_outliers(size_t(n * out), 32);
  const std::vector<double> pos = fp8ref::positive_values(Fp8Format::e4m3);
  float sx = 0, sd = 0;
  ops->fp8_scale(x.data(), n * in, Fp8Format::e4m3, &sx);
  ops->fp8_scale(dy.data(), n * out, Fp8Format::e4m3, &sd);
  std::vector<uint8_t> xt(size_t(in * ld), 0xab), dyt(size_t(out * ld), 0xab);
  ops->fp8_quantize_transposed_padded(x.data(), &sx, xt.data(), n, in, ld, Fp8Format::e4m3);
  ops->fp8_quantize_transposed_padded(dy.data(), &sd, dyt.data(), n, out, ld, Fp8Format::e4m3);
  for (int64_t c = 0; c < in; ++c)
    for (int64_t r = 0; r < ld; ++r)
      ASSERT_EQ(int(xt[size_t(c * ld + r)]),
                r < n ? int(fp8ref::ref_encode(Fp8Format::e4m3, x[size_t(r * in + c)] / sx, pos)) : 0)
          << c << "," << r;
  std::vector<float> dw(size_t(out * in));
  for (size_t i = 0; i < dw.size(); ++i) dw[i] = float(i % 7) - 3.f;  // the gradient so far
  const std::vector<float> dw0 = dw;
  ops->gemm_fp8_accumulate_f32(dyt.data(), Fp8Format::e4m3, &sd, xt.data(), Fp8Format::e4m3, &sx, dw.data(),
                               out, ld, in);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < in; ++c) {
      double sum = 0, mag = 0;
      for (int64_t t = 0; t < n; ++t) {
        const double p = spec_value(Fp8Format::e4m3, dyt[size_t(o * ld + t)]) * sd *
                         spec_value(Fp8Format::e4m3, xt[size_t(c * ld + t)]) * sx;
        sum += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(dw[size_t(o * in + c)], dw0[size_t(o * in + c)] + sum, 1e-5 * (mag + 3)) << o << "," << c;
    }
  EXPECT_THROW(ops->fp8_quantize_transposed_padded(x.data(), &sx, xt.data(), n, in, n - 1, Fp8Format::e4m3),
               std::invalid_argument);
}

// The CPU GEMM against a double-precision sum of the decoded codes; its error is fp32
// summation only (each product is exact in fp32): at most K * 2^-24 of sum |a b|.
TEST_F(CpuFp8Ops, GemmMatchesTheDecodedProduct) {
  const int64_t M = 37, K = 96, N = 48;
  for (auto [fa, fb] :
       {std::pair{Fp8Format::e4m3, Fp8Format::e4m3}, std::pair{Fp8Format::e5m2, Fp8Format::e4m3},
        std::pair{Fp8Format::e4m3, Fp8Format::e5m2}}) {
    std::mt19937 g(3);
    std::vector<uint8_t> a(size_t(M * K)), b(size_t(N * K));
    for (auto& c : a) do
        c = uint8_t(g());
      while (std::isnan(fp8::decode(fa, c)) || std::isinf(fp8::decode(fa, c)));
    for (auto& c : b) do
        c = uint8_t(g());
      while (std::isnan(fp8::decode(fb, c)) || std::isinf(fp8::decode(fb, c)));
    const float sa = 0.375f, sb = 1.0f / 3.0f;
    for (bool acc : {false, true}) {
      std::vector<float> d(size_t(M * N), acc ? 2.5f : std::numeric_limits<float>::quiet_NaN());
      ops->gemm_fp8(a.data(), fa, &sa, b.data(), fb, &sb, d.data(), M, K, N, acc);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double p = spec_value(fa, a[size_t(m * K + k)]) * spec_value(fb, b[size_t(n * K + k)]);
            sum += p;
            mag += std::fabs(p);
          }
          const double s = double(sa) * double(sb);
          const double want = sum * s + (acc ? 2.5 : 0.0);
          const double tol =
              (K * std::ldexp(1.0, -24) + std::ldexp(1.0, -22)) * mag * s + std::ldexp(1.0, -22) * 2.5;
          ASSERT_NEAR(d[size_t(m * N + n)], want, tol) << m << "," << n << (acc ? " accumulate" : "");
        }
    }
  }
}

// Onto a residual: d = r + the product, elementwise the gemm_fp8 result plus r (r left as it was);
// r given as d is refused.
TEST_F(CpuFp8Ops, GemmOntoAResidualAddsIt) {
  const int64_t M = 9, K = 32, N = 16;
  std::mt19937 g(5);
  std::vector<uint8_t> a(size_t(M * K)), b(size_t(N * K));
  for (auto& c : a) c = uint8_t(g() % 0x70);  // finite e4m3 codes of either sign below 0x70
  for (auto& c : b) c = uint8_t(0x80 | (g() % 0x70));
  const float sa = 0.5f, sb = 0.25f;
  std::vector<float> r(size_t(M * N)), plain(size_t(M * N)), d(size_t(M * N), std::nanf(""));
  for (auto& v : r) v = float(int(g() % 200) - 100) / 8.0f;
  const std::vector<float> r0 = r;
  ops->gemm_fp8(a.data(), Fp8Format::e4m3, &sa, b.data(), Fp8Format::e4m3, &sb, plain.data(), M, K, N, false);
  ops->gemm_fp8_residual(a.data(), Fp8Format::e4m3, &sa, b.data(), Fp8Format::e4m3, &sb, r.data(), d.data(),
                         M, K, N);
  for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(d[i], r0[i] + plain[i]) << i;
  EXPECT_EQ(r, r0);
  EXPECT_THROW(ops->gemm_fp8_residual(a.data(), Fp8Format::e4m3, &sa, b.data(), Fp8Format::e4m3, &sb,
                                      d.data(), d.data(), M, K, N),
               std::invalid_argument);
}

TEST_F(CpuFp8Ops, GemmRejectsTwoE5m2OperandsAndNegativeShapes) {
  std::vector<uint8_t> a(64, 0x38), b(64, 0x38);
  std::vector<float> d(16, 0.f);
  const float s = 1.f;
  EXPECT_THROW(
      ops->gemm_fp8(a.data(), Fp8Format::e5m2, &s, b.data(), Fp8Format::e5m2, &s, d.data(), 4, 16, 4, false),
      std::invalid_argument);
  EXPECT_THROW(
      ops->gemm_fp8(a.data(), Fp8Format::e4m3, &s, b.data(), Fp8Format::e4m3, &s, d.data(), -1, 16, 4, false),
      std::invalid_argument);
  for (float v : d) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace rp
