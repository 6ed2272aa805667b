// The CPU backend's FP8 ops with per-row scales (kernels/ops.hpp: gemm_fp8_rows,
// fp8_quantize_rows_col_scaled, transpose_bytes) against plain fp64 references: the GEMM of
// codes with one scale per row of each operand, the codes of x * col_scale with one scale per
// row (codes from the OCP table search of tests/kernels/fp8_ref.hpp), the byte transpose.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp8.hpp"
#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"
#include "tests/kernels/fp8_ref.hpp"

namespace rp {
namespace {

using Codes = std::vector<uint8_t>;
constexpr Fp8Format E4 = Fp8Format::e4m3;

// Random e4m3 codes of normal values (sigma 4: every binade of the format is used, no NaN).
Codes random_codes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 4.f);
  Codes c(n);
  for (auto& x : c) x = fp8::encode(E4, d(g));
  return c;
}

// Positive scales spread over 2^-12 .. 2^4, not powers of two.
std::vector<float> random_scales(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> e(-12.f, 4.f);
  std::vector<float> s(n);
  for (auto& x : s) x = std::exp2(e(g)) * 1.37f;
  return s;
}

// y = (sa[m] sb[n]) sum_k A B^T of the decoded codes, in fp64, against the fp32 GEMM: the
// products are exact in fp32, so the sum errs by at most K * 2^-24 of sum |a b| (any order),
// the scale products by two fp32 roundings (2^-23 of |y|); accumulate adds the old value.
TEST(Fp8Rows, GemmMatchesTheFp64ProductOfTheDequantizedOperands) {
  auto ops = make_cpu_ops(2);
  struct Shape {
    int64_t M, K, N;
  };
  for (const Shape sh : {Shape{5, 48, 7}, Shape{33, 256, 17}, Shape{1, 16, 1}})
    for (bool acc : {false, true}) {
      const int64_t M = sh.M, K = sh.K, N = sh.N;
      const Codes a = random_codes(size_t(M * K), uint32_t(M + K)),
                  b = random_codes(size_t(N * K), uint32_t(N));
      const std::vector<float> sa = random_scales(size_t(M), 3), sb = random_scales(size_t(N), 4);
      std::vector<float> y(size_t(M * N), 0.25f);
      ops->gemm_fp8_rows(a.data(), E4, sa.data(), b.data(), E4, sb.data(), y.data(), M, K, N, acc);
      int64_t nonzero = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double p =
                fp8ref::spec_value(E4, a[size_t(m * K + k)]) * fp8ref::spec_value(E4, b[size_t(n * K + k)]);
            sum += p;
            mag += std::fabs(p);
          }
          const double s = double(sa[size_t(m)]) * double(sb[size_t(n)]);
          const double want = sum * s + (acc ? 0.25 : 0.0);
          const double e =
              double(K) * std::ldexp(1.0, -24) * mag * s + std::ldexp(1.0, -22) * std::fabs(want);
          ASSERT_NEAR(double(y[size_t(m * N + n)]), want, e)
              << M << "x" << K << "x" << N << (acc ? " +C" : "") << " at (" << m << "," << n << ")";
          nonzero += sum != 0;
        }
      EXPECT_GT(nonzero, M * N / 2) << "degenerate operands";
    }
}

// The whole chain of a linear from an fp8-stored weight: x [n, in] quantized per token
// (fp8_scale_rows, fp8_quantize_rows), W [out, in] stored as fp8 (quantize_weights: codes and
// one scale per output row), y = gemm_fp8_rows(codes of x, s_x, codes of W, s_w) against the
// fp64 product x W^T of the unquantized values. Each value's e4m3 rounding moves it by at most
// 2^-4 of itself (3 mantissa bits, half a step) or, below the normal range, half the smallest
// subnormal step, 2^-10 of its scale; the product of two such values by e_x |w| + e_w |x| +
// e_x e_w; the fp32 sum adds K * 2^-24 of sum |x w|.
TEST(Fp8Rows, LinearFromStoredCodesWithinTheE4m3RoundingBound) {
  auto ops = make_cpu_ops(2);
  const int64_t n = 9, in = 64, out = 24;
  std::vector<float> x = fp8ref::normal_with_outliers(size_t(n * in), 21), w(size_t(out * in));
  std::mt19937 g(22);
  for (int64_t r = 0; r < out; ++r) {  // rows of very different magnitude: what row scales are for
    std::normal_distribution<float> d(0.f, std::exp2(float(r % 7) - 9.f));
    for (int64_t c = 0; c < in; ++c) w[size_t(r * in + c)] = d(g);
  }
  std::vector<uint8_t> stored(weight_format_bytes(WeightFormat::fp8, out * in, in));
  quantize_weights(WeightFormat::fp8, w.data(), stored.data(), out * in, in);
  const auto* sw = reinterpret_cast<const float*>(stored.data());
  const uint8_t* cw = stored.data() + out * 4;
  std::vector<float> sx(static_cast<size_t>(n)), y(size_t(n * out));
  Codes cx(size_t(n * in));
  ops->fp8_scale_rows(x.data(), n, in, E4, sx.data());
  ops->fp8_quantize_rows(x.data(), sx.data(), cx.data(), n, in, E4);
  ops->gemm_fp8_rows(cx.data(), E4, sx.data(), cw, E4, sw, y.data(), n, in, out, false);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double want = 0, bound = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double xv = x[size_t(t * in + k)], wv = w[size_t(o * in + k)];
        const double ex = std::max(std::ldexp(std::fabs(xv), -4), std::ldexp(double(sx[size_t(t)]), -10));
        const double ew = std::max(std::ldexp(std::fabs(wv), -4), std::ldexp(double(sw[o]), -10));
        want += xv * wv;
        bound += ex * std::fabs(wv) + ew * std::fabs(xv) + ex * ew +
                 double(in) * std::ldexp(std::fabs(xv * wv), -23);
      }
      ASSERT_NEAR(double(y[size_t(t * out + o)]), want, bound) << "token " << t << ", output " << o;
    }
}

// Codes of x * col_scale with a scale per row, against the spec's nearest-code search; a zero
// row gets scale 1 and zero codes; a NaN makes its row's scale NaN.
TEST(Fp8Rows, ColumnScaledRowCodesMatchTheSpec) {
  auto ops = make_cpu_ops(1);
  const int64_t rows = 6, cols = 37;
  std::vector<float> x = fp8ref::normal_with_outliers(size_t(rows * cols), 5), cs(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) cs[size_t(c)] = std::exp2(float(c % 9) - 6.f) * 1.1f;
  for (int64_t c = 0; c < cols; ++c) x[size_t(2 * cols + c)] = 0.f;  // row 2: zero
  x[size_t(4 * cols + 3)] = std::nanf("");                           // row 4: NaN
  Codes q(size_t(rows * cols), 0xab);
  std::vector<float> s(size_t(rows), -1.f);
  ops->fp8_quantize_rows_col_scaled(x.data(), cs.data(), q.data(), s.data(), rows, cols, E4);
  const std::vector<double> pos = fp8ref::positive_values(E4);
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c)
      amax = std::max(amax, std::fabs(x[size_t(r * cols + c)] * cs[size_t(c)]));
    if (r == 4) {
      EXPECT_TRUE(std::isnan(s[size_t(r)])) << "a NaN row's scale";
      continue;
    }
    const float want_s = r == 2 ? 1.f : amax / 448.f;
    ASSERT_EQ(s[size_t(r)], want_s) << "row " << r;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[size_t(r * cols + c)] * cs[size_t(c)];
      ASSERT_EQ(int(q[size_t(r * cols + c)]), int(fp8ref::ref_encode(E4, v / want_s, pos)))
          << "row " << r << ", column " << c;
    }
  }
}

TEST(Fp8Rows, TransposeBytesIsExact) {
  auto ops = make_cpu_ops(1);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 70}, {65, 64}, {128, 17}}) {
    Codes src(size_t(rows * cols)), dst(size_t(rows * cols), 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 37 + 11);
    ops->transpose_bytes(src.data(), dst.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(dst[size_t(c * rows + r)], src[size_t(r * cols + c)]) << rows << "x" << cols;
  }
  EXPECT_THROW(ops->transpose_bytes(nullptr, nullptr, -1, 2), std::invalid_argument);
}

}  // namespace
}  // namespace rp
