// The fused projections of a model family's checkpoints (model/fused_projections.hpp).
#include "model/fused_projections.hpp"

#include <fmt/format.h>

namespace rp {

bool hf_fuses_projections(const ModelConfig& c) { return c.architecture == "phi3"; }

std::vector<FusedProjection> fused_projections(const ModelConfig& c) {
  std::vector<FusedProjection> out;
  if (!hf_fuses_projections(c)) return out;
  const int64_t H = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string a = fmt::format("model.layers.{}.self_attn.", l),
                      m = fmt::format("model.layers.{}.mlp.", l);
    out.push_back({a + "qkv_proj.weight",
                   "qkv_proj",
                   {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                   {"q_proj", "k_proj", "v_proj"},
                   {c.num_attention_heads * D, c.num_key_value_heads * D, c.num_key_value_heads * D},
                   H});
    out.push_back({m + "gate_up_proj.weight",
                   "gate_up_proj",
                   {m + "gate_proj.weight", m + "up_proj.weight"},
                   {"gate_proj", "up_proj"},
                   {F, F},
                   H});
  }
  return out;
}

}  // namespace rp
