// Element types used for device tensors and host copies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace rp {

/// Storage type of a tensor. Compute always accumulates in fp32.
enum class DType : uint8_t { f32, bf16, f16, i32 };

/// Bytes per element of `t`.
constexpr size_t dtype_size(DType t) {
  return t == DType::f32 || t == DType::i32 ? 4 : 2;
}
/// "f32", "bf16", "f16" or "i32".
const char* dtype_name(DType t);
/// Parses "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16";
/// throws std::invalid_argument naming the text otherwise.
DType parse_dtype(const std::string& s);

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

/// Writes n fp32 values to `dst` in dtype `t` (f32 copy, bf16/f16 round-to-nearest-even).
void cast_f32_to(const float* src, void* dst, int64_t n, DType t);

}  // namespace rp
