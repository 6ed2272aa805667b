// The decoder layer's construction and forward, and make_layer (model/layers.hpp; the class:
// model/decoder_layer.hpp, its backward: model/layers_backward.cpp; the embedding and tail
// layers: model/layers_ends.cpp).
// Reference: transformers' modeling_llama.py / modeling_qwen3.py (LlamaDecoderLayer,
// LlamaAttention with repeat_kv, LlamaMLP, LlamaRMSNorm, Qwen3Attention q_norm/k_norm) and
// modeling_gpt_oss.py (GptOssAttention: biased projections, sinks, sliding window),
// modeling_gemma2.py / modeling_gemma3.py (Gemma2DecoderLayer's four norms, GemmaRMSNorm's
// 1 + w, the GeGLU MLP, Gemma3's sliding layers' own RoPE base).
#include "model/layers.hpp"

#include "model/decoder_layer.hpp"
#include "model/layer_args.hpp"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace rp {

RopeParams rope_params(const ModelConfig& c, int64_t layer) {
  RopeParams p;
  if (c.rope_local_theta > 0 && c.attention_window(layer) > 0) {  // Gemma 3's sliding layers
    p.theta = c.rope_local_theta;
    p.head_dim = c.rotary_dim();
    p.max_position_embeddings = c.max_position_embeddings;
    return p;
  }
  p.type = c.rope_scaling.type;
  p.theta = c.rope_theta;
  p.head_dim = c.rotary_dim();  // transformers' dim = head_dim * partial_rotary_factor
  p.factor = c.rope_scaling.factor;
  p.low_freq_factor = c.rope_scaling.low_freq_factor;
  p.high_freq_factor = c.rope_scaling.high_freq_factor;
  p.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  p.max_position_embeddings = c.max_position_embeddings;
  p.beta_fast = c.rope_scaling.beta_fast;
  p.beta_slow = c.rope_scaling.beta_slow;
  p.attention_factor = c.rope_scaling.attention_factor;
  p.truncate = c.rope_scaling.truncate;
  return p;
}

RopeTables layer_rope_tables(const ModelConfig& c, int64_t layer) {
  return rope_tables(rope_params(c, layer), {c.rope_scaling.short_factor, c.rope_scaling.long_factor});
}

int64_t rope_length(const LayerArgs& a, bool needed) {
  if (!a.positions) return a.shape.seq_len;
  if (a.rope_length <= 0 && needed)
    throw std::invalid_argument(
        "decoder: a longrope layer with LayerArgs::positions needs LayerArgs::rope_length (largest position "
        "+ 1)");
  return a.rope_length;
}

namespace {

using namespace layer_args;

// y[r,:] += b for the M rows of y [M,N] (a linear's bias; offset < 0: no bias).
void bias_fwd(Ops& ops, const LayerArgs& a, int64_t off, void* y, int64_t M, int64_t N) {
  if (off < 0) return;
  const int32_t rows[2] = {0, int32_t(M)};
  ops.grouped_bias_fwd(y, param(a, 0, off), rows, 1, N);
}

}  // namespace

DecoderLayer::DecoderLayer(const ModelLayout& m, int layer, const LayerOptions& opt)
    : c_(m.config), chunk_tokens_(opt.mlp_chunk_tokens), saved_attention_(opt.save_attention), fp8_(opt.fp8) {
  const ParamGroup& g = m.groups[size_t(layer)];
  const std::string p = fmt::format("model.layers.{}.", layer - 1);
  w_in_ = offset_if(g, p + "input_layernorm.weight", !c_.post_norms);
  wq_ = offset_of(g, p + "self_attn.q_proj.weight");
  wk_ = offset_of(g, p + "self_attn.k_proj.weight");
  wv_ = offset_of(g, p + "self_attn.v_proj.weight");
  if (c_.qk_norm) {
    wqn_ = offset_of(g, p + "self_attn.q_norm.weight");
    wkn_ = offset_of(g, p + "self_attn.k_norm.weight");
  }
  wo_ = offset_of(g, p + "self_attn.o_proj.weight");
  bq_ = offset_if(g, p + "self_attn.q_proj.bias", c_.has_qkv_bias());
  bk_ = offset_if(g, p + "self_attn.k_proj.bias", c_.has_qkv_bias());
  bv_ = offset_if(g, p + "self_attn.v_proj.bias", c_.has_qkv_bias());
  bo_ = offset_if(g, p + "self_attn.o_proj.bias", c_.attention_bias);
  sinks_ = offset_if(g, p + "self_attn.sinks", c_.attention_sinks);
  window_ = c_.attention_window(layer - 1);
  w_post_ = offset_of(g, p + "post_attention_layernorm.weight");
  w_post_ff_ = offset_if(g, p + "post_feedforward_layernorm.weight", post_norm_branches());
  // the norm before the MLP: LLaMA's post_attention_layernorm, Gemma's pre_feedforward_layernorm
  w_mlp_in_ = c_.gemma()      ? offset_of(g, p + "pre_feedforward_layernorm.weight")
              : c_.post_norms ? -1
                              : w_post_;
  off_ = c_.norm_weight_offset();
  if (c_.is_moe_layer(layer - 1)) {
    moe_ = std::make_unique<MoeBlock>(m, layer);
    moe_layers_ = c_.num_moe_layers();
  } else {
    wg_ = offset_of(g, p + "mlp.gate_proj.weight");
    wu_ = offset_of(g, p + "mlp.up_proj.weight");
    wd_ = offset_of(g, p + "mlp.down_proj.weight");
  }
  if (fp8_ && opt.fp8_stored_direct && g.frozen)  // a sparse block's experts have no FP8
    stored_offsets_ = fp8_stored_linears(g, p, moe_ ? 4 : kAdaptedLinears, fp8_stored_.data());
  ropes_ = layer_rope_tables(c_, layer - 1);
  lora_ = lora_linears(m, layer);
  const bool adapted = m.adapter_group(layer) >= 0;
  n_groups_ = adapted ? 2 : 1;
  if (adapted) {
    scaling_ = float(m.lora->scaling());
    dropout_ = float(m.lora->dropout);
    lora_seed_ = m.lora->seed;
  }
  layer_ = layer;
  dims_ = DecoderDims{
      c_.hidden_size, c_.intermediate_size, c_.num_attention_heads,  c_.num_key_value_heads,    c_.head_dim,
      c_.qk_norm,     opt.save_attention,   adapted ? m.lora->r : 0, adapted && dropout_ > 0.f, g.frozen};
  dims_.fp8 = fp8_;
  dims_.fp8_wgrad = fp8_ && opt.fp8_weight_gradients;
  if (moe_) {
    dims_.experts = c_.num_experts;
    dims_.experts_per_tok = c_.num_experts_per_tok;
    dims_.expert_ffn = c_.moe_intermediate_size;
    dims_.expert_lora = moe_->adapted();
    dims_.expert_padded = opt.expert_padded;
  }
}

void DecoderLayer::forward(const LayerArgs& a) const {
  Ops& ops = check_args(a, n_groups_, needed(a, false), "decoder.forward", false);
  if (!a.x || !a.y) throw std::invalid_argument("decoder.forward: x/y null");
  DecoderBufs b = carve(a, ops, false);
  use_saved_attention(a, b, "decoder.forward");
  const LoraCall lc = lora_call(a, b, false);
  const Fp8Set f8 = fp8_linears(a, b, false, "decoder.forward");
  attention_forward(a, b, lc, f8, saved_attention_, false);
  const int64_t T = a.shape.tokens();
  for (int64_t r0 = 0; r0 < T; r0 += b.chunk) mlp_forward(a, b, lc, f8, r0, std::min(b.chunk, T - r0));
}

Ops::AttentionVariant DecoderLayer::attention_variant(const LayerArgs& a, bool backward) const {
  Ops::AttentionVariant v;
  v.window = window_;
  v.softcap = float(c_.attn_logit_softcapping);
  if (sinks_ >= 0) {
    v.sinks = param(a, 0, sinks_);
    if (backward) v.dsinks = grad(a, 0, sinks_);
  }
  v.pos = a.positions;
  return v;
}

Fp8Set DecoderLayer::fp8_linears(const LayerArgs& a, const DecoderBufs& b, bool backward,
                                 const char* who) const {
  Fp8Set s;
  if (!fp8_) return s;
  const size_t need = fp8_weight_bytes(backward);
  if (!a.fp8_weights || a.fp8_weights_bytes < need)
    throw std::invalid_argument(
        fmt::format("{}: an FP8 decoder needs LayerArgs::fp8_weights of {} bytes, got {}", who, need,
                    a.fp8_weights ? a.fp8_weights_bytes : 0));
  ScratchCarver sc(a.fp8_weights);
  Fp8WeightBufs wb;
  carve_fp8_weights(dims_, backward, sc, wb);
  const int64_t w_off[kAdaptedLinears] = {wq_, wk_, wv_, wo_, wg_, wu_, wd_};
  s.on = true;
  // the base's stored codes run as they are where the device has the per-row-scale GEMM (the
  // uploader then copied them instead of dequantizing: LayerArgs::fp8_stored_base)
  const bool stored = a.fp8_stored_base && !stored_offsets_.empty() && a.ops->gemm_fp8_rows_supported();
  if (stored && a.fp8_fill_weights && wb.ones) a.ops->fill(DType::f32, wb.ones, wb.n_ones, 1.f);
  for (size_t i = 0; i < kAdaptedLinears; ++i) {
    if (!wb.w[i]) continue;  // a sparse block's experts
    const bool direct = stored && fp8_stored_[i] && wb.row_scale[i];
    float* scale = wb.scale + i * Fp8WeightBufs::kScaleStride;
    if (a.fp8_fill_weights && direct)
      fp8_stored_weight(*a.ops, param(a, 0, w_off[i]), wb.out[i], wb.in[i], wb.w[i], wb.wt[i],
                        wb.row_scale[i]);
    else if (a.fp8_fill_weights)
      fp8_quantize_weight(*a.ops, param(a, 0, w_off[i]), wb.out[i], wb.in[i], wb.w[i], wb.wt[i], scale);
    const Fp8Weight w{wb.w[i], wb.wt[i], scale, direct ? wb.row_scale[i] : nullptr,
                      direct ? wb.ones : nullptr};
    s.lin[i] = Fp8Linear{w, {b.fp8_codes, b.fp8_scale}, false};
    s.same_input[i] = s.lin[i];
    s.same_input[i].input_quantized = true;
    s.prescaled[i] = s.lin[i];
    s.prescaled[i].input_scaled = true;
  }
  if (backward) s.wgrad = {b.fp8_dyt, b.fp8_xt, b.fp8_dyt_scale, b.fp8_xt_scale};
  if (backward) s.kept_base = b.fp8_kept;
  return s;
}

Ops::QkNormRope DecoderLayer::qk_norm_rope(const LayerArgs& a, const RopeTable& rope, int64_t heads) const {
  Ops::QkNormRope s;
  s.n_seq = a.shape.n_seq;
  s.seq_len = a.shape.seq_len;
  s.heads = heads;
  s.head_dim = c_.head_dim;
  s.eps = float(c_.rms_norm_eps);
  s.w_offset = off_;
  s.inv_freq = rope.inv_freq.data();
  s.rope_scale = rope.attention_scaling;
  s.rotary_dim = c_.rotary_dim();
  s.pos = a.positions;
  return s;
}

void DecoderLayer::attention_forward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc,
                                     const Fp8Set& f8, bool with_lse, bool reuse) const {
  Ops& ops = *a.ops;
  const int64_t T = a.shape.tokens(), H = c_.hidden_size;
  const int64_t nq = c_.num_attention_heads, nkv = c_.num_key_value_heads, D = c_.head_dim;
  const float eps = float(c_.rms_norm_eps);
  const int64_t S = a.shape.n_seq, L = a.shape.seq_len;
  // this call's RoPE table (longrope: by the call's length; a backward's as its forward's)
  const RopeTable& rope_ = ropes_.pick(rope_length(a, ropes_.longrope()));
  const void* xin = attention_input(a, b);
  const bool pre_norm = !c_.post_norms;  // OLMo 2 normalizes after the attention instead
  if (pre_norm)
    norm_fwd(ops, a.x, param(a, 0, w_in_), b.xn, T, H, eps, off_, f8(LoraModule::q),
             f8.keep_wgrad(kKeptAttnIn));
  void* q_lin = c_.qk_norm ? b.qr : b.q;
  void* k_lin = c_.qk_norm ? b.kr : b.k;
  const SiblingLinear qkv[] = {
      {&lora(LoraModule::q), param(a, 0, wq_), q_lin, nq * D,
       pre_norm ? f8.after_norm(LoraModule::q) : f8(LoraModule::q)},
      {&lora(LoraModule::k), param(a, 0, wk_), k_lin, nkv * D, f8.reuse(LoraModule::k, LoraModule::q)},
      {&lora(LoraModule::v), param(a, 0, wv_), b.v, nkv * D, f8.reuse(LoraModule::v, LoraModule::q)}};
  adapted_siblings_fwd(ops, lc, qkv, xin, T, H, 0);
  bias_fwd(ops, a, bq_, q_lin, T, nq * D);
  bias_fwd(ops, a, bk_, k_lin, T, nkv * D);
  bias_fwd(ops, a, bv_, b.v, T, nkv * D);
  // q/k norms (Qwen3, Gemma 3 per head: one pass with RoPE; OLMo 2 over whole q/k), then RoPE
  // at the packed positions (restarting per example) or at t % L
  const Ops::QkNormRope qs = qk_norm_rope(a, rope_, nq), ks = qk_norm_rope(a, rope_, nkv);
  if (c_.qk_norm && !c_.qk_norm_whole) {
    ops.qk_norm_rope_fwd(b.qr, param(a, 0, wqn_), b.q, qs);
    ops.qk_norm_rope_fwd(b.kr, param(a, 0, wkn_), b.k, ks);
  } else {
    if (c_.qk_norm) {
      ops.rmsnorm_fwd(b.qr, param(a, 0, wqn_), b.q, T, nq * D, eps, off_);
      ops.rmsnorm_fwd(b.kr, param(a, 0, wkn_), b.k, T, nkv * D, eps, off_);
    }
    ops.rope(b.q, qs, false);
    ops.rope(b.k, ks, false);
  }
  const float scale = c_.attention_scale();
  float* lse = with_lse ? b.lse : nullptr;
  if (!reuse) {
    if (variant())  // sliding window, sinks, soft-capping (packed positions through the variant)
      ops.attention_fwd_v(b.q, b.k, b.v, b.o, lse, S, L, nq, nkv, D, scale, attention_variant(a, false),
                          b.attn);
    else if (a.positions)  // packed sequences: attention restarts per example
      ops.attention_fwd_packed(b.q, b.k, b.v, b.o, lse, a.positions, S, L, nq, nkv, D, scale, b.attn);
    else ops.attention_fwd(b.q, b.k, b.v, b.o, lse, S, L, nq, nkv, D, scale, b.attn);
  }
  // OLMo 2, Gemma: o_proj's output (in xn, unused now) is normalized into h1
  void* attn = post_norm_branches() ? b.xn : b.h1;
  // h1 = x + attn, x added where o_proj writes h1 (residual_in_gemm) unless o_proj has a bias
  const bool plain = residual_in_gemm() && bo_ < 0;
  adapted_linear_fwd(ops, lc, lora(LoraModule::o), b.o, param(a, 0, wo_), attn, T, nq * D, H, 0,
                     f8(LoraModule::o), plain ? a.x : nullptr);
  bias_fwd(ops, a, bo_, attn, T, H);
  if (post_norm_branches()) ops.rmsnorm_fwd(attn, param(a, 0, w_post_), b.h1, T, H, eps, off_);
  if (branch_scaled()) scale_activation(ops, b.h1, b.h1, T * H, float(c_.residual_multiplier));
  if (!plain) ops.add(a.x, b.h1, b.h1, T * H);
}

void DecoderLayer::gate_up_fwd(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc, const Fp8Set& f8,
                               const void* in, bool pre_norm, int64_t r0, int64_t n) const {
  const int64_t H = c_.hidden_size, F = c_.intermediate_size;
  const SiblingLinear gu[] = {
      {&lora(LoraModule::gate), param(a, 0, wg_), b.g, F,
       pre_norm ? f8.after_norm(LoraModule::gate) : f8(LoraModule::gate)},
      {&lora(LoraModule::up), param(a, 0, wu_), b.u, F, f8.reuse(LoraModule::up, LoraModule::gate)}};
  adapted_siblings_fwd(*a.ops, lc, gu, in, n, H, r0);
}

void DecoderLayer::mlp_forward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc, const Fp8Set& f8,
                               int64_t r0, int64_t n) const {
  Ops& ops = *a.ops;
  const int64_t H = c_.hidden_size, F = c_.intermediate_size;
  const void* h1 = row(ops, b.h1, r0, H);
  void* y = row(ops, a.y, r0, H);
  const bool pre_norm = w_mlp_in_ >= 0;  // OLMo 2: no pre-norm
  if (pre_norm)
    norm_fwd(ops, h1, param(a, 0, w_mlp_in_), b.hn, n, H, float(c_.rms_norm_eps), off_,
             moe_ ? nullptr : f8(LoraModule::gate));
  if (moe_)
    return moe_->forward(ops, a.params[0], b.hn, h1, y, n, b.moe, a.moe_stats, moe_adapters(a, false));
  const void* in = pre_norm ? b.hn : h1;
  gate_up_fwd(a, b, lc, f8, in, pre_norm, r0, n);
  const Fp8Linear* down_f8 = f8.scaled(LoraModule::down);
  if (c_.gemma()) {  // GeGLU: down quantizes its input in its own pass
    ops.geglu_fwd(b.g, b.u, b.m, n * F);
    down_f8 = f8(LoraModule::down);
  } else if (const Fp8Linear* down = f8(LoraModule::down); down && !down->weight.row_scale) {
    // (per-token scales: down's forward quantizes its input in one pass of its own)
    ops.swiglu_fwd_fp8_scale(b.g, b.u, b.m, n * F, kFp8ActFormat, down->act.scale);
  } else {
    ops.swiglu_fwd(b.g, b.u, b.m, n * F);
  }
  // OLMo 2, Gemma: down's output (in hn, no longer read) is normalized into y
  void* out = post_norm_branches() ? b.hn : y;
  // y = h1 + mlp, h1 added where down_proj writes y (residual_in_gemm)
  const bool plain = residual_in_gemm();
  adapted_linear_fwd(ops, lc, lora(LoraModule::down), b.m, param(a, 0, wd_), out, n, F, H, r0, down_f8,
                     plain ? h1 : nullptr);
  if (post_norm_branches())
    ops.rmsnorm_fwd(out, param(a, 0, w_post_ff_), y, n, H, float(c_.rms_norm_eps), off_);
  if (branch_scaled()) scale_activation(ops, y, y, n * H, float(c_.residual_multiplier));
  if (!plain) ops.add(h1, y, y, n * H);
}

std::unique_ptr<Layer> make_layer(const ModelLayout& m, int layer, const LayerOptions& opt) {
  if (layer < 0 || layer >= m.num_layers())
    throw std::out_of_range(fmt::format("make_layer: layer {} outside [0, {})", layer, m.num_layers()));
  switch (m.kind(layer)) {
    case LayerKind::embedding: return make_embedding_layer(m);
    case LayerKind::decoder: return std::make_unique<DecoderLayer>(m, layer, opt);
    case LayerKind::tail: return make_tail_layer(m);
  }
  return nullptr;
}

}  // namespace rp
