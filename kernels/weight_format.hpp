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
//   mxfp4          : OCP Microscaling Formats (MX) spec v1.0, MXFP4 (FP4 E2M1 elements, one E8M0
//                    scale per 32), laid out as ggml's block_mxfp4: blocks of 32 values
//                    {uint8 e; uint8 qs[16]}, values 0..15 in the low nibbles and 16..31 in the
//                    high nibbles, x = kMxfp4[q] * 2^(e-128) (kMxfp4 = twice the E2M1 values,
//                    so this is E2M1(q) * 2^(e-127), the spec's X = 2^(E-127) * P). Every value
//                    is an exact fp32 product (2^(e-128) is subnormal for e < 2; e = 255, the
//                    spec's NaN scale, is not special-cased: it decodes to 2^127 * kMxfp4[q],
//                    +-inf for |code| >= 2). Quantized as ggml's quantize_row_mxfp4_ref:
//                    e = floor(log2(absmax)) - 2 + 127 (0 for an all-zero block, clamped to
//                    [0, 254]), q the code nearest to x / 2^(e-128) (first on ties; values
//                    beyond 12 * 2^(e-128) saturate) (17 bytes per 32 values).
//   fp8            : a matrix's rows (of `cols` values each: the input features of a linear's
//                    W [out, in]) in OCP FP8 E4M3 (kernels/fp8.hpp) with one fp32 scale per
//                    row: rows * 4 bytes of little-endian fp32 scales, then the rows * cols
//                    codes row after row (1 byte per value plus 4 per row). Row r's scale is
//                    s = fp8::scale_from_amax(max|x_r|, e4m3) = amax / 448 (1 for an all-zero
//                    row, the smallest fp32 subnormal when amax / 448 underflows), its codes
//                    fp8::quantize(e4m3, x, s) (round to nearest even, saturating), and
//                    x = decode(code) * s. A row holding a NaN or an infinity is refused.
//                    The per-row scale is what lets an FP8 GEMM use the codes as they are:
//                    Y = X W^T scales output column r by s_r.
// Quantized formats need the element count to be a multiple of the block; fp8 needs the row
// length (`cols`, ignored by the other formats) to divide it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "roundpipe/dtype.hpp"  // WeightFormat

namespace rp {

/// "f32", "bf16", "f16", "q8_0", "q4_0", "nf4", "mxfp4", "fp8".
const char* weight_format_name(WeightFormat f);
/// Parses the names above (case-insensitive); throws std::invalid_argument naming the text.
WeightFormat parse_weight_format(const std::string& s);
/// Values per block (1 for plain formats).
int64_t weight_format_block(WeightFormat f);
/// Bytes of n values in format f (rows of `cols` values for fp8); throws
/// std::invalid_argument when n is negative or not a multiple of the block, for fp8 when cols
/// is not positive or does not divide n, or when f is none of the formats above.
size_t weight_format_bytes(WeightFormat f, int64_t n, int64_t cols = 0);
/// True for q8_0, q4_0, nf4, mxfp4, fp8.
inline bool weight_format_quantized(WeightFormat f) {
  return f == WeightFormat::q8_0 || f == WeightFormat::q4_0 || f == WeightFormat::nf4 ||
         f == WeightFormat::mxfp4 || f == WeightFormat::fp8;
}
/// The row length the storage of a tensor of this shape uses (its last dimension; 0 for a
/// scalar): the `cols` of the functions here.
int64_t weight_format_cols(const std::vector<int64_t>& shape);

/// The 16 NF4 code values (normal quantiles scaled to [-1, 1], with an exact 0).
extern const float kNf4[16];
/// The NF4 code of v: the index i of the kNf4 level nearest v (smallest |v - kNf4[i]|, the
/// lower index on a tie; 0 for NaN), as quantize_weights picks it for a value already divided
/// by its block's absmax.
uint8_t nf4_code(float v);
/// The 16 MXFP4 code values as ggml's kvalues_mxfp4: {0,1,2,3,4,6,8,12, 0,-1,-2,-3,-4,-6,-8,-12}
/// (twice the FP4 E2M1 values; code 8 is E2M1's -0, decoded as +0).
extern const float kMxfp4[16];
/// 2^(e-128) as fp32 (exact, subnormal for e < 2): the factor of an mxfp4 block's codes.
float mxfp4_scale(uint8_t e);

/// Host: n fp32 values into format f at dst (weight_format_bytes(f, n, cols) bytes). Throws
/// std::invalid_argument for n not a multiple of the block (fp8: of cols), and for fp8 when a
/// row holds a NaN or an infinity (the message names the row). fp8 runs its rows on several
/// threads when n is large.
void quantize_weights(WeightFormat f, const float* src, void* dst, int64_t n, int64_t cols = 0);
/// Host reference of Ops::dequantize: n values of format f into fp32.
void dequantize_weights(WeightFormat f, const void* src, float* dst, int64_t n, int64_t cols = 0);

/// One tensor of a batched device dequantization (Ops::dequantize_many): `n` values stored in
/// `format` at `src` (fp8: rows of `cols` values), written to `dst` in the device's dtype.
struct DequantPart {
  WeightFormat format = WeightFormat::bf16;
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t n = 0;
  int64_t cols = 0;
};

/// Converts Hugging Face GPT-OSS MXFP4 tensors (transformers/integrations/mxfp4.py, the
/// checkpoint's `*_blocks` and `*_scales`) into mxfp4 storage, exactly (same codes, same
/// exponents; only the nibble order differs):
///   blocks uint8 [rows, G, 16]: value 2i of a group is the LOW nibble of byte i, 2i+1 the high;
///   scales uint8 [rows, G]: value = FP4_VALUES[nibble] * 2^(scale-127),
///   FP4_VALUES = {+0,+0.5,+1,+1.5,+2,+3,+4,+6,-0,-0.5,-1,-1.5,-2,-3,-4,-6}.
/// rows is the product of the leading dimensions (e.g. experts * out_features for the stacked
/// expert weights [E, N, G, 16]); row r's G*32 values, in order, become G mxfp4 blocks at
/// dst + (r*G + g) * 17 (weight_format_bytes(mxfp4, rows*G*32) bytes). This is the [E, N, K]
/// (out, in) order of convert_moe_packed_tensors before its final transpose(1, 2), i.e. the
/// layout of Ops::grouped_linear_fwd's stacked weights. Throws std::invalid_argument for
/// negative sizes or null pointers with rows*G > 0.
void mxfp4_from_hf(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups, void* dst);

}  // namespace rp
