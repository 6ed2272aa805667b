// A model file opened for reading its tensors one at a time (GGUF file or Hugging Face folder).
//
// load_model (roundpipe/checkpoint.hpp) materialises every tensor as fp32: 4 bytes per
// parameter. A LoRA run keeps its frozen base in a storage form (bf16, f16, q8_0, q4_0, nf4, mxfp4, fp8;
// LoraConfig::base_format), so it opens the model as a ModelSource instead and converts one
// tensor at a time: the peak host memory of starting it is the storage form plus one tensor's
// fp32 copy. The files stay memory-mapped (the kernel's page cache holds their pages; each
// tensor's pages are dropped from the process's resident set once it is read), and a tensor
// whose file form already is the storage form is copied as it is:
//   - safetensors BF16 / F16 / F32 into bf16 / f16 / f32 storage: the stored elements;
//   - GGUF BF16 / F16 / F32 likewise, and GGUF Q8_0 / Q4_0 / MXFP4 into q8_0 / q4_0 / mxfp4
//     storage: the file's blocks, bit for bit (our q8_0 / q4_0 / mxfp4 are ggml's block
//     layouts, kernels/weight_format.hpp). LLaMA q_proj / k_proj rows are un-permuted as whole
//     rows of blocks (a row of K values is K/32 blocks; otherwise the tensor is converted);
//   - a Hugging Face GPT-OSS checkpoint's MXFP4 experts (`_blocks` / `_scales`) into mxfp4
//     storage: the codes and exponents of that expert's rows (mxfp4_from_hf), decoding to the
//     converted path's values bit for bit.
// Stacked experts (a GGUF's blk.N.ffn_*_exps, a GPT-OSS checkpoint's gate_up_proj / down_proj
// and their biases) are sliced expert by expert as they are read, never read whole.
// Any other pairing converts that tensor: its fp32 values (exactly load_model's) quantized with
// quantize_weights, as an eager load followed by quantization would store it.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/dtype.hpp"
#include "roundpipe/model.hpp"

namespace rp {

class ModelSource {
 public:
  /// Opens `path` as load_model does, with the same checks and one-line errors
  /// std::runtime_error("<file>: <what>") (every tensor of make_layout(config) present with the
  /// right shape, unknown tensors refused, unreadable dtypes / ggml types refused, a tied
  /// lm_head.weight equal to the embedding), but reads no tensor data beyond that comparison.
  /// Unlike load_model it does not require host memory for an fp32 copy of the model.
  static ModelSource open(const std::string& path);
  /// A source over the fp32 tensors of an already loaded model (they are moved in).
  static ModelSource from_loaded(LoadedModel m);

  ModelSource(ModelSource&&) noexcept;
  ModelSource& operator=(ModelSource&&) noexcept;
  ~ModelSource();

  const ModelConfig& config() const;
  /// The model without its tensors: config, tokenizer.json (or null), chat template, source.
  const LoadedModel& header() const;
  /// Shape (row-major, Hugging Face order) of tensor `name`; throws std::runtime_error
  /// ("<source>: tensor '<name>' ...") when make_layout(config()) has no such tensor.
  std::vector<int64_t> shape(const std::string& name) const;
  /// Tensor `name` as fp32, bit-identical to load_model(path).tensors[name].
  HostTensor read_f32(const std::string& name) const;
  /// Tensor `name` in storage form `f` into `dst` (weight_format_bytes(f, numel) bytes).
  /// Returns true when the file's elements or blocks were copied as they are, false when the
  /// tensor was converted (then dst equals quantize_weights(f, read_f32(name))). Throws
  /// std::invalid_argument when numel is not a multiple of f's block.
  bool read_as(const std::string& name, WeightFormat f, void* dst) const;
  /// The float form the file stores tensor `name` in: f32, f16 or bf16 (a safetensors
  /// F32/F16/BF16 tensor, a GGUF F32/F16/BF16 one); nullopt for a quantized tensor or one
  /// without a file form (from_loaded, a GPT-OSS checkpoint's expert slices). Throws as shape().
  std::optional<WeightFormat> float_format(const std::string& name) const;
  /// untie_embeddings (roundpipe/adapter.hpp) of the source: tie_word_embeddings becomes
  /// false and "lm_head.weight" reads the embedding. No-op for an untied model.
  void untie_embeddings();
  /// Every tensor read as fp32: what load_model returns.
  LoadedModel read_all() const;

  struct Impl;

 private:
  explicit ModelSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Fills the base groups (0 .. layout.num_layers()-1) of `layout` from `src`: a trainable group
/// as group.numel fp32 values in `trainable[g]`, a frozen one as its storage form
/// (group.storage_bytes bytes, each tensor at its byte_offset in its TensorSpec::format) in
/// `frozen[g]`; the other entry stays empty. Reads one tensor at a time; a tied model's
/// "lm_head.weight" (when the layout has one) reads the embedding. Both vectors are resized to
/// layout.groups.size(); adapter groups are left empty. Returns the number of tensors copied
/// as stored (no conversion). Throws what ModelSource::read_as throws, and
/// std::runtime_error("<source>: tensor '<name>' ...") for a tensor the source lacks or whose
/// element count differs from the layout's.
/// `frozen_later`: frozen groups stay empty too (read_frozen_group makes them when asked).
int64_t read_base_groups(const ModelSource& src, const ModelLayout& layout,
                         std::vector<std::vector<float>>& trainable,
                         std::vector<std::vector<uint8_t>>& frozen, bool frozen_later = false);

/// Base group g of `layout` that is not frozen (every group of a layout without LoRA) as fp32
/// into `out` (exactly its numel values), tensor by tensor: what read_base_groups puts in
/// trainable[g]; the peak memory beyond `out` is one tensor's fp32 copy. Throws
/// std::invalid_argument for a frozen or adapter group or an `out` of another size, and what
/// read_base_groups throws.
void read_model_group(const ModelSource& src, const ModelLayout& layout, int g, std::span<float> out);

/// Frozen base group g of `layout` (a group read_base_groups fills in storage form) from `src`
/// into `out` (exactly its storage_bytes bytes), tensor by tensor: what read_base_groups writes
/// into frozen[g]. Returns the tensors copied as stored. Throws std::invalid_argument for a
/// group that is not a frozen base group or an `out` of another size, and what read_base_groups
/// throws.
int64_t read_frozen_group(const ModelSource& src, const ModelLayout& layout, int g, std::span<std::byte> out);

/// A text naming `path`'s bytes as they are on disk now, "model <path>" then "; <file>: N bytes,
/// modified <UTC time>, status changed <UTC time>, inode I of device D" per file: each file's name, size,
/// modification and status-change times, device and inode (a folder's config.json, safetensors shards and
/// index, and GGUF files, sorted; its other files are left out, so a disk tier's cache kept in
/// the model's folder does not change it). What a frozen source's identity is made of, so a disk
/// tier's cache of it is rebuilt when a file changes, even one rewritten in place or copied over
/// with its modification time kept; a chmod or chown of a weights file also counts as a change.
std::string model_files_identity(const std::string& path);

}  // namespace rp
