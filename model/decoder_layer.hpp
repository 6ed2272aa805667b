// Private: the decoder layer (model/layers.hpp), shared by model/layers.cpp (its construction
// and forward) and model/layers_backward.cpp (its backward, which recomputes the forward).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/fp8_linear.hpp"
#include "model/layer_memory.hpp"
#include "model/layers.hpp"
#include "model/lora_linear.hpp"
#include "model/moe_block.hpp"

#include <fmt/format.h>

namespace rp {

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
  // The forward of linear m after its input norm (norm_fwd with (*this)(m) as `next`): a weight
  // with per-token activation scales (run from its stored codes) finds the codes the norm made,
  // any other the scale.
  const Fp8Linear* after_norm(LoraModule m) const {
    const Fp8Linear* f = (*this)(m);
    return f && f->weight.row_scale ? &same_input[size_t(m)] : scaled(m);
  }
  // The forward of a linear whose input the previous FP8 linear of the call quantized (k and v
  // after q, up after gate): the codes in the scratch are reused.
  const Fp8Linear* reuse(LoraModule m, LoraModule previous) const {
    if (!(*this)(m) || !(*this)(previous)) return (*this)(m);
    // per-token scales (a weight run from its stored codes) and a tensor scale do not mix
    if (!lin[size_t(m)].weight.row_scale != !lin[size_t(previous)].weight.row_scale) return (*this)(m);
    return &same_input[size_t(m)];
  }
  // The input gradient of a linear whose weight gradient's FP8 call left dy's row codes and
  // scale in the scratch (`coded`; fp8_linear_bwd_weight's dy_rows): they are reused.
  const Fp8Linear* dy_coded(LoraModule m, bool coded) const {
    return coded && (*this)(m) ? &same_input[size_t(m)] : (*this)(m);
  }
  // Weight gradients in FP8 (LayerOptions::fp8_weight_gradients, backward calls): the codes'
  // scratch; null codes: in the compute dtype.
  Fp8WgradScratch wgrad;
  bool wgrad_fp8(LoraModule m, int64_t in) const { return (*this)(m) && wgrad.dyt && fp8_wgrad_width(in); }
  // Backward calls: where the producers of the FP8 GEMMs' operands leave their scales
  // (DecoderBufs::fp8_kept); null elsewhere. keep_wgrad: the scales only weight gradients read
  // (x's), null without FP8 weight gradients.
  float* kept_base = nullptr;
  float* keep(Fp8Kept k) const { return kept_base ? kept_base + 4 * int(k) : nullptr; }
  float* keep_wgrad(Fp8Kept k) const { return wgrad.dyt ? keep(k) : nullptr; }
  // The input gradient of linear m from dy's scale that dy's producer kept (`kept`), copied into
  // m's scratch so the call skips its amax pass (tensor scales only; else (*this)(m)).
  const Fp8Linear* dy_scaled(Ops& ops, LoraModule m, const float* kept) const {
    const Fp8Linear* f = (*this)(m);
    if (!f || !kept || f->weight.row_scale || !f->act.scale) return f;
    ops.copy(DType::f32, f->act.scale, kept, 1);
    return &prescaled[size_t(m)];
  }
};

// y = RMSNorm(x) w over R rows of n; when `next` (the FP8 linear that reads y) is given, the
// norm also writes y's scale into that linear's scratch (its Fp8Set::scaled form skips the
// separate pass over y), and a copy into `keep` when given (Fp8Set::keep: y's weight gradient
// operand keeps it past the scratch's next use). A `next` with per-token scales (a frozen weight
// run from its stored codes) gets y's codes and row scales instead (Fp8Set::after_norm reuses
// them; Ops::rmsnorm_fwd_fp8_rows) and `keep` is not written: there is no tensor scale, and a
// frozen weight takes no weight gradient.
// w_offset: Gemma's 1 (ModelConfig::norm_weight_offset).
inline void norm_fwd(Ops& ops, const void* x, const void* w, void* y, int64_t R, int64_t n, float eps,
                     float w_offset, const Fp8Linear* next, float* keep = nullptr) {
  if (!next) return ops.rmsnorm_fwd(x, w, y, R, n, eps, w_offset);
  if (next->weight.row_scale)
    return ops.rmsnorm_fwd_fp8_rows(x, w, y, R, n, eps, kFp8ActFormat, next->act.codes, next->act.scale,
                                    w_offset);
  ops.rmsnorm_fwd_fp8_scale(x, w, y, R, n, eps, kFp8ActFormat, next->act.scale, w_offset);
  if (keep) ops.copy(DType::f32, keep, next->act.scale, 1);
}

class DecoderLayer final : public Layer {
 public:
  DecoderLayer(const ModelLayout& m, int layer, const LayerOptions& opt);
  LayerKind kind() const override { return LayerKind::decoder; }
  size_t scratch_bytes(const MicroBatchShape& s, DType dt = DType::f32, bool backward = true) const override {
    return decoder_scratch_bytes(dims_, s.n_seq, s.seq_len, dtype_size(dt), backward, chunk_tokens_);
  }
  size_t fp8_weight_bytes(bool backward) const override { return rp::fp8_weight_bytes(dims_, backward); }
  std::vector<int64_t> fp8_stored_tensors() const override { return stored_offsets_; }
  void forward(const LayerArgs& a) const override;
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
    c.xbuf = b.lora_x;
    c.a_cat = b.lora_a_cat;
    c.da_cat = backward ? b.lora_da_cat : nullptr;
    c.cat_elems = b.lora_cat_elems;
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
  // g, u = gate(in), up(in) for rows [r0, r0+n) (their adapters as one: adapted_siblings_fwd).
  void gate_up_fwd(const LayerArgs& a, const DecoderBufs& b, const LoraCall& lc, const Fp8Set& f8,
                   const void* in, bool pre_norm, int64_t r0, int64_t n) const;
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
  // The shape and constants of the q/k norm + RoPE calls for `heads` heads of this layer, with
  // the call's RoPE table (longrope: by its length) and a.positions (packed sequences).
  Ops::QkNormRope qk_norm_rope(const LayerArgs& a, const RopeTable& rope, int64_t heads) const;

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
  // Granite: residual branches times residual_multiplier (1 elsewhere)
  bool branch_scaled() const { return c_.residual_multiplier != 1.0; }
  // Whether o_proj / down_proj write x + branch themselves (the residual read in the GEMM's
  // epilogue: one rounding of the sum, one pass fewer): a branch neither normalized nor scaled,
  // in a model without sparse MLPs. In a MoE model the top-k routing reads every residual sum
  // before it, and the rounding change flipped a near-tie routing of the tiny Qwen3-MoE parity
  // fixture on the GPU (an expert's bf16 gradients 0.060-0.069 from transformers' fp32 against
  // the bound 0.05), so MoE models keep the separate add (their steps are in the expert GEMMs).
  bool residual_in_gemm() const { return !post_norm_branches() && !branch_scaled() && c_.num_experts == 0; }
  // projection biases (GPT-OSS; Qwen2: q/k/v), per-head sinks (-1: none) and the sliding
  // window (GPT-OSS, Mistral; 0: none)
  int64_t bq_ = -1, bk_ = -1, bv_ = -1, bo_ = -1, sinks_ = -1, window_ = 0;
  // the attention variant of a GPT-OSS layer (window, sinks; dsinks when `backward`) or a
  // Gemma 2 layer (window, soft-capped scores)
  bool variant() const { return window_ > 0 || sinks_ >= 0 || c_.attn_logit_softcapping > 0; }
  Ops::AttentionVariant attention_variant(const LayerArgs& a, bool backward) const;
  std::unique_ptr<MoeBlock> moe_;  // a sparse MLP block instead of the dense MLP
  int64_t moe_layers_ = 0;         // sparse layers of the model (load-balancing loss)
  RopeTables ropes_;               // longrope: a call takes the short or the long table by its rope_length
  std::array<LoraLinear, kLoraModules> lora_{};
  size_t n_groups_ = 1;  // 2 with LoRA: params[1] / grads[1] are the adapter group
  float scaling_ = 1.0f, dropout_ = 0.0f;
  uint64_t lora_seed_ = 0;
  int layer_ = 0;
};

}  // namespace rp
