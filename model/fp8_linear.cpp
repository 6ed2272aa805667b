// FP8 base linears (model/fp8_linear.hpp).
#include "model/fp8_linear.hpp"

#include <iterator>
#include <stdexcept>

namespace rp {

void fp8_quantize_weight(Ops& ops, const void* w, int64_t out, int64_t in, uint8_t* wq, uint8_t* wtq,
                         float* scale) {
  ops.fp8_scale(w, out * in, kFp8ActFormat, scale);
  ops.fp8_quantize(w, scale, wq, out * in, kFp8ActFormat);
  if (wtq) ops.fp8_quantize_transposed(w, scale, wtq, out, in, kFp8ActFormat);
}

void fp8_stored_weight(Ops& ops, const void* stored, int64_t out, int64_t in, uint8_t* wq, uint8_t* wtq,
                       float* row_scale) {
  if ((out * in) % 2 != 0)
    throw std::invalid_argument("fp8 linear: a stored weight needs an even element count");
  const auto* codes = static_cast<const uint8_t*>(stored) + out * 4;
  ops.copy(DType::f32, row_scale, stored, out);
  ops.copy(DType::bf16, wq, codes, out * in / 2);  // a byte copy: two codes per 16-bit element
  if (wtq) ops.transpose_bytes(codes, wtq, out, in);
}

std::vector<int64_t> fp8_stored_linears(const ParamGroup& g, const std::string& prefix, size_t linears,
                                        bool* stored) {
  static constexpr const char* names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                          "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                          "mlp.down_proj"};
  std::vector<int64_t> offsets;
  for (size_t i = 0; i < linears && i < std::size(names); ++i) {
    const int t = g.find(prefix + names[i] + ".weight");
    if (!g.frozen || t < 0) continue;
    const TensorSpec& ts = g.tensors[size_t(t)];
    if (ts.format != WeightFormat::fp8 || ts.shape.size() != 2 || ts.shape[0] % 16 || ts.shape[1] % 16)
      continue;
    stored[i] = true;
    offsets.push_back(ts.offset);
  }
  return offsets;
}

namespace {

// The codes of a [rows, cols] tensor and its scale in the call's scratch (the scale there
// already when `scaled`).
const uint8_t* quantize_act(Ops& ops, const Fp8ActScratch& s, const void* x, int64_t rows, int64_t cols,
                            Fp8Format f, bool scaled = false) {
  if (!s.codes || !s.scale) throw std::invalid_argument("fp8 linear: no activation scratch");
  if (!scaled) ops.fp8_scale(x, rows * cols, f, s.scale);
  ops.fp8_quantize(x, s.scale, s.codes, rows * cols, f);
  return s.codes;
}

}  // namespace

void fp8_linear_fwd(Ops& ops, const Fp8Linear& f, const void* x, void* y, int64_t n, int64_t in, int64_t out,
                    bool accumulate, const void* residual) {
  if (n <= 0) return;
  if (residual && accumulate) throw std::invalid_argument("fp8 linear: a residual and accumulate together");
  if (!f.weight.w || !(f.weight.scale || f.weight.row_scale))
    throw std::invalid_argument("fp8 linear: the weight's codes are missing");
  if (f.weight.row_scale) {  // stored codes: one scale per token and per output row
    if (!f.input_quantized) {
      if (!f.act.codes || !f.act.scale) throw std::invalid_argument("fp8 linear: no activation scratch");
      // fp8_scale_rows' scales and fp8_quantize_rows' codes from one read of x
      ops.fp8_quantize_rows_col_scaled(x, nullptr, f.act.codes, f.act.scale, n, in, kFp8ActFormat);
    }
    if (residual) ops.copy(ops.dtype(), y, residual, n * out);  // the rows' GEMM adds onto y
    ops.gemm_fp8_rows(f.act.codes, kFp8ActFormat, f.act.scale, f.weight.w, kFp8ActFormat, f.weight.row_scale,
                      y, n, in, out, accumulate || residual);
    return;
  }
  const uint8_t* xq =
      f.input_quantized ? f.act.codes : quantize_act(ops, f.act, x, n, in, kFp8ActFormat, f.input_scaled);
  if (residual)
    return ops.gemm_fp8_residual(xq, kFp8ActFormat, f.act.scale, f.weight.w, kFp8ActFormat, f.weight.scale,
                                 residual, y, n, in, out);
  ops.gemm_fp8(xq, kFp8ActFormat, f.act.scale, f.weight.w, kFp8ActFormat, f.weight.scale, y, n, in, out,
               accumulate);
}

void fp8_linear_bwd_input(Ops& ops, const Fp8Linear& f, const void* dy, void* dx, int64_t n, int64_t in,
                          int64_t out, bool accumulate) {
  if (n <= 0) return;
  if (!f.weight.wt || !(f.weight.scale || (f.weight.row_scale && f.weight.ones)))
    throw std::invalid_argument(
        "fp8 linear: the input gradient needs the codes of W^T (a backward weight cache)");
  if (f.weight.row_scale) {  // dx = diag(s_d) q(dy diag(s_w)) C: the row scales folded into dy
    if (f.input_quantized)
      throw std::invalid_argument(
          "fp8 linear: a weight with row scales quantizes dy itself (input_quantized)");
    if (!f.act.codes || !f.act.scale) throw std::invalid_argument("fp8 linear: no activation scratch");
    ops.fp8_quantize_rows_col_scaled(dy, f.weight.row_scale, f.act.codes, f.act.scale, n, out, f.grad_format);
    ops.gemm_fp8_rows(f.act.codes, f.grad_format, f.act.scale, f.weight.wt, kFp8ActFormat, f.weight.ones, dx,
                      n, out, in, accumulate);
    return;
  }
  const uint8_t* dyq =
      f.input_quantized ? f.act.codes : quantize_act(ops, f.act, dy, n, out, f.grad_format, f.input_scaled);
  ops.gemm_fp8(dyq, f.grad_format, f.act.scale, f.weight.wt, kFp8ActFormat, f.weight.scale, dx, n, out, in,
               accumulate);
}

void fp8_linear_bwd_weight(Ops& ops, const Fp8WgradScratch& s, const void* dy, const void* x, float* dw,
                           int64_t n, int64_t in, int64_t out, Fp8Format grad_format, bool x_quantized,
                           const Fp8ActScratch* dy_rows, Fp8KnownScales known) {
  if (n <= 0) return;
  if (!s.dyt || !s.xt || !s.dy_scale || !s.x_scale)
    throw std::invalid_argument("fp8 weight gradient: no scratch for the codes of dy^T and x^T");
  if (dy_rows && (!dy_rows->codes || !dy_rows->scale))
    throw std::invalid_argument("fp8 weight gradient: no scratch for dy's row codes");
  if (!fp8_wgrad_width(in))
    throw std::invalid_argument("fp8 weight gradient: the input width must be a multiple of 16");
  const int64_t K = fp8_padded_tokens(n);
  const float* x_scale = known.x ? known.x : s.x_scale;
  if (!x_quantized) {
    if (!known.x) ops.fp8_scale(x, n * in, kFp8ActFormat, s.x_scale);
    ops.fp8_quantize_transposed_padded(x, x_scale, s.xt, n, in, K, kFp8ActFormat);
  }
  // the input gradient that reads dy's row codes finds their scale beside them, so a known scale
  // is copied there (four bytes instead of a pass over dy)
  float* slot = dy_rows ? dy_rows->scale : s.dy_scale;
  const float* dy_scale = known.dy ? known.dy : slot;
  if (!known.dy) ops.fp8_scale(dy, n * out, grad_format, slot);
  else if (dy_rows) ops.copy(DType::f32, slot, known.dy, 1);
  if (dy_rows) ops.fp8_quantize_both(dy, dy_scale, dy_rows->codes, s.dyt, n, out, K, grad_format);
  else ops.fp8_quantize_transposed_padded(dy, dy_scale, s.dyt, n, out, K, grad_format);
  ops.gemm_fp8_accumulate_f32(s.dyt, grad_format, dy_scale, s.xt, kFp8ActFormat, x_scale, dw, out, K, in);
}

Fp8WgradReach fp8_wgrad_reach(const ModelConfig& c) {
  // input widths: q, k, v and gate, up read the hidden state; o the attention output; down the MLP's
  const int64_t hidden = c.hidden_size, attention = c.num_attention_heads * c.head_dim;
  Fp8WgradReach r;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool dense = !c.is_moe_layer(l);
    r.linears += dense ? 7 : 4;
    r.fp8_wgrad += (fp8_wgrad_width(hidden) ? 3 : 0) + (fp8_wgrad_width(attention) ? 1 : 0);
    if (dense)
      r.fp8_wgrad += (fp8_wgrad_width(hidden) ? 2 : 0) + (fp8_wgrad_width(c.intermediate_size) ? 1 : 0);
  }
  return r;
}

}  // namespace rp
