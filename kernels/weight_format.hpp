// Storage forms of frozen weights (LoRA's base model): kept once in host memory in this form,
// uploaded as is, and dequantized on the device inside the layer that reads them
// (Ops::dequantize). Trainable weights are never stored like this.
//
//   f32, bf16, f16 : plain elements (bf16/f16 round-to-nearest-even from fp32).
//   q8_0           : GGUF Q8_0 blocks of 32 values: {f16 d; int8 q[32]}, x = q * d,
//                    d = max|x| / 127 (34 bytes per 32 values, 1.0625 bytes per value).
//   q4_0           : GGUF Q4_0 blocks of 32 values: {f16 d; uint8 qs[16]}, x = (q - 8) * d with
//                    values 0..15 in the low nibbles and 16..31 in the high nibbles,
//                    d = -x_absmax_signed / 8 as ggml quantizes (18 bytes per 32 values).
//   nf4            : QLoRA's 4-bit NormalFloat (Dettmers et al. 2023, "QLoRA", sec. 3): blocks
//                    of 64 values {f32 absmax; uint8 q[32]}, x = kNf4[q] * absmax, value 2i in
//                    the high nibble of q[i] and 2i+1 in the low one, q the index of the code
//                    nearest to x / absmax (36 bytes per 64 values, 0.5625 bytes per value).
// Quantized formats need the element count to be a multiple of the block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "roundpipe/dtype.hpp"  // WeightFormat

namespace rp {

/// "f32", "bf16", "f16", "q8_0", "q4_0", "nf4".
const char* weight_format_name(WeightFormat f);
/// Parses the names above (case-insensitive); throws std::invalid_argument naming the text.
WeightFormat parse_weight_format(const std::string& s);
/// Values per block (1 for plain formats).
int64_t weight_format_block(WeightFormat f);
/// Bytes of n values in format f; throws std::invalid_argument when n is negative or not a
/// multiple of the block, or f is none of the formats above.
size_t weight_format_bytes(WeightFormat f, int64_t n);
/// True for q8_0, q4_0, nf4.
inline bool weight_format_quantized(WeightFormat f) {
  return f == WeightFormat::q8_0 || f == WeightFormat::q4_0 || f == WeightFormat::nf4;
}

/// The 16 NF4 code values (normal quantiles scaled to [-1, 1], with an exact 0).
extern const float kNf4[16];

/// Host: n fp32 values into format f at dst (weight_format_bytes(f, n) bytes). Throws
/// std::invalid_argument for n not a multiple of the block.
void quantize_weights(WeightFormat f, const float* src, void* dst, int64_t n);
/// Host reference of Ops::dequantize: n values of format f into fp32.
void dequantize_weights(WeightFormat f, const void* src, float* dst, int64_t n);

}  // namespace rp
