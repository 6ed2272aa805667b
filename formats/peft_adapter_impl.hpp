// Private: what formats/peft_adapter.cpp (the names, the layout's side, the export) and
// formats/peft_adapter_read.cpp (the import) share: the base tensors PEFT saves as
// modules_to_save, the seven linears, and what a LoRA layout adapts and trains.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "roundpipe/adapter.hpp"

namespace rp {

inline constexpr const char* kEmbed = "model.embed_tokens.weight";
inline constexpr const char* kLmHead = "lm_head.weight";
inline constexpr const char* kNorm = "model.norm.weight";
inline const std::vector<std::string> kLinears = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};

/// "embed_tokens" / "lm_head" for a modules_to_save entry (PEFT also writes full module
/// paths such as "model.embed_tokens"), "" for anything else.
std::string module_to_save_name(const std::string& s);
/// The adapter tensors of a layout: (group, tensor) of every "lora_A"/"lora_B" tensor.
std::vector<std::pair<int, const TensorSpec*>> adapter_tensors(const ModelLayout& layout);
/// (group, tensor) of a base matrix by name, or (-1, nullptr).
std::pair<int, const TensorSpec*> find_tensor(const ModelLayout& layout, const std::string& name);

/// What the run trains besides the adapters: the embedding (group 0) and the head group (final
/// norm + untied lm_head), from the groups' frozen flags (make_layout(config, lora) freezes
/// the others), and the modules_to_save names PEFT knows them by.
struct TrainedBase {
  bool embed = false, head = false;
  std::vector<std::string> modules_to_save;  ///< embed_tokens, lm_head, model.norm (in that order)
};
TrainedBase trained_base(const ModelLayout& layout);

/// The modules whose adapters `layout` holds: lora_target_list, less the MLP modules of a
/// model whose decoder layers are all sparse ("all-linear" reaches only attention there).
std::vector<std::string> adapted_modules(const ModelLayout& layout);

}  // namespace rp
