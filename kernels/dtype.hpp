// Element types used for device tensors and host copies: conversions (DType itself is
// public: roundpipe/dtype.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "roundpipe/dtype.hpp"

namespace rp {

/// fp32 -> bf16 with round-to-nearest-even (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// IEEE half <-> float (round-to-nearest-even), used for GGUF F16 tensors and fp16 copies.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

/// The finite values of x[0, n) that round to infinity in dtype `t` (f16: |x| >= 65520, as
/// its largest value is 65504; bf16: within half a step of FLT_MAX; f32 and i32: none): how
/// many, and the index of the first (-1 when none). A writer that narrows weights checks this
/// first, so no weight turns into an infinity without a word.
struct Overflows {
  int64_t count = 0, first = -1;
};
Overflows narrowing_overflows(const float* x, int64_t n, DType t);

/// Writes n fp32 values to `dst` in dtype `t` (f32 copy, bf16/f16 round-to-nearest-even).
void cast_f32_to(const float* src, void* dst, int64_t n, DType t);

}  // namespace rp
