// GGUF (llama.cpp's model file format, versions 2 and 3) reader.
//
// The header is read when the file is opened and the tensors when asked for, at their offsets
// (never through a memory mapping, so a file that shrinks or fails while being read gives an
// error, not SIGBUS). Everything is validated when it is opened (magic,
// version, counts, string/array lengths, tensor dims, types, offsets and sizes within the
// file), so a truncated or corrupt file throws std::runtime_error("<file>: <what>") from the
// constructor and never crashes later.
//
// Dimension order: GGUF stores ne[0] as the innermost (fastest varying) dimension, the
// reverse of row-major / Hugging Face order. GgufTensorInfo::shape() gives the row-major
// order, e.g. a linear layer's weight [out_features, in_features] has ne = {in, out}.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/input_file.hpp"
#include "model/config.hpp"

namespace rp {

/// ggml tensor types (values of enum ggml_type). Only those listed are dequantized.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,  ///< block_mxfp4 {u8 e; u8 qs[16]}: the layout of WeightFormat::mxfp4
};

/// "F32", "Q4_1", ... or "type<N>" for a number we do not know.
std::string ggml_type_name(uint32_t type);
/// Elements per block and bytes per block of `type`; false when the type is unknown.
bool ggml_type_block(uint32_t type, int64_t& block_elems, int64_t& block_bytes);
/// True when dequantize_ggml() handles `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q4_K, Q5_K, Q6_K, MXFP4).
bool ggml_can_dequantize(uint32_t type);
/// Dequantizes `n` elements (a multiple of the type's block size) from ggml's block layout in
/// `src` into fp32 `dst`. Throws std::invalid_argument for unsupported types or a bad `n`.
void dequantize_ggml(uint32_t type, const void* src, float* dst, int64_t n);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  ///< GGUF order: ne[0] innermost
  uint32_t type = 0;        ///< a GgmlType value
  uint64_t offset = 0;      ///< bytes, relative to GgufFile::data_offset()
  uint64_t nbytes = 0;      ///< bytes of tensor data
  int64_t numel() const;
  /// Row-major (HF) shape: ne reversed.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  /// Opens `path` and parses its header. Throws std::runtime_error("<path>: <what>") on any problem.
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  /// All metadata as {key: value}. Integers -> numbers, floats -> numbers, bool -> bool,
  /// strings -> strings (raw bytes; not re-validated as UTF-8), arrays -> arrays (nested too).
  const nlohmann::json& metadata() const { return meta_; }
  bool has(const std::string& key) const { return meta_.contains(key); }
  /// Metadata value; throws std::runtime_error("<path>: missing metadata key '<key>'").
  const nlohmann::json& get(const std::string& key) const;
  /// Integer / float / string metadata with type checks (errors name the file and key).
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// Tensor named `name`, or nullptr.
  const GgufTensorInfo* find(const std::string& name) const;
  uint64_t alignment() const { return alignment_; }      ///< general.alignment, default 32
  uint64_t data_offset() const { return data_offset_; }  ///< bytes from file start
  uint64_t file_size() const { return size_; }
  /// Bytes [at, at + n) of tensor `t`'s stored data into `dst`; tensor_bytes: all of them.
  /// Throw std::runtime_error naming the file and tensor when the file no longer holds them (it
  /// shrank since it was opened) or cannot be read; std::logic_error for a range outside `t`.
  void read_tensor_bytes(const GgufTensorInfo& t, uint64_t at, uint64_t n, void* dst) const;
  std::vector<uint8_t> tensor_bytes(const GgufTensorInfo& t) const;
  /// Elements [first, first + n) of `t` (whole blocks of its type) dequantized into out[0, n).
  void dequantize_blocks(const GgufTensorInfo& t, int64_t first, int64_t n, float* out) const;
  /// Tensor `t` as fp32 in row-major order (ne[0] fastest). Throws std::runtime_error naming
  /// the file and tensor for types that cannot be dequantized.
  std::vector<float> dequantize(const GgufTensorInfo& t) const;
  /// Throws dequantize()'s error when `t`'s type cannot be dequantized.
  void check_dequantizable(const GgufTensorInfo& t) const;

 private:
  std::string path_;
  PositionalFile file_;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  nlohmann::json meta_;
  std::vector<GgufTensorInfo> tensors_;
};

/// ModelConfig from the metadata of a "llama", "qwen2", "qwen3", "qwen3moe" or "gpt-oss" GGUF
/// (general.architecture; "qwen3moe" becomes architecture "qwen3_moe", "gpt-oss" "gpt_oss":
/// see gpt_oss_config_from_gguf; "qwen2" has qkv_bias, its q/k/v biases "blk.<i>.attn_<q|k|v>.bias").
/// Mistral GGUFs are written as "llama" by convert_hf_to_gguf.py and load as LLaMA (llama.cpp
/// keeps no sliding window for them either).
/// tie_word_embeddings is true when there is no output.weight. A llama3 rope_freqs.weight
/// tensor is recognised (factor taken from it, other llama3 parameters at Llama-3.1 defaults,
/// checked against the tensor). "qwen3moe" (llama.cpp's Qwen3-MoE): every decoder layer is
/// sparse (decoder_sparse_step 1, no mlp_only_layers); qwen3moe.expert_count,
/// expert_used_count (in [1, expert_count]) and expert_feed_forward_length (else, as llama.cpp,
/// feed_forward_length / expert_used_count) give num_experts, num_experts_per_tok and
/// moe_intermediate_size; feed_forward_length (intermediate_size) may be absent;
/// norm_topk_prob is true (llama.cpp always renormalises the top-k weights of this
/// architecture). rope.scaling.type "yarn" reads factor, original_context_length,
/// yarn_beta_fast / yarn_beta_slow (default 32 / 1) and yarn_attn_factor (transformers'
/// attention_factor, which convert_hf_to_gguf.py copies there; default: derived). Throws
/// std::runtime_error("<file>: <what>"), naming the metadata key.
ModelConfig config_from_gguf(const GgufFile& f);

/// The GPT-OSS part of config_from_gguf for a "gpt-oss" file (llama.cpp's LLM_ARCH_OPENAI_MOE,
/// written by convert_hf_to_gguf.py's GptOssModel), `p` = "gpt-oss.":
///   num_experts = expert_count, num_experts_per_tok = expert_used_count (in [1, E]),
///   moe_intermediate_size = intermediate_size = expert_feed_forward_length (else
///   feed_forward_length, which the converter writes with the same value), sliding_window =
///   attention.sliding_window (required, >= 1), layer_types alternating from a sliding layer
///   0 (llama.cpp's set_swa_pattern(2): even layers slide, as GptOssConfig's default),
///   attention_bias, attention_sinks and norm_topk_prob true (llama.cpp softmaxes the top-k
///   logits), qk_norm false, swiglu_alpha 1.702 / swiglu_limit 7 (llama.cpp's constants; no
///   key carries them), YaRN untruncated (GPT-OSS's RoPE: rope_scaling.truncate false),
///   rms_norm_eps default 1e-5, rope_theta default 150000, and the training-only
///   router_aux_loss_coef 0.001 / output_router_logits false of GptOssConfig. Throws
///   std::runtime_error("<file>: metadata '<key>': ...") on one line.
void gpt_oss_config_from_gguf(const GgufFile& f, ModelConfig& c);
/// The routed-expert counts every MoE architecture's GGUF writes under prefix `p` (e.g.
/// "qwen3moe.", "gpt-oss."): expert_count (1..2^20) into num_experts, expert_used_count
/// (1..expert_count) into num_experts_per_tok. Throws std::runtime_error naming the file and
/// the metadata key.
void gguf_expert_counts(const GgufFile& f, const std::string& p, ModelConfig& c);

/// Hugging Face name of a GGUF tensor ("blk.3.attn_q.weight" ->
/// "model.layers.3.self_attn.q_proj.weight", "blk.3.ffn_gate_inp.weight" ->
/// "model.layers.3.mlp.gate.weight"), or "" when the name is not a known one (the stacked
/// expert tensors below included). `arch` is the file's general.architecture; "gpt-oss" adds
/// GPT-OSS's names: attn_{q,k,v,output}.bias -> self_attn.{q,k,v,o}_proj.bias,
/// attn_sinks.weight -> self_attn.sinks, post_attention_norm.weight ->
/// post_attention_layernorm.weight, ffn_gate_inp.{weight,bias} -> mlp.router.{weight,bias}.
std::string gguf_to_hf_name(const std::string& gguf_name, const std::string& arch = "");
/// The GGUF tensor that holds Hugging Face tensor `hf` in a file of architecture `arch`
/// (gguf_to_hf_name's inverse; a per-expert tensor "model.layers.N.mlp.experts.<e>.up_proj.weight"
/// gives its stack "blk.N.ffn_up_exps.weight"), or "" when there is none. For error messages.
std::string hf_to_gguf_name(const std::string& hf, const std::string& arch = "");

/// Stacked expert tensors of a sparse layer: "blk.N.ffn_{gate,up,down}_exps.weight", row-major
/// [num_experts, F, H] (gate, up) or [num_experts, H, F] (down), i.e. GGUF ne = {H, F, E} /
/// {F, H, E} (llama.cpp's convert_hf_to_gguf.py stacks the Hugging Face per-expert matrices
/// along a new first axis); GPT-OSS's expert biases "blk.N.ffn_{gate,up,down}_exps.bias",
/// [num_experts, F] / [num_experts, H]. Returns true and sets `prefix` =
/// "model.layers.N.mlp.experts." and `suffix` = ".gate_proj.weight" (".up_proj.weight",
/// ".down_proj.weight", ".gate_proj.bias", ...), so slice e is the Hugging Face tensor
/// prefix + e + suffix; false for any other name. llama.cpp's fused stacks
/// "blk.N.ffn_gate_up_exps.{weight,bias}" ([E, 2F, H] / [E, 2F]: expert e's gate rows, then
/// its up rows) give suffix ".gate_up_proj.weight" / ".gate_up_proj.bias": slice e is then
/// gate_proj (rows [0, F)) and up_proj (rows [F, 2F)) of expert e.
bool gguf_expert_stack_name(const std::string& gguf_name, std::string& prefix, std::string& suffix);

/// Undoes llama.cpp's convert_hf_to_gguf.py permute() of LLaMA q_proj / k_proj rows, in place.
/// `w` is row-major [rows, cols] with rows = n_head * head_dim: GGUF row h*hd + 2*i + j holds
/// HF row h*hd + j*hd/2 + i (i < hd/2, j < 2). Throws std::invalid_argument when rows is not
/// a multiple of 2*n_head.
void unpermute_qk_rows(float* w, int64_t rows, int64_t cols, int64_t n_head);
/// The same row permutation on rows of `row_bytes` bytes each (rows of quantized blocks: a
/// row of a Q8_0 / Q4_0 matrix is a whole number of blocks when its length is a multiple of
/// 32). Same errors.
void unpermute_qk_row_bytes(uint8_t* w, int64_t rows, size_t row_bytes, int64_t n_head);

}  // namespace rp
