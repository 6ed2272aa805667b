// Independent reference for fp32 -> bf16 / f16 round-to-nearest-even, for the tests only.
// Works on values in double: scale by the target format's ulp at that magnitude, round with
// std::nearbyint (default mode: nearest, ties to even), and encode the bits from the
// rounded value — no bit tricks shared with the implementation under test.
#pragma once
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>

namespace ref_round {

/// Rounds x to a binary format with `p` significand bits (incl. the implicit one) and
/// minimum normal exponent emin; returns +-inf past the largest finite value `maxv`.
inline double round_to(double x, int p, int emin, double maxv) {
  if (x == 0 || std::isnan(x) || std::isinf(x)) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
  int exp = std::max(e - 1, emin);
  double ulp = std::ldexp(1.0, exp - (p - 1));
  double r = std::nearbyint(x / ulp) * ulp;
  if (std::fabs(r) > maxv) return std::copysign(INFINITY, x);
  return r;
}

inline uint16_t bf16_bits(float f) {
  if (std::isnan(f)) return uint16_t((std::bit_cast<uint32_t>(f) >> 16) | 0x40);
  // bf16 = fp32's exponent range, 8 significand bits; max finite (2 - 2^-7) * 2^127
  double r = round_to(double(f), 8, -126, std::ldexp(2.0 - std::ldexp(1.0, -7), 127));
  return uint16_t(std::bit_cast<uint32_t>(float(r)) >> 16);  // r is exact in fp32
}

inline uint16_t f16_bits(float f) {
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return uint16_t(sign | 0x7e00);
  double r = std::fabs(round_to(double(f), 11, -14, 65504.0));
  if (std::isinf(r)) return uint16_t(sign | 0x7c00);
  if (r == 0) return sign;
  int e;
  double fr = std::frexp(r, &e);                                                // r = fr * 2^e
  if (e - 1 < -14) return uint16_t(sign | uint16_t(r / std::ldexp(1.0, -24)));  // subnormal
  uint16_t mant = uint16_t(fr * 2048 - 1024);                                   // 10 explicit bits
  return uint16_t(sign | uint16_t((e - 1 + 15) << 10) | mant);
}

}  // namespace ref_round
