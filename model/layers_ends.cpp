// The embedding and tail layers with explicit forward/backward (model/layers.hpp): the
// lookup (times Granite's embedding_multiplier or Gemma's sqrt(hidden_size)) and the final
// norm (Gemma's 1 + w), LM head and cross-entropy (the logits divided by Granite's
// logits_scaling, soft-capped by Gemma's final_logit_softcapping).
#include "model/layers.hpp"

#include "model/layer_args.hpp"
#include "model/layer_memory.hpp"

#include "kernels/dtype.hpp"

namespace rp {

void scale_activation(Ops& ops, const void* x, void* y, int64_t n, float alpha) {
  if (x == y) return ops.add_into(ops.dtype(), y, ops.dtype(), x, n, alpha - 1.0f);
  ops.fill(ops.dtype(), y, n, 0.0f);
  ops.add_into(ops.dtype(), y, ops.dtype(), x, n, alpha);
}

float in_dtype(const Ops& ops, float v) {
  if (ops.dtype() == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (ops.dtype() == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

namespace {

using namespace layer_args;

class EmbeddingLayer final : public Layer {
 public:
  explicit EmbeddingLayer(const ModelLayout& m)
      : H_(m.config.hidden_size),
        V_(m.config.vocab_size),
        off_(offset_of(m.groups[0], "model.embed_tokens.weight")),
        // every family's transformers module (LLaMA, Mistral, Qwen2/3, Qwen3-MoE, GPT-OSS, OLMo 2,
        // Granite, Phi-3, Gemma 2/3) builds nn.Embedding(..., padding_idx=config.pad_token_id):
        // the lookup gives the pad row no gradient (a tied LM head still does)
        pad_(m.config.pad_token_id),
        mult_(float(m.config.embedding_scale())) {}
  LayerKind kind() const override { return LayerKind::embedding; }
  // Granite's multiplier: the backward scales dy into scratch [T, H]
  size_t scratch_bytes(const MicroBatchShape& s, DType dt = DType::f32, bool backward = true) const override {
    return backward && mult_ != 1.0f ? size_t(s.tokens() * H_) * dtype_size(dt) : 0;
  }
  void forward(const LayerArgs& a) const override {
    Ops& ops = check_args(a, 1, 0, "embedding.forward", false);
    if (!a.ids || !a.y) throw std::invalid_argument("embedding.forward: ids/y null");
    ops.embedding_fwd(a.ids, param(a, 0, off_), a.y, a.shape.tokens(), H_, V_);
    if (mult_ != 1.0f) scale_activation(ops, a.y, a.y, a.shape.tokens() * H_, in_dtype(ops, mult_));
  }
  void backward(const LayerArgs& a) const override {
    Ops& ops = check_args(a, 1, scratch_bytes(a.shape, a.ops ? a.ops->dtype() : DType::f32),
                          "embedding.backward", true);
    if (!a.ids || !a.dy) throw std::invalid_argument("embedding.backward: ids/dy null");
    void* dw = grad(a, 0, off_);
    if (!dw) return;  // frozen: nothing
    const void* dy = a.dy;
    if (mult_ != 1.0f) {
      scale_activation(ops, a.dy, a.scratch, a.shape.tokens() * H_, in_dtype(ops, mult_));
      dy = a.scratch;
    }
    ops.embedding_bwd(a.ids, dy, dw, a.shape.tokens(), H_, V_, pad_);
  }

 private:
  int64_t H_, V_, off_;
  int64_t pad_;  // pad_token_id, -1: none
  float mult_;   // Granite's embedding_multiplier, Gemma's sqrt(hidden_size) (1 elsewhere)
};

class TailLayer final : public Layer {
 public:
  explicit TailLayer(const ModelLayout& m) : c_(m.config) {
    const ParamGroup& head = m.groups.at(size_t(m.num_layers() - 1));  // adapter groups follow it
    w_norm_ = offset_of(head, "model.norm.weight");
    if (c_.tie_word_embeddings) {
      lm_group_ = 1;  // args.params[1] is group 0
      w_lm_ = offset_of(m.groups[0], "model.embed_tokens.weight");
    } else {
      lm_group_ = 0;
      w_lm_ = offset_of(head, "lm_head.weight");
    }
    n_groups_ = c_.tie_word_embeddings ? 2 : 1;
  }
  LayerKind kind() const override { return LayerKind::tail; }
  size_t scratch_bytes(const MicroBatchShape& s, DType dt = DType::f32, bool = true) const override {
    return tail_scratch_bytes(s.tokens(), c_.hidden_size, c_.vocab_size, dtype_size(dt));
  }
  void forward(const LayerArgs& a) const override { run(a, false); }
  void backward(const LayerArgs& a) const override { run(a, true); }

 private:
  void run(const LayerArgs& a, bool backward) const {
    const char* who = backward ? "tail.backward" : "tail.forward";
    Ops& ops =
        check_args(a, n_groups_, scratch_bytes(a.shape, a.ops ? a.ops->dtype() : DType::f32), who, backward);
    if (!a.x || !a.targets || !a.loss || (backward && !a.dx))
      throw std::invalid_argument(fmt::format("{}: x/targets/loss/dx null", who));
    ScratchCarver sc(a.scratch);
    TailBufs tb;
    carve_tail_scratch(a.shape.tokens(), c_.hidden_size, c_.vocab_size, dtype_size(ops.dtype()), sc, tb);
    void *hn = tb.hn, *dhn = tb.dhn, *ce = tb.ce;
    const int64_t T = a.shape.tokens(), H = c_.hidden_size, V = c_.vocab_size;
    const float eps = float(c_.rms_norm_eps);
    const float off = c_.norm_weight_offset();  // Gemma: 1 + w
    ops.rmsnorm_fwd(a.x, param(a, 0, w_norm_), hn, T, H, eps, off);
    // Granite: logits = lm_head(hn) / logits_scaling = lm_head(hn / logits_scaling)
    const float inv_logits_scaling = float(1.0 / c_.logits_scaling);
    if (c_.logits_scaling != 1.0) scale_activation(ops, hn, hn, T * H, inv_logits_scaling);
    const void* w = param(a, size_t(lm_group_), w_lm_);
    const float softcap = float(c_.final_logit_softcapping);  // Gemma's (0: none)
    if (!backward) {
      ops.lm_head_cross_entropy(hn, w, a.targets, T, H, V, a.loss, nullptr, nullptr, ce, 1.0f, softcap);
      return;
    }
    ops.lm_head_cross_entropy(hn, w, a.targets, T, H, V, a.loss, dhn, grad(a, size_t(lm_group_), w_lm_), ce,
                              a.loss_scale, softcap);
    if (c_.logits_scaling != 1.0) scale_activation(ops, dhn, dhn, T * H, inv_logits_scaling);
    ops.rmsnorm_bwd(a.x, param(a, 0, w_norm_), dhn, a.dx, grad(a, 0, w_norm_), T, H, eps, false, off);
  }

  ModelConfig c_;
  int64_t w_norm_, w_lm_;
  int lm_group_;
  size_t n_groups_;
};

}  // namespace

std::unique_ptr<Layer> make_embedding_layer(const ModelLayout& m) {
  return std::make_unique<EmbeddingLayer>(m);
}
std::unique_ptr<Layer> make_tail_layer(const ModelLayout& m) { return std::make_unique<TailLayer>(m); }

}  // namespace rp
