// AdamW and sum_of_squares on every ISA path this CPU has (forced with set_adamw_isa) and on
// thread pools: element-wise against the double reference (1e-6), bit-identical to the
// scalar path, low-precision copies equal to round-to-nearest-even of the fp32 result.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "adam_ref.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/clip.hpp"
#include "optimizer/isa.hpp"
#include "optimizer/thread_pool.hpp"
#include "rounding_ref.hpp"

namespace {
using rp::AdamWOptions;
using rp::AdamWState;
using rp::DType;
using rp::Isa;

struct IsaGuard {
  Isa saved = rp::adamw_isa();
  ~IsaGuard() { rp::set_adamw_isa(saved); }
};

enum class OutKind { none, f32, bf16, f16 };
const char* out_name(OutKind k) {
  static const char* n[] = {"no copy", "f32 copy", "bf16 copy", "f16 copy"};
  return n[int(k)];
}

/// One independent copy of the optimizer (weights, state, low-precision copy) run on one ISA,
/// optionally on a pool.
struct Lane {
  Isa isa;
  rp::ThreadPool* pool = nullptr;
  std::string label;
  std::vector<float> w;
  AdamWState st;
  std::vector<float> o32;
  std::vector<uint16_t> o16;

  void step(const std::vector<float>& g, float scale, const AdamWOptions& o, double lr, OutKind k) {
    rp::set_adamw_isa(isa);
    const int64_t n = int64_t(w.size());
    void* out = nullptr;
    DType dt = DType::bf16;
    if (k == OutKind::f32) o32.resize(w.size()), out = o32.data(), dt = DType::f32;
    if (k == OutKind::bf16) o16.resize(w.size()), out = o16.data(), dt = DType::bf16;
    if (k == OutKind::f16) o16.resize(w.size()), out = o16.data(), dt = DType::f16;
    if (n == 0) out = nullptr;
    if (pool) rp::adamw_update(w.data(), st, g.data(), n, scale, o, lr, out, dt, *pool);
    else rp::adamw_update(w.data(), st, g.data(), n, scale, o, lr, out, dt);
  }
};

/// Bitwise equality of finite values; a NaN must be NaN on both sides (its sign and payload
/// may differ between ISA paths, see optimizer/kernels.hpp).
template <class V1, class V2>
std::string same_bits(const V1& a, const V2& b, const char* what) {
  if (a.size() != b.size()) return std::string(what) + ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i]))
        return std::string(what) + "[" + std::to_string(i) + "]: NaN on one side";
      continue;
    }
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]))
      return std::string(what) + "[" + std::to_string(i) + "] " + std::to_string(a[i]) + " vs " +
             std::to_string(b[i]);
  }
  return "";
}

/// The low-precision copy of `L` equals RNE(w) exactly.
std::string check_copy(const Lane& L, OutKind k) {
  for (size_t i = 0; i < L.w.size(); ++i) {
    const float w = L.w[i];
    if (k == OutKind::f32 && std::bit_cast<uint32_t>(L.o32[i]) != std::bit_cast<uint32_t>(w))
      return "f32 copy [" + std::to_string(i) + "] differs from w";
    if (k == OutKind::bf16 && L.o16[i] != ref_round::bf16_bits(w))
      return "bf16 copy [" + std::to_string(i) + "] is not RNE(w)";
    if (k == OutKind::f16 && L.o16[i] != ref_round::f16_bits(w))
      return "f16 copy [" + std::to_string(i) + "] is not RNE(w)";
  }
  return "";
}

std::string compare_lanes(const Lane& a, const Lane& b, OutKind k) {
  std::string e;
  if (!(e = same_bits(a.w, b.w, "w")).empty()) return e;
  if (!(e = same_bits(a.st.m, b.st.m, "m")).empty()) return e;
  if (!(e = same_bits(a.st.v, b.st.v, "v")).empty()) return e;
  if (!(e = same_bits(a.st.vmax, b.st.vmax, "vmax")).empty()) return e;
  if (a.st.step != b.st.step) return "step counters differ";
  if (k == OutKind::f32) return same_bits(a.o32, b.o32, "f32 copy");
  if ((k == OutKind::bf16 || k == OutKind::f16) && a.o16 != b.o16) {
    for (size_t i = 0; i < a.o16.size(); ++i)
      if (a.o16[i] != b.o16[i] && !std::isnan(a.w[i]))
        return "16-bit copy [" + std::to_string(i) + "] differs";
  }
  return "";
}

/// Runs `steps` steps of lanes (the first must be the scalar path) against the double
/// reference; every lane must equal the first bit for bit. Returns "" or the first failure.
std::string run_lanes(std::vector<Lane>& lanes, int64_t n, const AdamWOptions& o, int steps, double grad_mag,
                      OutKind k, uint32_t seed, bool check_ref = true) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> w0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (auto& x : w0) x = u(rng);
  for (auto& L : lanes) L.w = w0, L.st = AdamWState{};
  adam_ref::Ref ref(w0);
  for (int s = 0; s < steps; ++s) {
    // magnitudes shrink on later steps (so amsgrad's max matters) and grads change sign
    const double mag = grad_mag * (s % 4 == 3 ? 0.01 : 1.0 / (1 + s));
    for (auto& x : g) x = float(u(rng) * mag);
    const float scale = s % 3 == 0 ? 1.f : 0.37f;
    const double lr = o.lr * (1.0 + 0.1 * s);
    for (auto& L : lanes) L.step(g, scale, o, lr, k);
    const std::string ctx = adam_ref::name(o) + " n=" + std::to_string(n) + " " + out_name(k) + " step " +
                            std::to_string(s) + ": ";
    if (check_ref) {
      ref.step(g.data(), double(scale), o, lr);
      const std::string e = adam_ref::compare(lanes[0].w.data(), lanes[0].st, ref, o);
      if (!e.empty()) return ctx + lanes[0].label + " vs reference: " + e;
    }
    for (auto& L : lanes) {
      std::string e = check_copy(L, k);
      if (!e.empty()) return ctx + L.label + ": " + e;
      if (&L == &lanes[0]) continue;
      e = compare_lanes(lanes[0], L, k);
      if (!e.empty()) return ctx + L.label + " vs " + lanes[0].label + ": " + e;
    }
  }
  return "";
}

std::vector<Lane> isa_lanes() {
  std::vector<Lane> lanes;
  for (Isa i : rp::supported_isas()) lanes.push_back(Lane{i, nullptr, rp::isa_name(i)});
  return lanes;
}

TEST(IsaPaths, ReportsWhatThisMachineRuns) {
  std::string s;
  for (Isa i : rp::supported_isas()) s += std::string(rp::isa_name(i)) + " ";
  std::printf("[ info ] ISA paths on this CPU: %s(default %s)\n", s.c_str(), rp::isa_name(rp::adamw_isa()));
  EXPECT_TRUE(rp::isa_supported(Isa::scalar));
  EXPECT_EQ(rp::parse_isa("avx2"), Isa::avx2);
  EXPECT_THROW(rp::parse_isa("sse9"), std::invalid_argument);
#if defined(__x86_64__)
  // the dispatch must not depend on -march: the vector paths exist in every x86-64 build
  __builtin_cpu_init();
  EXPECT_EQ(rp::isa_supported(Isa::avx2),
            bool(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")));
  EXPECT_EQ(rp::isa_supported(Isa::avx512),
            bool(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")));
#endif
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (!rp::isa_supported(i)) {
      IsaGuard guard;
      EXPECT_THROW(rp::set_adamw_isa(i), std::invalid_argument);
    }
}

// Every length 0..1024, every option combination, 12 steps, every ISA path; the copy dtype
// and gradient magnitude (1e-20 for one case in five) rotate over the cases.
TEST(IsaPaths, EveryLength0To1024AllCombosAllPaths) {
  IsaGuard guard;
  const auto combos = adam_ref::all_combos();
  std::vector<Lane> lanes = isa_lanes();
  int failures = 0;
  for (size_t c = 0; c < combos.size(); ++c)
    for (int64_t n = 0; n <= 1024; ++n) {
      const OutKind k = OutKind((n + int64_t(c)) % 4);
      const double mag = (n + int64_t(c)) % 5 == 0 ? 1e-20 : 1.0;
      const std::string e = run_lanes(lanes, n, combos[c], 12, mag, k, uint32_t(1000 * c + n));
      if (!e.empty()) {
        ADD_FAILURE() << e;
        if (++failures > 5) return;
      }
    }
}

TEST(IsaPaths, TinyGradientsEveryPath) {
  IsaGuard guard;
  std::vector<Lane> lanes = isa_lanes();
  int c = 0;
  for (const auto& o : adam_ref::all_combos())
    for (int64_t n : {1, 7, 16, 17, 257, 1000}) {
      ++c;
      for (double mag : {1e-20, 1e-30}) {
        const std::string e = run_lanes(lanes, n, o, 12, mag, OutKind(c % 4), uint32_t(77 * c));
        ASSERT_TRUE(e.empty()) << "grad magnitude " << mag << ": " << e;
      }
    }
}

TEST(IsaPaths, NonDefaultHyperParametersEveryPath) {
  IsaGuard guard;
  std::vector<Lane> lanes = isa_lanes();
  for (auto o : adam_ref::all_combos()) {
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.eps = 1e-2;
    o.lr = 0.05;
    o.weight_decay = o.weight_decay ? 0.3 : 0.0;
    for (int64_t n : {131, 1024})
      for (OutKind k : {OutKind::bf16, OutKind::f16}) {
        const std::string e = run_lanes(lanes, n, o, 15, 0.5, k, 9);
        ASSERT_TRUE(e.empty()) << e;
      }
  }
}

// Large tensors on pools of several sizes (pinned and not): the same bits as the scalar
// path on one thread; the reference check on the whole of 100003 elements.
TEST(IsaPaths, LargeLengthsPoolsAndPaths) {
  IsaGuard guard;
  const std::vector<int> cpus = rp::allowed_cpus();
  rp::ThreadPool p3(3), p2pinned(rp::ThreadPool::Options{2, cpus}), p5(5);
  std::vector<Lane> lanes = isa_lanes();
  lanes.push_back(Lane{rp::best_isa(), &p3, "best ISA, 3 threads"});
  lanes.push_back(Lane{rp::best_isa(), &p2pinned, "best ISA, 2 pinned threads"});
  lanes.push_back(Lane{Isa::scalar, &p5, "scalar, 5 threads"});
  int c = 0;
  for (const auto& o : adam_ref::all_combos()) {
    ++c;
    const std::string e = run_lanes(lanes, 100003, o, 11, 3.0, OutKind(c % 4), uint32_t(c));
    ASSERT_TRUE(e.empty()) << e;
  }
  // over a megabyte per tensor: several pieces per pool; bitwise only (the reference is the
  // scalar lane, already checked against the double reference above)
  for (int bits : {0, 3, 9, 15}) {
    const auto o = adam_ref::all_combos()[size_t(bits)];
    for (int64_t n : {int64_t(1) << 20, (int64_t(1) << 20) + 3, int64_t(3 * 65536 + 17)}) {
      const std::string e = run_lanes(lanes, n, o, 10, 1.0, OutKind((bits + n) % 4), uint32_t(n), false);
      ASSERT_TRUE(e.empty()) << e;
    }
  }
}

// Pointers at every alignment: the vector paths peel to an aligned streaming store of the
// copy; every offset must give the scalar path's bits.
TEST(IsaPaths, MisalignedBuffers) {
  IsaGuard guard;
  AdamWOptions o;
  o.weight_decay = 0.05;
  for (int64_t n : {63, 64, 100, 1000, 4097})
    for (OutKind k : {OutKind::f32, OutKind::bf16, OutKind::f16})
      for (int off = 0; off < 17; ++off) {
        std::mt19937 rng(uint32_t(n * 31 + off));
        std::normal_distribution<float> nd;
        std::vector<float> w0(static_cast<size_t>(n)), g0(static_cast<size_t>(n));
        for (auto& x : w0) x = nd(rng);
        for (auto& x : g0) x = nd(rng);
        std::vector<std::vector<float>> outs;
        std::vector<std::vector<uint8_t>> out_bytes;
        for (Isa isa : rp::supported_isas()) {
          rp::set_adamw_isa(isa);
          std::vector<float> wbuf(static_cast<size_t>(n + 32)), gbuf(static_cast<size_t>(n + 32));
          std::vector<uint8_t> obuf(size_t(n + 32) * 4, 0xAB);
          float* w = wbuf.data() + off;
          float* g = gbuf.data() + (off * 7) % 17;
          std::memcpy(w, w0.data(), size_t(n) * 4);
          std::memcpy(g, g0.data(), size_t(n) * 4);
          const size_t es = k == OutKind::f32 ? 4 : 2;
          void* out = obuf.data() + size_t(off) * es;
          AdamWState st;
          const DType dt = k == OutKind::f32 ? DType::f32 : k == OutKind::bf16 ? DType::bf16 : DType::f16;
          for (int s = 0; s < 3; ++s) rp::adamw_update(w, st, g, n, 0.5f, o, 1e-2, out, dt);
          outs.emplace_back(w, w + n);
          // the copy, plus the untouched guard bytes around it
          out_bytes.emplace_back(obuf);
          for (size_t b = 0; b < size_t(off) * es; ++b) ASSERT_EQ(obuf[b], 0xAB) << "wrote before the copy";
          for (size_t b = size_t(off + n) * es; b < obuf.size(); ++b)
            ASSERT_EQ(obuf[b], 0xAB) << "wrote past the copy";
        }
        for (size_t i = 1; i < outs.size(); ++i) {
          ASSERT_EQ(same_bits(outs[0], outs[i], "w"), "") << "n=" << n << " offset " << off;
          ASSERT_EQ(out_bytes[0], out_bytes[i]) << "n=" << n << " offset " << off << " " << out_name(k);
        }
      }
}

// inf / NaN gradients: the same elements end up NaN / inf on every path, the rest bitwise equal.
TEST(IsaPaths, NonFiniteGradientsAgreeAcrossPaths) {
  IsaGuard guard;
  for (const auto& o : adam_ref::all_combos()) {
    std::vector<Lane> lanes = isa_lanes();
    const int64_t n = 300;
    std::vector<float> w0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    for (auto& x : w0) x = nd(rng);
    for (auto& L : lanes) L.w = w0;
    for (int s = 0; s < 4; ++s) {
      for (auto& x : g) x = nd(rng);
      g[size_t(7 + s)] = INFINITY;
      g[size_t(100 + s)] = -INFINITY;
      g[size_t(200 + s)] = NAN;
      for (auto& L : lanes) L.step(g, 1.f, o, 1e-3, OutKind::bf16);
      for (size_t i = 1; i < lanes.size(); ++i)
        ASSERT_EQ(compare_lanes(lanes[0], lanes[i], OutKind::bf16), "")
            << adam_ref::name(o) << " " << lanes[i].label;
    }
  }
}

// Conversion of special values and random bit patterns on every path (zero gradient and no
// decay leave w unchanged, so the copy must be RNE of the given w).
TEST(IsaPaths, LowPrecisionCopyRoundsToNearestEvenEveryPath) {
  IsaGuard guard;
  std::mt19937 rng(4);
  std::vector<float> w;
  while (w.size() < 200000) {
    const float f = std::bit_cast<float>(uint32_t(rng()));
    if (!std::isnan(f)) w.push_back(f);
  }
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) w.push_back(u(rng));
  for (int i = 0; i < 50000; ++i) w.push_back(std::ldexp(u(rng), -30));  // f16 subnormals
  for (uint32_t hi : {0x3f80u, 0x3f81u, 0xc2f7u, 0x0001u, 0x7f7fu})      // bf16 ties
    for (uint32_t lo : {0x8000u, 0x7fffu, 0x8001u}) w.push_back(std::bit_cast<float>(hi << 16 | lo));
  for (float f : {65504.f, 65519.99f, 65520.f, INFINITY, -INFINITY, 0.f, -0.f, std::ldexp(1.f, -25),
                  std::ldexp(1.5f, -24), std::ldexp(3.f, -25)})
    w.push_back(f);
  const std::vector<float> g(w.size(), 0.f);
  for (Isa isa : rp::supported_isas()) {
    rp::set_adamw_isa(isa);
    for (DType dt : {DType::bf16, DType::f16}) {
      std::vector<float> ww = w;
      std::vector<uint16_t> out(w.size());
      AdamWState st;
      rp::adamw_update(ww.data(), st, g.data(), int64_t(w.size()), 1.f, AdamWOptions{}, 1e-3, out.data(), dt);
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(ww[i]), std::bit_cast<uint32_t>(w[i])) << rp::isa_name(isa);
        const uint16_t want = dt == DType::bf16 ? ref_round::bf16_bits(w[i]) : ref_round::f16_bits(w[i]);
        ASSERT_EQ(out[i], want) << rp::isa_name(isa) << (dt == DType::bf16 ? " bf16" : " f16")
                                << " w=" << w[i] << " bits " << std::hex << std::bit_cast<uint32_t>(w[i]);
      }
    }
    // NaN stays NaN with the scalar path's encoding (sign | 0x7e00 for f16)
    std::vector<float> nan = {NAN, -NAN};
    std::vector<float> gz(2, 0.f);
    std::vector<uint16_t> h(2);
    AdamWState st;
    rp::adamw_update(nan.data(), st, gz.data(), 2, 1.f, AdamWOptions{}, 1e-3, h.data(), DType::f16);
    EXPECT_EQ(h[0] & 0x7fff, 0x7e00) << rp::isa_name(isa);
    EXPECT_EQ(h[1] & 0x7fff, 0x7e00) << rp::isa_name(isa);
  }
}

// sum_of_squares: the same bits on every path and pool, and the norm of shards equals the
// norm of the concatenation.
TEST(IsaPaths, SumOfSquaresEveryPathAndPool) {
  IsaGuard guard;
  rp::ThreadPool p2(2), p3(3), p7(7);
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<std::vector<float>> shards;
  for (int64_t n : {0, 1, 15, 16, 17, 1000, 65535, 65536, 65537, 200003, 1 << 20})
    shards.emplace_back(static_cast<size_t>(n)), [&] {
      for (auto& x : shards.back()) x = nd(rng);
    }();
  std::vector<float> all;
  for (auto& s : shards) all.insert(all.end(), s.begin(), s.end());
  long double naive = 0;
  for (float x : all) naive += (long double)x * x;
  rp::set_adamw_isa(Isa::scalar);
  std::vector<double> want;
  for (auto& s : shards) want.push_back(rp::sum_of_squares(s.data(), int64_t(s.size())));
  const double want_all = rp::sum_of_squares(all.data(), int64_t(all.size()));
  for (Isa isa : rp::supported_isas()) {
    rp::set_adamw_isa(isa);
    double partial = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      const auto& s = shards[i];
      const int64_t n = int64_t(s.size());
      const double a = rp::sum_of_squares(s.data(), n);
      EXPECT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(want[i]))
          << rp::isa_name(isa) << " n=" << n;
      for (rp::ThreadPool* p : {&p2, &p3, &p7})
        EXPECT_EQ(std::bit_cast<uint64_t>(rp::sum_of_squares(s.data(), n, *p)), std::bit_cast<uint64_t>(a))
            << rp::isa_name(isa) << " n=" << n << " pool " << p->size();
      partial += a;
    }
    EXPECT_NEAR(std::sqrt(partial), std::sqrt(double(naive)), 1e-12 * std::sqrt(double(naive)));
    const double a = rp::sum_of_squares(all.data(), int64_t(all.size()), p3);
    EXPECT_EQ(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(want_all)) << rp::isa_name(isa);
    EXPECT_NEAR(a, double(naive), 1e-12 * double(naive));
    // inf / NaN anywhere make the sum non-finite (the skip signal)
    auto bad = all;
    bad[all.size() - 3] = INFINITY;
    EXPECT_TRUE(std::isinf(rp::sum_of_squares(bad.data(), int64_t(bad.size()), p7)));
    bad[5] = NAN;
    EXPECT_TRUE(std::isnan(rp::sum_of_squares(bad.data(), int64_t(bad.size()))));
    const float big[2] = {3e38f, -3e38f};  // squares overflow fp32, not the double sum
    EXPECT_TRUE(std::isfinite(rp::sum_of_squares(big, 2)));
  }
}

// Moments are first-touched (zeroed) by the workers: a fresh state on a pool starts at 0
// even over uninitialised memory, for every path.
TEST(IsaPaths, FreshStateOnPoolStartsAtZero) {
  IsaGuard guard;
  rp::ThreadPool pool(3);
  const int64_t n = 5 * rp::kMinElemsPerThread + 11;
  for (Isa isa : rp::supported_isas()) {
    rp::set_adamw_isa(isa);
    for (bool ams : {false, true}) {
      AdamWOptions o;
      o.amsgrad = ams;
      std::vector<float> w1(static_cast<size_t>(n), 0.25f), w2 = w1, g(static_cast<size_t>(n), 0.5f);
      AdamWState a, b;
      b.m.assign(size_t(n), 0.f);
      b.v.assign(size_t(n), 0.f);
      if (ams) b.vmax.assign(size_t(n), 0.f);
      rp::adamw_update(w1.data(), a, g.data(), n, 1.f, o, 1e-3, nullptr, DType::bf16, pool);
      rp::adamw_update(w2.data(), b, g.data(), n, 1.f, o, 1e-3, nullptr, DType::bf16, pool);
      ASSERT_EQ(0, std::memcmp(w1.data(), w2.data(), size_t(n) * 4)) << rp::isa_name(isa);
      ASSERT_EQ(a.m, b.m);
      ASSERT_EQ(a.v, b.v);
      ASSERT_EQ(a.vmax, b.vmax);
    }
  }
}

// The stand-alone copy (deferred publish) gives the same bits as the fused one, on every
// path, pool and alignment.
TEST(IsaPaths, WriteLowpCopyMatchesFusedCopy) {
  IsaGuard guard;
  rp::ThreadPool pool(3);
  std::mt19937 rng(21);
  std::vector<float> w;
  while (w.size() < 150000) {
    const float f = std::bit_cast<float>(uint32_t(rng()));
    w.push_back(std::isnan(f) ? 1.f : f);
  }
  for (Isa isa : rp::supported_isas()) {
    rp::set_adamw_isa(isa);
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (int off : {0, 1, 5, 8, 13})
        for (rp::ThreadPool* p : {static_cast<rp::ThreadPool*>(nullptr), &pool}) {
          const int64_t n = int64_t(w.size()) - off - (off % 3);
          std::vector<uint32_t> buf(w.size() + 16, 0xdeadbeefu);
          char* base = reinterpret_cast<char*>(buf.data());
          const size_t es = dt == DType::f32 ? 4 : 2;
          rp::write_lowp_copy(w.data() + off, base + size_t(off) * es, n, dt, p);
          for (int64_t i = 0; i < n; ++i) {
            const float x = w[size_t(off + i)];
            if (dt == DType::f32) {
              float y;
              std::memcpy(&y, base + size_t(off + i) * 4, 4);
              ASSERT_EQ(std::bit_cast<uint32_t>(y), std::bit_cast<uint32_t>(x));
            } else {
              uint16_t h;
              std::memcpy(&h, base + size_t(off + i) * 2, 2);
              ASSERT_EQ(h, dt == DType::bf16 ? ref_round::bf16_bits(x) : ref_round::f16_bits(x))
                  << rp::isa_name(isa) << " i=" << i << " off=" << off;
            }
          }
          // nothing written outside [off, off + n)
          for (size_t b = 0; b < size_t(off) * es; ++b)
            ASSERT_EQ(uint8_t(base[b]), (std::array<uint8_t, 4>{0xef, 0xbe, 0xad, 0xde}[b % 4]));
          for (size_t b = size_t(off + n) * es; b < buf.size() * 4; ++b)
            ASSERT_EQ(uint8_t(base[b]), (std::array<uint8_t, 4>{0xef, 0xbe, 0xad, 0xde}[b % 4]));
        }
  }
  EXPECT_THROW(rp::write_lowp_copy(w.data(), w.data(), 4, DType::i32), std::invalid_argument);
}

}  // namespace
