// FP8 element formats (OCP 8-bit Floating Point Specification, OFP8, rev. 1.0): scalar
// conversions shared by the CPU backend and the CUDA kernels (host and device inline code),
// so both round every value the same way, bit for bit.
//
//   e4m3 ("E4M3FN"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, NaN is
//                    S.1111.111 (0x7f / 0xff); largest finite 448 (0x7e), smallest normal 2^-6,
//                    subnormals m/8 * 2^-6 (smallest 2^-9).
//   e5m2           : 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like: S.11111.00 is
//                    +-inf, S.11111.{01,10,11} NaN; largest finite 57344 (0x7b), smallest
//                    normal 2^-14, subnormals m/4 * 2^-14 (smallest 2^-16).
//
// fp32 -> fp8 is what CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt) computes (the
// cvt.rn.satfinite instruction on sm_89+): round to nearest, ties to even mantissa, values
// (and infinities) beyond the largest finite value saturate to it with their sign, NaN
// becomes 0x7f (sign dropped), values at or below half the smallest subnormal become a zero
// with the input's sign.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RP_FP8_HD __host__ __device__ __forceinline__
#else
#define RP_FP8_HD inline
#endif

namespace rp {

/// The two FP8 formats.
enum class Fp8Format : uint8_t { e4m3, e5m2 };

namespace fp8 {

RP_FP8_HD uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
RP_FP8_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// Layout of a format: mantissa bits, exponent bias, largest finite code (positive).
template <Fp8Format F>
struct Traits;
template <>
struct Traits<Fp8Format::e4m3> {
  static constexpr int kMant = 3, kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7e;
  static constexpr float kMax = 448.0f;
};
template <>
struct Traits<Fp8Format::e5m2> {
  static constexpr int kMant = 2, kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7b;
  static constexpr float kMax = 57344.0f;
};

/// fp32 -> FP8 code, round-to-nearest-even, saturating (see the top of this file).
template <Fp8Format F>
RP_FP8_HD uint8_t encode(float x) {
  using T = Traits<F>;
  constexpr int M = T::kMant, B = T::kBias;
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  constexpr uint32_t kMinNormal = uint32_t(127 + 1 - B) << 23;
  uint32_t code;
  if (a >= kMinNormal) {
    // drop 23 - M mantissa bits with round-to-nearest-even (a carry moves into the exponent)
    const uint32_t r = (a + ((1u << (22 - M)) - 1u) + ((a >> (23 - M)) & 1u)) >> (23 - M);
    code = r - (uint32_t(127 - B) << M);
    if (code > T::kMaxCode) code = T::kMaxCode;
  } else {
    // subnormal target: code = |x| / 2^(1-B-M) rounded to nearest even (2^M is the smallest
    // normal, which the rounding may reach)
    const uint32_t e = a >> 23;
    const int shift = 151 - B - M - int(e);  // > 23 - M since e < 128 - B
    if (e == 0 || shift > 24) {
      code = 0;  // fp32 subnormals and values below a quarter of the smallest code's unit
    } else {
      const uint32_t m = (a & 0x7fffffu) | 0x800000u;
      const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
      code = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    }
  }
  return uint8_t(sign | code);
}

/// FP8 code -> fp32 (exact; NaN codes give a quiet NaN, e5m2's infinities +-inf).
template <Fp8Format F>
RP_FP8_HD float decode(uint8_t c) {
  using T = Traits<F>;
  constexpr int M = T::kMant, B = T::kBias;
  constexpr uint32_t kExpMax = (1u << (7 - M)) - 1u;
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t ex = (uint32_t(c) >> M) & kExpMax, mant = uint32_t(c) & ((1u << M) - 1u);
  if (F == Fp8Format::e4m3 && (c & 0x7fu) == 0x7fu) return float_of(0x7fc00000u);
  if (F == Fp8Format::e5m2 && ex == kExpMax) return float_of(mant ? 0x7fc00000u : (sign | 0x7f800000u));
  if (ex == 0) {  // zero or subnormal: mant * 2^(1-B-M), exact
    const float unit = float_of(uint32_t(127 + 1 - B - M) << 23);
    return float_of(sign | bits_of(float(mant) * unit));
  }
  return float_of(sign | (ex + uint32_t(127 - B)) << 23 | mant << (23 - M));
}

/// Runtime-format versions of encode / decode.
RP_FP8_HD uint8_t encode(Fp8Format f, float x) {
  return f == Fp8Format::e4m3 ? encode<Fp8Format::e4m3>(x) : encode<Fp8Format::e5m2>(x);
}
RP_FP8_HD float decode(Fp8Format f, uint8_t c) {
  return f == Fp8Format::e4m3 ? decode<Fp8Format::e4m3>(c) : decode<Fp8Format::e5m2>(c);
}
/// Largest finite value of f (448 or 57344).
RP_FP8_HD float max_finite(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Traits<Fp8Format::e4m3>::kMax : Traits<Fp8Format::e5m2>::kMax;
}

/// The per-tensor (or per-row) scale of values whose largest magnitude is amax: amax / max
/// (fp32 division, so the largest value maps onto the largest finite code), with
///   amax == 0                 -> 1 (an all-zero tensor: any scale quantizes it exactly),
///   amax NaN                  -> NaN (0x7fc00000), amax inf -> inf: a non-finite scale that
///                                makes every product using it non-finite, for the caller's
///                                non-finite-step handling to see,
///   amax / max underflowing   -> the smallest fp32 subnormal (so x / scale never divides by 0).
RP_FP8_HD float scale_from_amax(float amax, Fp8Format f) {
  if (amax != amax) return float_of(0x7fc00000u);
  if (amax == 0.0f) return 1.0f;
  const float s = amax / max_finite(f);
  return s == 0.0f ? float_of(1u) : s;
}

/// The code of x under scale s: encode(x / s) (fp32 division, round to nearest).
RP_FP8_HD uint8_t quantize(Fp8Format f, float x, float s) { return encode(f, x / s); }

}  // namespace fp8

/// "e4m3" or "e5m2".
inline const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

}  // namespace rp
