// Large tensors converted on several threads (formats/parallel_quantize.hpp): the bytes equal
// one quantize_weights over the whole tensor for every storage form, with rows a block does not
// divide, with rows whose count splits unevenly, and below the size where it splits; a bad
// block multiple throws the same error; a bf16 safetensors tensor above that size reads back
// as the same floats.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "formats/parallel_quantize.hpp"
#include "formats/safetensors.hpp"
#include "kernels/weight_format.hpp"
#include "tests/formats/test_io_util.hpp"

namespace rp::test {
namespace {

std::vector<float> normal_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 0.05f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

struct Shape {
  int64_t rows, cols;
};

class ParallelQuantize : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(ParallelQuantize, SameBytesAsOneSerialCall) {
  const WeightFormat f = GetParam();
  // above the split size with 16 threads' uneven pieces; 96-value rows straddle nf4's 64 blocks;
  // one under the split size
  for (const Shape s : {Shape{4099, 1024}, Shape{43691 * 2, 96}, Shape{64, 128}}) {
    const int64_t n = s.rows * s.cols;
    if (n % weight_format_block(f) != 0) continue;
    const std::vector<float> v = normal_values(n, uint32_t(n));
    const size_t bytes = weight_format_bytes(f, n, s.cols);
    std::vector<uint8_t> want(bytes, 0x11), got(bytes, 0x22);
    quantize_weights(f, v.data(), want.data(), n, s.cols);
    quantize_weights_parallel(f, v.data(), got.data(), n, s.cols);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), bytes))
        << weight_format_name(f) << " " << s.rows << " x " << s.cols;
  }
}

TEST(ParallelQuantizeErrors, ABadBlockMultipleThrowsAsTheSerialCallDoes) {
  std::vector<float> v(size_t(kParallelConvertValues) + 16);
  std::vector<uint8_t> out(v.size() * 4);
  std::string serial, parallel;
  try {
    quantize_weights(WeightFormat::nf4, v.data(), out.data(), int64_t(v.size()), 16);
  } catch (const std::invalid_argument& e) {
    serial = e.what();
  }
  try {
    quantize_weights_parallel(WeightFormat::nf4, v.data(), out.data(), int64_t(v.size()), 16);
  } catch (const std::invalid_argument& e) {
    parallel = e.what();
  }
  EXPECT_FALSE(serial.empty());
  EXPECT_EQ(serial, parallel);
}

TEST(ParallelQuantizeErrors, RangesCoverEachValueOnceOnGrainBounds) {
  for (const int64_t n :
       {int64_t(0), int64_t(7), kParallelConvertValues - 1, kParallelConvertValues * 3 + 5}) {
    std::vector<int> hits(size_t(n), 0);
    std::atomic<int> pieces{0};
    for_ranges_parallel(n, 96, [&](int64_t lo, int64_t hi) {
      ++pieces;
      EXPECT_TRUE(lo % 96 == 0) << lo;
      EXPECT_TRUE(hi % 96 == 0 || hi == n) << hi;
      for (int64_t i = lo; i < hi; ++i) ++hits[size_t(i)];
    });
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "n " << n << " at " << i;
    if (n >= kParallelConvertValues && convert_threads() > 1) {
      EXPECT_GT(pieces.load(), 1) << n;
    }
    if (n < kParallelConvertValues) {
      EXPECT_LE(pieces.load(), 1) << n;
    }
  }
}

TEST(ParallelQuantizeErrors, Bf16SafetensorsAboveTheSplitSizeReadsBackExactly) {
  const int64_t rows = 2049, cols = 2048;  // 4.2 M values
  // values a bf16 holds exactly (random bf16 bit patterns, finite, both signs), so the file
  // holds them as given and reads back bit for bit
  std::vector<float> v(size_t(rows * cols));
  std::mt19937 rng(5);
  for (auto& x : v) {
    const uint32_t u = uint32_t(rng() & 0xbf7f) << 16;
    std::memcpy(&x, &u, 4);
  }
  TempDir dir("parallel_bf16");
  const std::string path = dir / "w.safetensors";
  save_safetensors(path, {TensorRef{"w", {rows, cols}, v.data()}}, DType::bf16);
  SafetensorsFile file(path);
  const HostTensor t = file.read_f32(*file.find("w"));
  ASSERT_EQ(t.data.size(), v.size());
  EXPECT_EQ(0, std::memcmp(t.data.data(), v.data(), v.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Formats, ParallelQuantize,
                         ::testing::Values(WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16,
                                           WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4,
                                           WeightFormat::mxfp4, WeightFormat::fp8),
                         [](const auto& info) { return std::string(weight_format_name(info.param)); });

}  // namespace
}  // namespace rp::test
