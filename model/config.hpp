// Decoder-only transformer configuration (Hugging Face config.json vocabulary): reading and
// writing config.json (the ModelConfig type is public: roundpipe/model.hpp).
#pragma once
#include <cstdint>
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

}  // namespace rp
