// fp8 storage of frozen weights (kernels/weight_format.hpp): e4m3 codes with one fp32 scale
// per row. Hand-computed rows (codes from the OFP8 bit layout), zero, tiny and non-finite
// rows, the round-trip bound that follows from e4m3's 3 mantissa bits, the multi-threaded
// quantization against row-by-row quantization, and the CPU backend's Ops::dequantize.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"

namespace rp {
namespace {

constexpr WeightFormat kFp8 = WeightFormat::fp8;

std::vector<uint8_t> quant(const std::vector<float>& v, int64_t cols) {
  std::vector<uint8_t> q(weight_format_bytes(kFp8, int64_t(v.size()), cols));
  quantize_weights(kFp8, v.data(), q.data(), int64_t(v.size()), cols);
  return q;
}
float scale_of(const std::vector<uint8_t>& q, int64_t row) {
  float s;
  std::memcpy(&s, q.data() + row * 4, 4);
  return s;
}

TEST(WeightFormatFp8, NameAndBytes) {
  EXPECT_STREQ(weight_format_name(kFp8), "fp8");
  EXPECT_EQ(parse_weight_format("FP8"), kFp8);
  EXPECT_TRUE(weight_format_quantized(kFp8));
  EXPECT_EQ(weight_format_bytes(kFp8, 12, 4), 12u + 3u * 4u);  // 1 byte a value, 4 a row
  EXPECT_EQ(weight_format_bytes(kFp8, 4096 * 14336, 14336), size_t(4096) * 14336 + 4096 * 4);
  EXPECT_EQ(weight_format_bytes(kFp8, 0, 8), 0u);
  EXPECT_THROW(weight_format_bytes(kFp8, 12), std::invalid_argument);     // no row length
  EXPECT_THROW(weight_format_bytes(kFp8, 12, 5), std::invalid_argument);  // not whole rows
  EXPECT_THROW(weight_format_bytes(kFp8, -4, 4), std::invalid_argument);
  EXPECT_EQ(weight_format_cols({4, 7}), 7);
  EXPECT_EQ(weight_format_cols({}), 0);
}

// Row 0: amax 448 -> scale 1; 448 = 1.75 * 2^8 -> exponent 15, mantissa 110 = 0x7e; -224 ->
// 0x80 | 0x76; 1 -> exponent 7 = 0x38; 0 -> 0. Row 1: amax 2 -> scale 2/448; 2 maps onto 448
// (0x7e), 0.5 onto 112 = 1.75 * 2^6 -> 0x6e, -0.25 onto -56 = -1.75 * 2^5 -> 0xe6.
TEST(WeightFormatFp8, HandComputedRows) {
  const std::vector<float> v = {448.f, -224.f, 1.f, 0.f, 2.f, 0.5f, -0.25f, 0.f};
  const std::vector<uint8_t> q = quant(v, 4);
  ASSERT_EQ(q.size(), 8u + 8u);
  EXPECT_EQ(scale_of(q, 0), 1.f);
  EXPECT_EQ(scale_of(q, 1), 2.f / 448.f);
  const std::vector<uint8_t> codes(q.begin() + 8, q.end());
  EXPECT_EQ(codes, (std::vector<uint8_t>{0x7e, 0xf6, 0x38, 0x00, 0x7e, 0x6e, 0xe6, 0x00}));
  std::vector<float> back(8);
  dequantize_weights(kFp8, q.data(), back.data(), 8, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[size_t(i)], v[size_t(i)]) << i;  // exact under scale 1
  EXPECT_EQ(back[4], 448.f * (2.f / 448.f));
}

// An all-zero row gets scale 1 and zero codes; it decodes to zeros (its neighbours keep
// their own scales).
TEST(WeightFormatFp8, ZeroRow) {
  const std::vector<float> v = {0.f, 0.f, 0.f, 3.f, -1.f, 0.5f};
  const std::vector<uint8_t> q = quant(v, 3);
  EXPECT_EQ(scale_of(q, 0), 1.f);
  EXPECT_EQ(scale_of(q, 1), 3.f / 448.f);
  std::vector<float> back(6, 7.f);
  dequantize_weights(kFp8, q.data(), back.data(), 6, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back[size_t(i)], 0.f);
  EXPECT_NEAR(back[3], 3.f, 3.f / 16);
}

// A row holding a NaN or an infinity has no finite scale: refused, naming the row.
TEST(WeightFormatFp8, NonFiniteRowIsRefused) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> v(5 * 8, 0.25f);
    v[3 * 8 + 5] = bad;
    std::vector<uint8_t> q(weight_format_bytes(kFp8, 40, 8));
    try {
      quantize_weights(kFp8, v.data(), q.data(), 40, 8);
      ADD_FAILURE() << "a row with " << bad << " was quantized";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("row 3"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

// Tiny rows: amax / 448 underflowing to zero gives the smallest subnormal scale, and fp32
// subnormal rows still round-trip (7 * 2^-149 is the code 7 under that scale).
TEST(WeightFormatFp8, TinyRows) {
  const float sub = std::ldexp(7.f, -149);
  const std::vector<float> v = {sub, -sub, 0.f, sub};
  const std::vector<uint8_t> q = quant(v, 4);
  EXPECT_EQ(scale_of(q, 0), std::numeric_limits<float>::denorm_min());
  std::vector<float> back(4);
  dequantize_weights(kFp8, q.data(), back.data(), 4, 4);
  EXPECT_EQ(back, v);
}

// Round trip: e4m3 keeps 3 mantissa bits, so a value in the normal range of its row's codes
// (>= 2^-6 * scale) is off by at most 2^-4 of itself, one in the subnormal range by at most
// half the smallest step, 2^-10 * scale. Rows of very different magnitudes, tiny ones included.
TEST(WeightFormatFp8, RoundTripBound) {
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  const int64_t rows = 60, cols = 257;
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[size_t(r * cols + c)] = nd(g) * std::ldexp(1.f, int(r % 12) * 9 - 100);
  const std::vector<uint8_t> q = quant(v, cols);
  std::vector<float> back(v.size());
  dequantize_weights(kFp8, q.data(), back.data(), rows * cols, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scale_of(q, r);
    for (int64_t c = 0; c < cols; ++c) {
      const float x = v[size_t(r * cols + c)], y = back[size_t(r * cols + c)];
      const float bound = std::max(std::fabs(x) * 0.0625f, s * std::ldexp(1.f, -10)) * 1.0001f;
      ASSERT_LE(std::fabs(x - y), bound) << "row " << r << " col " << c << " x " << x << " y " << y;
    }
  }
}

// A matrix large enough for the threaded path gives the bytes that quantizing each row on
// its own (one thread) gives; a bad row deep inside it is still reported by its index.
TEST(WeightFormatFp8, ThreadedEqualsRowByRow) {
  const int64_t rows = 1031, cols = 1100;  // > 2^20 values, rows not a multiple of the threads
  std::mt19937 g(9);
  std::normal_distribution<float> nd;
  std::vector<float> v(size_t(rows * cols));
  for (auto& x : v) x = nd(g) * 0.02f;
  const std::vector<uint8_t> q = quant(v, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row(v.begin() + r * cols, v.begin() + (r + 1) * cols);
    const std::vector<uint8_t> one = quant(row, cols);
    ASSERT_EQ(scale_of(q, r), scale_of(one, 0)) << r;
    ASSERT_EQ(0, std::memcmp(q.data() + rows * 4 + r * cols, one.data() + 4, size_t(cols))) << r;
  }
  v[size_t(777 * cols + 3)] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> out(q.size());
  try {
    quantize_weights(kFp8, v.data(), out.data(), rows * cols, cols);
    ADD_FAILURE() << "an infinity was quantized";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row 777 "), std::string::npos) << e.what();
  }
}

// The CPU backend's dequantize (the twin of the CUDA kernel) is dequantize_weights, and it
// needs the row length.
TEST(WeightFormatFp8, CpuOpsDequantize) {
  auto ops = make_cpu_ops(1);
  std::vector<float> v(6 * 40);
  std::mt19937 g(4);
  std::normal_distribution<float> nd;
  for (auto& x : v) x = nd(g);
  const std::vector<uint8_t> q = quant(v, 40);
  std::vector<float> want(v.size()), got(v.size());
  dequantize_weights(kFp8, q.data(), want.data(), 240, 40);
  ops->dequantize(kFp8, q.data(), got.data(), 240, 40);
  EXPECT_EQ(got, want);
  EXPECT_THROW(ops->dequantize(kFp8, q.data(), got.data(), 240), std::invalid_argument);
}

}  // namespace
}  // namespace rp
