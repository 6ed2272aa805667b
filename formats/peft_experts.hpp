// The experts' LoRA adapters in PEFT's form (PEFT's ParamWrapper, target_parameters, on
// transformers 5's Qwen3MoeExperts), and back.
//
// PEFT wraps each targeted stacked parameter of `mlp.experts` once, the wrappers nested: with
// both "mlp.experts.gate_up_proj" and "mlp.experts.down_proj" targeted, gate_up_proj's wrapper is
// the inner one, so its tensors are "model.layers.<i>.mlp.experts.base_layer.lora_A/B.weight" and
// down_proj's "model.layers.<i>.mlp.experts.lora_A/B.weight"; with one of them, that one's are
// "...mlp.experts.lora_A/B.weight". For a parameter [E, out, in] and rank r:
//   lora_A.weight [E*r, in]    row e*r + q  = A_e[q, :]          (our [E, r, in], the same bytes)
//   lora_B.weight [out, r*E]   column q*E+e = B_e[:, q]          (our [E, out, r], permuted)
// (peft/tuners/lora/layer.py ParamWrapper.get_delta_weight: A reshaped (E, r, in), B reshaped
// (out, r, E); delta_e = s * B_e A_e). gate_up_proj's B has the gate rows first, then the up rows
// (Qwen3MoeExperts: gate, up = linear(x, gate_up_proj[e]).chunk(2)); GPT-OSS interleaves them
// (GptOssExperts: gate = gate_up[..., ::2], up = gate_up[..., 1::2]: gate row f is B's row 2f,
// up row f its row 2f + 1). Ours are the two stacked tensors gate_proj.lora_B and
// up_proj.lora_B (model/lora.hpp expert_lora_tensors).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/model.hpp"

namespace rp {

/// The expert adapters of one decoder layer in PEFT's names (without "base_model.model.") and
/// layout, from the adapter group's fp32 values `group` of `layout`. Empty for a layer
/// without expert adapters.
std::map<std::string, HostTensor> peft_expert_tensors(const ModelLayout& layout, int64_t decoder,
                                                      const float* group);

/// Replaces PEFT's expert adapter tensors in `tensors` ("model.layers.<i>.mlp.experts[.base_layer]
/// .lora_A/B.weight") by ours, for an adapter of rank `lora.r` whose target_parameters are
/// `lora.target_parameters`. Throws std::runtime_error("<where>: key '<key>': ...") for a key
/// of a projection that target_parameters does not name or a shape that is not [E*r, in] /
/// [out, r*E] (gate_up: out even).
void expert_tensors_from_peft(const LoraConfig& lora, std::map<std::string, HostTensor>& tensors,
                              const std::string& where);

/// expert_tensors_from_peft does not know the model and splits gate_up_proj's B as
/// Qwen3-MoE's (gate rows first, then up rows). For a GPT-OSS model `c`, whose rows
/// interleave, the gate_proj / up_proj .lora_B pairs of `tensors` ([E, Fe, r] each) regrouped
/// to gate row f = PEFT's row 2f, up row f = row 2f + 1, by name; empty for other models (and
/// without a pair of one shape: whoever copies the tensors names those).
std::map<std::string, HostTensor> gpt_oss_gate_up(const std::map<std::string, HostTensor>& tensors,
                                                  const ModelConfig& c);

/// Whether `name` (without the PEFT prefix) is one of PEFT's expert adapter tensors.
bool is_peft_expert_key(const std::string& name);

}  // namespace rp
