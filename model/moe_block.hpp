// The sparse MLP block of a mixture-of-experts decoder (Qwen3-MoE; HF
// Qwen3MoeSparseMoeBlock), on the ops of kernels/ops.hpp:
//   logits = hn W_gate^T [C,E]; p = softmax(logits); the k largest p pick experts i_j with
//   weights w_j (p_{i_j}, renormalised when norm_topk_prob);
//   y = h1 + sum_j w_j * down_e(silu(gate_e(hn)) * up_e(hn)), e = i_j,
// for a chunk of C tokens (hn = RMSNorm(h1), the decoder's post-attention norm).
// GPT-OSS (ModelConfig::gpt_oss; HF GptOssMLP): logits = hn W_router^T + b_router; the top-k
// logits' softmax is the renormalised top-k of p (norm_topk); every expert's projections
// carry a bias and the activation is the clamped SwiGLU (Ops::swiglu_clamped_fwd):
//   down_e(h) + b_down_e, h = swiglu_clamped(gate_e(hn) + b_gate_e, up_e(hn) + b_up_e). The C*k
// (token, expert) assignments are grouped by expert so each expert's projections run as one
// GEMM over its rows (Ops::grouped_linear_*).
//
// Load-balancing loss (Fedus et al. 2021, "Switch Transformers", eq. 4-6, as transformers'
// load_balancing_loss_func): over the Ls sparse layers of one forward pass of T tokens,
//   aux = E * sum_e (c_e / (Ls T)) * (P_e / (Ls T)),
// c_e the assignments to expert e and P_e the sum of p[., e], both summed over the Ls layers.
// Its gradient in p[t,e] of any layer is E c_e / (Ls T)^2: the same for every token, known
// once the whole forward pass has run (the counts travel with the micro-batch, LayerArgs::
// moe_stats).
#pragma once
#include <cstdint>

#include "kernels/ops.hpp"
#include "model/layer_memory.hpp"
#include "model/layout.hpp"

namespace rp {

/// Where the block's tensors sit in its decoder group and its sizes.
class MoeBlock {
 public:
  /// Decoder compute layer `layer` of `m`, which must be sparse (ModelConfig::is_moe_layer);
  /// throws std::invalid_argument when the group lacks a tensor or the experts of one
  /// projection are not stacked contiguously.
  MoeBlock(const ModelLayout& m, int layer);
  /// Rows [0, n) of the chunk: y = h1 + block(hn). w: the decoder group's device weights;
  /// stats: LayerArgs::moe_stats (null: none gathered).
  void forward(Ops& ops, const void* w, const void* hn, const void* h1, void* y, int64_t n, const MoeBufs& b,
               float* stats) const;
  /// Recomputes the chunk's forward, then from dy [n,H]: dhn [n,H] (overwritten), the weight
  /// gradients into dw (the group's gradient; null: frozen, none) and, when counts != null,
  /// the load-balancing loss's gradient aux_coef * counts[e] on every p[t,e].
  void backward(Ops& ops, const void* w, void* dw, const void* hn, const void* dy, void* dhn, int64_t n,
                const MoeBufs& b, const float* counts, float aux_coef) const;
  int64_t experts() const { return E_; }

 private:
  // logits, routing and grouping of the chunk; returns the host offsets in `off`
  void route(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b, float* stats,
             int32_t* off) const;
  // xs, g, u, m and ys of the chunk
  void experts_forward(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b,
                       const int32_t* off) const;
  int64_t H_, E_, k_, Fe_;
  bool norm_topk_;
  int64_t w_router_, w_gate_, w_up_, w_down_;  // element offsets in the group
  bool gpt_oss_ = false;
  int64_t b_router_ = -1, b_gate_ = -1, b_up_ = -1, b_down_ = -1;  // GPT-OSS biases ([E], [E, out] stacks)
  float alpha_ = 0, limit_ = 0;                                     // GPT-OSS clamped SwiGLU
};

}  // namespace rp
