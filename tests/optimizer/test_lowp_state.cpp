// Fused low-precision copy (exact rounding incl. ties and specials) and state save/load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "base/checksum.hpp"
#include "optimizer/adamw.hpp"
#include "rounding_ref.hpp"

namespace {
using rp::AdamWOptions;
using rp::AdamWState;
using rp::DType;

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

/// With zero gradients and no weight decay the step leaves w unchanged (m = 0 => update 0),
/// so the low-precision copy must be exactly the rounding of the given w.
std::vector<uint16_t> convert(std::vector<float>& w, DType dt) {
  std::vector<float> g(w.size(), 0.f);
  std::vector<uint16_t> out(w.size());
  AdamWState st;
  auto before = w;
  rp::adamw_update(w.data(), st, g.data(), int64_t(w.size()), 1.f, AdamWOptions{}, 1e-3, out.data(), dt);
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isnan(before[i])) {
      EXPECT_EQ(std::bit_cast<uint32_t>(before[i]), std::bit_cast<uint32_t>(w[i])) << i;
    }
  }
  return out;
}

std::vector<float> special_values() {
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -1.f,
                          INFINITY,
                          -INFINITY,
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          65504.f,
                          65519.99f,
                          65520.f,
                          65536.f,
                          1e10f,
                          -7e4f,
                          std::ldexp(1.f, -14),
                          std::ldexp(1.f, -24),
                          std::ldexp(1.f, -25),
                          std::ldexp(1.5f, -25),
                          std::ldexp(1.f, -26),
                          std::ldexp(3.f, -25),
                          std::ldexp(1.f, -15) * 1.0009765625f};
  // bf16 ties: lower 16 bits exactly 0x8000 with even and odd kept parts, and +-1 around
  for (uint32_t hi : {0x3f80u, 0x3f81u, 0x4049u, 0xc2f7u, 0x0001u, 0x7f7fu, 0x0080u})
    for (uint32_t lo : {0x8000u, 0x7fffu, 0x8001u, 0x0000u, 0xffffu}) v.push_back(from_bits(hi << 16 | lo));
  // f16 ties: dropped 13 bits exactly half, even and odd kept mantissa, normal and subnormal
  for (float base : {1.f, 1.0009765625f, 3.14f, 1000.f, 60000.f}) {
    uint32_t u = std::bit_cast<uint32_t>(base) & ~0x1fffu;
    for (uint32_t d : {0x1000u, 0x0fffu, 0x1001u, 0x3000u})
      v.push_back(from_bits(u | d)), v.push_back(-from_bits(u | d));
  }
  for (int k = 1; k < 12; ++k)  // subnormal half ties: (k + 0.5) * 2^-24
    v.push_back(std::ldexp(float(k) + 0.5f, -24)), v.push_back(std::ldexp(float(k) + 0.25f, -24));
  return v;
}

TEST(LowPrecisionCopy, Bf16SpecialsAndTies) {
  auto w = special_values();
  auto out = convert(w, DType::bf16);
  for (size_t i = 0; i < w.size(); ++i)
    EXPECT_EQ(out[i], ref_round::bf16_bits(w[i])) << "w=" << w[i] << " i=" << i;
  // hand-checked ties: 1 + 2^-8 (tie, even kept) -> 1.0; 1 + 3 * 2^-8 -> 1 + 2^-6 (up)
  std::vector<float> t = {from_bits(0x3f808000u), from_bits(0x3f818000u)};
  auto o = convert(t, DType::bf16);
  EXPECT_EQ(o[0], 0x3f80);
  EXPECT_EQ(o[1], 0x3f82);
}

TEST(LowPrecisionCopy, F16SpecialsAndTies) {
  auto w = special_values();
  auto out = convert(w, DType::f16);
  for (size_t i = 0; i < w.size(); ++i)
    EXPECT_EQ(out[i], ref_round::f16_bits(w[i])) << "w=" << w[i] << " i=" << i;
  // hand-checked: 65504 max, 65520 is a tie that rounds to even = inf, 2^-25 ties to 0,
  // 1.5 * 2^-24 ties to 2 * 2^-24 (even)
  std::vector<float> t = {65504.f, 65520.f, std::ldexp(1.f, -25), std::ldexp(1.5f, -24), -0.f, 1.f};
  auto o = convert(t, DType::f16);
  EXPECT_EQ(o[0], 0x7bff);
  EXPECT_EQ(o[1], 0x7c00);
  EXPECT_EQ(o[2], 0x0000);
  EXPECT_EQ(o[3], 0x0002);
  EXPECT_EQ(o[4], 0x8000);
  EXPECT_EQ(o[5], 0x3c00);
}

TEST(LowPrecisionCopy, NaNStaysNaN) {
  std::vector<float> w = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
  auto b = convert(w, DType::bf16);
  auto h = convert(w, DType::f16);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i] & 0x7f80, 0x7f80);
    EXPECT_NE(b[i] & 0x007f, 0);
    EXPECT_EQ(h[i] & 0x7c00, 0x7c00);
    EXPECT_NE(h[i] & 0x03ff, 0);
  }
}

TEST(LowPrecisionCopy, RandomBitPatterns) {
  std::mt19937 rng(4);
  std::vector<float> w;
  while (w.size() < 300000) {
    float f = from_bits(uint32_t(rng()));
    if (!std::isnan(f)) w.push_back(f);
  }
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);  // f16's whole range
  for (int i = 0; i < 200000; ++i) w.push_back(u(rng));
  for (int i = 0; i < 100000; ++i) w.push_back(std::ldexp(u(rng), -30));  // f16 subnormals
  auto w2 = w;
  auto b = convert(w, DType::bf16);
  auto h = convert(w2, DType::f16);
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(b[i], ref_round::bf16_bits(w[i])) << std::hex << std::bit_cast<uint32_t>(w[i]);
    ASSERT_EQ(h[i], ref_round::f16_bits(w[i])) << std::hex << std::bit_cast<uint32_t>(w[i]);
  }
}

// ---- save / load -----------------------------------------------------------------------

void run(std::vector<float>& w, AdamWState& st, const AdamWOptions& o, int from, int to,
         std::vector<uint16_t>* out = nullptr) {
  const int64_t n = int64_t(w.size());
  std::vector<float> g(w.size());
  for (int s = from; s < to; ++s) {
    std::mt19937 rng(uint32_t(1234 + s));  // gradient of step s depends only on s
    std::normal_distribution<float> nd;
    for (auto& x : g) x = nd(rng);
    rp::adamw_update(w.data(), st, g.data(), n, 0.25f, o, 1e-3 * (1 + s), out ? out->data() : nullptr,
                     DType::bf16);
  }
}

TEST(StateIO, RoundTripContinuesBitIdentically) {
  for (bool ams : {false, true}) {
    AdamWOptions o;
    o.amsgrad = ams;
    o.weight_decay = 0.1;
    const int64_t n = 1001;
    std::vector<float> w0(n);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    for (auto& x : w0) x = nd(rng);

    std::vector<float> wa = w0;
    AdamWState sa;
    run(wa, sa, o, 0, 5);
    std::stringstream ss;
    rp::save_state(ss, sa);
    const std::vector<float> w_saved = wa;  // master weights are saved separately
    std::vector<uint16_t> outa(n), outb(n);
    run(wa, sa, o, 5, 10, &outa);

    AdamWState sb;
    sb.step = 99;
    sb.m.assign(3, 1.f);
    rp::load_state(ss, sb, n);
    EXPECT_EQ(sb.step, 5);
    EXPECT_EQ(sb.vmax.size(), ams ? size_t(n) : 0u);
    std::vector<float> wb = w_saved;
    run(wb, sb, o, 5, 10, &outb);
    EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), n * 4)) << "amsgrad " << ams;
    EXPECT_EQ(sa.m, sb.m);
    EXPECT_EQ(sa.v, sb.v);
    EXPECT_EQ(sa.vmax, sb.vmax);
    EXPECT_EQ(sa.step, sb.step);
    EXPECT_EQ(outa, outb);
  }
}

std::string saved(int64_t n, bool ams) {
  AdamWOptions o;
  o.amsgrad = ams;
  std::vector<float> w(static_cast<size_t>(n), 1.f);
  AdamWState st;
  run(w, st, o, 0, 2);
  std::stringstream ss;
  rp::save_state(ss, st);
  return ss.str();
}

void expect_load_error(const std::string& bytes, int64_t expected_n, const std::string& what) {
  std::istringstream is(bytes);
  AdamWState st;
  st.step = 42;
  try {
    rp::load_state(is, st, expected_n);
    ADD_FAILURE() << "accepted; wanted error containing: " << what;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  EXPECT_EQ(st.step, 42);  // unchanged on failure
}

TEST(StateIO, RejectsBadFiles) {
  const std::string good = saved(10, true);
  expect_load_error(good, 11, "expected 11 parameters, file has 10");
  expect_load_error("", -1, "truncated");
  expect_load_error("NOTADAMWxxxxxxxxxxxxxx", -1, "bad magic");
  std::string ver = good;
  ver[8] = 7;
  expect_load_error(ver, -1, "unsupported version 7");
  expect_load_error(good.substr(0, good.size() - 20), 10, "truncated");
  expect_load_error(good.substr(0, 30), 10, "truncated");
  std::string flip = good;
  flip[40] ^= 1;  // inside m
  expect_load_error(flip, 10, "checksum");
  // the step and the flags are under the checksum too (version 3): a damaged step used to load
  for (size_t at : {size_t(12), size_t(16), size_t(23)}) {
    std::string head = good;
    head[at] ^= (at == 12 ? 1 : 4);  // the vmax flag, the step's low and high bytes
    std::istringstream hs(head);
    AdamWState hst;
    EXPECT_THROW(rp::load_state(hs, hst, 10), std::runtime_error) << "byte " << at;
  }
  // any expected size accepted with -1
  std::istringstream is(good);
  AdamWState st;
  rp::load_state(is, st, -1);
  EXPECT_EQ(st.m.size(), 10u);
  EXPECT_EQ(st.step, 2);
}

// A version-2 record (written before the checksum covered flags, step and n) still loads:
// built here from a version-3 one, with the version field and the checksum of that format.
TEST(StateIO, VersionTwoRecordsStillLoad) {
  const std::string v3 = saved(10, true);
  ASSERT_EQ(v3[8], 3);
  std::string v2 = v3;
  v2[8] = 2;
  rp::Checksum c;  // version 2: the hyper-parameter bytes (none here) and the floats only
  c.update(v2.data() + 32, v2.size() - 32 - 8);
  const uint64_t d = c.digest();
  std::memcpy(v2.data() + v2.size() - 8, &d, 8);
  std::istringstream is(v2);
  AdamWState st;
  rp::load_state(is, st, 10);
  std::istringstream is3(v3);
  AdamWState st3;
  rp::load_state(is3, st3, 10);
  EXPECT_EQ(st.step, st3.step);
  EXPECT_EQ(st.m, st3.m);
  EXPECT_EQ(st.vmax, st3.vmax);
  // and its step is not checked, as that format never could
  v2[16] ^= 1;
  std::istringstream bad(v2);
  rp::load_state(bad, st, 10);
  EXPECT_EQ(st.step, st3.step ^ 1);
}

TEST(StateIO, EmptyGroup) {
  AdamWState st;
  st.step = 3;
  std::stringstream ss;
  rp::save_state(ss, st);
  AdamWState back;
  rp::load_state(ss, back, 0);
  EXPECT_EQ(back.step, 3);
  EXPECT_TRUE(back.m.empty() && back.v.empty() && back.vmax.empty());
}

}  // namespace
