// Which layout tensors a model family's Hugging Face checkpoints fuse into one (Phi-3's qkv_proj
// and gate_up_proj). A fact about the model that make_layout's LoRA checks need (a LoRA run
// adapts the parts of a fused projection all or none); how such checkpoints and adapters are
// read and written is in formats/phi3_hf.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "roundpipe/model.hpp"

namespace rp {

/// The checkpoint fuses q/k/v and gate/up (model_type phi3).
bool hf_fuses_projections(const ModelConfig& c);

/// A fused tensor of layer `layer`: its name, and the layout tensors it holds in order with
/// their rows.
struct FusedProjection {
  std::string name;                       ///< "model.layers.N.self_attn.qkv_proj.weight"
  std::string module;                     ///< "qkv_proj" / "gate_up_proj"
  std::vector<std::string> parts;         ///< "model.layers.N.self_attn.q_proj.weight", ...
  std::vector<std::string> part_modules;  ///< "q_proj", "k_proj", "v_proj"
  std::vector<int64_t> rows;              ///< rows of each part
  int64_t cols = 0;
};
/// The two fused tensors of every layer of `c` (none unless hf_fuses_projections).
std::vector<FusedProjection> fused_projections(const ModelConfig& c);

}  // namespace rp
