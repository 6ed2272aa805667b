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
/// 0") unless r >= 1, alpha > 0 (finite), 0 <= dropout < 1, target_modules is non-empty and
/// holds only kLoraModuleNames or "all-linear", modules_to_save only "embed_tokens" /
/// "lm_head".
void validate_lora(const LoraConfig& lora);
/// Whether `lora` puts an adapter on module m ("all-linear": on all seven).
bool lora_targets(const LoraConfig& lora, LoraModule m);
/// Whether decoder layer `decoder` (0-based) of `c` has linear `m`: a sparse (mixture-of-
/// experts) layer has no gate/up/down_proj linear of its own (its experts are stacked
/// tensors, which adapters do not reach, as in PEFT's target_modules on Qwen3-MoE).
bool lora_module_exists(const ModelConfig& c, int64_t decoder, LoraModule m);

/// Initial values of adapter group g of m (numel floats), as PEFT's LoraLayer.reset_lora_
/// parameters with init_lora_weights=True: lora_A ~ U(-1/sqrt(in), 1/sqrt(in)) (torch's
/// kaiming_uniform_ with a = sqrt(5): gain sqrt(2/(1+5)), bound gain*sqrt(3/in)), lora_B = 0,
/// so the adapted model starts equal to the base. The numbers come from a counter-based hash
/// of (lora.seed, g, tensor, element) (kernels/dropout_hash.hpp), not from torch's generator:
/// deterministic for a seed, independent of the order groups are filled. Throws
/// std::invalid_argument when m has no LoRA or g is not one of its adapter groups.
std::vector<float> lora_initial_group(const ModelLayout& m, int g);


}  // namespace rp
