// Element types of weights and activations.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace rp {

/// Storage type of a tensor. Compute always accumulates in fp32.
enum class DType : uint8_t { f32, bf16, f16, i32 };

/// Bytes per element of `t`.
constexpr size_t dtype_size(DType t) { return t == DType::f32 || t == DType::i32 ? 4 : 2; }
/// "f32", "bf16", "f16" or "i32".
const char* dtype_name(DType t);
/// Parses "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16";
/// throws std::invalid_argument naming the text otherwise.
DType parse_dtype(const std::string& s);

/// Storage form of a frozen weight tensor (LoRA's base model) in host memory and on the
/// link; the device dequantizes it into its compute dtype (the layouts are described in
/// kernels/weight_format.hpp of the source tree):
///   f32, bf16, f16 : plain elements;
///   q8_0           : GGUF Q8_0, blocks of 32 values (1.0625 bytes per value);
///   q4_0           : GGUF Q4_0, blocks of 32 values (0.5625 bytes per value);
///   nf4            : QLoRA NF4, blocks of 64 values with an fp32 absmax (0.5625 bytes per value);
///   mxfp4          : OCP MXFP4 as ggml's block_mxfp4 (GPT-OSS's expert weights), blocks of 32
///                    FP4 E2M1 values with a shared E8M0 exponent (0.53125 bytes per value);
///   fp8            : OCP FP8 E4M3 codes with one fp32 scale per row (output feature) of a
///                    matrix (1 byte per value plus 4 per row).
enum class WeightFormat : uint8_t { f32, bf16, f16, q8_0, q4_0, nf4, mxfp4, fp8 };

}  // namespace rp
