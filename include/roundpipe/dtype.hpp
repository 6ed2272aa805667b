// Element types of weights and activations.
#pragma once
#include <cstddef>
#include <cstdint>
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

}  // namespace rp
