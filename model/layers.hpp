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
//    at 0 per sequence.
//  - TailLayer     : loss = CE(lm_head(RMSNorm(x; model.norm)), targets), summed.
// backward() recomputes the layer's forward into scratch, then back-propagates.
#pragma once
#include <cstddef>

#include "kernels/ops.hpp"
#include "model/config.hpp"
#include "model/layer.hpp"

namespace rp {

/// RoPE parameters of `c` (rope_theta, head_dim, rope_scaling, max_position_embeddings)
/// for rope_frequencies().
RopeParams rope_params(const ModelConfig& c);

/// Alignment of every buffer a layer carves out of its scratch.
constexpr size_t kScratchAlign = 256;

/// Bump allocator over a layer's scratch. With base == nullptr it only counts bytes
/// (used by scratch_bytes()).
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    off_ = (off_ + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    void* p = base_ ? base_ + off_ : nullptr;
    off_ += bytes;
    return p;
  }
  size_t used() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

}  // namespace rp
