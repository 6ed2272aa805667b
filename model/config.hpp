// Decoder-only transformer configuration (Hugging Face config.json vocabulary): reading and
// writing config.json (the ModelConfig type is public: roundpipe/model.hpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "roundpipe/model.hpp"  // RopeScaling, ModelConfig

namespace rp {

/// Parses a HF config.json object. `where` names the file in error messages:
/// "<where>: key '<k>': expected <...>". Unknown architectures / rope types are refused.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& where);
/// Reads and parses a config.json file (errors name the file).
ModelConfig load_config_file(const std::string& path);
/// HF config.json for `c` (loadable by transformers' LlamaForCausalLM / Qwen3ForCausalLM).
nlohmann::json config_to_json(const ModelConfig& c);

/// ModelConfig::num_parameters() computed without overflow: std::nullopt when a size is
/// negative or the count exceeds 2^48 (ModelConfig::validate refuses such configs).
std::optional<int64_t> parameter_count(const ModelConfig& c);

/// Refuses, before anything is allocated from them, config sizes the weight files cannot
/// hold: `file_bytes` (all weight files together) must hold parameter_count(c) parameters of
/// at least `min_bytes_per_param` bytes each (GGUF: 84/256, the Q2_K block; safetensors: 2,
/// the F16/BF16 this reader takes). `layers_key` names the layer count in the message
/// ("block_count", "num_hidden_layers"), `held_by` the weight files ("the file" where `where` is
/// the weights' own file). Throws std::runtime_error("<where>: ..., but <held_by> hold(s) N bytes").
void check_weights_fit_files(const ModelConfig& c, uint64_t file_bytes, double min_bytes_per_param,
                             const std::string& where, const std::string& layers_key,
                             const std::string& held_by = "the file");

/// Refuses a model whose fp32 weights (loaded tensors plus the parameter groups made from
/// them, 8 bytes per parameter) exceed the host's available memory. Throws
/// std::runtime_error("<where>: ...").
void check_host_memory_to_load(const ModelConfig& c, const std::string& where);

}  // namespace rp
