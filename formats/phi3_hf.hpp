// Phi-3's fused projections in Hugging Face checkpoints and adapters, and in the layout.
//   HF (Phi3Attention, Phi3MLP): self_attn.qkv_proj.weight [(nq + 2 nkv) D, H], the rows of q,
//   then k, then v; mlp.gate_up_proj.weight [2F, H], the rows of gate, then up.
//   Layout (make_layout): self_attn.{q,k,v}_proj.weight and mlp.{gate,up}_proj.weight as for
//   LLaMA, consecutive in their group, so the fused tensor is the layout's memory as it is.
// A LoRA run adapts q/k/v (and gate/up) all or none; PEFT sees one adapter on qkv_proj (and on
// gate_up_proj) whose lora_A stacks ours ([3r, H]) and whose lora_B is block diagonal
// ([(nq + 2 nkv) D, 3r]), its rank and alpha given in rank_pattern / alpha_pattern so that its
// scaling equals ours; a PEFT-trained fused adapter of rank r is read as three adapters
// sharing its lora_A.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "formats/safetensors.hpp"      // TensorRef, HostTensor
#include "model/fused_projections.hpp"  // FusedProjection, fused_projections
#include "model/layout.hpp"

namespace rp {

/// Where a tensor of a Hugging Face folder lies in the layout's parameter groups: `shape`
/// values from fp32 element `offset` of group `group`.
struct HfTensorPlace {
  std::string name;
  std::vector<int64_t> shape;
  size_t group = 0;
  int64_t offset = 0;
};
/// The tensors a Hugging Face folder of `layout` holds, group by group: the layout's, with
/// each fused projection's parts replaced by one tensor over their (consecutive) data.
std::vector<HfTensorPlace> hf_tensor_places(const ModelLayout& layout);

/// PEFT's module name for our module `m` of a model of `c` ("q_proj" -> "qkv_proj" for Phi-3).
std::string peft_module_name(const ModelConfig& c, const std::string& m);

/// Phi-3 PEFT export: the fused adapters of `layout`'s adapter tensors (name -> tensor, keyed
/// as the adapter file names them without its prefix), replacing the parts' keys; and the
/// rank_pattern / alpha_pattern entries that keep PEFT's scaling ours (group_data empty: the
/// patterns only).
struct FusedAdapters {
  std::map<std::string, HostTensor> tensors;
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  std::vector<std::string> replaced;  ///< our adapter tensor names they replace
};
FusedAdapters fused_adapters(const ModelLayout& layout, const std::vector<const float*>& group_data);

/// Phi-3 PEFT import: our per-part lora_A / lora_B tensors from a file's fused ones (`tensors`,
/// keyed without the prefix): rank n r (ours, block diagonal) or r (PEFT's, lora_A shared).
/// Throws std::runtime_error("<where>: key '<key>': ...") for a fused tensor of another rank or
/// shape. Tensors other than fused adapters pass through.
/// `r`: the adapter's lora.r; `c`: the base model's config (nothing to split unless Phi-3).
std::map<std::string, HostTensor> split_fused_adapters(const std::map<std::string, HostTensor>& tensors,
                                                       const ModelConfig& c, int64_t r,
                                                       const std::string& where);

}  // namespace rp
