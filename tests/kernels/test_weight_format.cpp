// Storage forms of frozen weights on the host (kernels/weight_format.hpp): sizes, names, the
// byte layouts of GGUF Q8_0 / Q4_0 and QLoRA NF4 blocks on hand-computed blocks, round-trip
// error bounds that follow from each format's definition, and the CPU backend's
// Ops::dequantize (the twin the CUDA kernels are compared with).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/dtype.hpp"
#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"

namespace rp {
namespace {

std::vector<uint8_t> quant(WeightFormat f, const std::vector<float>& v) {
  std::vector<uint8_t> q(weight_format_bytes(f, int64_t(v.size())));
  quantize_weights(f, v.data(), q.data(), int64_t(v.size()));
  return q;
}
std::vector<float> dequant(WeightFormat f, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_weights(f, q.data(), y.data(), n);
  return y;
}

TEST(WeightFormat, NamesBlocksAndBytes) {
  for (auto [f, name, block, bytes64] :
       {std::tuple{WeightFormat::f32, "f32", 1, 256}, std::tuple{WeightFormat::bf16, "bf16", 1, 128},
        std::tuple{WeightFormat::f16, "f16", 1, 128}, std::tuple{WeightFormat::q8_0, "q8_0", 32, 68},
        std::tuple{WeightFormat::q4_0, "q4_0", 32, 36}, std::tuple{WeightFormat::nf4, "nf4", 64, 36}}) {
    EXPECT_STREQ(weight_format_name(f), name);
    EXPECT_EQ(parse_weight_format(name), f);
    EXPECT_EQ(weight_format_block(f), block) << name;
    EXPECT_EQ(weight_format_bytes(f, 64), size_t(bytes64)) << name;
    EXPECT_EQ(weight_format_bytes(f, 0), size_t(0)) << name;
    EXPECT_EQ(weight_format_quantized(f), block > 1) << name;
  }
  EXPECT_EQ(parse_weight_format("Q4_0"), WeightFormat::q4_0);
  EXPECT_EQ(parse_weight_format("NF4"), WeightFormat::nf4);
  EXPECT_THROW(parse_weight_format("q4_k"), std::invalid_argument);
  EXPECT_THROW(weight_format_bytes(WeightFormat::q8_0, 33), std::invalid_argument);
  EXPECT_THROW(weight_format_bytes(WeightFormat::nf4, 32), std::invalid_argument);
  EXPECT_THROW(weight_format_bytes(WeightFormat::f32, -1), std::invalid_argument);
  EXPECT_THROW(weight_format_bytes(WeightFormat(17), 4), std::invalid_argument);
  std::vector<float> x(96);
  std::vector<uint8_t> q(256);
  EXPECT_THROW(quantize_weights(WeightFormat::nf4, x.data(), q.data(), 96), std::invalid_argument);
  EXPECT_THROW(dequantize_weights(WeightFormat::q4_0, q.data(), x.data(), 40), std::invalid_argument);
}

// The NF4 codes: 16 sorted values from -1 to 1 with an exact 0 (QLoRA, appendix E).
TEST(WeightFormat, Nf4Codes) {
  EXPECT_EQ(kNf4[0], -1.0f);
  EXPECT_EQ(kNf4[7], 0.0f);
  EXPECT_EQ(kNf4[15], 1.0f);
  for (int i = 1; i < 16; ++i) EXPECT_LT(kNf4[i - 1], kNf4[i]) << i;
}

// Plain 16-bit forms round to nearest, ties to even.
TEST(WeightFormat, Plain16BitRoundToNearestEven) {
  const std::vector<float> v = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f};
  const auto b = quant(WeightFormat::bf16, v), h = quant(WeightFormat::f16, v);
  EXPECT_EQ(b[0] | b[1] << 8, 0x3F80);  // tie to the even 1.0
  EXPECT_EQ(b[2] | b[3] << 8, 0x3F82);  // tie to the even 1 + 2^-6
  EXPECT_EQ(h[4] | h[5] << 8, 0x3C00);
  EXPECT_EQ(h[6] | h[7] << 8, 0x3C02);
  EXPECT_EQ(dequant(WeightFormat::bf16, b, 4)[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(dequant(WeightFormat::f16, h, 4)[3], 1.0f + 0x1p-9f);
  const auto big = quant(WeightFormat::f16, {65520.f});  // halfway to 65536: rounds to inf
  EXPECT_TRUE(std::isinf(dequant(WeightFormat::f16, big, 1)[0]));
}

// GGUF Q8_0: {f16 d = max|x|/127; int8 q = round(x/d)} (ties away from zero, as roundf).
TEST(WeightFormat, Q8_0Block) {
  std::vector<float> x(32, 0.f);
  x[0] = -127.f, x[2] = 1.4f, x[3] = 2.5f, x[4] = -2.5f, x[5] = 126.6f, x[31] = -0.5f;
  const auto q = quant(WeightFormat::q8_0, x);
  ASSERT_EQ(q.size(), 34u);
  EXPECT_EQ(q[0], 0x00);  // d = 1.0 = f16 0x3C00, little-endian
  EXPECT_EQ(q[1], 0x3C);
  const int8_t want[] = {-127, 0, 1, 3, -3, 127};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(int8_t(q[size_t(2 + i)]), want[i]) << i;
  EXPECT_EQ(int8_t(q[33]), -1);
  const auto y = dequant(WeightFormat::q8_0, q, 32);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[size_t(i)], float(want[i])) << i;
}

// GGUF Q4_0: d = (the value of largest magnitude, signed) / -8, q = min(15, int(x/d + 8.5)),
// values 0..15 in the low nibbles, 16..31 in the high ones, x = (q - 8) * d.
TEST(WeightFormat, Q4_0Block) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[size_t(i)] = float(i - 16);  // -16 has the largest magnitude
  const auto q = quant(WeightFormat::q4_0, x);
  ASSERT_EQ(q.size(), 18u);
  EXPECT_EQ(q[0], 0x00);  // d = -16 / -8 = 2 = f16 0x4000
  EXPECT_EQ(q[1], 0x40);
  EXPECT_EQ(q[2], 0x80);   // x0 = -16 -> 0, x16 = 0 -> 8
  EXPECT_EQ(q[3], 0x91);   // x1 = -15 -> int(1.0) = 1, x17 = 1 -> int(9.0) = 9
  EXPECT_EQ(q[17], 0xF8);  // x15 = -1 -> 8, x31 = 15 -> 16 clamped to 15
  const auto y = dequant(WeightFormat::q4_0, q, 32);
  EXPECT_EQ(y[0], -16.f);
  EXPECT_EQ(y[1], -14.f);
  EXPECT_EQ(y[16], 0.f);
  EXPECT_EQ(y[31], 14.f);
}

// QLoRA NF4: {f32 absmax; nearest code of x/absmax}, value 2i in the high nibble.
TEST(WeightFormat, Nf4Block) {
  std::vector<float> x(64, 0.f);
  x[0] = 2.f, x[1] = -2.f, x[3] = 1.f, x[63] = -0.37f;
  const auto q = quant(WeightFormat::nf4, x);
  ASSERT_EQ(q.size(), 36u);
  float amax;
  std::memcpy(&amax, q.data(), 4);
  EXPECT_EQ(amax, 2.f);
  EXPECT_EQ(q[4], 0xF0);   // codes 15 (1.0), 0 (-1.0)
  EXPECT_EQ(q[5], 0x7C);   // codes 7 (0), 12 (0.5 is nearer 0.4407 than 0.5626)
  EXPECT_EQ(q[6], 0x77);
  EXPECT_EQ(q[35], 0x75);  // codes 7 (0), 5 (-0.37 / 2 = -0.185 is nearest -0.1848)
  const auto y = dequant(WeightFormat::nf4, q, 64);
  EXPECT_EQ(y[1], -2.f);
  EXPECT_EQ(y[3], kNf4[12] * 2.f);
  EXPECT_EQ(y[63], kNf4[5] * 2.f);
}

// Round trips stay within what each format's definition allows per block.
TEST(WeightFormat, RoundTripErrorBounds) {
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(64 * 300);
  for (auto& v : x) v = nd(g);
  for (WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4}) {
    const int64_t b = weight_format_block(f);
    const auto y = dequant(f, quant(f, x), int64_t(x.size()));
    for (size_t blk = 0; blk < x.size() / size_t(b); ++blk) {
      float amax = 0;
      for (int64_t i = 0; i < b; ++i) amax = std::max(amax, std::fabs(x[blk * size_t(b) + size_t(i)]));
      // q8_0: half a step of amax/127 (+ the f16 rounding of the step over 127 steps);
      // q4_0: one step of amax/8 (the clamped code 16); nf4: half the widest code gap.
      const float bound = f == WeightFormat::q8_0 ? 0.57f * amax / 127 : f == WeightFormat::q4_0 ? 1.01f * amax / 8
                                                                                                   : 0.153f * amax;
      for (int64_t i = 0; i < b; ++i) {
        const size_t k = blk * size_t(b) + size_t(i);
        ASSERT_LE(std::fabs(y[k] - x[k]), bound) << weight_format_name(f) << " value " << k;
      }
    }
  }
}

// All-zero blocks give zeros (no division by a zero scale).
TEST(WeightFormat, ZeroBlocks) {
  const std::vector<float> z(64, 0.f);
  for (WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4})
    for (float v : dequant(f, quant(f, z), 64)) ASSERT_EQ(v, 0.f) << weight_format_name(f);
}

// The CPU backend's Ops::dequantize is dequantize_weights into f32 and checks n the same way.
TEST(WeightFormat, CpuOpsDequantize) {
  auto ops = make_cpu_ops(1);
  std::vector<float> x(128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16, WeightFormat::q8_0,
                         WeightFormat::q4_0, WeightFormat::nf4}) {
    const auto q = quant(f, x);
    std::vector<float> y(128, -7.f);
    ops->dequantize(f, q.data(), y.data(), 128);
    EXPECT_EQ(y, dequant(f, q, 128)) << weight_format_name(f);
  }
  std::vector<float> y(64);
  std::vector<uint8_t> q(64);
  EXPECT_THROW(ops->dequantize(WeightFormat::q8_0, q.data(), y.data(), 16), std::invalid_argument);
  EXPECT_THROW(ops->dequantize(WeightFormat::f32, q.data(), y.data(), -1), std::invalid_argument);
}

}  // namespace
}  // namespace rp
