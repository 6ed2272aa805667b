// LoRA at the level of the layout: which linears carry adapters, their shapes, the checks of
// a LoraConfig, and the initial adapter weights (make_layout(config, lora) itself is declared
// in roundpipe/model.hpp; the adapter math is in model/lora_linear.hpp).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "roundpipe/model.hpp"

namespace rp {

/// The seven linears of a decoder layer, in the base group's tensor order (layout.cpp).
enum class LoraModule : int { q, k, v, o, gate, up, down };
constexpr int kLoraModules = 7;
/// PEFT's target-module names, indexed by LoraModule: q_proj, k_proj, v_proj, o_proj,
/// gate_proj, up_proj, down_proj.
extern const std::array<const char*, kLoraModules> kLoraModuleNames;
/// The module's path inside a decoder layer: "self_attn.q_proj", ..., "mlp.down_proj".
std::string lora_module_path(LoraModule m);
/// {in_features, out_features} of the module's base linear for config c.
std::array<int64_t, 2> lora_module_dims(const ModelConfig& c, LoraModule m);

/// Throws std::invalid_argument with one line naming the field ("lora.r: expected >= 1, got
/// 0") unless r >= 1, alpha > 0 (finite), 0 <= dropout < 1, target_modules holds only
/// kLoraModuleNames or "all-linear" and is non-empty unless target_parameters is,
/// target_parameters only kExpertProjNames (dropout 0 then: PEFT's ParamWrapper has none),
/// modules_to_save only "embed_tokens" / "lm_head".
void validate_lora(const LoraConfig& lora);
/// Whether `lora` puts an adapter on module m ("all-linear": on all seven).
bool lora_targets(const LoraConfig& lora, LoraModule m);
/// Whether decoder layer `decoder` (0-based) of `c` has linear `m`: a sparse (mixture-of-
/// experts) layer has no gate/up/down_proj linear of its own (its experts are stacked
/// tensors, which adapters do not reach, as in PEFT's target_modules on Qwen3-MoE).
bool lora_module_exists(const ModelConfig& c, int64_t decoder, LoraModule m);

/// The stacked expert projections that take per-expert adapters (LoraConfig::target_parameters),
/// as PEFT's ParamWrapper on transformers 5's Qwen3MoeExperts: gate_up (gate_up_proj [E, 2Fe, H],
/// the gate rows first) and down (down_proj [E, H, Fe]).
enum class ExpertProj : int { gate_up, down };
constexpr int kExpertProjs = 2;
/// PEFT's target_parameters names, indexed by ExpertProj: "mlp.experts.gate_up_proj",
/// "mlp.experts.down_proj".
extern const std::array<const char*, kExpertProjs> kExpertProjNames;
/// Whether `lora` puts adapters on the experts' projection p ("gate_up_proj" / "down_proj" with
/// or without the "mlp.experts." prefix).
bool lora_targets_experts(const LoraConfig& lora, ExpertProj p);
/// Whether `lora` adapts any expert projection.
bool lora_has_expert_targets(const LoraConfig& lora);
/// Refuses expert adapters on a model without mixture-of-experts layers, where they would be
/// silently dropped: throws std::invalid_argument("lora.target_parameters: the model has no
/// mixture-of-experts layer ..."). Used by make_layout (training) and merge_peft_adapter
/// (merge, generate) alike.
void check_lora_expert_targets(const ModelConfig& c, const LoraConfig& lora);
/// Sets lora.target_modules and lora.target_parameters from one list of a command line's
/// --lora-targets: "experts" (both expert projections), "experts.gate_up_proj",
/// "experts.down_proj" (also with the "mlp." prefix) go to target_parameters, every other
/// entry to target_modules (checked later by validate_lora).
void set_lora_targets(LoraConfig& lora, const std::vector<std::string>& entries);

/// Names of the adapter tensors of the experts of decoder `decoder` (0-based) in its adapter
/// group, "model.layers.<i>.mlp.experts.<stem>.weight", with their shapes, for E experts, hidden
/// H, expert FFN Fe and rank r:
///   gate_up: gate_up_proj.lora_A [E, r, H], gate_proj.lora_B [E, Fe, r], up_proj.lora_B [E, Fe, r]
///            (PEFT's one lora_B [2Fe, r] per expert, its gate rows and its up rows, kept apart
///            so each is a stacked [E, Fe, r] the grouped linears take);
///   down   : down_proj.lora_A [E, r, Fe], down_proj.lora_B [E, H, r].
/// Per expert e the update is W_e += s * B_e A_e (PEFT's get_delta_weight, "o r e, e r i -> e o i").
std::vector<std::pair<std::string, std::vector<int64_t>>> expert_lora_tensors(const ModelConfig& c,
                                                                              int64_t decoder, ExpertProj p,
                                                                              int64_t r);

/// Initial values of adapter group g of m (numel floats), as PEFT's LoraLayer.reset_lora_
/// parameters with init_lora_weights=True: lora_A ~ U(-1/sqrt(in), 1/sqrt(in)) (torch's
/// kaiming_uniform_ with a = sqrt(5): gain sqrt(2/(1+5)), bound gain*sqrt(3/in)), lora_B = 0,
/// so the adapted model starts equal to the base. The numbers come from a counter-based hash
/// of (lora.seed, g, tensor, element) (kernels/dropout_hash.hpp), not from torch's generator:
/// deterministic for a seed, independent of the order groups are filled. Throws
/// std::invalid_argument when m has no LoRA or g is not one of its adapter groups.
std::vector<float> lora_initial_group(const ModelLayout& m, int g);

}  // namespace rp
