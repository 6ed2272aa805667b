// The decoder layer's backward (model/decoder_layer.hpp): the recompute of its forward (the
// attention half whole, the MLP half chunk by chunk), then the MLP's and the attention's
// weight and input gradients, through FP8 weight-gradient GEMMs where the call asks for them.
#include <stdexcept>

#include "model/decoder_layer.hpp"
#include "model/layer_args.hpp"

namespace rp {

namespace {

using namespace layer_args;

// db += column sums of dy [M,N] unless the bias is absent or frozen.
void bias_bwd(Ops& ops, const LayerArgs& a, int64_t off, const void* dy, int64_t M, int64_t N) {
  if (off < 0) return;
  void* db = grad(a, 0, off);
  if (!db) return;
  const int32_t rows[2] = {0, int32_t(M)};
  ops.grouped_bias_bwd(dy, db, rows, 1, N);
}

// What a weight gradient's FP8 call left in the scratch: x^T's codes (for the next linear with
// the same x) and dy's row codes and scale (for this linear's input gradient).
struct WgradCodes {
  bool x = false;
  bool dy = false;
};

// dw += dy^T x (M tokens, x [M,K], dy [M,N]) unless dw is a frozen group's (null): through
// the FP8 GEMM when the call runs linear m's weight gradient in FP8 (`x_same`: x^T's codes are
// the previous call's, which had the same x; `known`: the scales x's and dy's producers kept,
// Fp8Set::keep), else Ops::linear_bwd_weight. Where m's input gradient runs in FP8 under a
// tensor scale, dy's row codes are made in the same pass as dy^T's, into m's activation
// scratch: the input gradient's call must come next (Fp8Set::dy_coded), before any other FP8
// linear uses the scratch.
WgradCodes weight_grad(Ops& ops, const Fp8Set& f8, LoraModule m, const void* dy, const void* x, void* dw,
                       int64_t M, int64_t K, int64_t N, bool x_same = false, Fp8KnownScales known = {}) {
  if (!dw) return {};
  if (!f8.wgrad_fp8(m, K)) {
    ops.linear_bwd_weight(dy, x, dw, M, K, N);
    return {};
  }
  const Fp8Linear& f = *f8(m);
  const bool share_dy = !f.weight.row_scale;
  fp8_linear_bwd_weight(ops, f8.wgrad, dy, x, static_cast<float*>(dw), M, K, N, f.grad_format, x_same,
                        share_dy ? &f.act : nullptr, known);
  return {true, share_dy};
}

// One linear's backward: dw += dy^T x (weight_grad), then dx (+)= dy W with its adapter's part
// (adapted_linear_bwd_input), which reads the codes of dy the weight gradient left or, without
// them, takes dy's scale from `known` (the scale dy's producer kept) instead of an amax pass.
struct LinearBackward {
  LoraModule m;
  const void *x, *dy, *w;
  void *dw, *dx;
  int64_t n, in, out;
  bool accumulate;  // dx += (else =)
  int64_t row0;     // the call's first row (an MLP chunk's)
  bool reuse_u;     // the adapter's u is the recompute's
  bool x_same = false;
};
WgradCodes linear_backward(Ops& ops, const Fp8Set& f8, const LoraCall& lc, const LoraLinear& l,
                           const LinearBackward& g, Fp8KnownScales known = {}) {
  const WgradCodes c = weight_grad(ops, f8, g.m, g.dy, g.x, g.dw, g.n, g.in, g.out, g.x_same, known);
  // dy's codes from the weight gradient's call, else its scale from dy's producer, else its own
  const Fp8Linear* f = c.dy ? f8.dy_coded(g.m, true) : f8.dy_scaled(ops, g.m, known.dy);
  adapted_linear_bwd_input(ops, lc, l, g.x, g.dy, g.w, g.dx, g.n, g.in, g.out, g.accumulate, g.row0,
                           g.reuse_u, f);
  return c;
}

// The adapters of linears that read x, run as one where they can (lora_siblings_backward): their
// input gradient written into dx first (added when `accumulate`). True when they ran: each
// linear's backward then takes kNoAdapter and adds its base input gradient onto dx.
bool siblings_first(const LoraCall& lc, std::span<const LoraLinear* const> ls,
                    std::span<const void* const> dy, const void* x, void* dx, int64_t n, bool accumulate) {
  if (!lora_siblings_fuse(lc, ls)) return false;
  lora_siblings_backward(lc, ls, dy, x, dx, n, accumulate, true);
  return true;
}
const LoraLinear kNoAdapter{};

}  // namespace

void DecoderLayer::mlp_backward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc,
                                const Fp8Set& f8, int64_t r0, int64_t n) const {
  Ops& ops = *a.ops;
  const int64_t H = c_.hidden_size, F = c_.intermediate_size;
  const float eps = float(c_.rms_norm_eps);
  const void* h1 = row(ops, b.h1, r0, H);
  const void* dy = row(ops, a.dy, r0, H);
  void* dh1 = row(ops, a.dx, r0, H);
  // recompute the chunk's forward up to m
  const bool pre_norm = w_mlp_in_ >= 0;  // OLMo 2: no pre-norm
  // the scales the weight gradients take from their operands' producers (null: none kept)
  const bool swiglu = !moe_ && !c_.gemma();
  float* hn_scale = pre_norm && !moe_ && f8(LoraModule::gate) ? f8.keep_wgrad(kKeptMlpIn) : nullptr;
  float* m_scale = swiglu ? f8.keep_wgrad(kKeptMlpAct) : nullptr;
  const bool dgu_scaled = swiglu && f8.keep(kKeptDGate) && f8(LoraModule::gate) && f8(LoraModule::up) &&
                          f8(LoraModule::gate)->grad_format == f8(LoraModule::up)->grad_format;
  if (pre_norm)
    norm_fwd(ops, h1, param(a, 0, w_mlp_in_), b.hn, n, H, eps, off_, moe_ ? nullptr : f8(LoraModule::gate),
             hn_scale);
  if (moe_) {
    const bool aux = a.moe_stats && a.moe_aux_scale != 0.0f;
    const double rows = double(moe_layers_) * double(a.shape.tokens());
    const float aux_coef =
        aux ? float(double(a.moe_aux_scale) * double(moe_->experts()) / (rows * rows)) : 0.0f;
    moe_->backward(ops, a.params[0], a.grads[0], b.hn, dy, b.dhn, n, b.moe, aux ? a.moe_stats : nullptr,
                   aux_coef, moe_adapters(a, true));
    ops.copy(ops.dtype(), dh1, dy, n * H);  // residual path
    ops.rmsnorm_bwd(h1, param(a, 0, w_post_), b.dhn, dh1, grad(a, 0, w_post_), n, H, eps, true);
    return;
  }
  const void* in = pre_norm ? b.hn : h1;
  gate_up_fwd(a, b, lc, f8, in, pre_norm, r0, n);
  if (m_scale) ops.swiglu_fwd_fp8_scale(b.g, b.u, b.m, n * F, kFp8ActFormat, m_scale);
  else act_fwd(ops, b.g, b.u, b.m, n * F);
  // y = h1 + r * post_norm(down(m)): dout, the gradient at down's output, is dy itself for
  // LLaMA; OLMo 2 and Gemma recompute down's output (into hn) for its norm's backward (Gemma
  // then normalizes h1 into hn again), Granite scales dy
  const void* dout = dy;
  if (post_norm_branches()) {
    adapted_linear_fwd(ops, lc, lora(LoraModule::down), b.m, param(a, 0, wd_), b.hn, n, F, H, r0,
                       f8(LoraModule::down));
    ops.rmsnorm_bwd(b.hn, param(a, 0, w_post_ff_), dy, b.dhn, grad(a, 0, w_post_ff_), n, H, eps, false, off_);
    if (pre_norm) ops.rmsnorm_fwd(h1, param(a, 0, w_mlp_in_), b.hn, n, H, eps, off_);
    dout = b.dhn;
  } else if (branch_scaled()) {
    scale_activation(ops, dy, b.dhn, n * H, float(c_.residual_multiplier));
    dout = b.dhn;
  }
  // down's adapter has its u from the recompute only when down's forward ran again
  linear_backward(ops, f8, lc, lora(LoraModule::down),
                  {LoraModule::down, b.m, dout, param(a, 0, wd_), grad(a, 0, wd_), b.dm, n, F, H, false, r0,
                   post_norm_branches(), false},
                  {m_scale, nullptr});
  float *dg_scale = dgu_scaled ? f8.keep(kKeptDGate) : nullptr,
        *du_scale = dgu_scaled ? f8.keep(kKeptDUp) : nullptr;
  if (c_.gemma()) ops.geglu_bwd(b.g, b.u, b.dm, b.dg, b.du, n * F);
  else if (dgu_scaled)
    ops.swiglu_bwd_fp8_scale(b.g, b.u, b.dm, b.dg, b.du, n * F, f8(LoraModule::gate)->grad_format, dg_scale,
                             du_scale);
  else ops.swiglu_bwd(b.g, b.u, b.dm, b.dg, b.du, n * F);
  // without a pre-norm the input gradients add straight onto the residual path's
  void* din = pre_norm ? b.dhn : dh1;
  if (!pre_norm) ops.copy(ops.dtype(), dh1, dy, n * H);  // residual path
  // each linear's weight gradient, then its input gradient (which may read dy's codes the
  // first left in the scratch)
  const LoraModule G = LoraModule::gate, U = LoraModule::up;
  const LoraLinear* gu[] = {&lora(G), &lora(U)};
  const void* dgu[] = {b.dg, b.du};
  const bool fused = siblings_first(lc, gu, dgu, in, din, n, !pre_norm);
  const WgradCodes gate = linear_backward(
      ops, f8, lc, fused ? kNoAdapter : lora(G),
      {G, in, b.dg, param(a, 0, wg_), grad(a, 0, wg_), din, n, H, F, fused || !pre_norm, r0, true, false},
      {hn_scale, dg_scale});
  linear_backward(ops, f8, lc, fused ? kNoAdapter : lora(U),
                  {U, in, b.du, param(a, 0, wu_), grad(a, 0, wu_), din, n, H, F, true, r0, true, gate.x},
                  {hn_scale, du_scale});
  if (!pre_norm) return;
  ops.copy(ops.dtype(), dh1, dy, n * H);  // residual path
  ops.rmsnorm_bwd(h1, param(a, 0, w_mlp_in_), b.dhn, dh1, grad(a, 0, w_mlp_in_), n, H, eps, true, off_);
}

void DecoderLayer::attention_backward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc,
                                      const Fp8Set& f8) const {
  Ops& ops = *a.ops;
  const int64_t T = a.shape.tokens(), H = c_.hidden_size;
  const int64_t nq = c_.num_attention_heads, nkv = c_.num_key_value_heads, D = c_.head_dim;
  const float eps = float(c_.rms_norm_eps);
  const int64_t S = a.shape.n_seq, L = a.shape.seq_len;
  // this call's RoPE table (longrope: by the call's length; a backward's as its forward's)
  const RopeTable& rope_ = ropes_.pick(rope_length(a, ropes_.longrope()));
  // h1 = x + r * post_norm(o_proj(o)): dattn (at o_proj's output) is dh1 for LLaMA, through
  // OLMo 2's norm (its input, o_proj's output, in xn) or scaled for Granite; into h1 (not read)
  const void* dattn = a.dx;
  if (post_norm_branches()) {
    ops.rmsnorm_bwd(b.xn, param(a, 0, w_post_), a.dx, b.h1, grad(a, 0, w_post_), T, H, eps, false, off_);
    // Gemma: xn is the q/k/v input again
    if (!c_.post_norms) ops.rmsnorm_fwd(a.x, param(a, 0, w_in_), b.xn, T, H, eps, off_);
    dattn = b.h1;
  } else if (branch_scaled()) {
    scale_activation(ops, a.dx, b.h1, T * H, float(c_.residual_multiplier));
    dattn = b.h1;
  }
  bias_bwd(ops, a, bo_, dattn, T, H);
  linear_backward(
      ops, f8, lc, lora(LoraModule::o),
      {LoraModule::o, b.o, dattn, param(a, 0, wo_), grad(a, 0, wo_), b.dout, T, nq * D, H, false, 0, true});
  const float scale = c_.attention_scale();
  if (variant())
    ops.attention_bwd_v(b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, S, L, nq, nkv, D, scale,
                        attention_variant(a, true), b.attn);
  else if (a.positions)
    ops.attention_bwd_packed(b.q, b.k, b.v, b.o, b.lse, b.dout, a.positions, b.dq, b.dk, b.dv, S, L, nq, nkv,
                             D, scale, b.attn);
  else
    ops.attention_bwd(b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, S, L, nq, nkv, D, scale, b.attn);
  // RoPE's and the q/k norms' backward; with norms, dout and v (no longer read) take their
  // input gradients
  const Ops::QkNormRope qs = qk_norm_rope(a, rope_, nq), ks = qk_norm_rope(a, rope_, nkv);
  void* dq_lin = c_.qk_norm ? b.dout : b.dq;
  void* dk_lin = c_.qk_norm ? b.v : b.dk;
  if (c_.qk_norm && !c_.qk_norm_whole) {
    ops.qk_norm_rope_bwd(b.qr, param(a, 0, wqn_), b.dq, dq_lin, grad(a, 0, wqn_), qs);
    ops.qk_norm_rope_bwd(b.kr, param(a, 0, wkn_), b.dk, dk_lin, grad(a, 0, wkn_), ks);
  } else {
    ops.rope(b.dq, qs, true);
    ops.rope(b.dk, ks, true);
    if (c_.qk_norm) {  // OLMo 2: over the whole q and k
      ops.rmsnorm_bwd(b.qr, param(a, 0, wqn_), b.dq, dq_lin, grad(a, 0, wqn_), T, nq * D, eps, false, off_);
      ops.rmsnorm_bwd(b.kr, param(a, 0, wkn_), b.dk, dk_lin, grad(a, 0, wkn_), T, nkv * D, eps, false, off_);
    }
  }
  const void* xin = attention_input(a, b);
  bias_bwd(ops, a, bq_, dq_lin, T, nq * D);
  bias_bwd(ops, a, bk_, dk_lin, T, nkv * D);
  bias_bwd(ops, a, bv_, b.dv, T, nkv * D);
  // h1 is no longer read; without a pre-norm the input gradients add onto the residual's in dx;
  // each linear's weight gradient, then its input gradient (as in mlp_backward)
  void* dxn = c_.post_norms ? a.dx : b.h1;
  const float* xin_scale =  // the recompute's input norm kept it (attention_forward)
      !c_.post_norms && f8(LoraModule::q) ? f8.keep_wgrad(kKeptAttnIn) : nullptr;
  const LoraModule Q = LoraModule::q, K = LoraModule::k, V = LoraModule::v;
  const LoraLinear* qkv[] = {&lora(Q), &lora(K), &lora(V)};
  const void* dqkv[] = {dq_lin, dk_lin, b.dv};
  const bool fused = siblings_first(lc, qkv, dqkv, xin, dxn, T, c_.post_norms);
  const WgradCodes q = linear_backward(ops, f8, lc, fused ? kNoAdapter : lora(Q),
                                       {Q, xin, dq_lin, param(a, 0, wq_), grad(a, 0, wq_), dxn, T, H, nq * D,
                                        fused || c_.post_norms, 0, true, false},
                                       {xin_scale});
  linear_backward(ops, f8, lc, fused ? kNoAdapter : lora(K),
                  {K, xin, dk_lin, param(a, 0, wk_), grad(a, 0, wk_), dxn, T, H, nkv * D, true, 0, true, q.x},
                  {xin_scale});
  linear_backward(ops, f8, lc, fused ? kNoAdapter : lora(V),
                  {V, xin, b.dv, param(a, 0, wv_), grad(a, 0, wv_), dxn, T, H, nkv * D, true, 0, true, q.x},
                  {xin_scale});
  if (!c_.post_norms)
    ops.rmsnorm_bwd(a.x, param(a, 0, w_in_), dxn, a.dx, grad(a, 0, w_in_), T, H, eps, true, off_);
}

void DecoderLayer::backward(const LayerArgs& a) const {
  Ops& ops = check_args(a, n_groups_, needed(a, true), "decoder.backward", true);
  if (!a.x || !a.dy || !a.dx) throw std::invalid_argument("decoder.backward: x/dy/dx null");
  if (a.dx == a.dy || a.dx == a.x) throw std::invalid_argument("decoder.backward: dx aliases x or dy");
  if (dropout_ > 0.f && a.dropout_id < 0)
    throw std::invalid_argument(
        "decoder.backward: LoRA dropout needs LayerArgs::dropout_id (>= 0, the forward's)");
  DecoderBufs b = carve(a, ops, true);
  use_saved_attention(a, b, "decoder.backward");
  const LoraCall lc = lora_call(a, b, true);
  const Fp8Set f8 = fp8_linears(a, b, true, "decoder.backward");
  // recompute (with a saved attention, all but the attention itself); the MLP half is
  // recomputed chunk by chunk below
  attention_forward(a, b, lc, f8, true, saved_attention_);
  if (a.after_recompute) a.after_recompute();
  const int64_t T = a.shape.tokens();
  for (int64_t r0 = 0; r0 < T; r0 += b.chunk) mlp_backward(a, b, lc, f8, r0, std::min(b.chunk, T - r0));
  attention_backward(a, b, lc, f8);
}

}  // namespace rp
