// Models: a dense decoder-only transformer (LLaMA / Qwen3) and how its parameters are
// grouped in host memory. Loading and saving: roundpipe/checkpoint.hpp.
//
// The unit the runtime moves, updates and protects is a parameter *group*: one contiguous
// fp32 buffer holding every tensor of one layer.
//   group 0          : "embed"  model.embed_tokens.weight [vocab, hidden]
//   group 1..L       : "layer.<i>" the tensors of decoder layer i-1 (HF names)
//   group L+1        : "head"   model.norm.weight [hidden] (+ lm_head.weight [vocab, hidden]
//                      when embeddings are not tied)
//   group L+2..2L+1  : "lora.<i>" with LoRA only: the adapters of decoder layer i (see
//                      ModelLayout::lora); the base groups 0..L+1 are then frozen
// With tied embeddings the tail (final norm + LM head) reads group 0 as its LM head.
// Compute layers: 0 embedding, 1..L decoders, L+1 tail.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "roundpipe/dtype.hpp"

namespace rp {

/// rope_scaling of HF config.json. type "default" means no scaling.
struct RopeScaling {
  std::string type = "default";  ///< default | linear | llama3 | yarn | longrope
  /// longrope: 0 when config.json has none (max_position_embeddings /
  /// original_max_position_embeddings then, as transformers derives it)
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  /// llama3, yarn, longrope (the pre-training context). longrope: config.json's top-level key
  /// wins over rope_scaling's (Phi3Config's default 4096 for model_type phi3), as in transformers
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  /// yarn, longrope: 0 = derive (yarn: 0.1*ln(factor)+1; longrope:
  /// sqrt(1 + ln(factor)/ln(original_max_position_embeddings))), as transformers does
  double attention_factor = 0.0;
  /// yarn: round the correction range to whole dimensions (transformers' "truncate", default
  /// true; GPT-OSS checkpoints ship false)
  bool truncate = true;
  /// longrope (LongRoPE, Ding et al. 2024, arXiv 2402.13753; Phi-3-mini-128k, Phi-3.5-mini,
  /// Phi-4-mini): rotary_dim()/2 divisors of the inverse frequencies each, short_factor for a
  /// forward pass whose largest position + 1 is at most original_max_position_embeddings,
  /// long_factor beyond
  std::vector<double> short_factor, long_factor;
};

/// A LLaMA / Mistral / Qwen2 / Qwen3 / Qwen3-MoE / GPT-OSS / OLMo 2 / Granite / Phi-3 decoder.
/// Field names follow HF config.json. Mistral is LLaMA's decoder with an optional sliding window
/// on every layer (layer_types all "sliding_attention" when config.json's sliding_window is
/// set); Qwen2 (and Qwen2.5, the same model_type) is LLaMA's decoder with biases on q/k/v
/// (qkv_bias); OLMo 2 moves the norms into the residual branches (post_norms) and normalizes the
/// whole q and k (qk_norm_whole); Granite scales embeddings, residual branches, attention and
/// logits; Phi-3 is LLaMA's decoder (with Mistral's window when set) whose checkpoints fuse
/// q/k/v into "self_attn.qkv_proj" and gate/up into "mlp.gate_up_proj": the layout keeps them
/// apart, the readers and writers of folders and adapters split and fuse them (formats/phi3_hf.hpp).
/// Gemma 2 and Gemma 3 (text) are LLaMA's decoder with Gemma's changes (gemma()): RMSNorms of
/// weight 1 + w, a norm before and after both the attention and the MLP, a GeGLU MLP, the
/// embeddings times sqrt(hidden_size), scores times query_pre_attn_scalar^-0.5, sliding and
/// global layers (layer_types), Gemma 2's logit soft-capping and, for Gemma 3, q/k norms per
/// head and its own RoPE base on the sliding layers (rope_local_theta).
struct ModelConfig {
  /// "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "olmo2", "granite", "phi3",
  /// "gemma2" or "gemma3_text" (model_type)
  std::string architecture = "llama";
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
  /// Phi-3 family (Phi-4-mini 0.75): RoPE rotates the first rotary_dim() features of each
  /// head only (frequencies over rotary_dim()), the rest pass through; 1 everywhere else.
  double partial_rotary_factor = 1.0;
  /// int(head_dim * partial_rotary_factor), as transformers' `dim`; head_dim when 1.
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool qk_norm = false;  ///< Qwen3: RMSNorm over head_dim on q and k before RoPE
  /// OLMo 2: q_norm / k_norm ("self_attn.{q,k}_norm.weight" [nq*D] / [nkv*D]) normalize the
  /// whole projected q and k of a token, not each head (with qk_norm)
  bool qk_norm_whole = false;
  /// OLMo 2: no pre-norms; each residual branch ends in an RMSNorm:
  ///   h = x + RMSNorm(o_proj(attn(x)); post_attention_layernorm),
  ///   y = h + RMSNorm(mlp(h); post_feedforward_layernorm)   (no input_layernorm)
  bool post_norms = false;
  // Granite ("granite"): embeddings times embedding_multiplier, each residual branch (attention
  // and MLP output) times residual_multiplier, attention scores times attention_multiplier
  // (instead of 1/sqrt(head_dim)), logits divided by logits_scaling. 1, 1, 0 (= 1/sqrt(head_dim)), 1
  // for every other family.
  double embedding_multiplier = 1.0, residual_multiplier = 1.0, attention_multiplier = 0.0,
         logits_scaling = 1.0;
  /// The attention's score scale: attention_multiplier, or query_pre_attn_scalar^-0.5 when
  /// that is set (Gemma), or 1/sqrt(head_dim).
  float attention_scale() const;
  /// Gemma ("gemma2", "gemma3_text"): every RMSNorm (the layers', q/k's, the final one)
  /// multiplies by 1 + weight (norm_weight_offset() 1); the decoder is
  ///   h = x + post_attention_layernorm(attn(input_layernorm(x))),
  ///   y = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))   (sandwich norms),
  /// mlp(h) = down(gelu_tanh(gate(h)) * up(h)) (hidden_activation gelu_pytorch_tanh), and the
  /// embeddings are multiplied by sqrt(hidden_size) rounded to the compute dtype.
  bool gemma() const { return architecture == "gemma2" || architecture == "gemma3_text"; }
  /// 1 for Gemma's RMSNorm (x * r * (1 + w)), 0 elsewhere (Ops::rmsnorm_fwd's w_offset).
  float norm_weight_offset() const { return gemma() ? 1.0f : 0.0f; }
  /// Gemma: the attention's scores times query_pre_attn_scalar^-0.5 (0: not set).
  double query_pre_attn_scalar = 0.0;
  /// Gemma 2's logit soft-capping (transformers' Gemma2Config; 0: none): every attention score
  /// s = q k^T * scale becomes attn_logit_softcapping * tanh(s / attn_logit_softcapping) before
  /// the mask and softmax, and the final logits z become final_logit_softcapping *
  /// tanh(z / final_logit_softcapping) before the loss and sampling. Gemma2Config's defaults
  /// are 50 and 30 (a null key: 0). Gemma 3 applies only the final one (its attention ignores
  /// attn_logit_softcapping, which must be null there); other families have neither.
  double attn_logit_softcapping = 0.0, final_logit_softcapping = 0.0;
  /// Gemma 3: RoPE base of the "sliding_attention" layers (rope_local_base_freq, or
  /// rope_parameters.sliding_attention.rope_theta; no scaling there); rope_theta and
  /// rope_scaling are the full-attention layers'. 0: every layer uses rope_theta.
  double rope_local_theta = 0.0;
  /// The multiplier of the embeddings: Granite's embedding_multiplier, Gemma's sqrt(hidden_size).
  double embedding_scale() const;
  /// q/k/v/o projections with biases ("self_attn.<q|k|v|o>_proj.bias"); GPT-OSS only
  bool attention_bias = false;
  /// q/k/v projections (not o) with biases ("self_attn.<q|k|v>_proj.bias"); Qwen2 only
  bool qkv_bias = false;
  /// q/k/v carry a bias (attention_bias or qkv_bias).
  bool has_qkv_bias() const { return attention_bias || qkv_bias; }
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;

  // Mixture of experts (Qwen3-MoE, "qwen3_moe"; Shazeer et al. 2017, Fedus et al. 2021).
  // Decoder layer i (0-based) has a sparse MLP block when num_experts > 0, i is not in
  // mlp_only_layers and (i + 1) % decoder_sparse_step == 0; otherwise a dense SwiGLU MLP of
  // intermediate_size. A sparse block: router logits = x W_gate^T (W_gate [num_experts,
  // hidden], "mlp.gate.weight"), p = softmax, the num_experts_per_tok largest p pick the
  // experts (weights p, renormalised to sum 1 when norm_topk_prob), each expert a SwiGLU
  // MLP of moe_intermediate_size ("mlp.experts.<e>.{gate,up,down}_proj.weight").
  int64_t num_experts = 0;  ///< 0: a dense model
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  /// Load-balancing loss (Switch Transformer, Fedus et al. 2021, eq. 4-6, as transformers'
  /// load_balancing_loss_func over all sparse layers of a forward pass) times this
  /// coefficient is added to the loss when output_router_logits is true (transformers adds it
  /// only then; Qwen3-MoE checkpoints ship with false).
  double router_aux_loss_coef = 0.0;
  bool output_router_logits = false;

  // GPT-OSS ("gpt_oss", HF GptOssForCausalLM). Every layer is sparse: the router has a bias
  // ("mlp.router.weight" [E, H], "mlp.router.bias" [E]), its top-k logits are softmaxed (the
  // renormalised top-k of p: norm_topk_prob = true), each expert is a biased clamped SwiGLU
  // MLP of moe_intermediate_size (= intermediate_size of config.json):
  //   gc = min(g, swiglu_limit), uc = clamp(u, -swiglu_limit, swiglu_limit),
  //   h = (uc + 1) * gc * sigmoid(swiglu_alpha * gc),
  // stored per expert as "mlp.experts.<e>.{gate,up,down}_proj.{weight,bias}" (HF's
  // interleaved gate_up_proj [E, H, 2F] / down_proj [E, F, H] are converted on load and
  // export). Each query head has a learned sink logit ("self_attn.sinks" [num_attention_heads])
  // in its softmax's denominator; layer i attends to the last sliding_window keys when
  // layer_types[i] is "sliding_attention", to all earlier keys when "full_attention"
  // (layer_types: GPT-OSS, and Mistral with a sliding_window, where every layer slides).
  bool attention_sinks = false;
  int64_t sliding_window = 0;            ///< keys a sliding layer sees (itself included); 0: none
  std::vector<std::string> layer_types;  ///< empty, or one "sliding_attention" / "full_attention" per layer
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  /// The GPT-OSS block (biased router and experts, clamped SwiGLU) instead of Qwen3-MoE's.
  bool gpt_oss() const { return architecture == "gpt_oss"; }
  /// Keys decoder layer i (0-based) attends to: sliding_window for a "sliding_attention"
  /// layer, 0 (all earlier keys) otherwise.
  int64_t attention_window(int64_t i) const;
  /// Decoder layer i (0-based) has a sparse MLP block.
  bool is_moe_layer(int64_t i) const;
  /// Number of decoder layers with a sparse block.
  int64_t num_moe_layers() const;
  /// The coefficient of the load-balancing loss in effect (0 unless output_router_logits).
  double aux_loss_coef() const { return output_router_logits ? router_aux_loss_coef : 0.0; }
  /// Parameters a token's forward pass multiplies by: num_parameters() with each sparse block
  /// counted as its router plus num_experts_per_tok experts (the whole count for dense models).
  int64_t num_active_parameters() const;

  /// Number of parameters (tied embeddings counted once).
  int64_t num_parameters() const;
  /// Throws std::invalid_argument with "<key>: <what was expected>" when inconsistent
  /// (heads not dividing, unsupported rope type, attention_bias, ...).
  void validate() const;
};

struct TensorSpec {
  std::string name;            ///< Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  ///< row-major, HF order ([out_features, in_features] for linears)
  int64_t offset = 0;          ///< in elements, from the start of its group
  /// Frozen groups only: the tensor's storage form in host memory and on the link, and where
  /// it starts (bytes) in the group's storage. Trainable groups: f32 and 0 (unused).
  WeightFormat format = WeightFormat::f32;
  int64_t byte_offset = 0;
  int64_t numel() const;
};

struct ParamGroup {
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;
  /// A frozen group is never updated: it has no fp32 master, no moments, no gradient (the
  /// layers receive a null gradient pointer for it) and one version forever. Its host copy is
  /// its storage (storage_bytes, each tensor in its TensorSpec::format), uploaded as is and
  /// dequantized on the device into the compute dtype at the same element offsets as a
  /// trainable group's copy.
  bool frozen = false;
  int64_t storage_bytes = 0;  ///< frozen groups: bytes of the storage form
  /// Index of tensor `name` in `tensors`, or -1.
  int find(const std::string& tensor_name) const;
  /// Frozen groups whose storage begins with the compute copy itself: the number of leading
  /// storage bytes that are uploaded straight into the device's weights, numel *
  /// dtype_size(compute), when every tensor either is stored in the element type `compute`
  /// (f32, bf16 or f16) at byte_offset = offset * dtype_size(compute) or lies after those
  /// bytes (byte_offset >= numel * dtype_size(compute); freeze_group puts a 16-bit base's f32
  /// norms there). Only the tensors after the prefix go through a staging buffer and are
  /// converted on the device. 0 for trainable groups and for every other storage form.
  int64_t direct_bytes(DType compute) const;
};

/// Low-rank adapters (Hu et al. 2021, "LoRA", sec. 4.1) on frozen linears:
/// y = W x + scaling * B (A dropout(x)), A [r, in], B [out, r]; scaling = alpha / r, or
/// alpha / sqrt(r) with use_rslora (Kalajdzievski 2023, "rsLoRA"). Initialised as PEFT does:
/// A Kaiming-uniform (a = sqrt(5), bound 1 / sqrt(in)), B zero. Names follow PEFT's
/// LoraConfig.
struct LoraConfig {
  /// The largest rank accepted from a spec, an adapter_config.json or --lora-r: far above
  /// any useful rank (a rank is at most a linear's width), and small enough that every
  /// adapter size and parameter count formed from it stays within int64_t.
  static constexpr int64_t kMaxRank = 65536;
  int64_t r = 8;  ///< 1..kMaxRank
  double alpha = 8;
  double dropout = 0;  ///< on the adapter's input only; 0 <= dropout < 1
  /// Linear module names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or
  /// the single entry "all-linear" (all seven; never the LM head, as PEFT).
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  /// Stacked expert weights of the sparse (mixture-of-experts) layers that carry per-expert
  /// adapters, by PEFT's target_parameters names: "mlp.experts.gate_up_proj" (the fused gate
  /// and up projections, one A [E, r, H] and B [E, 2*Fe, r]) and "mlp.experts.down_proj" (A
  /// [E, r, Fe], B [E, H, r]); "gate_up_proj" / "down_proj" are read the same. Empty: experts
  /// stay frozen and adapter-free (target_modules never reaches them). Needs dropout 0, as
  /// PEFT's ParamWrapper (model/lora.hpp).
  std::vector<std::string> target_parameters;
  bool use_rslora = false;
  /// Modules trained fully beside the adapters: "embed_tokens" (group 0), "lm_head" (the
  /// head group; with tied embeddings, the embedding).
  std::vector<std::string> modules_to_save;
  /// Storage form of the frozen base weights' linear matrices (1-D tensors stay f32).
  WeightFormat base_format = WeightFormat::bf16;
  uint64_t seed = 0;  ///< A's initialisation and the dropout masks
  double scaling() const;
};

/// Compute units of one iteration, in forward order: embedding, L decoder layers, tail.
enum class LayerKind : uint8_t { embedding, decoder, tail };

struct ModelLayout {
  ModelConfig config;
  std::vector<ParamGroup> groups;  ///< see the file comment
  /// With LoRA: the base groups 0..L+1 are frozen (but for modules_to_save) and group
  /// L+1+i ("lora.<i-1>") holds the adapters of decoder layer i (compute layer i), for
  /// i in 1..L: tensors "model.layers.<i-1>.<self_attn|mlp>.<module>.lora_A.weight" [r, in]
  /// and "...lora_B.weight" [out, r], in the base group's module order. groups_of(decoder
  /// layer i) is then {i, L+1+i}.
  std::optional<LoraConfig> lora;
  /// The adapter group of compute layer `layer`, or -1.
  int adapter_group(int layer) const;
  int num_layers() const { return int(config.num_hidden_layers) + 2; }  ///< embedding + decoders + tail
  LayerKind kind(int layer) const;
  /// Groups read by compute layer `layer` (0 = embedding, 1..L decoders, L+1 tail).
  /// The tail reads {L+1} and also {0} when embeddings are tied.
  std::vector<int> groups_of(int layer) const;
  /// Sorted union of groups_of(l) over `layers`: the groups a stage running them reads,
  /// and (backward and tail stages) the groups whose gradient it produces.
  std::vector<int> groups_of(const std::vector<int>& layers) const;
  /// The groups whose weights a stage running `layers` must upload: groups_of(layers),
  /// except that a backward stage (`backward_stage`: recompute + backward) leaves out the
  /// embedding's, whose backward scatters dy into gradient rows by token id and reads no
  /// weight (a forward or tail stage runs the embedding's forward, which does).
  std::vector<int> groups_uploaded(const std::vector<int>& layers, bool backward_stage) const;
  int64_t total_numel() const;
};

/// Builds the layout for `c` (the tensor order within a group is fixed). Throws
/// std::invalid_argument from c.validate().
ModelLayout make_layout(const ModelConfig& c);
/// The layout with LoRA adapters (see ModelLayout::lora). Throws std::invalid_argument naming
/// the field ("lora.r: expected >= 1, got 0", an unknown target module, ...).
ModelLayout make_layout(const ModelConfig& c, const LoraConfig& lora);

/// Marks group g frozen: 2-D tensors whose element count is a multiple of base's block are
/// stored in `base`, the others in f32 (a quantized base keeps a router in bf16; mxfp4 applies
/// to experts' matrices only, the other matrices are bf16); fills TensorSpec::format/byte_offset and
/// storage_bytes. With a plain 16-bit base (bf16, f16) the storage begins with the group's
/// compute copy in that type (each 16-bit tensor at offset * 2, the slots of the others left
/// zero) and the f32 tensors follow it, so a device computing in that type uploads the
/// prefix straight into its weights (ParamGroup::direct_bytes). Throws std::out_of_range for
/// a bad g.
void freeze_group(ModelLayout& m, int g, WeightFormat base);

/// Shape of one micro-batch: n_seq sequences of seq_len tokens (T = n_seq * seq_len tokens;
/// attention is causal within each sequence, positions restart at 0 in each).
struct MicroBatchShape {
  int64_t n_seq = 1;
  int64_t seq_len = 1;
  int64_t tokens() const { return n_seq * seq_len; }
};

}  // namespace rp
