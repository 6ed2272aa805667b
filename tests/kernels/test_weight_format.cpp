// Storage forms of frozen weights on the host (kernels/weight_format.hpp): sizes, names, the
// byte layouts of GGUF Q8_0 / Q4_0, QLoRA NF4 and MXFP4 blocks on hand-computed blocks, the
// conversion of Hugging Face GPT-OSS MXFP4 tensors against transformers' own dequantizer
// (fixture tests/fixtures/mxfp4_hf, made by its make_fixture.py), round-trip
// error bounds that follow from each format's definition, and the CPU backend's
// Ops::dequantize (the twin the CUDA kernels are compared with).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
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
        std::tuple{WeightFormat::q4_0, "q4_0", 32, 36}, std::tuple{WeightFormat::nf4, "nf4", 64, 36},
        std::tuple{WeightFormat::mxfp4, "mxfp4", 32, 34}}) {
    EXPECT_STREQ(weight_format_name(f), name);
    EXPECT_EQ(parse_weight_format(name), f);
    EXPECT_EQ(weight_format_block(f), block) << name;
    EXPECT_EQ(weight_format_bytes(f, 64), size_t(bytes64)) << name;
    EXPECT_EQ(weight_format_bytes(f, 0), size_t(0)) << name;
    EXPECT_EQ(weight_format_quantized(f), block > 1) << name;
  }
  EXPECT_EQ(parse_weight_format("Q4_0"), WeightFormat::q4_0);
  EXPECT_EQ(parse_weight_format("NF4"), WeightFormat::nf4);
  EXPECT_EQ(parse_weight_format("MXFP4"), WeightFormat::mxfp4);
  EXPECT_THROW(weight_format_bytes(WeightFormat::mxfp4, 48), std::invalid_argument);
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

// nf4_code is the nearest level by its definition: the smallest |v - kNf4[i]|, the lower index
// on a tie, 0 for NaN. Checked against that scan on every level, the midpoints between levels
// and their float neighbours (where a tie or a rounding would show), values past +-1 and +-2
// (a block's absmax divides its values into [-1, 1]; larger ones take the scan), and a million
// random values.
TEST(WeightFormat, Nf4CodeIsTheNearestLevelLowerOnTies) {
  auto scan = [](float v) {
    int best = 0;
    for (int i = 1; i < 16; ++i)
      if (std::fabs(v - kNf4[i]) < std::fabs(v - kNf4[best])) best = i;
    return best;
  };
  std::vector<float> vals = {0.f,
                             -0.f,
                             1.f,
                             -1.f,
                             2.f,
                             -2.f,
                             2.5f,
                             -3.f,
                             1e30f,
                             -1e30f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 16; ++i) vals.push_back(kNf4[i]);
  for (int i = 0; i + 1 < 16; ++i) {
    const float mid = (kNf4[i] + kNf4[i + 1]) / 2;
    float v = mid;
    for (int k = 0; k < 3; ++k) v = std::nextafter(v, -2.f);
    for (int k = 0; k < 7; ++k, v = std::nextafter(v, 2.f)) vals.push_back(v);
  }
  std::mt19937 g(11);
  std::uniform_real_distribution<float> d(-1.2f, 1.2f);
  for (int i = 0; i < 1000000; ++i) vals.push_back(d(g));
  for (float v : vals) ASSERT_EQ(int(nf4_code(v)), scan(v)) << "v = " << v;
  EXPECT_EQ(nf4_code(std::numeric_limits<float>::quiet_NaN()), 0);
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
  EXPECT_EQ(q[4], 0xF0);  // codes 15 (1.0), 0 (-1.0)
  EXPECT_EQ(q[5], 0x7C);  // codes 7 (0), 12 (0.5 is nearer 0.4407 than 0.5626)
  EXPECT_EQ(q[6], 0x77);
  EXPECT_EQ(q[35], 0x75);  // codes 7 (0), 5 (-0.37 / 2 = -0.185 is nearest -0.1848)
  const auto y = dequant(WeightFormat::nf4, q, 64);
  EXPECT_EQ(y[1], -2.f);
  EXPECT_EQ(y[3], kNf4[12] * 2.f);
  EXPECT_EQ(y[63], kNf4[5] * 2.f);
}

// One MXFP4 block by hand (ggml's quantize_row_mxfp4_ref): amax 6 gives e = floor(log2 6) - 2 +
// 127 = 127, d = 2^(e-128) = 0.5; x/d is rounded to the nearest of {0,1,2,3,4,6,8,12} with its
// sign (ties to the first code, saturating at 12); values 0..15 low nibbles, 16..31 high.
TEST(WeightFormat, Mxfp4BlockLayout) {
  std::vector<float> x(32, 0.f);
  x[0] = 6.f;     // 12 * d: code 7
  x[16] = -0.5f;  // -1 * d: code 9
  x[1] = 2.6f;    // 5.2 d -> 6 d: code 5
  x[17] = -7.5f;  // saturates at -12 d: code 15
  x[2] = 1.25f;   // 2.5 d, a tie of 2 and 3: code 2
  x[18] = 0.1f;   // 0.2 d -> 0: code 0
  const auto q = quant(WeightFormat::mxfp4, x);
  ASSERT_EQ(q.size(), size_t(17));
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 0x97);
  EXPECT_EQ(q[2], 0xF5);
  EXPECT_EQ(q[3], 0x02);
  for (int i = 4; i < 17; ++i) EXPECT_EQ(q[size_t(i)], 0) << i;
  const auto y = dequant(WeightFormat::mxfp4, q, 32);
  EXPECT_EQ(y[0], 6.f);
  EXPECT_EQ(y[16], -0.5f);
  EXPECT_EQ(y[1], 3.f);
  EXPECT_EQ(y[17], -6.f);
  EXPECT_EQ(y[2], 1.f);
  EXPECT_EQ(y[18], 0.f);
  // the subnormal scales: e = 0 is 2^-128, e = 1 is 2^-127 (exact products)
  std::vector<uint8_t> b(34, 0);
  b[0] = 0, b[1] = 0x07;    // value 0: code 7 (12)
  b[17] = 1, b[18] = 0xF0;  // value 16 of block 2: code 15 (-12)
  const auto z = dequant(WeightFormat::mxfp4, b, 64);
  EXPECT_EQ(z[0], std::ldexp(12.f, -128));
  EXPECT_EQ(z[48], std::ldexp(-12.f, -127));
  EXPECT_EQ(mxfp4_scale(255), std::ldexp(1.f, 127));
  EXPECT_EQ(kMxfp4[7], 12.f);
  EXPECT_EQ(kMxfp4[15], -12.f);
}

// Hugging Face's GPT-OSS MXFP4 tensors (blocks [E, N, G, 16], scales [E, N, G]) converted into
// mxfp4 storage dequantize exactly to what transformers' convert_moe_packed_tensors gives
// (in fp32, before its final transpose).
TEST(WeightFormat, Mxfp4FromHfMatchesTransformers) {
  const std::string dir = std::string(RP_FIXTURES_DIR) + "/mxfp4_hf/";
  auto read = [&](const std::string& name) {
    std::ifstream in(dir + name, std::ios::binary);
    EXPECT_TRUE(in.good()) << "cannot open " << dir + name;
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  };
  const auto blocks = read("blocks.bin"), scales = read("scales.bin"), vbytes = read("values.bin");
  const int64_t rows = 2 * 3, G = 2, n = rows * G * 32;
  ASSERT_EQ(blocks.size(), size_t(rows * G * 16));
  ASSERT_EQ(scales.size(), size_t(rows * G));
  ASSERT_EQ(vbytes.size(), size_t(n) * 4);
  std::vector<float> want(static_cast<size_t>(n));
  std::memcpy(want.data(), vbytes.data(), vbytes.size());
  std::vector<uint8_t> q(weight_format_bytes(WeightFormat::mxfp4, n));
  mxfp4_from_hf(blocks.data(), scales.data(), rows, G, q.data());
  const auto got = dequant(WeightFormat::mxfp4, q, n);
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << "value " << i << " (row " << i / (G * 32) << ")";
    nonzero += want[size_t(i)] != 0.f;
  }
  EXPECT_GT(nonzero, n / 2);  // the fixture is not all zeros
  for (int64_t b = 0; b < rows * G; ++b) EXPECT_EQ(q[size_t(b * 17)], scales[size_t(b)]);
  EXPECT_THROW(mxfp4_from_hf(nullptr, scales.data(), 1, 1, q.data()), std::invalid_argument);
  EXPECT_THROW(mxfp4_from_hf(blocks.data(), scales.data(), -1, 1, q.data()), std::invalid_argument);
}

// Round trips stay within what each format's definition allows per block.
TEST(WeightFormat, RoundTripErrorBounds) {
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(64 * 300);
  for (auto& v : x) v = nd(g);
  for (WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::mxfp4}) {
    const int64_t b = weight_format_block(f);
    const auto y = dequant(f, quant(f, x), int64_t(x.size()));
    for (size_t blk = 0; blk < x.size() / size_t(b); ++blk) {
      float amax = 0;
      for (int64_t i = 0; i < b; ++i) amax = std::max(amax, std::fabs(x[blk * size_t(b) + size_t(i)]));
      // q8_0: half a step of amax/127 (+ the f16 rounding of the step over 127 steps);
      // q4_0: one step of amax/8 (the clamped code 16); nf4: half the widest code gap;
      // mxfp4 (d = 2^(floor(log2 amax) - 3), so amax < 16d): saturation at 12d, error < 4d.
      const float mx_bound = 4.f * std::ldexp(1.f, int(std::floor(std::log2(amax))) - 3);
      const float bound = f == WeightFormat::q8_0   ? 0.57f * amax / 127
                          : f == WeightFormat::q4_0 ? 1.01f * amax / 8
                          : f == WeightFormat::nf4  ? 0.153f * amax
                                                    : mx_bound;
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
  for (WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::mxfp4})
    for (float v : dequant(f, quant(f, z), 64)) ASSERT_EQ(v, 0.f) << weight_format_name(f);
}

// The CPU backend's Ops::dequantize is dequantize_weights into f32 and checks n the same way.
TEST(WeightFormat, CpuOpsDequantize) {
  auto ops = make_cpu_ops(1);
  std::vector<float> x(128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16, WeightFormat::q8_0,
                         WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::mxfp4}) {
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
