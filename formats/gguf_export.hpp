// Hugging Face folder -> GGUF (`roundpipe export-gguf`): the inverse of the GGUF reader
// (formats/gguf.hpp) for dense "llama", "qwen2" and "qwen3" models, written as llama.cpp's
// convert_hf_to_gguf.py writes them, so that llama.cpp and our own reader both load the file.
//
//   container   GGUF v3, little-endian, general.alignment 32 (not written: the default);
//               metadata, then the tensor infos, then each tensor's data at a multiple of 32.
//   metadata    general.architecture / type / name / file_type / quantization_version,
//               <arch>.context_length, embedding_length, block_count, feed_forward_length,
//               attention.head_count, head_count_kv, key_length, value_length,
//               layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count, vocab_size,
//               rope.scaling.{type,factor,original_context_length} (linear, yarn); llama3 RoPE
//               scaling as the tensor rope_freqs.weight (F32 [head_dim/2], llama.cpp's factors);
//               tokenizer.ggml.{model "gpt2", pre, tokens, token_type, merges, bos_token_id,
//               eos_token_id, padding_token_id, add_bos_token}, tokenizer.chat_template;
//               roundpipe.written_by "roundpipe export-gguf" (what --force checks).
//   tensors     token_embd, output (absent when tied), output_norm, blk.N.{attn_norm, attn_q,
//               attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate,
//               ffn_up, ffn_down}.weight, blk.N.attn_{q,k,v}.bias (qwen2). 2-D weights in the
//               chosen type; 1-D tensors (norms, biases, rope_freqs) in F32, as llama.cpp keeps
//               them; a q8_0 matrix whose rows are not a multiple of 32 falls back to F16.
//               LLaMA q_proj / k_proj rows are permuted as convert_hf_to_gguf.py's permute()
//               (the reader undoes it).
//   tokenizer   from tokenizer.json (byte-level BPE): tokens by id, [PAD<i>] (type 5, unused)
//               for ids the vocabulary lacks below vocab_size, token_type 1 normal, 3 control
//               (special added tokens), 4 user-defined (other added tokens); merges as
//               "left right"; pre from the pre-tokenizer ("smollm", "qwen2", "llama-bpe",
//               else "gpt2"); add_bos_token when the post-processor prepends the BOS token.
#pragma once
#include <string>

namespace rp {

/// The tensor type of an export: "f16", "bf16" or "q8_0".
enum class GgufExportType { f16, bf16, q8_0 };
/// Parses "f16", "bf16", "q8_0"; throws std::invalid_argument naming the text.
GgufExportType parse_gguf_export_type(const std::string& s);

/// Writes the model in `in_dir` (a Hugging Face folder, or a LoRA adapter folder, which is
/// merged into its base first: load_model_or_adapter, with `base` when not empty, else the base
/// its adapter_config.json names) to the GGUF file `out`, atomically
/// (base/atomic_file.hpp). `out` must not exist, unless `force` and it is a GGUF this command
/// wrote (roundpipe.written_by); it must not be or lie inside the input or the base. Throws
/// std::invalid_argument (one line naming the file) for a refused output, another
/// architecture, a tokenizer that is not byte-level BPE; std::runtime_error("<file>: ...")
/// for I/O failures and what load_model throws, and before anything is written
/// std::runtime_error("<out>: the GGUF file needs about X, the file system has Y free; ...")
/// when `out`'s disk lacks the room. Returns the number of tensors written.
/// A model folder is read one tensor at a time as the file is written (ModelSource: about one
/// tensor's fp32 values of host memory); an adapter folder is merged onto its base first and
/// held in fp32 (open_model_or_adapter).
int64_t export_gguf(const std::string& in_dir, const std::string& out, GgufExportType type, bool force,
                    const std::string& base = "");

}  // namespace rp
