// Test references for the FP8 formats, written from the OCP 8-bit floating point
// specification (OFP8 rev. 1.0), not from kernels/fp8.hpp: the value of every code from the
// format's definition, and fp32 -> code by searching the table of values for the nearest one
// (ties to the even code, beyond the largest finite value: saturate, NaN -> 0x7f).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/fp8.hpp"

namespace rp::fp8ref {

struct Layout {
  int mant, bias;
  uint8_t max_code;
};
inline Layout layout(Fp8Format f) { return f == Fp8Format::e4m3 ? Layout{3, 7, 0x7e} : Layout{2, 15, 0x7b}; }

/// The value of code c: (-1)^s 2^(E-bias) (1 + m/2^M) for E > 0, (-1)^s 2^(1-bias) m/2^M for
/// E = 0; e4m3: S.1111.111 is NaN (no infinities); e5m2: E = 31 is inf (m = 0) or NaN.
inline double spec_value(Fp8Format f, uint8_t c) {
  const Layout l = layout(f);
  const int e_bits = 7 - l.mant, e_max = (1 << e_bits) - 1;
  const int s = c >> 7, e = (c >> l.mant) & e_max, m = c & ((1 << l.mant) - 1);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  if (f == Fp8Format::e4m3 && e == e_max && m == (1 << l.mant) - 1) return nan;
  if (f == Fp8Format::e5m2 && e == e_max) return m ? nan : (s ? -inf : inf);
  const double frac = double(m) / double(1 << l.mant);
  const double v = e == 0 ? std::ldexp(frac, 1 - l.bias) : std::ldexp(1.0 + frac, e - l.bias);
  return s ? -v : v;
}

/// Values of the positive finite codes 0 .. max_code, ascending.
inline std::vector<double> positive_values(Fp8Format f) {
  std::vector<double> v;
  for (int c = 0; c <= layout(f).max_code; ++c) v.push_back(spec_value(f, uint8_t(c)));
  return v;
}

/// Nearest code to x (round to nearest, ties to the even code, saturating, NaN -> 0x7f).
inline uint8_t ref_encode(Fp8Format f, float x, const std::vector<double>& pos) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(double(x));
  const int top = int(pos.size()) - 1;
  if (a >= pos[size_t(top)]) return uint8_t(sign | top);
  int lo = 0, hi = top;  // pos[lo] <= a < pos[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (pos[size_t(mid)] <= a ? lo : hi) = mid;
  }
  const double d0 = a - pos[size_t(lo)], d1 = pos[size_t(hi)] - a;
  const int c = d0 < d1 ? lo : d1 < d0 ? hi : (lo % 2 == 0 ? lo : hi);
  return uint8_t(sign | c);
}

/// n normal values (sigma 1) with every 97th replaced by an outlier of magnitude 20..60
/// (activations with a few large channels).
inline std::vector<float> normal_with_outliers(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::uniform_real_distribution<float> big(20.f, 60.f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i % 97 == 13 ? (i % 2 ? -big(g) : big(g)) : d(g);
  return v;
}

}  // namespace rp::fp8ref
