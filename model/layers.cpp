// The decoder layer with explicit forward/backward, and make_layer (model/layers.hpp; the
// embedding and tail layers: model/layers_ends.cpp).
// Reference: transformers' modeling_llama.py / modeling_qwen3.py (LlamaDecoderLayer,
// LlamaAttention with repeat_kv, LlamaMLP, LlamaRMSNorm, Qwen3Attention q_norm/k_norm) and
// modeling_gpt_oss.py (GptOssAttention: biased projections, sinks, sliding window),
// modeling_gemma2.py / modeling_gemma3.py (Gemma2DecoderLayer's four norms, GemmaRMSNorm's
// 1 + w, the GeGLU MLP, Gemma3's sliding layers' own RoPE base).
#include "model/layers.hpp"

#include "model/fp8_linear.hpp"
#include "model/layer_args.hpp"
#include "model/lora_linear.hpp"
#include "model/moe_block.hpp"

#include <array>
#include <cmath>
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
// db += column sums of dy [M,N] unless the bias is absent or frozen.
void bias_bwd(Ops& ops, const LayerArgs& a, int64_t off, const void* dy, int64_t M, int64_t N) {
  if (off < 0) return;
  void* db = grad(a, 0, off);
  if (!db) return;
  const int32_t rows[2] = {0, int32_t(M)};
  ops.grouped_bias_bwd(dy, db, rows, 1, N);
}

// The FP8 base linears of one decoder call, indexed by LoraModule (model/fp8_linear.hpp);
// `on` false: every linear in the compute dtype.
struct Fp8Set {
  bool on = false;
  std::array<Fp8Linear, kAdaptedLinears> lin{};
  std::array<Fp8Linear, kAdaptedLinears> same_input{};  // lin with input_quantized
  std::array<Fp8Linear, kAdaptedLinears> prescaled{};   // lin with input_scaled
  const Fp8Linear* operator()(LoraModule m) const {
    const Fp8Linear& f = lin[size_t(m)];
    return on && f.weight.w ? &f : nullptr;
  }
  // The forward of a linear whose input's scale the producing kernel computed into the
  // scratch (rmsnorm_fwd_fp8_scale before q and gate, swiglu_fwd_fp8_scale before down).
  const Fp8Linear* scaled(LoraModule m) const { return (*this)(m) ? &prescaled[size_t(m)] : nullptr; }
  // The forward of a linear whose input the previous FP8 linear of the call quantized (k and v
  // after q, up after gate): the codes in the scratch are reused.
  const Fp8Linear* reuse(LoraModule m, LoraModule previous) const {
    if (!(*this)(m) || !(*this)(previous)) return (*this)(m);
    // per-token scales (a weight run from its stored codes) and a tensor scale do not mix
    if (!lin[size_t(m)].weight.row_scale != !lin[size_t(previous)].weight.row_scale) return (*this)(m);
    return &same_input[size_t(m)];
  }
  // Weight gradients in FP8 (LayerOptions::fp8_weight_gradients, backward calls): the codes'
  // scratch; null codes: in the compute dtype.
  Fp8WgradScratch wgrad;
  bool wgrad_fp8(LoraModule m, int64_t in) const { return (*this)(m) && wgrad.dyt && in % 16 == 0; }
};

// dw += dy^T x (M tokens, x [M,K], dy [M,N]) unless dw is a frozen group's (null): through
// the FP8 GEMM when the call runs linear m's weight gradient in FP8 (`x_same`: x^T's codes are
// the previous call's, which had the same x), else Ops::linear_bwd_weight. Returns whether
// x^T's codes are now in the scratch, for the next linear reading the same x.
bool weight_grad(Ops& ops, const Fp8Set& f8, LoraModule m, const void* dy, const void* x, void* dw, int64_t M,
                 int64_t K, int64_t N, bool x_same = false) {
  if (!dw) return false;
  if (!f8.wgrad_fp8(m, K)) {
    ops.linear_bwd_weight(dy, x, dw, M, K, N);
    return false;
  }
  fp8_linear_bwd_weight(ops, f8.wgrad, dy, x, static_cast<float*>(dw), M, K, N, f8.lin[size_t(m)].grad_format,
                        x_same);
  return true;
}

// y = RMSNorm(x) w over R rows of n; when `next` (the FP8 linear that reads y) is given, the
// norm also writes y's scale into that linear's scratch (its Fp8Set::scaled form skips the
// separate pass over y).
// w_offset: Gemma's 1 (ModelConfig::norm_weight_offset).
void norm_fwd(Ops& ops, const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
              float w_offset, const Fp8Linear* next) {
  if (next) ops.rmsnorm_fwd_fp8_scale(x, w, y, R, n, eps, kFp8ActFormat, next->act.scale, w_offset);
  else ops.rmsnorm_fwd(x, w, y, R, n, eps, w_offset);
}

// ---------------------------------------------------------------------------------

class DecoderLayer final : public Layer {
 public:
  DecoderLayer(const ModelLayout& m, int layer, const LayerOptions& opt)
      : c_(m.config),
        chunk_tokens_(opt.mlp_chunk_tokens),
        saved_attention_(opt.save_attention),
        fp8_(opt.fp8) {
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
  LayerKind kind() const override { return LayerKind::decoder; }
  size_t scratch_bytes(const MicroBatchShape& s, DType dt = DType::f32, bool backward = true) const override {
    return decoder_scratch_bytes(dims_, s.n_seq, s.seq_len, dtype_size(dt), backward, chunk_tokens_);
  }
  size_t fp8_weight_bytes(bool backward) const override { return rp::fp8_weight_bytes(dims_, backward); }
  std::vector<int64_t> fp8_stored_tensors() const override { return stored_offsets_; }
  void forward(const LayerArgs& a) const override {
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
  void backward(const LayerArgs& a) const override;

 private:
  size_t needed(const LayerArgs& a, bool backward) const {
    return scratch_bytes(a.shape, a.ops ? a.ops->dtype() : DType::f32, backward);
  }
  DecoderBufs carve(const LayerArgs& a, const Ops& ops, bool backward) const {
    DecoderBufs b;
    ScratchCarver sc(a.scratch);
    carve_decoder_scratch(dims_, a.shape.n_seq, a.shape.seq_len, dtype_size(ops.dtype()), backward,
                          chunk_tokens_, sc, b);
    return b;
  }
  // Row r of a [T, cols] activation in the compute dtype.
  static void* row(const Ops& ops, const void* base, int64_t r, int64_t cols) {
    return const_cast<char*>(static_cast<const char*>(base)) + r * cols * int64_t(dtype_size(ops.dtype()));
  }
  // The adapters' share of this call (model/lora_linear.hpp); all modules off without LoRA.
  LoraCall lora_call(const LayerArgs& a, const DecoderBufs& b, bool backward) const {
    LoraCall c;
    if (n_groups_ < 2) return c;
    c.ops = a.ops;
    c.params = a.params[1];
    c.grads = backward ? a.grads[1] : nullptr;
    c.scaling = scaling_;
    if (dropout_ > 0.f && a.dropout_id >= 0) {  // training; dropout_id < 0: evaluation
      c.dropout = dropout_;
      c.seed = lora_dropout_seed(lora_seed_, a.dropout_id, layer_);
    }
    c.ax = b.lora_ax;
    c.g = b.lora_g;
    c.xbuf = b.lora_x;
    if (backward) {  // the recompute leaves each module's u for its backward
      c.u_keep = b.lora_u;
      c.u_rows = a.shape.tokens();
    }
    return c;
  }
  const LoraLinear& lora(LoraModule m) const { return lora_[size_t(m)]; }
  // The q/k/v projections' input: RMSNorm(x) in xn, or x itself without a pre-norm (OLMo 2).
  const void* attention_input(const LayerArgs& a, const DecoderBufs& b) const {
    return c_.post_norms ? a.x : b.xn;
  }
  // The FP8 linears of this call (none without LayerOptions::fp8): their weights' codes in
  // a.fp8_weights, quantized there first when a.fp8_fill_weights (W^T too in a backward).
  Fp8Set fp8_linears(const LayerArgs& a, const DecoderBufs& b, bool backward, const char* who) const;
  // The experts' adapters: the adapter group (model/moe_block.hpp); none without.
  MoeAdapterArgs moe_adapters(const LayerArgs& a, bool backward) const {
    if (n_groups_ < 2 || !moe_ || !moe_->adapted()) return {};
    return {a.params[1], backward ? a.grads[1] : nullptr};
  }
  // With a saved attention, o and lse are the caller's (LayerArgs::attn_o / attn_lse).
  void use_saved_attention(const LayerArgs& a, DecoderBufs& b, const char* who) const {
    if (!saved_attention_) return;
    if (!a.attn_o || !a.attn_lse)
      throw std::invalid_argument(
          fmt::format("{}: a decoder with a saved attention needs attn_o and attn_lse", who));
    b.o = a.attn_o;
    b.lse = a.attn_lse;
  }
  // xn, q, k, v (for the attention and its backward), then, unless `reuse` (o and lse are
  // the forward's, saved), o (and lse when with_lse); and h1 = x + o_proj(o).
  void attention_forward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc, const Fp8Set& f8,
                         bool with_lse, bool reuse) const;
  // Rows [r0, r0+n) of the MLP: y = h1 + down(silu(gate(hn)) * up(hn)), hn = RMSNorm(h1).
  void mlp_forward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc, const Fp8Set& f8, int64_t r0,
                   int64_t n) const;
  // Rows [r0, r0+n) of the MLP backward from dy, recomputing the chunk's forward; writes
  // dh1 = dy + d(RMSNorm(h1))/dh1 into those rows of a.dx and adds the MLP's weight
  // gradients.
  void mlp_backward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc, const Fp8Set& f8,
                    int64_t r0, int64_t n) const;
  // From dh1 (in a.dx): the attention half's weight gradients and dx += d/dx.
  void attention_backward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc,
                          const Fp8Set& f8) const;

  ModelConfig c_;
  int64_t chunk_tokens_;
  bool saved_attention_;
  bool fp8_;  // LayerOptions::fp8
  // the dense linears (LoraModule order) a frozen fp8-stored base can run from their codes,
  // and their offsets in the base group (Layer::fp8_stored_tensors)
  std::array<bool, kAdaptedLinears> fp8_stored_{};
  std::vector<int64_t> stored_offsets_;
  DecoderDims dims_;
  // w_post_: post_attention_layernorm, the norm before the MLP (LLaMA) or after the attention
  // (OLMo 2, Gemma: post_norm_branches()); w_mlp_in_ the norm before the MLP (-1: none, OLMo 2),
  // w_post_ff_ the one after it (OLMo 2, Gemma; -1: none) and w_in_ -1 without a pre-norm
  int64_t w_in_, wq_, wk_, wv_, wqn_ = -1, wkn_ = -1, wo_, w_post_, wg_ = -1, wu_ = -1, wd_ = -1;
  int64_t w_post_ff_ = -1, w_mlp_in_ = -1;
  float off_ = 0.0f;  // the norms' weight offset (Gemma: 1 + w)
  // an RMSNorm ends each residual branch (OLMo 2 without pre-norms, Gemma with them)
  bool post_norm_branches() const { return c_.post_norms || c_.gemma(); }
  // the MLP's activation: SwiGLU, or Gemma's GeGLU
  void act_fwd(Ops& ops, const void* g, const void* u, void* m, int64_t n) const {
    if (c_.gemma()) ops.geglu_fwd(g, u, m, n);
    else ops.swiglu_fwd(g, u, m, n);
  }
  // q/k norms: rows and width per token (per head, or OLMo 2's whole q and k)
  int64_t qk_norm_rows(int64_t T, int64_t heads) const { return c_.qk_norm_whole ? T : T * heads; }
  int64_t qk_norm_cols(int64_t heads) const { return c_.qk_norm_whole ? heads * c_.head_dim : c_.head_dim; }
  // Granite: residual branches times residual_multiplier (1 elsewhere)
  bool branch_scaled() const { return c_.residual_multiplier != 1.0; }
  // projection biases (GPT-OSS; Qwen2: q/k/v), per-head sinks (-1: none) and the sliding
  // window (GPT-OSS, Mistral; 0: none)
  int64_t bq_ = -1, bk_ = -1, bv_ = -1, bo_ = -1, sinks_ = -1, window_ = 0;
  // the attention variant of a GPT-OSS layer (window, sinks; dsinks when `backward`) or a
  // Gemma 2 layer (window, soft-capped scores)
  bool variant() const { return window_ > 0 || sinks_ >= 0 || c_.attn_logit_softcapping > 0; }
  Ops::AttentionVariant attention_variant(const LayerArgs& a, bool backward) const {
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
  std::unique_ptr<MoeBlock> moe_;  // a sparse MLP block instead of the dense MLP
  int64_t moe_layers_ = 0;         // sparse layers of the model (load-balancing loss)
  RopeTables ropes_;               // longrope: a call takes the short or the long table by its rope_length
  std::array<LoraLinear, kLoraModules> lora_{};
  size_t n_groups_ = 1;  // 2 with LoRA: params[1] / grads[1] are the adapter group
  float scaling_ = 1.0f, dropout_ = 0.0f;
  uint64_t lora_seed_ = 0;
  int layer_ = 0;
};

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
  return s;
}

void DecoderLayer::attention_forward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc,
                                     const Fp8Set& f8, bool with_lse, bool reuse) const {
  Ops& ops = *a.ops;
  const int64_t T = a.shape.tokens(), H = c_.hidden_size;
  const int64_t nq = c_.num_attention_heads, nkv = c_.num_key_value_heads, D = c_.head_dim,
                R = c_.rotary_dim();
  const float eps = float(c_.rms_norm_eps);
  const int64_t S = a.shape.n_seq, L = a.shape.seq_len;
  // this call's RoPE table (longrope: by the call's length; a backward's as its forward's)
  const RopeTable& rope_ = ropes_.pick(rope_length(a, ropes_.longrope()));
  const void* xin = attention_input(a, b);
  const bool pre_norm = !c_.post_norms;  // OLMo 2 normalizes after the attention instead
  if (pre_norm) norm_fwd(ops, a.x, param(a, 0, w_in_), b.xn, T, H, eps, off_, f8(LoraModule::q));
  void* q_lin = c_.qk_norm ? b.qr : b.q;
  void* k_lin = c_.qk_norm ? b.kr : b.k;
  adapted_linear_fwd(ops, lc, lora(LoraModule::q), xin, param(a, 0, wq_), q_lin, T, H, nq * D, 0,
                     pre_norm ? f8.scaled(LoraModule::q) : f8(LoraModule::q));
  adapted_linear_fwd(ops, lc, lora(LoraModule::k), xin, param(a, 0, wk_), k_lin, T, H, nkv * D, 0,
                     f8.reuse(LoraModule::k, LoraModule::q));
  adapted_linear_fwd(ops, lc, lora(LoraModule::v), xin, param(a, 0, wv_), b.v, T, H, nkv * D, 0,
                     f8.reuse(LoraModule::v, LoraModule::q));
  bias_fwd(ops, a, bq_, q_lin, T, nq * D);
  bias_fwd(ops, a, bk_, k_lin, T, nkv * D);
  bias_fwd(ops, a, bv_, b.v, T, nkv * D);
  if (c_.qk_norm) {
    ops.rmsnorm_fwd(b.qr, param(a, 0, wqn_), b.q, qk_norm_rows(T, nq), qk_norm_cols(nq), eps, off_);
    ops.rmsnorm_fwd(b.kr, param(a, 0, wkn_), b.k, qk_norm_rows(T, nkv), qk_norm_cols(nkv), eps, off_);
  }
  const float scale = c_.attention_scale();
  if (variant()) {  // sliding window, sinks, soft-capping (packed positions through the variant)
    if (a.positions) {
      ops.rope_fwd_at(b.q, a.positions, T, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
      ops.rope_fwd_at(b.k, a.positions, T, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    } else {
      ops.rope_fwd(b.q, S, L, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
      ops.rope_fwd(b.k, S, L, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    }
    if (!reuse)
      ops.attention_fwd_v(b.q, b.k, b.v, b.o, with_lse ? b.lse : nullptr, S, L, nq, nkv, D, scale,
                          attention_variant(a, false), b.attn);
  } else if (a.positions) {  // packed sequences: positions and attention restart per example
    ops.rope_fwd_at(b.q, a.positions, T, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    ops.rope_fwd_at(b.k, a.positions, T, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    if (!reuse)
      ops.attention_fwd_packed(b.q, b.k, b.v, b.o, with_lse ? b.lse : nullptr, a.positions, S, L, nq, nkv, D,
                               scale, b.attn);
  } else {
    ops.rope_fwd(b.q, S, L, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    ops.rope_fwd(b.k, S, L, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    if (!reuse)
      ops.attention_fwd(b.q, b.k, b.v, b.o, with_lse ? b.lse : nullptr, S, L, nq, nkv, D, scale, b.attn);
  }
  // OLMo 2, Gemma: o_proj's output (in xn, unused now) is normalized into h1
  void* attn = post_norm_branches() ? b.xn : b.h1;
  adapted_linear_fwd(ops, lc, lora(LoraModule::o), b.o, param(a, 0, wo_), attn, T, nq * D, H, 0,
                     f8(LoraModule::o));
  bias_fwd(ops, a, bo_, attn, T, H);
  if (post_norm_branches()) ops.rmsnorm_fwd(attn, param(a, 0, w_post_), b.h1, T, H, eps, off_);
  if (branch_scaled()) scale_activation(ops, b.h1, b.h1, T * H, float(c_.residual_multiplier));
  ops.add(a.x, b.h1, b.h1, T * H);  // h1 = x + attn
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
  adapted_linear_fwd(ops, lc, lora(LoraModule::gate), in, param(a, 0, wg_), b.g, n, H, F, r0,
                     pre_norm ? f8.scaled(LoraModule::gate) : f8(LoraModule::gate));
  adapted_linear_fwd(ops, lc, lora(LoraModule::up), in, param(a, 0, wu_), b.u, n, H, F, r0,
                     f8.reuse(LoraModule::up, LoraModule::gate));
  const Fp8Linear* down_f8 = f8.scaled(LoraModule::down);
  if (c_.gemma()) {  // GeGLU: down quantizes its input in its own pass
    ops.geglu_fwd(b.g, b.u, b.m, n * F);
    down_f8 = f8(LoraModule::down);
  } else if (const Fp8Linear* down = f8(LoraModule::down)) {
    ops.swiglu_fwd_fp8_scale(b.g, b.u, b.m, n * F, kFp8ActFormat, down->act.scale);
  } else {
    ops.swiglu_fwd(b.g, b.u, b.m, n * F);
  }
  // OLMo 2, Gemma: down's output (in hn, no longer read) is normalized into y
  void* out = post_norm_branches() ? b.hn : y;
  adapted_linear_fwd(ops, lc, lora(LoraModule::down), b.m, param(a, 0, wd_), out, n, F, H, r0, down_f8);
  if (post_norm_branches())
    ops.rmsnorm_fwd(out, param(a, 0, w_post_ff_), y, n, H, float(c_.rms_norm_eps), off_);
  if (branch_scaled()) scale_activation(ops, y, y, n * H, float(c_.residual_multiplier));
  ops.add(h1, y, y, n * H);
}

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
  if (pre_norm)
    norm_fwd(ops, h1, param(a, 0, w_mlp_in_), b.hn, n, H, eps, off_, moe_ ? nullptr : f8(LoraModule::gate));
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
  adapted_linear_fwd(ops, lc, lora(LoraModule::gate), in, param(a, 0, wg_), b.g, n, H, F, r0,
                     pre_norm ? f8.scaled(LoraModule::gate) : f8(LoraModule::gate));
  adapted_linear_fwd(ops, lc, lora(LoraModule::up), in, param(a, 0, wu_), b.u, n, H, F, r0,
                     f8.reuse(LoraModule::up, LoraModule::gate));
  act_fwd(ops, b.g, b.u, b.m, n * F);
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
  weight_grad(ops, f8, LoraModule::down, dout, b.m, grad(a, 0, wd_), n, F, H);
  adapted_linear_bwd_input(ops, lc, lora(LoraModule::down), b.m, dout, param(a, 0, wd_), b.dm, n, F, H, false,
                           r0, post_norm_branches(), f8(LoraModule::down));
  if (c_.gemma()) ops.geglu_bwd(b.g, b.u, b.dm, b.dg, b.du, n * F);
  else ops.swiglu_bwd(b.g, b.u, b.dm, b.dg, b.du, n * F);
  const bool in_codes = weight_grad(ops, f8, LoraModule::gate, b.dg, in, grad(a, 0, wg_), n, H, F);
  weight_grad(ops, f8, LoraModule::up, b.du, in, grad(a, 0, wu_), n, H, F, in_codes);
  // without a pre-norm the input gradients add straight onto the residual path's
  void* din = pre_norm ? b.dhn : dh1;
  if (!pre_norm) ops.copy(ops.dtype(), dh1, dy, n * H);  // residual path
  adapted_linear_bwd_input(ops, lc, lora(LoraModule::gate), in, b.dg, param(a, 0, wg_), din, n, H, F,
                           !pre_norm, r0, true, f8(LoraModule::gate));
  adapted_linear_bwd_input(ops, lc, lora(LoraModule::up), in, b.du, param(a, 0, wu_), din, n, H, F, true, r0,
                           true, f8(LoraModule::up));
  if (!pre_norm) return;
  ops.copy(ops.dtype(), dh1, dy, n * H);  // residual path
  ops.rmsnorm_bwd(h1, param(a, 0, w_mlp_in_), b.dhn, dh1, grad(a, 0, w_mlp_in_), n, H, eps, true, off_);
}

void DecoderLayer::attention_backward(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc,
                                      const Fp8Set& f8) const {
  Ops& ops = *a.ops;
  const int64_t T = a.shape.tokens(), H = c_.hidden_size;
  const int64_t nq = c_.num_attention_heads, nkv = c_.num_key_value_heads, D = c_.head_dim,
                R = c_.rotary_dim();
  const float eps = float(c_.rms_norm_eps);
  const int64_t S = a.shape.n_seq, L = a.shape.seq_len;
  // this call's RoPE table (longrope: by the call's length; a backward's as its forward's)
  const RopeTable& rope_ = ropes_.pick(rope_length(a, ropes_.longrope()));
  // h1 = x + r * post_norm(o_proj(o)): dattn, the gradient at o_proj's output, is dh1 for
  // LLaMA, through OLMo 2's norm (its input, o_proj's output, is in xn) or scaled for Granite;
  // into h1, which is no longer read
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
  weight_grad(ops, f8, LoraModule::o, dattn, b.o, grad(a, 0, wo_), T, nq * D, H);
  bias_bwd(ops, a, bo_, dattn, T, H);
  adapted_linear_bwd_input(ops, lc, lora(LoraModule::o), b.o, dattn, param(a, 0, wo_), b.dout, T, nq * D, H,
                           false, 0, true, f8(LoraModule::o));
  const float scale = c_.attention_scale();
  if (variant()) {
    ops.attention_bwd_v(b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, S, L, nq, nkv, D, scale,
                        attention_variant(a, true), b.attn);
    if (a.positions) {
      ops.rope_bwd_at(b.dq, a.positions, T, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
      ops.rope_bwd_at(b.dk, a.positions, T, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    } else {
      ops.rope_bwd(b.dq, S, L, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
      ops.rope_bwd(b.dk, S, L, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    }
  } else if (a.positions) {
    ops.attention_bwd_packed(b.q, b.k, b.v, b.o, b.lse, b.dout, a.positions, b.dq, b.dk, b.dv, S, L, nq, nkv,
                             D, scale, b.attn);
    ops.rope_bwd_at(b.dq, a.positions, T, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    ops.rope_bwd_at(b.dk, a.positions, T, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
  } else {
    ops.attention_bwd(b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, S, L, nq, nkv, D, scale, b.attn);
    ops.rope_bwd(b.dq, S, L, nq, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
    ops.rope_bwd(b.dk, S, L, nkv, D, rope_.inv_freq.data(), rope_.attention_scaling, R);
  }
  void* dq_lin = b.dq;
  void* dk_lin = b.dk;
  if (c_.qk_norm) {  // dout and v are no longer read: they take the norms' input gradients
    ops.rmsnorm_bwd(b.qr, param(a, 0, wqn_), b.dq, b.dout, grad(a, 0, wqn_), qk_norm_rows(T, nq),
                    qk_norm_cols(nq), eps, false, off_);
    ops.rmsnorm_bwd(b.kr, param(a, 0, wkn_), b.dk, b.v, grad(a, 0, wkn_), qk_norm_rows(T, nkv),
                    qk_norm_cols(nkv), eps, false, off_);
    dq_lin = b.dout;
    dk_lin = b.v;
  }
  const void* xin = attention_input(a, b);
  const bool x_codes = weight_grad(ops, f8, LoraModule::q, dq_lin, xin, grad(a, 0, wq_), T, H, nq * D);
  weight_grad(ops, f8, LoraModule::k, dk_lin, xin, grad(a, 0, wk_), T, H, nkv * D, x_codes);
  weight_grad(ops, f8, LoraModule::v, b.dv, xin, grad(a, 0, wv_), T, H, nkv * D, x_codes);
  bias_bwd(ops, a, bq_, dq_lin, T, nq * D);
  bias_bwd(ops, a, bk_, dk_lin, T, nkv * D);
  bias_bwd(ops, a, bv_, b.dv, T, nkv * D);
  // h1 is no longer read; without a pre-norm the input gradients add onto the residual's in dx
  void* dxn = c_.post_norms ? a.dx : b.h1;
  adapted_linear_bwd_input(ops, lc, lora(LoraModule::q), xin, dq_lin, param(a, 0, wq_), dxn, T, H, nq * D,
                           c_.post_norms, 0, true, f8(LoraModule::q));
  adapted_linear_bwd_input(ops, lc, lora(LoraModule::k), xin, dk_lin, param(a, 0, wk_), dxn, T, H, nkv * D,
                           true, 0, true, f8(LoraModule::k));
  adapted_linear_bwd_input(ops, lc, lora(LoraModule::v), xin, b.dv, param(a, 0, wv_), dxn, T, H, nkv * D,
                           true, 0, true, f8(LoraModule::v));
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

}  // namespace

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
