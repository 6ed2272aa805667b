// Hugging Face tokenizer.json / tokenizer_config.json from a GGUF's tokenizer.ggml.* metadata.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "formats/gguf.hpp"

namespace rp {

/// HF `tokenizers` tokenizer.json for a byte-level BPE GGUF (tokenizer.ggml.model "gpt2"):
///  - model: BPE, vocab from tokenizer.ggml.tokens (id = position), merges from
///    tokenizer.ggml.merges written as [left, right] pairs;
///  - added_tokens: token_type 3 (control, special=true) and 4 (user-defined, special=false);
///  - pre_tokenizer chosen by tokenizer.ggml.pre: "smollm" (Digits + ByteLevel), "qwen2"
///    (Split on Qwen2's regex + ByteLevel without regex), "llama-bpe"/"llama3" (Split on
///    LLaMA-3's regex + ByteLevel without regex), "gpt-4o" (GPT-OSS: Split on o200k's regex
///    + ByteLevel without regex), anything else ("gpt2", "default", absent):
///    ByteLevel with its GPT-2 regex;
///  - decoder ByteLevel; normalizer null; post_processor null, or a TemplateProcessing that
///    prepends BOS when tokenizer.ggml.add_bos_token is true.
/// Throws std::runtime_error("<file>: <what>") for other tokenizer models ("llama" SPM, ...)
/// or inconsistent metadata (token_type length, ids out of range).
nlohmann::json tokenizer_json_from_gguf(const GgufFile& f);

/// The tokenizer.ggml.pre of a tokenizer.json's pre-tokenizer, the inverse of
/// tokenizer_json_from_gguf's choice: "gpt2" (ByteLevel with its regex), "smollm" (Digits +
/// ByteLevel), "qwen2" / "llama-bpe" / "gpt-4o" (Split on that family's regex + ByteLevel
/// without regex); "" for any other pre-tokenizer.
std::string gguf_pre_of_tokenizer_json(const nlohmann::json& tokenizer_json);

/// Content string of token `id` in an HF tokenizer.json (added_tokens first, then
/// model.vocab), or "" when not found / id < 0.
std::string token_content(const nlohmann::json& tokenizer_json, int64_t id);

/// HF tokenizer_config.json: tokenizer_class PreTrainedTokenizerFast, bos/eos/pad tokens (from
/// the ids, looked up in `tokenizer_json`; omitted when < 0 or unknown), chat_template (when
/// non-empty), model_max_length, clean_up_tokenization_spaces false.
nlohmann::json tokenizer_config_json(const nlohmann::json& tokenizer_json, int64_t bos_id, int64_t eos_id,
                                     int64_t pad_id, const std::string& chat_template,
                                     int64_t model_max_length);

}  // namespace rp
