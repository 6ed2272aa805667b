// Compute layers with explicit forward and backward (no autograd engine).
//
// The runtime moves three kinds of layers through the pipeline (model/layout.hpp):
//   embedding : ids [T] i32                      -> y [T, hidden]
//   decoder   : x [T, hidden]                    -> y [T, hidden]   (pre-norm block:
//               RMSNorm, GQA causal attention with RoPE (+ Qwen3 q/k norm), residual,
//               RMSNorm, SwiGLU MLP, residual)
//   tail      : x [T, hidden], targets [T] i32   -> loss (final RMSNorm, LM head,
//               cross-entropy over chunks of tokens so the [T, vocab] logits never exist)
// T = n_seq * seq_len tokens of one micro-batch, sequences laid out one after another;
// attention is causal within each sequence, positions restart at 0 for every sequence.
// All device pointers are in the device's compute dtype (Device::compute_dtype())
// except ids/targets (i32), and gradient accumulators (grad_dtype() of Ops, f32 on CPU).
//
// Losses are *sums* over target tokens (targets < 0 are ignored); the optimizer divides
// the accumulated gradients by the global number of target tokens, so accumulation over
// micro-batches and over forward_backward calls equals one big batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/dtype.hpp"
#include "model/layout.hpp"  // also MicroBatchShape

namespace rp {

class Ops;

/// Everything one layer call reads and writes. Unused fields stay null.
struct LayerArgs {
  Ops* ops = nullptr;  ///< the device's ops (compute stream)
  MicroBatchShape shape;
  /// Device copies of the groups in ModelLayout::groups_of(layer), same order.
  std::vector<const void*> params;
  /// Gradient accumulators for the same groups (same order, same numel, grad dtype).
  /// backward() *adds* into them (they are zeroed by the runtime once per iteration). The
  /// entry of a frozen group (ParamGroup::frozen) is nullptr: backward() computes no weight
  /// gradient for it (no dW GEMM, no norm-weight or embedding gradient) and still produces dx.
  std::vector<void*> grads;
  const int32_t* ids = nullptr;      ///< embedding input [T]
  const int32_t* targets = nullptr;  ///< tail: next-token targets [T], < 0 = ignore
  /// Decoders, packed sequences (several examples per sequence): the RoPE position of each
  /// token [T] i32 (device), restarting at 0 where an example begins; attention then stays
  /// within each example (Ops::attention_fwd_packed). Null: positions t % seq_len, attention
  /// causal over the whole sequence.
  const int32_t* positions = nullptr;
  /// Decoders with positions: the largest of them + 1 (host), by which a longrope layer picks
  /// its short or long RoPE table for the whole call, as transformers does by
  /// max(position_ids) + 1 (model/layers.hpp's rope_length). 0: not given, which a longrope
  /// layer with positions refuses; without positions it is seq_len.
  int64_t rope_length = 0;
  const void* x = nullptr;   ///< layer input [T, hidden]
  void* y = nullptr;         ///< forward output [T, hidden]
  const void* dy = nullptr;  ///< gradient w.r.t. y [T, hidden]
  void* dx = nullptr;        ///< backward output: gradient w.r.t. x [T, hidden] (not aliasing dy or x)
  /// Tail only: device float[2], receives {sum of token losses, number of target tokens}.
  float* loss = nullptr;
  /// Tail backward only: the gradients are those of loss_scale * loss sum (fp16 dynamic
  /// loss scaling; unitless, finite, > 0). The reported loss stays unscaled.
  float loss_scale = 1.0f;
  void* scratch = nullptr;  ///< device scratch of at least scratch_bytes()
  size_t scratch_bytes = 0;
  /// Decoders built with LayerOptions::save_attention: the attention output o [T, nq*D]
  /// (compute dtype) and its log-sum-exp lse [n_seq, nq, seq_len] (fp32). forward() writes
  /// them here; backward() reads the forward's values from here and skips recomputing the
  /// attention (the rest of the forward is recomputed as usual). Null otherwise.
  void* attn_o = nullptr;
  float* attn_lse = nullptr;
  /// Optional timing hook: backward() of a layer that recomputes its forward (decoders)
  /// calls it once the recompute is issued and before the backward proper, on the thread
  /// issuing the ops, so the profiler can time the two apart (actors/layer_timer.hpp).
  std::function<void()> after_recompute;
  /// LoRA dropout (ModelLayout::lora with dropout > 0): names this micro-batch's pass so its
  /// backward regenerates the forward's masks (model/lora_linear.hpp). The forward and the
  /// backward of one micro-batch pass the same value, other micro-batches and iterations other
  /// values (e.g. iteration * micro_batches + micro_batch). -1 (the default): no dropout, as in
  /// evaluation; a decoder's backward with dropout configured then throws
  /// std::invalid_argument.
  int64_t dropout_id = -1;
  /// Sparse (mixture-of-experts) decoders: the micro-batch's router statistics, device fp32
  /// [2E]. forward() adds this layer's expert assignment counts (first E) and router
  /// probability sums (last E); backward() reads the first E as the counts summed over every
  /// sparse layer of the micro-batch's forward pass and adds nothing (model/moe_block.hpp).
  /// Null: none gathered (and no load-balancing gradient).
  float* moe_stats = nullptr;
  /// Sparse decoders' backward: d(objective) / d(load-balancing loss of this micro-batch),
  /// i.e. loss_scale * router_aux_loss_coef * the micro-batch's target tokens when the loss is
  /// a sum over tokens (the micro-batch's aux loss weighs as much as its mean token loss).
  /// 0: no load-balancing gradient.
  float moe_aux_scale = 0.0f;
  /// Decoders built with LayerOptions::fp8: the layer's FP8 weight cache, at least
  /// Layer::fp8_weight_bytes(backward call) device bytes, owned by the caller for as long as
  /// the weights in `params` stay uploaded (model/layer_memory.hpp's Fp8WeightBufs). A call
  /// with fp8_fill_weights quantizes the weights into it first (forward: W; backward: W and
  /// W^T), every other call reads what the last filling call left: the caller sets it on the
  /// first call after each upload (of a backward stage: on a backward call). Null for other
  /// layers; an FP8 decoder throws std::invalid_argument without it.
  void* fp8_weights = nullptr;
  size_t fp8_weights_bytes = 0;
  bool fp8_fill_weights = false;
  /// The tensors Layer::fp8_stored_tensors() lists hold their fp8 storage form (row scales,
  /// then codes: kernels/weight_format.hpp) at their offsets in params[0] instead of the
  /// compute-dtype weights whenever ops->gemm_fp8_rows_supported(): the uploader copied them
  /// as they are then (dequantizing them otherwise), and the layer runs those linears from
  /// the stored codes (model/fp8_linear.hpp). False: every weight in the compute dtype.
  bool fp8_stored_base = false;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual LayerKind kind() const = 0;
  /// Device scratch bytes a call needs for a micro-batch of `s` when the device stores
  /// activations in `dt` (Device::compute_dtype(); f32 is the worst case): backward() (the
  /// default, the larger) or forward() only (`backward` false). model/layer_memory.hpp
  /// computes the same numbers without a layer object.
  virtual size_t scratch_bytes(const MicroBatchShape& s, DType dt = DType::f32,
                               bool backward = true) const = 0;
  /// Device bytes of the FP8 weight cache a call needs (LayerArgs::fp8_weights): 0 but for
  /// decoders built with LayerOptions::fp8; `backward` adds the codes of W^T.
  virtual size_t fp8_weight_bytes(bool /*backward*/) const { return 0; }
  /// Element offsets (TensorSpec::offset) in the layer's first group of the frozen fp8-stored
  /// linear weights an FP8 decoder can run from their codes (LayerArgs::fp8_stored_base):
  /// the dense linears whose TensorSpec::format is fp8 and whose sides are multiples of 16.
  /// Empty for every other layer.
  virtual std::vector<int64_t> fp8_stored_tensors() const { return {}; }
  /// Forward without saving anything. Tail: computes only args.loss (evaluation).
  virtual void forward(const LayerArgs& args) const = 0;
  /// Recomputes this layer's forward from args.x (ids for the embedding), then
  /// back-propagates args.dy into args.dx (not for the embedding) and adds the
  /// parameter gradients into args.grads. Tail: fused forward + loss + backward,
  /// dy unused (d loss_sum / d loss_i = 1), writes args.loss and args.dx.
  virtual void backward(const LayerArgs& args) const = 0;
};

/// Choices that change a layer's scratch but not its result (beyond rounding; fp8's rounding
/// is coarser).
struct LayerOptions {
  /// Decoders run their MLP over chunks of at most this many tokens, so the [tokens, ffn]
  /// intermediates exist for one chunk at a time (<= 0: kDefaultMlpChunkTokens of
  /// model/layer_memory.hpp). Weight gradients are summed over the chunks.
  int64_t mlp_chunk_tokens = 0;
  /// Decoders keep the attention output and its log-sum-exp of the forward
  /// (LayerArgs::attn_o / attn_lse) so that backward does not recompute the attention; their
  /// scratch then holds neither.
  bool save_attention = false;
  /// Decoders run the forward, recompute and input-gradient GEMMs of their dense linears
  /// (q, k, v, o, gate, up, down; not a sparse block's experts) in FP8 e4m3 with fp32
  /// accumulation (model/fp8_linear.hpp); weight gradients and LoRA adapters stay in the
  /// compute dtype. Changes the result (FP8 rounding) and needs LayerArgs::fp8_weights.
  bool fp8 = false;
  /// With fp8: the dense linears' weight gradients dW += dy^T x as FP8 GEMMs too (the codes
  /// of dy^T and x^T, e4m3, scales from each tensor's amax; model/fp8_linear.hpp), where the
  /// linear's input width is a multiple of 16; otherwise in the compute dtype.
  bool fp8_weight_gradients = false;
  /// With fp8 over a LoRA base stored as fp8: the linears whose sides are multiples of 16 run
  /// from the stored e4m3 codes and row scales, with one activation scale per token
  /// (model/fp8_linear.hpp; no dequantize and requantize per upload), where the device has the
  /// per-row-scale GEMM (Ops::gemm_fp8_rows_supported). Off by default: experimental (docs/gpu.md,
  /// "FP8 linears").
  bool fp8_stored_direct = false;
  /// Sparse blocks lay their sorted rows out padded (Ops::moe_pad; DeviceOptions::
  /// expert_gemm_bucketed, which sets the ops' ExpertGemm::bucketed as well): scratch for
  /// padded_rows_bound(C*k) rows; results equal the unpadded layout's.
  bool expert_padded = false;
};

/// Builds compute layer `layer` (0 = embedding, 1..L decoders, L+1 tail) of `m`.
/// Throws std::out_of_range for a layer outside [0, m.num_layers()).
std::unique_ptr<Layer> make_layer(const ModelLayout& m, int layer, const LayerOptions& opt = {});

}  // namespace rp
