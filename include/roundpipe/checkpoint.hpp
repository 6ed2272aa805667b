// Loading a model (GGUF file or Hugging Face folder) into fp32 host tensors, copying it into
// the runtime's parameter groups, and saving Hugging Face checkpoints atomically.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "roundpipe/dtype.hpp"
#include "roundpipe/model.hpp"

namespace rp {

/// A host tensor in fp32, row-major.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  int64_t numel() const;
};

struct LoadedModel {
  ModelConfig config;
  /// HF names -> fp32 tensors in HF (row-major) shapes: exactly the tensors of
  /// make_layout(config) (a tied lm_head.weight is dropped after checking it equals the
  /// embedding).
  std::map<std::string, HostTensor> tensors;
  nlohmann::json tokenizer_json;  ///< HF tokenizer.json content, or null
  /// Where tokenizer_json came from, as tokenizer errors name it: "<folder>/tokenizer.json", or
  /// "<file>.gguf (its tokenizer.ggml.* metadata)"; "" when unknown (tokenizer_origin says
  /// "<source> tokenizer" then).
  std::string tokenizer_source;
  std::string chat_template;  ///< Jinja chat template, or ""
  /// Where chat_template came from, as template errors name it ("<file>:<line>: ..."):
  /// "chat_template.jinja", "tokenizer_config.json key 'chat_template'" or "<file>.gguf key
  /// 'tokenizer.chat_template'"; "" when unknown (errors say chat_template.jinja then).
  std::string chat_template_source;
  /// Why the model's own chat template cannot be used although its files name some (a
  /// tokenizer_config.json list of templates without a "default" entry, as transformers refuses
  /// it); chat_template is "" then. Chat formatting with the model's template ("auto" or
  /// "jinja") throws std::invalid_argument with this text; raw-text data is unaffected.
  std::string chat_template_error;
  std::string source;  ///< the path it was loaded from
};

/// The name template errors give `m`'s chat template: m.chat_template_source, else
/// "chat_template.jinja".
inline std::string template_file_name(const LoadedModel& m) {
  return m.chat_template_source.empty() ? std::string("chat_template.jinja") : m.chat_template_source;
}

/// Where `m`'s tokenizer came from, for errors: m.tokenizer_source, else "<m.source> tokenizer".
inline std::string tokenizer_origin(const LoadedModel& m) {
  return m.tokenizer_source.empty() ? m.source + " tokenizer" : m.tokenizer_source;
}

/// Loads `path`: a .gguf file (llama, qwen3, qwen3moe or gpt-oss architecture; quantized
/// tensors dequantized to fp32, LLaMA q/k rows un-permuted back to HF's rotate-half order,
/// stacked experts split per expert, tokenizer.json rebuilt from tokenizer.ggml.* when it is
/// byte-level BPE, else null) or a Hugging Face folder
/// (config.json, model.safetensors or model.safetensors.index.json + shards; tokenizer.json
/// and the chat_template of tokenizer_config.json or chat_template.jinja when present).
/// Every tensor of make_layout(config) must be present with the right shape; unknown extra
/// tensors are refused. Throws std::runtime_error("<file>: <what>") naming the tensor.
/// It is ModelSource::open(path) (roundpipe/model_source.hpp) with every tensor read: about
/// 4 bytes per parameter of host memory. A LoRA run reads its frozen base tensor by tensor
/// from a ModelSource instead.
LoadedModel load_model(const std::string& path);

/// Resizes `group_data` to layout.groups.size() buffers of group.numel floats and copies
/// each tensor of `m` to its TensorSpec offset. Throws std::runtime_error when a tensor is
/// missing or has another number of elements.
void fill_groups(const LoadedModel& m, const ModelLayout& layout,
                 std::vector<std::vector<float>>& group_data);
/// The tensors of layout group `g` copied from `m` into `out` (exactly group.numel floats, at
/// their TensorSpec offsets): one group of fill_groups. Throws as fill_groups, and
/// std::invalid_argument for an `out` of another size.
void fill_group(const LoadedModel& m, const ModelLayout& layout, size_t g, std::span<float> out);

/// Writes a Hugging Face checkpoint of the fp32 parameters in `group_data` (one pointer per
/// layout group, group.numel floats each, laid out as in `layout`) into folder `dir`:
/// config.json (torch_dtype = dtype), generation_config.json, model.safetensors (or
/// 5 GB shards + model.safetensors.index.json) in `dtype` (f32, bf16 or f16),
/// tokenizer.json (when tokenizer_json is not null) and tokenizer_config.json (with
/// chat_template and bos/eos/pad tokens of layout.config).
/// Atomic: everything is written into "<dir>.tmp-<pid>", fsynced, and then replaces `dir`
/// (an old `dir` is moved aside and removed only after the new one is in place), so a
/// failure never leaves a partial checkpoint and keeps any previous one. Throws
/// std::invalid_argument for a wrong number of groups, std::runtime_error("<file>: <what>")
/// for I/O failures. `extra` (optional) is called with the temporary folder after the model
/// files are written and before the rename, to add files that must appear atomically with
/// the checkpoint (the trainer's optimizer state); an exception from it aborts the save like
/// any other failure.
void save_hf_checkpoint(const std::string& dir, const ModelLayout& layout,
                        const std::vector<const float*>& group_data, const nlohmann::json& tokenizer_json,
                        const std::string& chat_template, DType dtype,
                        const std::function<void(const std::string& tmp_dir)>& extra = {});

/// Reads layout group `g` for a streaming save: a pointer to its group.numel fp32 values, laid
/// out as in the layout, valid until the next call (null: the save fails naming a tensor).
using GroupReader = std::function<const float*(size_t g)>;

/// save_hf_checkpoint with each group read when the writer reaches its tensors, one group at a
/// time and each once (plus, for GPT-OSS, one decoder's experts in Hugging Face's stacked
/// form): the host memory of a save is about twice the largest group, not the model. The
/// files are those of the other overload, bit for bit. What `read_group` throws aborts the
/// save as any failure does (the previous `dir` is kept).
void save_hf_checkpoint(const std::string& dir, const ModelLayout& layout, const GroupReader& read_group,
                        const nlohmann::json& tokenizer_json, const std::string& chat_template, DType dtype,
                        const std::function<void(const std::string& tmp_dir)>& extra = {});

/// The file convert and merge leave in the model folders they write, listing every file they
/// wrote there ({"written_by": "roundpipe convert", "files": [...]}): what a later convert or
/// merge into the same folder may replace.
inline constexpr const char* kModelManifestFile = "roundpipe_manifest.json";

/// Refuses an output folder (the `output` of convert and merge, as their --help names it) that
/// writing a model folder would replace at a loss, before anything is read or written: the root
/// folder, $HOME, the working directory or a folder holding it; one that is an input (a folder
/// or file read from), lies inside one or holds one; a file; and an existing non-empty folder
/// holding anything its roundpipe_manifest.json does not list (the user's files, not an earlier
/// convert or merge). Throws std::invalid_argument("<out_dir>: output <why>"), one line. Empty
/// entries of `inputs` are skipped.
void check_model_output_folder(const std::string& out_dir, const std::vector<std::string>& inputs);

/// Before a convert or merge writes `out_dir`: what a killed earlier convert, merge or other
/// roundpipe writer left for that folder ("<out_dir>.tmp-<pid>", "<out_dir>.old-<pid>", each
/// with the marker naming a writer no longer alive, base/atomic_file.hpp) is removed, or put
/// back as `out_dir` when the kill came while the previous version was moved aside. Nothing
/// else is touched: names of that form without such a marker are left alone and reported.
/// Returns one line per leftover found; never throws for what it cannot remove.
std::vector<std::string> clean_model_folder_leftovers(const std::string& out_dir);

/// save_hf_checkpoint plus kModelManifestFile naming every file written, by `command`
/// ("convert", "merge"), so that the folder may later be replaced by another such write. First
/// throws std::runtime_error("<out_dir>: the model folder needs about X, the file system has Y
/// free; ...") when the weights in `dtype` and the tokenizer do not fit the free space of
/// out_dir's file system: nothing is written.
void save_model_folder(const std::string& out_dir, const ModelLayout& layout, const GroupReader& read_group,
                       const nlohmann::json& tokenizer_json, const std::string& chat_template, DType dtype,
                       const std::string& command);

/// The model of `gguf` written as a Hugging Face folder (save_model_folder) in `dtype` (default
/// fp32: dequantized GGUF values are exact in fp32), the values load_model(gguf) gives. Streamed:
/// each layout group is read from the file (ModelSource) when the writer reaches it, so the
/// host memory needed is about twice the largest group (the embedding or one decoder layer in
/// fp32), not the whole model. out_dir is checked first (check_model_output_folder).
void convert_gguf_to_hf(const std::string& gguf, const std::string& out_dir, DType dtype = DType::f32);

}  // namespace rp
