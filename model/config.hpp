// Decoder-only transformer configuration (Hugging Face config.json vocabulary).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace rp {

/// rope_scaling of HF config.json. type "default" means no scaling.
struct RopeScaling {
  std::string type = "default";  ///< default | linear | llama3 | yarn
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  double attention_factor = 0.0;  ///< 0 = derive (0.1*ln(factor)+1), as transformers does
};

/// A dense LLaMA / Qwen3 decoder. Field names follow HF config.json.
struct ModelConfig {
  std::string architecture = "llama";  ///< "llama" or "qwen3" (model_type)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  ///< hidden_size / num_attention_heads unless given
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool qk_norm = false;  ///< Qwen3: RMSNorm over head_dim on q and k before RoPE
  bool attention_bias = false;  ///< only false is supported
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;

  /// Number of parameters (tied embeddings counted once).
  int64_t num_parameters() const;
  /// Throws std::invalid_argument with "<key>: <what was expected>" when inconsistent
  /// (heads not dividing, unsupported rope type, attention_bias, ...).
  void validate() const;
};

/// Parses a HF config.json object. `where` names the file in error messages:
/// "<where>: key '<k>': expected <...>". Unknown architectures / rope types are refused.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& where);
/// Reads and parses a config.json file (errors name the file).
ModelConfig load_config_file(const std::string& path);
/// HF config.json for `c` (loadable by transformers' LlamaForCausalLM / Qwen3ForCausalLM).
nlohmann::json config_to_json(const ModelConfig& c);

}  // namespace rp
