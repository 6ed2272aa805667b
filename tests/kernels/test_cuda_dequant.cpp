// CUDA dequantization of frozen weights (Ops::dequantize; cuda::dequantize_to for an f32
// output) against the host twin dequantize_weights(): random values quantized on the host,
// the storage bytes uploaded at a byte offset inside a larger buffer (a tensor inside a
// frozen group's storage), dequantized on the device into a NaN-poisoned buffer. Every
// value must equal the host's fp32 value rounded once to the output dtype, bit for bit,
// and the poisoned elements around the output must stay NaN. Parameterised by the output
// dtype: bf16 and f16 are the device's compute dtype; f32 is written by a bf16 device's
// dequantize_to. Skipped when no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"
#include "tests/kernels/test_cuda_util.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace rp {
namespace {

using namespace rp::cudatest;

constexpr WeightFormat kFormats[] = {WeightFormat::f32,  WeightFormat::bf16, WeightFormat::f16,
                                     WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4,
                                     WeightFormat::mxfp4};
constexpr int64_t kTileValues = 8192;  // outputs per thread block of the quantized kernels

std::vector<uint8_t> quantized(WeightFormat f, const VecF& v) {
  std::vector<uint8_t> q(weight_format_bytes(f, int64_t(v.size())));
  quantize_weights(f, v.data(), q.data(), int64_t(v.size()));
  return q;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

class CudaDequant : public CudaTest, public ::testing::WithParamInterface<DType> {
 protected:
  DType dtype() const override { return GetParam() == DType::f16 ? DType::f16 : DType::bf16; }
  DType out() const { return GetParam(); }

  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
#ifndef RP_HAVE_CUDA
    if (out() == DType::f32) GTEST_SKIP() << "f32 output needs cuda::dequantize_to (CUDA build)";
#endif
  }

  /// Device buffer of `total` bytes holding `bytes` at byte `offset`, 0xA5 elsewhere.
  DeviceBuffer upload_at(const std::vector<uint8_t>& bytes, size_t offset, size_t total) {
    std::vector<uint8_t> h(total, 0xA5);
    std::memcpy(h.data() + offset, bytes.data(), bytes.size());
    DeviceBuffer d(dev(), total);
    cs().copy_h2d(d.get(), h.data(), total);
    cs().synchronize();
    return d;
  }

  /// Enqueues the dequantization into the output dtype on the compute stream and waits.
  void dequant(WeightFormat f, const void* src, void* dst, int64_t n) {
    run([&](Ops& o) {
#ifdef RP_HAVE_CUDA
      if (out() == DType::f32) return cuda::dequantize_to(o, f, DType::f32, src, dst, n);
#endif
      o.dequantize(f, src, dst, n);
    });
  }

  /// The fp8 twin of check_case: `rows` rows of `cols` values (row r scaled by scale * 4^(r % 5 - 2),
  /// so rows get different scales; every 7th row all zeros), storage at byte src_off.
  void check_fp8_case(int64_t rows, int64_t cols, size_t src_off, int64_t dst_off, uint32_t seed,
                      float scale = 1.f) {
    const int64_t n = rows * cols;
    VecF v = ref::randn(size_t(n), seed, scale);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v[size_t(r * cols + c)] *= r % 7 == 3 ? 0.f : std::ldexp(1.f, 2 * int(r % 5) - 4);
    std::vector<uint8_t> q(weight_format_bytes(WeightFormat::fp8, n, cols));
    quantize_weights(WeightFormat::fp8, v.data(), q.data(), n, cols);
    DeviceBuffer src = upload_at(q, src_off, src_off + q.size() + 16);
    DT dst = poisoned(dst_off + n + 3, out());
    void* d = static_cast<char*>(dst.get()) + dst_off * dtype_size(out());
    const void* s = static_cast<char*>(src.get()) + src_off;
    run([&](Ops& o) {
#ifdef RP_HAVE_CUDA
      if (out() == DType::f32) return cuda::dequantize_to(o, WeightFormat::fp8, DType::f32, s, d, n, cols);
#endif
      o.dequantize(WeightFormat::fp8, s, d, n, cols);
    });
    VecF want(static_cast<size_t>(n));
    dequantize_weights(WeightFormat::fp8, q.data(), want.data(), n, cols);
    EXPECT_TRUE(matches(download(dst), dst_off, want,
                        std::string("fp8 -> ") + dtype_name(out()) + " " + std::to_string(rows) + " x " +
                            std::to_string(cols) + " src offset " + std::to_string(src_off)));
  }

  /// got (downloaded, out() dtype) holds at [at, at + ref.size()) the host values rounded
  /// to out() bit for bit; the rest of got must still be NaN.
  ::testing::AssertionResult matches(const VecF& got, int64_t at, const VecF& ref, const std::string& what) {
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < ref.size(); ++i)
      if (bits(got[size_t(at) + i]) != bits(round_to(out(), ref[i])) && bad++ == 0) first = int64_t(i);
    if (bad)
      return ::testing::AssertionFailure()
             << what << ": " << bad << " of " << ref.size() << " values differ, first at " << first
             << ": got " << got[size_t(at + first)] << " expected " << round_to(out(), ref[size_t(first)])
             << " (host fp32 " << ref[size_t(first)] << ")";
    for (size_t i = 0; i < got.size(); ++i)
      if ((int64_t(i) < at || int64_t(i) >= at + int64_t(ref.size())) && !std::isnan(got[i]))
        return ::testing::AssertionFailure()
               << what << ": element " << i << " outside the output was written";
    return ::testing::AssertionSuccess();
  }

  /// Quantizes n random values (normal, `scale`) on the host, places the storage at byte
  /// src_off of a device buffer, dequantizes into element dst_off of a poisoned buffer
  /// (with 3 more poisoned elements after it) and compares with dequantize_weights().
  void check_case(WeightFormat f, int64_t n, size_t src_off, int64_t dst_off, uint32_t seed,
                  float scale = 1.f) {
    const VecF v = ref::randn(size_t(n), seed, scale);
    const std::vector<uint8_t> q = quantized(f, v);
    DeviceBuffer src = upload_at(q, src_off, src_off + q.size() + 16);
    DT dst = poisoned(dst_off + n + 3, out());
    dequant(f, static_cast<char*>(src.get()) + src_off,
            static_cast<char*>(dst.get()) + dst_off * dtype_size(out()), n);
    VecF want(static_cast<size_t>(n));
    dequantize_weights(f, q.data(), want.data(), n);
    EXPECT_TRUE(matches(download(dst), dst_off, want,
                        std::string(weight_format_name(f)) + " -> " + dtype_name(out()) +
                            " n=" + std::to_string(n) + " src offset " + std::to_string(src_off) +
                            " dst offset " + std::to_string(dst_off)));
  }
};

// Sizes: one block, a few blocks, more than two kernel tiles with a partial last tile
// (not a multiple of 256 values), about a million values; plain formats odd counts.
TEST_P(CudaDequant, EveryFormatMatchesTheHostBitForBit) {
  uint32_t seed = 1;
  for (WeightFormat f : kFormats) {
    const int64_t b = weight_format_block(f);
    const std::vector<int64_t> ns =
        weight_format_quantized(f)
            ? std::vector<int64_t>{b, 37 * b, (2 * kTileValues / b + 3) * b, ((int64_t(1) << 20) / b + 5) * b}
            : std::vector<int64_t>{1, 7, 1001, 2 * kTileValues + 3, (int64_t(1) << 20) + 3};
    for (int64_t n : ns) {
      check_case(f, n, 0, 0, seed++);
      check_case(f, n, weight_format_bytes(f, b) * 3, 1, seed++);  // 16-bit outputs: unaligned stores
    }
  }
}

// The storage of one tensor may start at any byte of its group's storage: every offset
// modulo 16 (odd ones included), on a few blocks and across tiles.
TEST_P(CudaDequant, SourceAtEveryByteOffset) {
  uint32_t seed = 100;
  for (WeightFormat f : kFormats) {
    const int64_t b = weight_format_block(f);
    for (size_t off = 0; off < 18; ++off) {
      check_case(f, 37 * b, off, 0, seed++);
      const int64_t across_tiles =
          weight_format_quantized(f) ? (2 * kTileValues / b + 1) * b : 3 * kTileValues + 5;
      if (off % 5 == 1) check_case(f, across_tiles, off, 2, seed++);
    }
  }
}

// Tiny values (f16 scales and 16-bit results below the normal range) and large ones.
TEST_P(CudaDequant, TinyAndLargeScales) {
  uint32_t seed = 200;
  for (WeightFormat f : kFormats)
    for (float scale : {1e-4f, 3e-6f, 300.f}) check_case(f, 64 * 41, 2, 0, seed++, scale);
}

// Arbitrary storage bytes (every code, including q8_0's -128 that the quantizer never
// writes) with finite random scales (mxfp4: random exponent bytes as well).
TEST_P(CudaDequant, ArbitraryBlockBytes) {
  std::mt19937 g(7);
  for (WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::mxfp4}) {
    const int64_t b = weight_format_block(f), n = 301 * b;
    const size_t bb = weight_format_bytes(f, b);
    std::vector<uint8_t> q(weight_format_bytes(f, n));
    for (auto& x : q) x = uint8_t(g());
    std::normal_distribution<float> scale(0.f, 0.05f);
    for (size_t blk = 0; blk < q.size() / bb; ++blk) {
      const float s = blk % 7 == 0 ? 0.f : scale(g);
      if (f == WeightFormat::mxfp4) {
        continue;  // every exponent byte is valid (0, 1: subnormal scales; >= 254: infinities)
      } else if (f == WeightFormat::nf4) {
        std::memcpy(&q[blk * bb], &s, 4);
      } else {
        const uint16_t h = f32_to_f16(s);
        std::memcpy(&q[blk * bb], &h, 2);
      }
    }
    DeviceBuffer src = upload_at(q, 10, q.size() + 26);
    DT dst = poisoned(n + 1, out());
    dequant(f, static_cast<char*>(src.get()) + 10, dst.get(), n);
    VecF want(static_cast<size_t>(n));
    dequantize_weights(f, q.data(), want.data(), n);
    EXPECT_TRUE(matches(download(dst), 0, want, std::string(weight_format_name(f)) + " arbitrary bytes"));
  }
}

// A frozen group's storage as freeze_group lays it out (tensors packed back to back, the
// quantized ones in the group's format, 1-D ones in f32), one upload, each tensor
// dequantized into the compute buffer at its element offset (as the runtime does).
TEST_P(CudaDequant, TensorsOfAFrozenGroup) {
  for (WeightFormat f : kFormats) {
    const int64_t b = weight_format_block(f);
    const std::vector<std::pair<WeightFormat, int64_t>> tensors = {{WeightFormat::f32, 3},  {f, 33 * b},
                                                                   {WeightFormat::f32, 96}, {f, 5 * b},
                                                                   {WeightFormat::f32, 1},  {f, 129 * b}};
    std::vector<uint8_t> storage;
    VecF want;
    std::vector<std::pair<size_t, int64_t>> at;  // byte offset, element offset
    uint32_t seed = 300;
    for (auto [tf, n] : tensors) {
      const VecF v = ref::randn(size_t(n), seed++);
      const std::vector<uint8_t> q = quantized(tf, v);
      at.emplace_back(storage.size(), int64_t(want.size()));
      storage.insert(storage.end(), q.begin(), q.end());
      want.resize(want.size() + size_t(n));
      dequantize_weights(tf, q.data(), want.data() + at.back().second, n);
    }
    DeviceBuffer src = upload_at(storage, 0, storage.size());
    DT dst = poisoned(int64_t(want.size()) + 2, out());
    char* d0 = static_cast<char*>(dst.get()) + dtype_size(out());
    run([&](Ops& o) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        const void* s = static_cast<const char*>(src.get()) + at[i].first;
        void* d = d0 + size_t(at[i].second) * dtype_size(out());
#ifdef RP_HAVE_CUDA
        if (out() == DType::f32) {
          cuda::dequantize_to(o, tensors[i].first, DType::f32, s, d, tensors[i].second);
          continue;
        }
#endif
        o.dequantize(tensors[i].first, s, d, tensors[i].second);
      }
    });
    EXPECT_TRUE(matches(download(dst), 1, want, std::string("group of ") + weight_format_name(f)));
  }
}

// fp8 rows (one fp32 scale per row ahead of the codes): shapes from one value to a
// million, odd row lengths, every source byte offset modulo 8 (the scales are read byte by
// byte), tiny and large rows.
TEST_P(CudaDequant, Fp8RowsMatchTheHostBitForBit) {
  uint32_t seed = 500;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {3, 7}, {64, 33}, {37, 1000}, {1024, 1027}, {4096, 256}})
    for (size_t off : {size_t(0), size_t(1), size_t(6)}) check_fp8_case(rows, cols, off, off % 2, seed++);
  for (float scale : {1e-30f, 3e-6f, 3e4f}) check_fp8_case(41, 64, 3, 0, seed++, scale);
  // the 16-byte path (codes on a 16-byte boundary: rows * 4 + offset, row length a multiple of
  // 16, the output aligned) and its near misses (offset 4 or 8 bytes, output 2 elements off)
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{4, 16}, {20, 48}, {128, 2048}, {36, 768}})
    for (auto [off, dst_off] :
         std::vector<std::pair<size_t, int64_t>>{{0, 0}, {16, 8}, {4, 0}, {8, 8}, {0, 2}})
      check_fp8_case(rows, cols, off, dst_off, seed++);
}

// fp8 needs its row length: none, one that does not divide n, or a negative one is refused
// before anything is enqueued.
TEST_P(CudaDequant, Fp8RejectsAMissingRowLength) {
  DT dst = poisoned(256, out());
  DeviceBuffer src(dev(), 4096);
  EXPECT_THROW(ops().dequantize(WeightFormat::fp8, src.get(), dst.get(), 64), std::invalid_argument);
  EXPECT_THROW(ops().dequantize(WeightFormat::fp8, src.get(), dst.get(), 64, 24), std::invalid_argument);
  EXPECT_THROW(ops().dequantize(WeightFormat::fp8, src.get(), dst.get(), 64, -8), std::invalid_argument);
  sync_ok();
  for (float x : download(dst)) ASSERT_TRUE(std::isnan(x));
}

// Bad arguments throw std::invalid_argument before anything is enqueued; the output stays
// poisoned.
TEST_P(CudaDequant, RejectsBadArgumentsBeforeWriting) {
  DT dst = poisoned(256, out());
  DeviceBuffer src(dev(), 4096);
  auto call = [&](WeightFormat f, int64_t n, DType t) {
#ifdef RP_HAVE_CUDA
    if (t != ct()) return cuda::dequantize_to(ops(), f, t, src.get(), dst.get(), n);
#endif
    ops().dequantize(f, src.get(), dst.get(), n);
  };
  EXPECT_THROW(call(WeightFormat::q8_0, 33, out()), std::invalid_argument);
  EXPECT_THROW(call(WeightFormat::q4_0, 48, out()), std::invalid_argument);
  EXPECT_THROW(call(WeightFormat::nf4, 96, out()), std::invalid_argument);
  EXPECT_THROW(call(WeightFormat::f16, -1, out()), std::invalid_argument);
  EXPECT_THROW(call(WeightFormat(17), 64, out()), std::invalid_argument);
  try {
    call(WeightFormat::nf4, 100, out());
    ADD_FAILURE() << "nf4 with 100 values did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nf4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
#ifdef RP_HAVE_CUDA
  EXPECT_THROW(cuda::dequantize_to(ops(), WeightFormat::q8_0, DType::i32, src.get(), dst.get(), 32),
               std::invalid_argument);
#endif
  call(WeightFormat::q4_0, 0, out());  // nothing to do
  sync_ok();
  for (float x : download(dst)) ASSERT_TRUE(std::isnan(x));
}

// dequantize_many over the tensors of a mixture-of-experts-like group: 40 fp8 experts on the
// 16-byte path (more than one launch's 32), block-format tensors with aligned outputs (batched
// per format run), and the parts that go one by one (fp8 rows of 33 values, an output 2
// elements off a 16-byte boundary, a plain bf16 tensor). Every value must equal the host's, bit
// for bit, and the poisoned elements between the outputs must stay NaN.
TEST_P(CudaDequant, ManyPartsMatchTheHostBitForBit) {
  if (out() != dtype()) GTEST_SKIP() << "dequantize_many writes the compute dtype";
  struct Spec {
    WeightFormat f;
    int64_t rows, cols;  // cols: fp8's row length (0: a flat tensor of rows values)
    int64_t dst_skew;    // elements past the 8-element (16-byte) boundary of the output
  };
  std::vector<Spec> specs;
  for (int e = 0; e < 40; ++e) specs.push_back({WeightFormat::fp8, 3 + 7 * (e % 6), 16 * (1 + e % 5), 0});
  specs.push_back({WeightFormat::fp8, 5, 33, 0});
  specs.push_back({WeightFormat::q4_0, 33 * 32, 0, 0});
  specs.push_back({WeightFormat::q4_0, 300 * 32, 0, 0});
  specs.push_back({WeightFormat::q4_0, 5 * 32, 0, 2});
  specs.push_back({WeightFormat::nf4, 129 * 64, 0, 0});
  specs.push_back({WeightFormat::bf16, 77, 0, 0});
  specs.push_back({WeightFormat::q8_0, 7 * 32, 0, 0});
  specs.push_back({WeightFormat::mxfp4, 260 * 32, 0, 0});
  specs.push_back({WeightFormat::fp8, 36, 768, 0});
  std::vector<uint8_t> storage;
  std::vector<size_t> src_at;
  std::vector<int64_t> dst_at, count;
  VecF want;
  int64_t out_len = 0;
  uint32_t seed = 900;
  for (const Spec& sp : specs) {
    const int64_t n = sp.cols > 0 ? sp.rows * sp.cols : sp.rows;
    const VecF v = ref::randn(size_t(n), seed++);
    std::vector<uint8_t> q(weight_format_bytes(sp.f, n, sp.cols));
    quantize_weights(sp.f, v.data(), q.data(), n, sp.cols);
    size_t at = storage.size();
    if (sp.f == WeightFormat::fp8)  // codes (after rows * 4 bytes of scales) on a 16-byte boundary
      while ((at + size_t(sp.rows) * 4) % 16 != 0) ++at;
    storage.resize(at, 0xA5);
    storage.insert(storage.end(), q.begin(), q.end());
    src_at.push_back(at);
    out_len = (out_len + 8 + 7) / 8 * 8 + sp.dst_skew;  // at least 8 poisoned elements apart
    dst_at.push_back(out_len);
    count.push_back(n);
    want.resize(size_t(out_len + n), std::numeric_limits<float>::quiet_NaN());
    dequantize_weights(sp.f, q.data(), want.data() + out_len, n, sp.cols);
    out_len += n;
  }
  want.resize(size_t(out_len + 5), std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer src = upload_at(storage, 0, storage.size());
  DT dst = poisoned(int64_t(want.size()), out());
  std::vector<DequantPart> parts;
  for (size_t i = 0; i < specs.size(); ++i)
    parts.push_back({specs[i].f, static_cast<const char*>(src.get()) + src_at[i],
                     static_cast<char*>(dst.get()) + size_t(dst_at[i]) * dtype_size(out()), count[i],
                     specs[i].cols});
  run([&](Ops& o) { o.dequantize_many(parts.data(), int64_t(parts.size())); });
  const VecF got = download(dst);
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool ok = std::isnan(want[i]) ? std::isnan(got[i]) : bits(got[i]) == bits(round_to(out(), want[i]));
    if (!ok && bad++ < 3) ADD_FAILURE() << "element " << i << ": got " << got[i] << " expected " << want[i];
  }
  EXPECT_EQ(bad, 0) << "of " << want.size() << " elements";
}

// A bad part anywhere in the list throws before any part is enqueued.
TEST_P(CudaDequant, ManyPartsCheckEveryPartFirst) {
  if (out() != dtype()) GTEST_SKIP() << "dequantize_many writes the compute dtype";
  DT dst = poisoned(512, out());
  DeviceBuffer src(dev(), 8192);
  std::vector<DequantPart> parts = {
      {WeightFormat::q4_0, src.get(), dst.get(), 64, 0},
      {WeightFormat::nf4, src.get(), static_cast<char*>(dst.get()) + 256, 100, 0}};
  EXPECT_THROW(ops().dequantize_many(parts.data(), 2), std::invalid_argument);
  parts[1] = {WeightFormat::fp8, src.get(), static_cast<char*>(dst.get()) + 256, 64, 24};
  EXPECT_THROW(ops().dequantize_many(parts.data(), 2), std::invalid_argument);
  sync_ok();
  for (float x : download(dst)) ASSERT_TRUE(std::isnan(x));
}

INSTANTIATE_TEST_SUITE_P(Out, CudaDequant, ::testing::Values(DType::bf16, DType::f16, DType::f32),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace rp
