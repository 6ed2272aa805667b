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
//
// Per-expert LoRA adapters (LoraConfig::target_parameters; PEFT's ParamWrapper on the stacked
// experts): with s = LoraConfig::scaling(), for expert e on its sorted rows
//   gate_up: [g; u] += s * B_e A_e xs   (A_e [r, H] shared by gate and up; B_e's gate rows and
//            up rows are the stacked [E, Fe, r] tensors Bg, Bu)
//   down   : ys += s * Bd_e Ad_e m      (Ad_e [r, Fe], Bd_e [H, r])
// run as grouped linears over the same expert offsets (rank r as the small N or K). With
// a = xs A_e^T and g_a = s (dg Bg_e + du Bu_e) (backward): dBg += s dg^T a, dBu += s du^T a,
// dA += g_a^T xs, dxs += g_a A_e; the same for down with m and dys. The frozen expert
// weights get no gradient. The B products are added into g, u and ys by the GEMMs themselves
// (Ops::grouped_linear_fwd_add).
//
// Padded layout (MoeBufs::padded; Ops::moe_pad, ExpertGemm::bucketed): each expert's segment is
// padded to its bucket's row count. Pad rows of xs and dys are zero, so the pads add nothing
// to any weight, bias or adapter gradient and combine reads only real rows: outputs and
// gradients equal the unpadded layout's (GPT-OSS's biases make pad rows of g, u, m and ys
// nonzero, but nothing reads them into a result). The gather then waits for the host offsets.
// Scratch: MoeBufs::lora_ax, lora_g and (backward) lora_a_gu
// [R, r]: a backward keeps its recompute's A products instead of computing them twice.
#pragma once
#include <array>
#include <cstdint>

#include "kernels/ops.hpp"
#include "model/layer_memory.hpp"
#include "model/layout.hpp"

namespace rp {

/// The adapter group's device copy (compute dtype) and its gradient (grad dtype; null: no
/// adapter gradients) for a block with expert adapters; both null without.
struct MoeAdapterArgs {
  const void* params = nullptr;
  void* grads = nullptr;
};

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
               float* stats, const MoeAdapterArgs& la = {}) const;
  /// Recomputes the chunk's forward, then from dy [n,H]: dhn [n,H] (overwritten), the weight
  /// gradients into dw (the group's gradient; null: frozen, none) and, when counts != null,
  /// the load-balancing loss's gradient aux_coef * counts[e] on every p[t,e].
  void backward(Ops& ops, const void* w, void* dw, const void* hn, const void* dy, void* dhn, int64_t n,
                const MoeBufs& b, const float* counts, float aux_coef, const MoeAdapterArgs& la = {}) const;
  int64_t experts() const { return E_; }
  /// Whether the experts carry adapters (then forward/backward need MoeAdapterArgs::params).
  bool adapted() const { return lora_gu_ || lora_down_; }

 private:
  // logits, routing and grouping of the chunk; launches the grouping, whose host offsets
  // land in `off` once experts_forward has waited for them (Ops::moe_sort_wait)
  void route(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b, float* stats,
             int32_t* off) const;
  // xs, g, u, m and ys of the chunk (adapters included); gathers xs, then waits for the
  // route's host offsets in `off`. The adapters' unscaled A products
  // land in ax_gu = xs A^T and ax_down = m Ad^T ([R, r]; the same buffer in a forward, two
  // kept buffers in a backward's recompute, which the adapters' backward reads again).
  void experts_forward(Ops& ops, const void* w, const void* hn, int64_t n, const MoeBufs& b, int32_t* off,
                       const MoeAdapterArgs& la, void* ax_gu, void* ax_down) const;
  // the adapters' backward, from the recompute's A products (ax_down in MoeBufs::lora_g,
  // ax_gu in lora_a_gu): down before dm overwrites m, gate/up once dg, du exist
  void down_adapter_backward(Ops& ops, const MoeAdapterArgs& la, const MoeBufs& b, const int32_t* off) const;
  void gate_up_adapter_backward(Ops& ops, const MoeAdapterArgs& la, const MoeBufs& b,
                                const int32_t* off) const;
  int64_t H_, E_, k_, Fe_;
  bool norm_topk_;
  int64_t w_router_, w_gate_, w_up_, w_down_;  // element offsets in the group
  bool gpt_oss_ = false;
  int64_t bias_router_ = -1, bias_gate_ = -1, bias_up_ = -1,
          bias_down_ = -1;       // GPT-OSS biases ([E], [E, out] stacks)
  float alpha_ = 0, limit_ = 0;  // GPT-OSS clamped SwiGLU
  // expert adapters: element offsets in the adapter group (model/lora.hpp expert_lora_tensors)
  bool lora_gu_ = false, lora_down_ = false;
  int64_t r_ = 0;
  float scaling_ = 1.0f;
  int64_t a_gu_ = -1, b_gate_ = -1, b_up_ = -1, a_down_ = -1, b_down_ = -1;
};

}  // namespace rp
