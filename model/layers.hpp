// Implementation details of make_layer (model/layer.hpp) that tests and tools reuse.
//
// Layer classes (model/layers.cpp), all pure functions of their LayerArgs:
//  - EmbeddingLayer: y = embed_tokens[ids]; backward scatter-adds dy into its gradient.
//  - DecoderLayer  : HF LlamaDecoderLayer / Qwen3DecoderLayer (pre-norm):
//        h = x + o_proj(attn(rope(qn(q_proj(xn))), rope(kn(k_proj(xn))), v_proj(xn)))
//        y = h + down_proj(silu(gate_proj(hn)) * up_proj(hn)),
//    xn = RMSNorm(x; input_layernorm), hn = RMSNorm(h; post_attention_layernorm),
//    qn/kn = Qwen3 per-head RMSNorm over head_dim (identity for LLaMA), attention
//    scale 1/sqrt(head_dim), causal within each sequence, RoPE positions restarting
//    at 0 per sequence. OLMo 2 (post_norms): no xn/hn, h = x + RMSNorm(o_proj(...)),
//    y = h + RMSNorm(down_proj(...)), qn/kn over a token's whole q and k; Granite: each
//    branch times residual_multiplier, scores times attention_multiplier.
//    With LoRA (ModelLayout::lora) each targeted linear adds s * B A drop(x)
//    (model/lora_linear.hpp), params[1] / grads[1] being the layer's adapter group; a null
//    grads[0] (frozen base) computes no base weight gradient, only dx and the adapters'.
//  - TailLayer     : loss = CE(lm_head(RMSNorm(x; model.norm)) / logits_scaling, targets),
//    summed (logits_scaling: Granite's, 1 elsewhere; the embedding likewise times
//    embedding_multiplier; Gemma's final_logit_softcapping caps the logits first). Embedding and tail:
//    model/layers_ends.cpp.
// backward() recomputes the layer's forward into scratch, then back-propagates; a decoder
// recomputes its attention half first and its MLP half chunk by chunk inside the backward
// (model/layer_memory.hpp lists the buffers).
#pragma once
#include <cstddef>

#include "kernels/ops.hpp"
#include "kernels/rope_tables.hpp"
#include "model/config.hpp"
#include "model/layer.hpp"
#include "model/layer_memory.hpp"

namespace rp {

/// RoPE parameters of decoder layer `layer` (0-based) of `c` (rope_theta, head_dim,
/// rope_scaling, max_position_embeddings) for rope_frequencies(); Gemma 3's sliding layers
/// take rope_local_theta without scaling.
RopeParams rope_params(const ModelConfig& c, int64_t layer);
/// The RoPE table(s) of decoder layer `layer`: rope_tables() of rope_params() and, for
/// longrope, rope_scaling's short and long factors.
RopeTables layer_rope_tables(const ModelConfig& c, int64_t layer);
/// The largest RoPE position + 1 of a decoder call (longrope picks its table by it):
/// LayerArgs::rope_length, or seq_len when the call has no positions. Throws
/// std::invalid_argument when the call has positions but no rope_length (<= 0) and `needed`
/// (a longrope layer).
int64_t rope_length(const LayerArgs& a, bool needed);

/// y[i] = alpha * x[i] for i < n in ops.dtype(), the product in fp32; y may be x. Granite's
/// embedding, residual and logit multipliers and their backward, through Ops::add_into (in
/// place: y += (alpha - 1) y; else y = 0, then y += alpha x).
void scale_activation(Ops& ops, const void* x, void* y, int64_t n, float alpha);
/// v rounded to ops.dtype() (bf16, f16; f32 unchanged): Gemma's embedding normalizer, which
/// transformers makes a tensor of the activations' dtype.
float in_dtype(const Ops& ops, float v);

}  // namespace rp
