// AdamW / Adam kernel vs an independent double-precision textbook reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "adam_ref.hpp"
#include "optimizer/adamw.hpp"
#include "rounding_ref.hpp"

namespace {
using rp::AdamWOptions;
using rp::AdamWState;
using rp::DType;

// The textbook reference (double precision + magnitude bounds) shared with the other
// optimizer tests.
using adam_ref::Ref;

constexpr double kRel = 1e-6;
constexpr double kDenorm = std::numeric_limits<float>::denorm_min();

void expect_close(const std::vector<float>& w, const AdamWState& st, const Ref& r, const AdamWOptions& o,
                  const char* ctx) {
  ASSERT_EQ(st.step, r.t);
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_LE(std::fabs(w[i] - r.w[i]), kRel * (std::fabs(r.w[i]) + r.wabs[i]) + 1e-30)
        << ctx << " w[" << i << "] ref " << r.w[i];
    ASSERT_LE(std::fabs(st.m[i] - r.m[i]), kRel * (std::fabs(r.m[i]) + r.mabs[i]) + 1e-38)
        << ctx << " m[" << i << "]";
    // v can sit in fp32's subnormal range for tiny gradients: allow a few subnormal ulps;
    // with L2, g = grad + wd * w may cancel, so v is relative to the sum of |terms|^2
    ASSERT_LE(std::fabs(st.v[i] - r.v[i]), kRel * r.vabs[i] + 64 * kDenorm) << ctx << " v[" << i << "]";
    if (o.amsgrad) {
      ASSERT_LE(std::fabs(st.vmax[i] - r.vmax[i]), kRel * r.vmax[i] + 64 * kDenorm + kRel * r.vabs[i])
          << ctx << " vmax[" << i << "]";
    }
  }
}

std::vector<AdamWOptions> all_combos() {
  std::vector<AdamWOptions> out;
  for (int bits = 0; bits < 16; ++bits) {
    AdamWOptions o;
    o.lr = 1e-3;
    o.decoupled = bits & 1;
    o.amsgrad = bits & 2;
    o.maximize = bits & 4;
    o.weight_decay = (bits & 8) ? 0.1 : 0.0;
    out.push_back(o);
  }
  return out;
}

std::string name(const AdamWOptions& o) {
  return std::string(o.decoupled ? "AdamW" : "Adam(L2)") + (o.amsgrad ? " amsgrad" : "") +
         (o.maximize ? " maximize" : "") + " wd=" + std::to_string(o.weight_decay);
}

/// Runs `steps` updates of length n for option set o against the reference; every step
/// also writes the low-precision copy in `dt` and checks it is exactly RNE(w).
void run_case(int64_t n, const AdamWOptions& o, int steps, double grad_mag, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uw(-1.f, 1.f), ug(-1.f, 1.f);
  std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (auto& x : w) x = uw(rng);
  Ref ref(w);
  AdamWState st;
  std::vector<float> out32(static_cast<size_t>(n));
  std::vector<uint16_t> out16(static_cast<size_t>(n));
  void* out = dt == DType::f32 ? static_cast<void*>(out32.data()) : out16.data();
  for (int s = 0; s < steps; ++s) {
    // magnitudes shrink on later steps (so amsgrad's max matters) and grads change sign
    const double mag = grad_mag * (s % 4 == 3 ? 0.01 : 1.0 / (1 + s));
    for (auto& x : g) x = float(ug(rng) * mag);
    const float scale = s % 3 == 0 ? 1.f : 0.37f;
    const double lr = o.lr * (1.0 + 0.1 * s);  // a schedule: lr differs per step
    rp::adamw_update(w.data(), st, g.data(), n, scale, o, lr, n ? out : nullptr, dt);
    ref.step(g.data(), double(scale), o, lr);
    const std::string ctx = name(o) + " n=" + std::to_string(n) + " step " + std::to_string(s);
    expect_close(w, st, ref, o, ctx.c_str());
    if (::testing::Test::HasFatalFailure()) return;
    for (int64_t i = 0; i < n; ++i) {
      if (dt == DType::f32)
        ASSERT_EQ(std::bit_cast<uint32_t>(out32[i]), std::bit_cast<uint32_t>(w[i])) << ctx;
      else if (dt == DType::bf16)
        ASSERT_EQ(out16[i], ref_round::bf16_bits(w[i])) << ctx << " i=" << i << " w=" << w[i];
      else ASSERT_EQ(out16[i], ref_round::f16_bits(w[i])) << ctx << " i=" << i << " w=" << w[i];
    }
  }
}

const DType kDtypes[3] = {DType::bf16, DType::f16, DType::f32};

TEST(AdamW, MatchesReferenceSmallLengthsAllCombos) {
  int c = 0;
  for (const auto& o : all_combos())
    for (int64_t n = 0; n <= 64; ++n, ++c) {
      run_case(n, o, 12, 1.0, kDtypes[c % 3], uint32_t(1000 + c));
      if (HasFatalFailure()) return;
    }
}

TEST(AdamW, MatchesReferenceLargeLengthsAllCombos) {
  int c = 0;
  for (const auto& o : all_combos())
    for (int64_t n : {100003, 4099}) {
      ++c;
      run_case(n, o, 11, 3.0, kDtypes[c % 3], uint32_t(77 + c));
      if (HasFatalFailure()) return;
    }
}

TEST(AdamW, TinyGradients) {
  int c = 0;
  for (const auto& o : all_combos()) {
    ++c;
    run_case(257, o, 12, 1e-20, kDtypes[c % 3], uint32_t(500 + c));
    if (HasFatalFailure()) return;
  }
}

TEST(AdamW, NonDefaultHyperParameters) {
  for (auto o : all_combos()) {
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.eps = 1e-2;  // large enough that its placement in the denominator is visible
    o.lr = 0.05;
    o.weight_decay = o.weight_decay ? 0.3 : 0.0;
    run_case(131, o, 15, 0.5, DType::bf16, 9);
    if (HasFatalFailure()) return;
  }
}

TEST(AdamW, FirstStepIsSignTimesLr) {
  // t = 1, eps -> 0: update = lr * g / |g| (bias correction exact)
  AdamWOptions o;
  o.eps = 0;
  std::vector<float> w = {1.f, -2.f, 0.5f}, g = {0.25f, -3.f, 1e-3f};
  AdamWState st;
  rp::adamw_update(w.data(), st, g.data(), 3, 1.f, o, 0.01);
  EXPECT_FLOAT_EQ(w[0], 0.99f);
  EXPECT_FLOAT_EQ(w[1], -1.99f);
  EXPECT_FLOAT_EQ(w[2], 0.49f);
  EXPECT_EQ(st.step, 1);
}

TEST(AdamW, ThreadsBitIdentical) {
  for (const auto& o : all_combos())
    for (int64_t n : {int64_t(100003), int64_t(200), int64_t(10), int64_t(64 * 3)}) {
      std::mt19937 rng{static_cast<uint32_t>(n)};
      std::normal_distribution<float> nd;
      std::vector<float> w1(static_cast<size_t>(n)), g(static_cast<size_t>(n));
      for (auto& x : w1) x = nd(rng);
      auto w3 = w1;
      std::vector<uint16_t> o1(static_cast<size_t>(n)), o3(static_cast<size_t>(n));
      AdamWState s1, s3;
      for (int s = 0; s < 4; ++s) {
        for (auto& x : g) x = nd(rng);
        rp::adamw_update(w1.data(), s1, g.data(), n, 0.5f, o, 1e-2, o1.data(), DType::f16, 1);
        rp::adamw_update(w3.data(), s3, g.data(), n, 0.5f, o, 1e-2, o3.data(), DType::f16, 3);
      }
      ASSERT_EQ(0, std::memcmp(w1.data(), w3.data(), size_t(n) * 4)) << name(o) << " n=" << n;
      ASSERT_EQ(s1.m, s3.m);
      ASSERT_EQ(s1.v, s3.v);
      ASSERT_EQ(s1.vmax, s3.vmax);
      ASSERT_EQ(o1, o3);
    }
}

TEST(AdamW, ZeroLengthStillCountsStep) {
  AdamWState st;
  rp::adamw_update(nullptr, st, nullptr, 0, 1.f, AdamWOptions{}, 1e-3);
  EXPECT_EQ(st.step, 1);
  EXPECT_TRUE(st.m.empty());
}

TEST(AdamW, RejectsBadArguments) {
  std::vector<float> w(8, 1.f), g(8, 1.f);
  AdamWState st;
  AdamWOptions o;
  auto call = [&](const AdamWOptions& oo, double lr, float scale, DType dt, void* out, int th) {
    rp::adamw_update(w.data(), st, g.data(), 8, scale, oo, lr, out, dt, th);
  };
  std::vector<int32_t> ibuf(8);
  EXPECT_THROW(call(o, -1.0, 1.f, DType::bf16, nullptr, 1), std::invalid_argument);
  EXPECT_THROW(call(o, 1e-3, NAN, DType::bf16, nullptr, 1), std::invalid_argument);
  EXPECT_THROW(call(o, 1e-3, 1.f, DType::i32, ibuf.data(), 1), std::invalid_argument);
  EXPECT_THROW(call(o, 1e-3, 1.f, DType::bf16, nullptr, 0), std::invalid_argument);
  auto bad = o;
  bad.beta1 = 1.0;
  EXPECT_THROW(call(bad, 1e-3, 1.f, DType::bf16, nullptr, 1), std::invalid_argument);
  bad = o;
  bad.weight_decay = -0.1;
  EXPECT_THROW(call(bad, 1e-3, 1.f, DType::bf16, nullptr, 1), std::invalid_argument);
  EXPECT_EQ(st.step, 0);  // nothing happened
  EXPECT_TRUE(st.m.empty());
  st.m.assign(7, 0.f);
  try {
    call(o, 1e-3, 1.f, DType::bf16, nullptr, 1);
    FAIL() << "size mismatch accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("state.m has 7 elements, parameter group has 8"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(st.step, 0);
  EXPECT_EQ(w, std::vector<float>(8, 1.f));
  EXPECT_THROW(rp::adamw_update(w.data(), st, g.data(), -1, 1.f, o, 1e-3), std::invalid_argument);
}

// Throughput: run with --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'
TEST(AdamW, DISABLED_Throughput50M) {
  const int64_t n = 50'000'000;
  std::vector<float> w(static_cast<size_t>(n), 0.5f), g(static_cast<size_t>(n), 1e-3f);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  AdamWState st;
  AdamWOptions o;
  o.weight_decay = 0.01;
  rp::adamw_update(w.data(), st, g.data(), n, 1.f, o, 1e-4, out.data(), DType::bf16);  // warm
  for (DType dt : {DType::bf16, DType::f16}) {
    const int reps = 5;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) rp::adamw_update(w.data(), st, g.data(), n, 1.f, o, 1e-4, out.data(), dt);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("AdamW n=%lld 1 thread, %s copy: %.1f ms/step, %.3g params/s\n", (long long)n,
                dt == DType::bf16 ? "bf16" : "f16", 1e3 * s / reps, double(n) * reps / s);
  }
}

}  // namespace
