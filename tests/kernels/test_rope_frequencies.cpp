// rope_frequencies vs independently written formulas of each scaling type.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "kernels/ops.hpp"
#include "kernels/rope_tables.hpp"

namespace rp {
namespace {

const double kPi = 3.14159265358979323846;

double base_inv(double theta, int64_t D, int64_t i) {
  return 1.0 / std::pow(theta, double(2 * i) / double(D));
}

TEST(RopeFrequencies, Default) {
  RopeParams p;
  p.head_dim = 64;
  p.theta = 10000.0;
  RopeTable t = rope_frequencies(p);
  ASSERT_EQ(t.inv_freq.size(), 32u);
  EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
  EXPECT_FLOAT_EQ(t.inv_freq[1], float(std::pow(10000.0, -2.0 / 64)));
  EXPECT_FLOAT_EQ(t.inv_freq[31], float(std::exp(-62.0 / 64 * std::log(10000.0))));
  EXPECT_EQ(t.attention_scaling, 1.0f);
}

TEST(RopeFrequencies, Linear) {
  RopeParams p;
  p.type = "linear";
  p.head_dim = 16;
  p.factor = 4.0;
  RopeTable t = rope_frequencies(p);
  for (int64_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(t.inv_freq[size_t(i)], float(base_inv(1e4, 16, i) / 4));
}

// Llama 3.1 (config.json of Meta-Llama-3.1-8B): theta 500000, factor 8, low 1, high 4,
// original context 8192, head_dim 128. Written from the Llama 3.1 reference code
// (apply_scaling in llama/model.py): per-frequency by wavelength band.
TEST(RopeFrequencies, Llama3) {
  RopeParams p;
  p.type = "llama3";
  p.head_dim = 128;
  p.theta = 500000.0;
  p.factor = 8.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position_embeddings = 8192;
  RopeTable t = rope_frequencies(p);
  ASSERT_EQ(t.inv_freq.size(), 64u);
  int n_high = 0, n_low = 0, n_mid = 0;
  for (int64_t i = 0; i < 64; ++i) {
    double f = base_inv(500000.0, 128, i);
    double wavelen = 2 * kPi / f, expect;
    if (wavelen < 8192.0 / 4.0) {
      expect = f;
      ++n_high;
    } else if (wavelen > 8192.0 / 1.0) {
      expect = f / 8.0;
      ++n_low;
    } else {
      double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expect = (1 - smooth) * f / 8.0 + smooth * f;
      ++n_mid;
    }
    EXPECT_NEAR(t.inv_freq[size_t(i)], expect, 1e-6 * expect) << "i=" << i;
  }
  EXPECT_GT(n_high, 0);
  EXPECT_GT(n_low, 0);
  EXPECT_GT(n_mid, 0);  // all three bands exercised
  // spot values: the highest frequency is untouched, the lowest divided by the factor
  EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
  EXPECT_NEAR(t.inv_freq[63], base_inv(500000.0, 128, 63) / 8.0, 1e-12);
  p.original_max_position_embeddings = 0;
  EXPECT_THROW(rope_frequencies(p), std::invalid_argument);
}

// YaRN (Peng et al. 2023, arXiv 2309.00071, eq. 17-19): dimension d has r(d) =
// L_orig / lambda_d rotations over the original context (lambda_d = 2*pi*theta^(2d/|D|));
// gamma = 0 (interpolate) when r < beta_slow, 1 (keep) when r > beta_fast, linear in
// between; HF rounds the band edges to whole dims (floor/ceil), so here the ramp is
// evaluated on those rounded edges, obtained by inverting r(d).
TEST(RopeFrequencies, Yarn) {
  RopeParams p;
  p.type = "yarn";
  p.head_dim = 128;
  p.theta = 1000000.0;
  p.factor = 4.0;
  p.original_max_position_embeddings = 32768;
  RopeTable t = rope_frequencies(p);
  const double D = 128, Lorig = 32768, th = 1e6;
  // Frequency pair i has wavelength 2*pi*th^(2i/D), i.e. r_i = Lorig/(2*pi*th^(2i/D))
  // rotations; the (fractional) pair index where r_i = rot:
  auto dim_at = [&](double rot) { return 0.5 * D * std::log(Lorig / (2 * kPi * rot)) / std::log(th); };
  double lo = std::max(0.0, std::floor(dim_at(32.0))), hi = std::min(D - 1, std::ceil(dim_at(1.0)));
  int n_keep = 0, n_interp = 0, n_mid = 0;
  for (int i = 0; i < 64; ++i) {
    double f = base_inv(th, 128, i);
    double gamma;  // weight of the original (extrapolated) frequency
    if (i <= lo) gamma = 1.0, ++n_keep;
    else if (i >= hi) gamma = 0.0, ++n_interp;
    else gamma = 1.0 - (i - lo) / (hi - lo), ++n_mid;
    double expect = gamma * f + (1 - gamma) * f / 4.0;
    EXPECT_NEAR(t.inv_freq[size_t(i)], expect, 1e-6 * expect) << "i=" << i;
  }
  EXPECT_GT(n_keep, 0);
  EXPECT_GT(n_interp, 0);
  EXPECT_GT(n_mid, 0);
  EXPECT_NEAR(t.attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-6);  // mscale, eq. 22
  // explicit attention_factor wins; original context defaults to max_position_embeddings
  p.attention_factor = 1.5;
  EXPECT_FLOAT_EQ(rope_frequencies(p).attention_scaling, 1.5f);
  RopeParams q = p;
  q.original_max_position_embeddings = 0;
  q.max_position_embeddings = 32768;
  EXPECT_EQ(rope_frequencies(q).inv_freq, rope_frequencies(p).inv_freq);
}

// LongRoPE (Ding et al. 2024, arXiv 2402.13753, as Phi-3 ships it): each frequency divided by
// its factor, short ones up to the original context, long ones beyond; attention scaling
// sqrt(1 + ln(s) / ln(L_orig)) with s = L_max / L_orig when no factor is given (values from
// transformers: tests/model/test_longrope.cpp).
TEST(RopeFrequencies, LongRope) {
  RopeParams p;
  p.type = "longrope";
  p.head_dim = 8;
  p.theta = 10000.0;
  p.factor = 0;  // derived: 256 / 16
  p.original_max_position_embeddings = 16;
  p.max_position_embeddings = 256;
  const LongRopeFactors lr{{1.0, 2.0, 3.0, 4.0}, {5.0, 6.0, 7.0, 8.0}};
  const RopeTables t = rope_tables(p, lr);
  ASSERT_TRUE(t.longrope());
  const double s = std::sqrt(1 + std::log(16.0) / std::log(16.0));
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(t.short_table.inv_freq[size_t(i)], base_inv(1e4, 8, i) / lr.short_factor[size_t(i)], 1e-7);
    EXPECT_NEAR(t.long_table.inv_freq[size_t(i)], base_inv(1e4, 8, i) / lr.long_factor[size_t(i)], 1e-7);
  }
  EXPECT_NEAR(t.short_table.attention_scaling, s, 1e-6);
  EXPECT_NEAR(t.long_table.attention_scaling, s, 1e-6);
  EXPECT_EQ(&t.pick(16), &t.short_table);
  EXPECT_EQ(&t.pick(17), &t.long_table);
  p.factor = 1.0;  // no extension: scaling 1
  EXPECT_EQ(rope_tables(p, lr).short_table.attention_scaling, 1.0f);
  p.attention_factor = 1.25;  // given: taken as is
  EXPECT_EQ(rope_tables(p, lr).long_table.attention_scaling, 1.25f);
  // one table for every other type
  RopeParams d;
  d.head_dim = 8;
  const RopeTables td = rope_tables(d);
  EXPECT_FALSE(td.longrope());
  EXPECT_EQ(td.short_table.inv_freq, rope_frequencies(d).inv_freq);
  EXPECT_EQ(&td.pick(1 << 30), &td.short_table);
  // refusals: the factor lists' length and values, the original context, rope_frequencies
  EXPECT_THROW(rope_tables(p, {{1.0, 2.0, 3.0}, lr.long_factor}), std::invalid_argument);
  EXPECT_THROW(rope_tables(p, {lr.short_factor, {1.0, 0.0, 1.0, 1.0}}), std::invalid_argument);
  EXPECT_THROW(rope_tables(p, {lr.short_factor, {1.0, NAN, 1.0, 1.0}}), std::invalid_argument);
  p.original_max_position_embeddings = 0;
  EXPECT_THROW(rope_tables(p, lr), std::invalid_argument);
  EXPECT_THROW(rope_frequencies(p), std::invalid_argument);
}

TEST(RopeFrequencies, Errors) {
  RopeParams p;
  p.head_dim = 7;
  EXPECT_THROW(rope_frequencies(p), std::invalid_argument);
  p.head_dim = 8;
  p.type = "dynamic";
  EXPECT_THROW(rope_frequencies(p), std::invalid_argument);
  p.type = "linear";
  p.factor = 0;
  EXPECT_THROW(rope_frequencies(p), std::invalid_argument);
}

}  // namespace
}  // namespace rp
