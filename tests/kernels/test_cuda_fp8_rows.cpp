// The CUDA backend's FP8 ops with per-row scales against their CPU twins
// (kernels/cpu/cpu_fp8.cpp): gemm_fp8_rows (cuBLASLt's outer-vector scales) exactly on
// integer-valued operands and power-of-two scales, within the FP8 GEMM's accumulation bound
// otherwise; fp8_quantize_rows_col_scaled bit for bit; transpose_bytes exactly. Skipped,
// saying so, without a GPU, and the GEMM tests where cuBLASLt refuses outer-vector scales
// (gemm_fp8_rows_supported() false: the layers then keep the tensor-scale path).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp8.hpp"
#include "tests/kernels/fp8_ref.hpp"
#include "tests/kernels/test_cuda_fixtures.hpp"

namespace rp::cudatest {
namespace {

using Codes = std::vector<uint8_t>;
constexpr Fp8Format E4 = Fp8Format::e4m3;

class CudaFp8Rows : public CudaOpsTest {
 protected:
  // the GEMM needs FP8 tensor cores and cuBLASLt's outer-vector scale mode
  bool rows_supported() {
    const bool ok = ops().gemm_fp8_rows_supported();
    std::printf("[ info ] gemm_fp8_rows_supported() on %s: %s\n", dev().name().c_str(), ok ? "yes" : "no");
    return ok;
  }
};

// Integer-valued codes and power-of-two row scales: every partial sum is exact, so the GPU
// equals the CPU twin's exact result rounded once to the output dtype; the scales differ per row and per
// column, so a swapped or ignored scale vector shows.
TEST_F(CudaFp8Rows, GemmIsExactOnSmallIntegers) {
  if (!rows_supported()) GTEST_SKIP() << "cuBLASLt offers no FP8 GEMM with outer-vector scales here";
  const int64_t M = 48, K = 64, N = 32;
  for (bool acc : {false, true}) {
    std::mt19937 g(acc ? 7 : 6);
    std::uniform_int_distribution<int> v(-2, 2), e(-3, 2), cv(-8, 8);
    Codes a(size_t(M * K)), b(size_t(N * K));
    for (auto& c : a) c = fp8::encode(E4, float(v(g)));
    for (auto& c : b) c = fp8::encode(E4, float(v(g)));
    VecF sa(static_cast<size_t>(M)), sb(static_cast<size_t>(N)), d0(size_t(M * N));
    for (auto& s : sa) s = std::exp2(float(e(g)));
    for (auto& s : sb) s = std::exp2(float(e(g)));
    for (auto& x : d0) x = acc ? float(cv(g)) : std::nanf("");
    DT ad = upload_bytes(a), bd = upload_bytes(b), sad = upload(sa, DType::f32), sbd = upload(sb, DType::f32);
    DT dd = acc ? upload(d0, ct()) : poisoned(M * N, ct());
    run([&](Ops& o) {
      o.gemm_fp8_rows(ad.as<uint8_t>(), E4, sad.as<float>(), bd.as<uint8_t>(), E4, sbd.as<float>(), dd.get(),
                      M, K, N, acc);
    });
    VecF want = d0;
    cpu_->gemm_fp8_rows(a.data(), E4, sa.data(), b.data(), E4, sb.data(), want.data(), M, K, N, acc);
    // the fp32 CPU twin's sums are exact; the GPU rounds D (d0 + the product) once to ct()
    want = rounded(ct(), want);
    const VecF got = download(dd);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < M * N; ++i)
      if (got[size_t(i)] != want[size_t(i)] && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0) << (acc ? "accumulate" : "overwrite") << ": first at (" << first / N << ", "
                      << first % N << "): GPU " << (first >= 0 ? got[size_t(first)] : 0.f) << ", CPU "
                      << (first >= 0 ? want[size_t(first)] : 0.f)
                      << (acc ? ", d0 " + std::to_string(first >= 0 ? d0[size_t(first)] : 0.f)
                              : std::string());
  }
}

// Random codes and scales: the GPU's fp32 sums differ from the CPU's by their order and by
// the tensor cores' reduced-precision addition inside each 128-element k-block (the bound of
// test_cuda_fp8.cpp's GemmWithinItsAccumulationBound: (K 2^-24 + ceil(K/128) 2^-12) of
// sum |a b| times the scales), then one rounding to bf16.
TEST_F(CudaFp8Rows, GemmWithinItsAccumulationBound) {
  if (!rows_supported()) GTEST_SKIP() << "cuBLASLt offers no FP8 GEMM with outer-vector scales here";
  const int64_t M = 64, K = 1024, N = 96;
  std::mt19937 g(12);
  std::normal_distribution<float> d(0.f, 3.f);
  std::uniform_real_distribution<float> e(-10.f, 2.f);
  Codes a(size_t(M * K)), b(size_t(N * K));
  for (auto& c : a) c = fp8::encode(E4, d(g));
  for (auto& c : b) c = fp8::encode(E4, d(g));
  VecF sa(static_cast<size_t>(M)), sb(static_cast<size_t>(N));
  for (auto& s : sa) s = std::exp2(e(g));
  for (auto& s : sb) s = std::exp2(e(g));
  DT ad = upload_bytes(a), bd = upload_bytes(b), sad = upload(sa, DType::f32), sbd = upload(sb, DType::f32);
  DT dd = poisoned(M * N, ct());
  run([&](Ops& o) {
    o.gemm_fp8_rows(ad.as<uint8_t>(), E4, sad.as<float>(), bd.as<uint8_t>(), E4, sbd.as<float>(), dd.get(), M,
                    K, N, false);
  });
  VecF c(size_t(M * N));
  cpu_->gemm_fp8_rows(a.data(), E4, sa.data(), b.data(), E4, sb.data(), c.data(), M, K, N, false);
  const VecF got = download(dd);
  const double rel = double(K) * std::ldexp(1.0, -24) + double((K + 127) / 128) * std::ldexp(1.0, -12);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double mag = 0;
      for (int64_t k = 0; k < K; ++k)
        mag +=
            std::fabs(double(fp8::decode(E4, a[size_t(m * K + k)])) * fp8::decode(E4, b[size_t(n * K + k)]));
      const double e_ = rel * mag * double(sa[size_t(m)]) * double(sb[size_t(n)]);
      const float ci = c[size_t(m * N + n)], gi = got[size_t(m * N + n)];
      const float lo = round_to(ct(), float(ci - e_)), hi = round_to(ct(), float(ci + e_));
      ASSERT_TRUE(gi >= lo && gi <= hi) << "(" << m << "," << n << "): GPU " << gi << ", CPU " << ci
                                        << ", allowed [" << lo << ", " << hi << "]";
    }
}

// Codes and row scales of x * col_scale from bf16 inputs equal the CPU twin's bit for bit
// (odd widths, a zero row; e4m3 and e5m2): rows the vectorized kernel holds in registers (one and
// two chunks a thread, up to 4,096 values), wider rows (LLaMA-8B's 14,336 among them: the scalar
// kernel, or without column scales the two row passes), widths off the 8-value grid, and x 2
// bytes off alignment; with column scales and without them (then the codes and scales of
// fp8_scale_rows and fp8_quantize_rows).
TEST_F(CudaFp8Rows, ColumnScaledRowCodesEqualTheCpuTwin) {
  struct Case {
    int64_t rows, cols, offset;
    Fp8Format f;
  };
  for (auto [rows, cols, offset, fmt] : {Case{7, 1000, 0, E4},
                                         {33, 48, 0, E4},
                                         {64, 2048, 0, E4},
                                         {1, 5, 0, E4},
                                         {5, 4096, 0, Fp8Format::e5m2},
                                         {4, 14336, 0, E4},
                                         {3, 16384, 0, E4},
                                         {2, 16392, 0, E4},
                                         {3, 2056, 1, E4},
                                         {9, 3000, 0, Fp8Format::e5m2}}) {
    VecF x = fp8ref::normal_with_outliers(size_t(rows * cols), uint32_t(rows * cols)),
         colsc(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) colsc[size_t(c)] = std::exp2(float(c % 11) - 8.f) * 1.3f;
    if (rows > 2)
      for (int64_t c = 0; c < cols; ++c) x[size_t(cols + c)] = 0.f;
    // with an offset, x starts `offset` elements into the upload (off the 16-byte grid)
    VecF padded(size_t(offset), 0.f);
    padded.insert(padded.end(), x.begin(), x.end());
    DT xd = upload(padded, ct()), csd = upload(colsc, DType::f32), sd = poisoned(rows, DType::f32);
    DT qd = alloc((rows * cols + 3) / 4 + 1, DType::i32);
    const void* xin = static_cast<const char*>(xd.get()) + offset * int64_t(dtype_size(ct()));
    run([&](Ops& o) {
      o.fp8_quantize_rows_col_scaled(xin, csd.as<float>(), qd.as<uint8_t>(), sd.as<float>(), rows, cols, fmt);
    });
    VecF xr = download(xd);  // the bf16-rounded inputs the GPU read
    xr.erase(xr.begin(), xr.begin() + offset);
    Codes cq(size_t(rows * cols));
    VecF cs_(static_cast<size_t>(rows));
    cpu_->fp8_quantize_rows_col_scaled(xr.data(), colsc.data(), cq.data(), cs_.data(), rows, cols, fmt);
    const VecF gs = download(sd);
    const Codes gq = download_bytes(qd.get(), rows * cols);
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(gs[size_t(r)], cs_[size_t(r)]) << what << " row " << r;
    for (int64_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(int(gq[size_t(i)]), int(cq[size_t(i)])) << what << " " << i;
    // without column scales: fp8_scale_rows' scales and fp8_quantize_rows' codes (CPU twin)
    run([&](Ops& o) {
      o.fp8_quantize_rows_col_scaled(xin, nullptr, qd.as<uint8_t>(), sd.as<float>(), rows, cols, fmt);
    });
    cpu_->fp8_scale_rows(xr.data(), rows, cols, fmt, cs_.data());
    cpu_->fp8_quantize_rows(xr.data(), cs_.data(), cq.data(), rows, cols, fmt);
    const VecF gs1 = download(sd);
    const Codes gq1 = download_bytes(qd.get(), rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(gs1[size_t(r)], cs_[size_t(r)]) << what << " plain row " << r;
    for (int64_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(int(gq1[size_t(i)]), int(cq[size_t(i)])) << what << " plain " << i;
  }
}

TEST_F(CudaFp8Rows, TransposeBytesEqualsTheCpuTwin) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {63, 65}, {128, 64}, {300, 17}, {2048, 896}}) {
    Codes src(size_t(rows * cols));
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t((i * 2654435761u) >> 13);
    DT sd = upload_bytes(src), dd = alloc((rows * cols + 3) / 4 + 1, DType::i32);
    run([&](Ops& o) { o.transpose_bytes(sd.as<uint8_t>(), dd.as<uint8_t>(), rows, cols); });
    Codes want(src.size());
    cpu_->transpose_bytes(src.data(), want.data(), rows, cols);
    EXPECT_EQ(download_bytes(dd.get(), rows * cols), want) << rows << "x" << cols;
  }
}

}  // namespace
}  // namespace rp::cudatest
