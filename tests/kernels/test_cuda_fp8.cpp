// The CUDA backend's FP8 ops against their CPU twins (kernels/cpu/cpu_fp8.cpp): scales and
// codes bit for bit (random bf16 inputs with outliers, odd sizes, misaligned starts, NaN-
// poisoned outputs, non-finite inputs), the conversion code against the GPU's own cvt
// instructions over every fp32 value, and the FP8 GEMM (exactly on integer-valued operands;
// within the bound of its accumulation otherwise). Skipped, saying so, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp8.hpp"
#include "tests/kernels/fp8_ref.hpp"
#include "tests/kernels/test_cuda_fixtures.hpp"
#ifdef RP_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace rp::cudatest {
namespace {

using Codes = std::vector<uint8_t>;

class CudaFp8 : public CudaOpsTest {
 protected:
  DT bytes(int64_t n, uint8_t fill) {
    DT d = alloc((n + 3) / 4 + 1, DType::i32);
    Codes h(size_t(d.n) * 4, fill);
    cs().copy_h2d(d.get(), h.data(), h.size());
    cs().synchronize();
    return d;
  }
  // scale bits equal (NaN: both NaN)
  static bool same_scale(float a, float b) {
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y || (std::isnan(a) && std::isnan(b));
  }
  // the GEMM refuses (rp::DeviceError) without FP8 tensor cores; quantization runs everywhere
  bool fp8_capable() { return gemm_probe(); }
  bool gemm_probe() {
    try {
      DT a = bytes(256, 0), s = upload_scale(1.f), d = poisoned(256, ct());
      ops().gemm_fp8(a.as<uint8_t>(), Fp8Format::e4m3, s.as<float>(), a.as<uint8_t>(), Fp8Format::e4m3,
                     s.as<float>(), d.get(), 16, 16, 16, false);
      sync_ok();
      return true;
    } catch (const DeviceError&) {
      return false;
    }
  }
  DT upload_scale(float s) {
    VecF v{s};
    return upload(v, DType::f32);
  }
};

#ifdef RP_HAVE_CUDA
// fp8::encode / decode equal the hardware's conversions on every fp32 input and every code.
TEST_F(CudaFp8, SharedConversionEqualsTheHardwareOnEveryFloat) {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const cuda::Fp8ConversionCheck r = cuda::check_fp8_conversions(ops(), f);
    EXPECT_EQ(r.encode_mismatches, 0u)
        << fp8_format_name(f) << ": first mismatch at fp32 bits 0x" << std::hex << r.first_mismatch_bits;
    EXPECT_EQ(r.decode_mismatches, 0u) << fp8_format_name(f);
    std::printf(
        "[ info ] %s: %llu NaN inputs got another NaN code than the hardware's (codes compared for NaN-ness "
        "only)\n",
        fp8_format_name(f), (unsigned long long)r.nan_code_differences);
  }
}
#endif

// Scales (per tensor, per row) and codes (both variants) from bf16 inputs equal the CPU
// twin's on the same (bf16-rounded) values, bit for bit.
TEST_F(CudaFp8, ScalesAndCodesEqualTheCpuTwin) {
  struct Shape {
    int64_t rows, cols, offset;  // offset: elements the tensor starts past a 256-byte boundary
  } shapes[] = {{64, 2048, 0}, {33, 1000, 0}, {17, 48, 1}, {1, 7, 3}, {128, 6144, 0}};
  for (const Shape& sh : shapes)
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const int64_t n = sh.rows * sh.cols;
      VecF x = fp8ref::normal_with_outliers(size_t(n + sh.offset), uint32_t(n + sh.offset));
      DT xd = upload(x, ct());
      const void* xp = static_cast<const char*>(xd.get()) + sh.offset * int64_t(dtype_size(ct()));
      const float* xh = x.data() + sh.offset;
      DT s = poisoned(1, DType::f32), rs = poisoned(sh.rows, DType::f32);
      DT q = bytes(n + 1, 0xab), qr = bytes(n + 1, 0xab);
      uint8_t* qp = q.as<uint8_t>() + (sh.offset ? 1 : 0);  // a misaligned output with the misaligned input
      run([&](Ops& o) {
        o.fp8_scale(xp, n, f, s.as<float>());
        o.fp8_scale_rows(xp, sh.rows, sh.cols, f, rs.as<float>());
        o.fp8_quantize(xp, s.as<float>(), qp, n, f);
        o.fp8_quantize_rows(xp, rs.as<float>(), qr.as<uint8_t>(), sh.rows, sh.cols, f);
      });
      float cs_ = 0;
      VecF crs(size_t(sh.rows));
      Codes cq(static_cast<size_t>(n)), cqr(static_cast<size_t>(n));
      cpu_->fp8_scale(xh, n, f, &cs_);
      cpu_->fp8_scale_rows(xh, sh.rows, sh.cols, f, crs.data());
      cpu_->fp8_quantize(xh, &cs_, cq.data(), n, f);
      cpu_->fp8_quantize_rows(xh, crs.data(), cqr.data(), sh.rows, sh.cols, f);
      const std::string what = std::string(fp8_format_name(f)) + " " + std::to_string(sh.rows) + "x" +
                               std::to_string(sh.cols) + " +" + std::to_string(sh.offset);
      const VecF gs = download(s), grs = download(rs);
      EXPECT_TRUE(same_scale(gs[0], cs_)) << what << ": " << gs[0] << " vs " << cs_;
      for (int64_t r = 0; r < sh.rows; ++r)
        ASSERT_TRUE(same_scale(grs[size_t(r)], crs[size_t(r)])) << what << " row " << r;
      const Codes gq = download_bytes(qp, n), gqr = download_bytes(qr.get(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(int(gq[size_t(i)]), int(cq[size_t(i)])) << what << " element " << i;
        ASSERT_EQ(int(gqr[size_t(i)]), int(cqr[size_t(i)])) << what << " (rows) element " << i;
      }
      EXPECT_EQ(int(download_bytes(qp + n, 1)[0]), 0xab) << what << ": wrote past the end";
    }
}

// Codes of x^T equal the CPU twin's: the tiled path (multiples of 64, aligned) and the
// element-wise one (other shapes, a misaligned start).
TEST_F(CudaFp8, TransposedCodesEqualTheCpuTwin) {
  struct Shape {
    int64_t rows, cols, offset;
  } shapes[] = {{128, 192, 0}, {64, 64, 0}, {2048, 1024, 0}, {33, 50, 0}, {128, 64, 1}};
  for (const Shape& sh : shapes)
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const int64_t n = sh.rows * sh.cols;
      VecF x = fp8ref::normal_with_outliers(size_t(n + sh.offset), uint32_t(n + 3));
      DT xd = upload(x, ct());
      const void* xp = static_cast<const char*>(xd.get()) + sh.offset * int64_t(dtype_size(ct()));
      DT s = poisoned(1, DType::f32), q = bytes(n + 1, 0xab);
      run([&](Ops& o) {
        o.fp8_scale(xp, n, f, s.as<float>());
        o.fp8_quantize_transposed(xp, s.as<float>(), q.as<uint8_t>(), sh.rows, sh.cols, f);
      });
      float cs_ = 0;
      Codes cq(static_cast<size_t>(n));
      cpu_->fp8_scale(x.data() + sh.offset, n, f, &cs_);
      cpu_->fp8_quantize_transposed(x.data() + sh.offset, &cs_, cq.data(), sh.rows, sh.cols, f);
      const Codes gq = download_bytes(q.get(), n + 1);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(int(gq[size_t(i)]), int(cq[size_t(i)])) << fp8_format_name(f) << " " << sh.rows << "x"
                                                          << sh.cols << " +" << sh.offset << " element " << i;
      EXPECT_EQ(int(gq[size_t(n)]), 0xab) << "wrote past the end";
    }
}

// The padded form (a weight gradient's operands): the same codes ld apart, zero codes in the
// padding, nothing written past cols * ld; tile and scalar paths (ld a multiple of 16 or not).
TEST_F(CudaFp8, PaddedTransposedCodesEqualTheCpuTwin) {
  struct Shape {
    int64_t rows, cols, ld;
  } shapes[] = {{128, 192, 128}, {128, 64, 144}, {100, 48, 112}, {33, 50, 40}, {2048, 256, 2064}};
  for (const Shape& sh : shapes)
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const int64_t n = sh.rows * sh.cols, m = sh.cols * sh.ld;
      VecF x = fp8ref::normal_with_outliers(size_t(n), uint32_t(n + 7));
      DT xd = upload(x, ct());
      DT s = poisoned(1, DType::f32), q = bytes(m + 1, 0xab);
      run([&](Ops& o) {
        o.fp8_scale(xd.get(), n, f, s.as<float>());
        o.fp8_quantize_transposed_padded(xd.get(), s.as<float>(), q.as<uint8_t>(), sh.rows, sh.cols, sh.ld,
                                         f);
      });
      float cs_ = 0;
      Codes cq(static_cast<size_t>(m), 0xcd);
      cpu_->fp8_scale(x.data(), n, f, &cs_);
      cpu_->fp8_quantize_transposed_padded(x.data(), &cs_, cq.data(), sh.rows, sh.cols, sh.ld, f);
      const Codes gq = download_bytes(q.get(), m + 1);
      for (int64_t i = 0; i < m; ++i)
        ASSERT_EQ(int(gq[size_t(i)]), int(cq[size_t(i)]))
            << fp8_format_name(f) << " " << sh.rows << "x" << sh.cols << " ld " << sh.ld << " element " << i;
      EXPECT_EQ(int(gq[size_t(m)]), 0xab) << "wrote past the end";
    }
}

// Both layouts from one pass (a weight gradient's dy): the row codes equal fp8_quantize's and
// the padded transposed codes fp8_quantize_transposed_padded's on the CPU, bit for bit, on the
// fused tile path (rows and cols multiples of 64) and on the two-kernel fallback; nothing is
// written past either output.
TEST_F(CudaFp8, BothLayoutsEqualTheCpuTwin) {
  struct Shape {
    int64_t rows, cols, ld;
  } shapes[] = {{128, 192, 144}, {2048, 256, 2064}, {192, 64, 192}, {100, 48, 112}, {33, 50, 40}};
  for (const Shape& sh : shapes)
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const int64_t n = sh.rows * sh.cols, m = sh.cols * sh.ld;
      VecF x = fp8ref::normal_with_outliers(size_t(n), uint32_t(n + 11));
      DT xd = upload(x, ct());
      DT s = poisoned(1, DType::f32), q = bytes(n + 1, 0xab), qt = bytes(m + 1, 0xab);
      run([&](Ops& o) {
        o.fp8_scale(xd.get(), n, f, s.as<float>());
        o.fp8_quantize_both(xd.get(), s.as<float>(), q.as<uint8_t>(), qt.as<uint8_t>(), sh.rows, sh.cols,
                            sh.ld, f);
      });
      float cs_ = 0;
      Codes cq(static_cast<size_t>(n), 0xcd), cqt(static_cast<size_t>(m), 0xcd);
      cpu_->fp8_scale(x.data(), n, f, &cs_);
      cpu_->fp8_quantize(x.data(), &cs_, cq.data(), n, f);
      cpu_->fp8_quantize_transposed_padded(x.data(), &cs_, cqt.data(), sh.rows, sh.cols, sh.ld, f);
      const Codes gq = download_bytes(q.get(), n + 1), gqt = download_bytes(qt.get(), m + 1);
      const std::string what = std::string(fp8_format_name(f)) + " " + std::to_string(sh.rows) + "x" +
                               std::to_string(sh.cols) + " ld " + std::to_string(sh.ld);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(int(gq[size_t(i)]), int(cq[size_t(i)])) << what << " row code " << i;
      for (int64_t i = 0; i < m; ++i)
        ASSERT_EQ(int(gqt[size_t(i)]), int(cqt[size_t(i)])) << what << " transposed code " << i;
      EXPECT_EQ(int(gq[size_t(n)]), 0xab) << what << ": wrote past the row codes";
      EXPECT_EQ(int(gqt[size_t(m)]), 0xab) << what << ": wrote past the transposed codes";
    }
}

// Zeros give scale 1, an inf an inf scale, a NaN a NaN scale, on both backends alike; the
// codes under those scales agree too (all NaN codes under a NaN scale).
TEST_F(CudaFp8, NonFiniteAndZeroTensors) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int which = 0; which < 3; ++which) {
    VecF x(1000, 0.f);
    if (which >= 1) x[123] = -inf, x[5] = 2.f;
    if (which == 2) x[700] = nan;
    DT xd = upload(x, ct());
    DT s = poisoned(1, DType::f32), q = bytes(1000, 0xab);
    run([&](Ops& o) {
      o.fp8_scale(xd.get(), 1000, Fp8Format::e4m3, s.as<float>());
      o.fp8_quantize(xd.get(), s.as<float>(), q.as<uint8_t>(), 1000, Fp8Format::e4m3);
    });
    float cs_ = 0;
    Codes cq(1000);
    cpu_->fp8_scale(x.data(), 1000, Fp8Format::e4m3, &cs_);
    cpu_->fp8_quantize(x.data(), &cs_, cq.data(), 1000, Fp8Format::e4m3);
    const float gs = download(s)[0];
    EXPECT_TRUE(same_scale(gs, cs_)) << which << ": " << gs << " vs " << cs_;
    if (which == 0) {
      EXPECT_EQ(gs, 1.f);
    } else if (which == 1) {
      EXPECT_EQ(gs, inf);
    } else {
      EXPECT_TRUE(std::isnan(gs));
    }
    EXPECT_EQ(download_bytes(q.get(), 1000), cq) << which;
  }
}

// rmsnorm_fwd_fp8_rows: y equals rmsnorm_fwd's bit for bit, and the row scales and codes equal
// the CPU twin's fp8_scale_rows and fp8_quantize_rows over the stored y. Rows in the norm's
// registers (512-4096 values on the 8-value grid; e4m3 and e5m2, a zero row, a NaN) and rows
// that take the separate ops (too short, too long, off the grid).
TEST_F(CudaFp8, NormRowCodesEqualTheSeparateOps) {
  struct Shape {
    int64_t rows, cols;
  } shapes[] = {{64, 2048}, {40, 4096}, {17, 520}, {33, 100}, {8, 4104}, {6, 1028}};
  const float eps = 1e-6f, nan = std::numeric_limits<float>::quiet_NaN();
  for (const Shape& sh : shapes)
    for (int poison = 0; poison < 3; ++poison) {  // 0 random, 1 a zero row, 2 one NaN
      const int64_t n = sh.rows * sh.cols;
      VecF x = fp8ref::normal_with_outliers(size_t(n), uint32_t(n + 3 * poison));
      VecF w = fp8ref::normal_with_outliers(size_t(sh.cols), 11);
      if (poison == 1) std::fill(x.begin() + sh.cols, x.begin() + 2 * sh.cols, 0.f);
      if (poison == 2) x[size_t(n / 2)] = nan;
      const Fp8Format f = poison == 1 ? Fp8Format::e5m2 : Fp8Format::e4m3;
      DT xd = upload(x, ct()), wd = upload(w, ct());
      DT y1 = poisoned(n, ct()), y2 = poisoned(n, ct()), sd = poisoned(sh.rows, DType::f32);
      DT qd = alloc(n / 4 + 2, DType::i32);
      run([&](Ops& o) {
        o.rmsnorm_fwd_fp8_rows(xd.get(), wd.get(), y1.get(), sh.rows, sh.cols, eps, f, qd.as<uint8_t>(),
                               sd.as<float>());
        o.rmsnorm_fwd(xd.get(), wd.get(), y2.get(), sh.rows, sh.cols, eps);
      });
      const std::string what =
          std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " input " + std::to_string(poison);
      const VecF gy1 = download(y1), gy2 = download(y2), gs = download(sd);
      for (size_t i = 0; i < gy1.size(); ++i)
        ASSERT_TRUE(same_scale(gy1[i], gy2[i])) << what << ": y at " << i;
      VecF cs(static_cast<size_t>(sh.rows));
      std::vector<uint8_t> cq(static_cast<size_t>(n));
      cpu_->fp8_scale_rows(gy2.data(), sh.rows, sh.cols, f, cs.data());
      cpu_->fp8_quantize_rows(gy2.data(), cs.data(), cq.data(), sh.rows, sh.cols, f);
      for (int64_t r = 0; r < sh.rows; ++r)
        ASSERT_TRUE(same_scale(gs[size_t(r)], cs[size_t(r)]))
            << what << ": row " << r << " scale " << gs[size_t(r)] << " vs " << cs[size_t(r)];
      const std::vector<uint8_t> gq = download_bytes(qd.get(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(int(gq[size_t(i)]), int(cq[size_t(i)])) << what << ": code " << i;
    }
}

// The producers that reduce max |y| inside their own pass (rmsnorm_fwd_fp8_scale,
// swiglu_fwd_fp8_scale): y equals the plain kernel's bit for bit, and the scale equals the
// CPU twin's fp8_scale over the stored y (so also the separate fp8_scale pass's). Vectorized
// and scalar paths, one and many rows per warp, an all-zero and a NaN-poisoned input.
TEST_F(CudaFp8, FusedProducerScalesEqualTheSeparatePass) {
  struct Shape {
    int64_t rows, cols;
  } shapes[] = {{64, 2048}, {1000, 128}, {33, 100}, {5, 7}, {40, 5120}};
  const float eps = 1e-6f, nan = std::numeric_limits<float>::quiet_NaN();
  for (const Shape& sh : shapes)
    for (int poison = 0; poison < 3; ++poison) {  // 0 random, 1 all zero, 2 one NaN
      const int64_t n = sh.rows * sh.cols;
      VecF x = fp8ref::normal_with_outliers(size_t(n), uint32_t(n + poison)),
           u = fp8ref::normal_with_outliers(size_t(n), 7);
      VecF w = fp8ref::normal_with_outliers(size_t(sh.cols), 9);
      if (poison == 1) std::fill(x.begin(), x.end(), 0.f);
      if (poison == 2) x[size_t(n / 2)] = nan;
      DT xd = upload(x, ct()), ud = upload(u, ct()), wd = upload(w, ct());
      DT y1 = poisoned(n, ct()), y2 = poisoned(n, ct()), h1 = poisoned(n, ct()), h2 = poisoned(n, ct());
      DT s1 = poisoned(1, DType::f32), s2 = poisoned(1, DType::f32), t1 = poisoned(1, DType::f32),
         t2 = poisoned(1, DType::f32);
      const Fp8Format f = poison == 1 ? Fp8Format::e5m2 : Fp8Format::e4m3;
      run([&](Ops& o) {
        o.rmsnorm_fwd_fp8_scale(xd.get(), wd.get(), y1.get(), sh.rows, sh.cols, eps, f, s1.as<float>());
        o.rmsnorm_fwd(xd.get(), wd.get(), y2.get(), sh.rows, sh.cols, eps);
        o.fp8_scale(y2.get(), n, f, s2.as<float>());
        o.swiglu_fwd_fp8_scale(xd.get(), ud.get(), h1.get(), n, f, t1.as<float>());
        o.swiglu_fwd(xd.get(), ud.get(), h2.get(), n);
        o.fp8_scale(h2.get(), n, f, t2.as<float>());
      });
      const std::string what =
          std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " input " + std::to_string(poison);
      const VecF gy1 = download(y1), gy2 = download(y2), gh1 = download(h1), gh2 = download(h2);
      for (size_t i = 0; i < gy1.size(); ++i) {
        ASSERT_TRUE(same_scale(gy1[i], gy2[i])) << what << ": y differs at " << i;
        ASSERT_TRUE(same_scale(gh1[i], gh2[i])) << what << ": h differs at " << i;
      }
      float cy = 0, ch = 0;
      cpu_->fp8_scale(gy1.data(), n, f, &cy);
      cpu_->fp8_scale(gh1.data(), n, f, &ch);
      EXPECT_TRUE(same_scale(download(s1)[0], cy)) << what << ": norm " << download(s1)[0] << " vs " << cy;
      EXPECT_TRUE(same_scale(download(s2)[0], cy)) << what << ": separate pass";
      EXPECT_TRUE(same_scale(download(t1)[0], ch)) << what << ": swiglu " << download(t1)[0] << " vs " << ch;
      EXPECT_TRUE(same_scale(download(t2)[0], ch)) << what << ": separate pass (swiglu)";
      if (poison == 1) {
        EXPECT_EQ(download(s1)[0], 1.f) << what;
      }
      if (poison == 2) {
        EXPECT_TRUE(std::isnan(download(t1)[0])) << what;
      }
    }
}

// SwiGLU's backward with both output gradients' scales reduced in its own pass
// (swiglu_bwd_fp8_scale): dg and du equal the plain kernel's bit for bit, and each scale equals
// the CPU twin's fp8_scale over the stored gradient. Vectorized and scalar paths (odd sizes),
// both formats, an all-zero dh (scales 1) and a NaN in g (both scales NaN).
TEST_F(CudaFp8, SwigluBackwardScalesEqualTheSeparatePasses) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {int64_t(1) << 20, int64_t(4099), int64_t(7)})
    for (int poison = 0; poison < 3; ++poison) {  // 0 random, 1 dh all zero, 2 one NaN in g
      VecF g = fp8ref::normal_with_outliers(size_t(n), uint32_t(n + 1)),
           u = fp8ref::normal_with_outliers(size_t(n), uint32_t(n + 2)),
           dh = fp8ref::normal_with_outliers(size_t(n), uint32_t(n + 3));
      if (poison == 1) std::fill(dh.begin(), dh.end(), 0.f);
      if (poison == 2) g[size_t(n / 2)] = nan;
      DT gd = upload(g, ct()), ud = upload(u, ct()), dhd = upload(dh, ct());
      DT dg1 = poisoned(n, ct()), du1 = poisoned(n, ct()), dg2 = poisoned(n, ct()), du2 = poisoned(n, ct());
      DT sg = poisoned(1, DType::f32), su = poisoned(1, DType::f32);
      const Fp8Format f = n == 7 ? Fp8Format::e5m2 : Fp8Format::e4m3;
      run([&](Ops& o) {
        o.swiglu_bwd_fp8_scale(gd.get(), ud.get(), dhd.get(), dg1.get(), du1.get(), n, f, sg.as<float>(),
                               su.as<float>());
        o.swiglu_bwd(gd.get(), ud.get(), dhd.get(), dg2.get(), du2.get(), n);
      });
      const std::string what = std::to_string(n) + " elements, input " + std::to_string(poison);
      const VecF a = download(dg1), b = download(dg2), c = download(du1), d = download(du2);
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(same_scale(a[i], b[i])) << what << ": dg differs at " << i;
        ASSERT_TRUE(same_scale(c[i], d[i])) << what << ": du differs at " << i;
      }
      float cg = 0, cu = 0;
      cpu_->fp8_scale(a.data(), n, f, &cg);
      cpu_->fp8_scale(c.data(), n, f, &cu);
      EXPECT_TRUE(same_scale(download(sg)[0], cg)) << what << ": dg's " << download(sg)[0] << " vs " << cg;
      EXPECT_TRUE(same_scale(download(su)[0], cu)) << what << ": du's " << download(su)[0] << " vs " << cu;
      if (poison == 0) {
        EXPECT_NE(cg, cu) << what;
      } else if (poison == 1) {
        EXPECT_EQ(download(sg)[0], 1.f) << what;
      } else if (poison == 2) {
        EXPECT_TRUE(std::isnan(download(sg)[0]) && std::isnan(download(su)[0])) << what;
      }
    }
}

// Integer-valued operands whose every partial sum is exact at any precision the hardware
// uses, and power-of-two scales: the GPU result equals the CPU twin's exactly.
TEST_F(CudaFp8, GemmIsExactOnSmallIntegers) {
  if (!fp8_capable()) GTEST_SKIP() << "no FP8 tensor cores on " << dev().name();
  const int64_t M = 48, K = 64, N = 32;
  for (bool acc : {false, true}) {
    std::mt19937 g(acc ? 5 : 4);
    const int lim = acc ? 1 : 2;  // |sum| <= K*lim^2, scaled by 1/8: exact in bf16 with C added
    std::uniform_int_distribution<int> v(-lim, lim), cv(-8, 8);
    Codes a(size_t(M * K)), b(size_t(N * K));
    for (auto& c : a) c = fp8::encode(Fp8Format::e4m3, float(v(g)));
    for (auto& c : b) c = fp8::encode(Fp8Format::e4m3, float(v(g)));
    VecF d0(size_t(M * N));
    for (auto& x : d0) x = acc ? float(cv(g)) : std::numeric_limits<float>::quiet_NaN();
    DT ad = upload_bytes(a), bd = upload_bytes(b), sa = upload_scale(0.5f), sb = upload_scale(0.25f);
    DT dd = acc ? upload(d0, ct()) : poisoned(M * N, ct());
    run([&](Ops& o) {
      o.gemm_fp8(ad.as<uint8_t>(), Fp8Format::e4m3, sa.as<float>(), bd.as<uint8_t>(), Fp8Format::e4m3,
                 sb.as<float>(), dd.get(), M, K, N, acc);
    });
    const float s_a = 0.5f, s_b = 0.25f;
    VecF want = d0;
    cpu_->gemm_fp8(a.data(), Fp8Format::e4m3, &s_a, b.data(), Fp8Format::e4m3, &s_b, want.data(), M, K, N,
                   acc);
    EXPECT_EQ(download(dd), want) << (acc ? "accumulate" : "overwrite");
  }
}

// The weight gradient's GEMM adds into an fp32 d: exact on integer-valued operands (as above),
// with a K that is a padded token count (zero codes at the end of each row).
TEST_F(CudaFp8, WeightGradientGemmAddsExactlyIntoFp32) {
  if (!fp8_capable()) GTEST_SKIP() << "no FP8 tensor cores on " << dev().name();
  const int64_t M = 64, K = 112, N = 48, tokens = 100;
  std::mt19937 g(11);
  std::uniform_int_distribution<int> v(-3, 3), cv(-1000, 1000);
  Codes a(size_t(M * K), 0), b(size_t(N * K), 0);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < tokens; ++k) a[size_t(r * K + k)] = fp8::encode(Fp8Format::e4m3, float(v(g)));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t k = 0; k < tokens; ++k) b[size_t(r * K + k)] = fp8::encode(Fp8Format::e4m3, float(v(g)));
  VecF d0(size_t(M * N));
  for (auto& x : d0) x = float(cv(g)) * 0.25f;
  DT ad = upload_bytes(a), bd = upload_bytes(b), sa = upload_scale(0.5f), sb = upload_scale(2.f);
  DT dd = upload(d0, DType::f32);
  run([&](Ops& o) {
    o.gemm_fp8_accumulate_f32(ad.as<uint8_t>(), Fp8Format::e4m3, sa.as<float>(), bd.as<uint8_t>(),
                              Fp8Format::e4m3, sb.as<float>(), dd.as<float>(), M, K, N);
  });
  const float s_a = 0.5f, s_b = 2.f;
  VecF want = d0;
  cpu_->gemm_fp8_accumulate_f32(a.data(), Fp8Format::e4m3, &s_a, b.data(), Fp8Format::e4m3, &s_b, want.data(),
                                M, K, N);
  // every partial sum is an integer below 2^24 / 4: exact in fp32 in any order
  EXPECT_EQ(download(dd), want);
  int changed = 0;
  for (size_t i = 0; i < want.size(); ++i) changed += want[i] != d0[i];
  EXPECT_GT(changed, int(want.size()) / 2) << "the GEMM added nothing";
}

// Random activations with outliers and weights, quantized on the GPU, multiplied there and on
// the CPU. The two sums differ by (1) the order of fp32 additions, at most K * 2^-24 of
// sum|a b| (the products are exact), and (2) the tensor cores' own addition, which keeps about
// 14 significant bits (DeepSeek-V3 technical report, sec. 3.3.2) and is rounded again at every
// addition inside a k-block before cuBLASLt promotes the block into fp32. Measured on the H200
// (sm_90 cubin and compute_80 PTX builds alike): up to 7.3e-4 of sum|a b| beyond bf16 rounding
// at K = 1024, over twice a bound of 2^-12 for the whole sum. The bound used counts one 2^-12
// per 128-element k-block: e = (K*2^-24 + ceil(K/128)*2^-12) * sum|a b| * scale (1.95e-3 at
// K = 1024). A wrong layout or scale errs by about |c| itself, far beyond it, and
// GemmIsExactOnSmallIntegers checks those exactly. Each GPU output, rounded once to bf16, must
// lie between the bf16 roundings of c - e and c + e with c the CPU's fp32 result; the largest
// error seen (beyond bf16's half step) is printed.
TEST_F(CudaFp8, GemmWithinItsAccumulationBound) {
  if (!fp8_capable()) GTEST_SKIP() << "no FP8 tensor cores on " << dev().name();
  struct Shape {
    int64_t M, K, N;
  };
  for (const Shape sh : {Shape{256, 1024, 192}, Shape{64, 4096, 128}})
    for (bool acc : {false, true}) {
      const int64_t M = sh.M, K = sh.K, N = sh.N;
      VecF x = fp8ref::normal_with_outliers(size_t(M * K), uint32_t(K + 1)),
           w = ref::randn(size_t(N * K), 9, 0.02f);
      VecF c0 = ref::randn(size_t(M * N), 10, 0.5f);
      DT xd = upload(x, ct()), wd = upload(w, ct());
      DT sx = poisoned(1, DType::f32), sw = poisoned(1, DType::f32), qx = bytes(M * K, 0xab),
         qw = bytes(N * K, 0xab);
      DT dd = acc ? upload(c0, ct()) : poisoned(M * N, ct());
      run([&](Ops& o) {
        o.fp8_scale(xd.get(), M * K, Fp8Format::e4m3, sx.as<float>());
        o.fp8_scale(wd.get(), N * K, Fp8Format::e4m3, sw.as<float>());
        o.fp8_quantize(xd.get(), sx.as<float>(), qx.as<uint8_t>(), M * K, Fp8Format::e4m3);
        o.fp8_quantize(wd.get(), sw.as<float>(), qw.as<uint8_t>(), N * K, Fp8Format::e4m3);
        o.gemm_fp8(qx.as<uint8_t>(), Fp8Format::e4m3, sx.as<float>(), qw.as<uint8_t>(), Fp8Format::e4m3,
                   sw.as<float>(), dd.get(), M, K, N, acc);
      });
      const Codes a = download_bytes(qx.get(), M * K), b = download_bytes(qw.get(), N * K);
      const float s_a = download(sx)[0], s_b = download(sw)[0];
      VecF c = c0;
      cpu_->gemm_fp8(a.data(), Fp8Format::e4m3, &s_a, b.data(), Fp8Format::e4m3, &s_b, c.data(), M, K, N,
                     acc);
      const VecF got = download(dd);
      const double s = double(s_a) * s_b;
      const double rel_bound =
          double(K) * std::ldexp(1.0, -24) + double((K + 127) / 128) * std::ldexp(1.0, -12);
      double worst = 0;
      int64_t exact = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double mag = 0;
          for (int64_t k = 0; k < K; ++k)
            mag += std::fabs(fp8::decode(Fp8Format::e4m3, a[size_t(m * K + k)]) *
                             double(fp8::decode(Fp8Format::e4m3, b[size_t(n * K + k)])));
          const double e = rel_bound * mag * s;
          const float ci = c[size_t(m * N + n)], gi = got[size_t(m * N + n)];
          const float lo = round_to(ct(), float(ci - e)), hi = round_to(ct(), float(ci + e));
          ASSERT_TRUE(gi >= lo && gi <= hi)
              << "M=" << M << " K=" << K << " (" << m << "," << n << "): GPU " << gi << ", CPU " << ci
              << ", allowed [" << lo << ", " << hi << "]";
          exact += gi == round_to(ct(), ci) ? 1 : 0;
          const double half_step = std::fabs(double(ci)) * std::ldexp(1.0, -9);
          worst = std::max(worst, (std::fabs(double(gi) - ci) - half_step) / (mag * s));
        }
      std::printf(
          "[ info ] gemm_fp8 M=%lld K=%lld N=%lld%s: %lld of %lld outputs equal the CPU's rounded; largest "
          "error beyond bf16 rounding %.2e of sum|a b|*scale (bound %.2e)\n",
          (long long)M, (long long)K, (long long)N, acc ? " +C" : "", (long long)exact, (long long)(M * N),
          std::max(worst, 0.0), rel_bound);
    }
}

// Shapes cuBLASLt's FP8 layout cannot take, both operands e5m2, misaligned operands: one
// std::invalid_argument before anything is enqueued (the output stays poisoned).
TEST_F(CudaFp8, GemmRefusesShapesCublasLtCannotDo) {
  if (!fp8_capable()) GTEST_SKIP() << "no FP8 tensor cores on " << dev().name();
  DT a = bytes(64 * 64 + 16, 0x38), s = upload_scale(1.f), d = poisoned(64 * 64 + 8, ct());
  const uint8_t* ap = a.as<uint8_t>();
  const float* sp = s.as<float>();
  auto call = [&](const uint8_t* x, Fp8Format fa, Fp8Format fb, int64_t M, int64_t K, int64_t N) {
    ops().gemm_fp8(x, fa, sp, ap, fb, sp, d.get(), M, K, N, false);
  };
  const Fp8Format e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
  EXPECT_THROW(call(ap, e4, e4, 16, 24, 16), std::invalid_argument);  // K not a multiple of 16
  EXPECT_THROW(call(ap, e4, e4, 16, 16, 40), std::invalid_argument);  // N not a multiple of 16
  EXPECT_THROW(call(ap, e5, e5, 16, 16, 16), std::invalid_argument);
  EXPECT_THROW(call(ap + 8, e4, e4, 16, 16, 16), std::invalid_argument);  // misaligned A
  try {
    call(ap, e4, e4, 16, 24, 16);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_fp8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos) << e.what();
  }
  sync_ok();
  for (float v : download(d)) ASSERT_TRUE(std::isnan(v));
  // e5m2 activations (gradients) times e4m3 weights are a supported pair
  run([&](Ops& o) { o.gemm_fp8(ap, e5, sp, ap, e4, sp, d.get(), 16, 64, 16, false); });
  VecF want(16 * 16);
  const float one = 1.f;
  const Codes h(64 * 16, 0x38);
  cpu_->gemm_fp8(h.data(), e5, &one, h.data(), e4, &one, want.data(), 16, 64, 16, false);
  VecF got = download(d);
  got.resize(16 * 16);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace rp::cudatest
