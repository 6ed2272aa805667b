// FP8 base linears of a decoder (LayerOptions::fp8; docs/gpu.md, "FP8 linears").
//
// The forward, its recompute and the input gradient of a dense linear run as FP8 GEMMs with
// fp32 accumulation (Ops::gemm_fp8):
//   y  = (s_x s_w) * q(x) q(W)^T          x [n, in] -> e4m3 codes, scale s_x from max|x|
//   dx = (s_dy s_w) * q(dy) q(W^T)^T      dy [n, out] -> e4m3 codes (kFp8GradFormat), scale s_dy
// W [out, in] is quantized once per upload (e4m3, one scale s_w for the whole matrix; the
// codes of W and of W^T are kept in the layer's weight cache, model/layer_memory.hpp's
// Fp8WeightBufs). Every scale is the current tensor's amax / largest finite code (no
// history; fp8::scale_from_amax). The scales are per tensor, not per row: Ops::gemm_fp8
// applies one scale per operand inside the GEMM (cuBLASLt's tensor-wide scale pointers), where
// per-row scales would need a separate pass over the output. A NaN or inf in x, dy or W makes
// its scale non-finite and so the whole product: the step's loss or gradients turn non-finite
// and the run's non-finite-step handling (SessionOptions::skip_nonfinite) takes over.
// Weight gradients dW += dy^T x stay in the compute dtype unless LayerOptions::
// fp8_weight_gradients: then (fp8_linear_bwd_weight)
//   dW += (s_dy s_x) * q(dy^T) q(x^T)^T   into the fp32 gradient, the token sum in the GEMM's K
// with dy^T [out, n] and x^T [in, n] quantized transposed (the FP8 GEMM wants K contiguous)
// and the token count padded to 16 with zero codes. LoRA adapters' low-rank GEMMs stay in the
// compute dtype.
//
// A frozen base stored as fp8 (kernels/weight_format.hpp: e4m3 codes C with one scale s_w[o]
// per output row, W = diag(s_w) C) runs from its stored codes where the device has the FP8
// GEMM with per-row scales (Ops::gemm_fp8_rows_supported; Fp8Weight::row_scale set):
//   y  = diag(s_x) q(x) C^T diag(s_w)     s_x [n]: one scale per token, scales and codes in one
//                                         pass over x (Ops::fp8_quantize_rows_col_scaled without
//                                         column scales; or made by the norm that produced x,
//                                         Ops::rmsnorm_fwd_fp8_rows)
//   dx = diag(s_d) q(dy diag(s_w)) C      s_w folded into dy before its per-token quantization
//                                         (Ops::fp8_quantize_rows_col_scaled); C^T's codes are
//                                         C's bytes transposed (Ops::transpose_bytes)
// so the weight is rounded once, when it was stored: no dequantization into the compute dtype,
// no tensor-wide requantization (fp8_stored_weight copies the codes and scales into the cache
// and transposes the codes, two byte passes instead of fp8_quantize_weight's three passes over
// compute-dtype weights).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
#include "model/layout.hpp"  // ParamGroup

namespace rp {

/// Format of the activations' and the weights' codes.
constexpr Fp8Format kFp8ActFormat = Fp8Format::e4m3;
/// Default format of the output gradients' codes in the input-gradient GEMM (Fp8Linear::
/// grad_format): e4m3, which keeps dx = dy W closer to the fp32 product than e5m2 for
/// Gaussian and for heavy-tailed dy alike (tests/model/test_fp8_linear.cpp,
/// GradientFormatE4m3IsTheCloser): with a scale from the tensor's own amax the range e5m2
/// adds is not needed, the mantissa bit it gives up is.
constexpr Fp8Format kFp8GradFormat = Fp8Format::e4m3;

/// One linear's quantized weight: codes of W [out, in] (e4m3), of W^T [in, out] (null in a
/// forward-only cache) and the scale s_w (device fp32[1]). With row_scale (a weight used in its
/// fp8 storage form) the scales are per output row, row_scale [out], `scale` is not read, and
/// the input gradient reads ones [in] (fp32 1s: the GEMM's scale vector of W^T's rows).
struct Fp8Weight {
  const uint8_t* w = nullptr;
  const uint8_t* wt = nullptr;
  const float* scale = nullptr;
  const float* row_scale = nullptr;
  const float* ones = nullptr;
};

/// Where a call quantizes its activations: codes of at least n * max(in, out) bytes and one
/// fp32 scale, n scales (one per token) for a weight with row scales (the decoder's scratch,
/// DecoderBufs::fp8_codes / fp8_scale).
struct Fp8ActScratch {
  uint8_t* codes = nullptr;
  float* scale = nullptr;
};

/// A base linear in FP8: its quantized weight and the call's activation scratch. Passed as
/// null where a linear runs in the compute dtype.
struct Fp8Linear {
  Fp8Weight weight;
  Fp8ActScratch act;
  /// act already holds the codes and scale of this call's input, which is then not read:
  /// fp8_linear_fwd's x (the previous linear read the same input, as k and v read q's, up reads
  /// gate's); fp8_linear_bwd_input's dy (fp8_linear_bwd_weight wrote its row codes beside
  /// dy^T's, in grad_format; tensor scales only, refused with row scales).
  bool input_quantized = false;
  /// act.scale already holds the scale of this call's input, so the input is read once, to
  /// quantize it: fp8_linear_fwd's x (the kernel that produced x computed it:
  /// Ops::rmsnorm_fwd_fp8_scale / swiglu_fwd_fp8_scale), fp8_linear_bwd_input's dy (in
  /// grad_format: Ops::swiglu_bwd_fp8_scale's, for gate's and up's input gradients).
  bool input_scaled = false;
  /// fp8_linear_bwd_input: the format of dy's codes (e4m3 or e5m2; W^T is e4m3).
  Fp8Format grad_format = kFp8GradFormat;
};

/// Where a weight gradient's FP8 GEMM quantizes dy^T and x^T (DecoderBufs::fp8_dyt / fp8_xt):
/// codes of at least out * fp8_padded_tokens(n) and in * fp8_padded_tokens(n) bytes, and one
/// 16-byte aligned fp32 scale each.
struct Fp8WgradScratch {
  uint8_t* dyt = nullptr;
  uint8_t* xt = nullptr;
  float* dy_scale = nullptr;
  float* x_scale = nullptr;
};

/// Tokens of a weight gradient's FP8 GEMM: n rounded up to the GEMM's multiple of 16.
constexpr int64_t fp8_padded_tokens(int64_t n) { return (n + 15) / 16 * 16; }

/// Whether a linear of input width `in` can take its weight gradient through the FP8 GEMM
/// (fp8_linear_bwd_weight): `in` is that GEMM's N, which must be a multiple of 16. The others'
/// weight gradients stay in the compute dtype.
constexpr bool fp8_wgrad_width(int64_t in) { return in > 0 && in % 16 == 0; }

/// The decoder linears of model `c` that run in FP8 (q, k, v, o and a dense MLP's gate, up and
/// down, over all layers; a sparse block's experts stay in the compute dtype), and how many of
/// them can take their weight gradients in FP8 (fp8_wgrad_width of their input width).
struct Fp8WgradReach {
  int64_t linears = 0, fp8_wgrad = 0;
};
Fp8WgradReach fp8_wgrad_reach(const ModelConfig& c);

/// scale[0] = scale of W [out, in] (compute dtype), wq = its e4m3 codes, and when wtq is not
/// null the codes of W^T [in, out].
void fp8_quantize_weight(Ops& ops, const void* w, int64_t out, int64_t in, uint8_t* wq, uint8_t* wtq,
                         float* scale);

/// A weight in its fp8 storage form (kernels/weight_format.hpp: `stored` holds out fp32 row
/// scales, then the out x in e4m3 codes) into the weight cache: row_scale [out] and wq [out,
/// in] copied, and when wtq is not null the codes transposed into it [in, out]. No rounding.
void fp8_stored_weight(Ops& ops, const void* stored, int64_t out, int64_t in, uint8_t* wq, uint8_t* wtq,
                       float* row_scale);

/// Which of the first `linears` dense linears (q, k, v, o, gate, up, down) of the decoder whose
/// tensors are named `prefix` + "self_attn.q_proj.weight" etc. in group g can run from their
/// fp8 storage: frozen in format fp8, both sides multiples of 16 (the FP8 GEMM's). Sets
/// stored[i] and returns their offsets (TensorSpec::offset) in order.
std::vector<int64_t> fp8_stored_linears(const ParamGroup& g, const std::string& prefix, size_t linears,
                                        bool* stored);

/// y [n, out] (+)= x W^T through the FP8 GEMM (x [n, in] in the compute dtype; y read when
/// `accumulate`). With `residual` ([n, out], not y; accumulate false): y = residual + x W^T, the
/// residual read in the GEMM's epilogue (Ops::gemm_fp8_residual).
void fp8_linear_fwd(Ops& ops, const Fp8Linear& f, const void* x, void* y, int64_t n, int64_t in, int64_t out,
                    bool accumulate, const void* residual = nullptr);
/// dx [n, in] (+)= dy W through the FP8 GEMM (dy [n, out]); needs f.weight.wt. Throws
/// std::invalid_argument without it.
void fp8_linear_bwd_input(Ops& ops, const Fp8Linear& f, const void* dy, void* dx, int64_t n, int64_t in,
                          int64_t out, bool accumulate);

/// dw [out, in] (fp32) += dy^T x through the FP8 GEMM (dy [n, out], x [n, in] in the compute
/// dtype; dy's codes in `grad_format`, x's e4m3). `x_quantized`: s.xt and s.x_scale already
/// hold x^T's codes from the previous call with the same x and n (k and v after q, up after
/// gate). `dy_rows` (or null): also leave dy's row-major codes [n, out] and its scale there,
/// made in the same pass as dy^T's (Ops::fp8_quantize_both), for the input gradient's GEMM
/// (fp8_linear_bwd_input with input_quantized): one amax and one read of dy serve both GEMMs.
/// Known scales (Fp8KnownScales): where the kernel that produced x or dy already wrote its scale
/// (a producer with a fused amax, as Ops::rmsnorm_fwd_fp8_scale in the recompute or
/// Ops::swiglu_bwd_fp8_scale), that scale is used and the tensor is read only to quantize it;
/// with x_quantized, x_scale is the scale x^T's codes were made with. The codes are those of
/// the call without known scales when the scales are the tensors' own (bit for bit).
/// Needs in % 16 == 0 (the GEMM's N); throws std::invalid_argument otherwise or without
/// scratch.
struct Fp8KnownScales {
  const float* x = nullptr;   ///< x's scale (device fp32[1], 16-byte aligned), or null: from max|x|
  const float* dy = nullptr;  ///< dy's scale in grad_format, or null: from max|dy|
};
void fp8_linear_bwd_weight(Ops& ops, const Fp8WgradScratch& s, const void* dy, const void* x, float* dw,
                           int64_t n, int64_t in, int64_t out, Fp8Format grad_format, bool x_quantized,
                           const Fp8ActScratch* dy_rows = nullptr, Fp8KnownScales known = {});

}  // namespace rp
