// Analytic per-layer cost model: FLOPs, bytes and memory of every compute layer of one
// micro-batch, turned into seconds with a roofline (max of FLOP time and byte time per op).
//
// Used before any measurement exists ("start from an analytic estimate (FLOPs
// and bytes per layer), not from parameter bytes alone") and by `roundpipe plan`, which
// must work from a bare config.json. Layer indices follow model/layout.hpp: 0 embedding,
// 1..L decoder layers, L+1 tail (final norm + LM head + cross-entropy).
//
// Formula sources: backward with recompute costs ~3x forward, and the RoundPipe paper
// (arXiv 2604.27085, Sec. "automatic partitioning"); FLOP counts are the usual 2*m*n*k per
// GEMM; causal attention counts half of the S^2 score matrix; the FlashAttention-2
// backward (Dao 2023) costs 2.5x its forward (5 instead of 2 S^2-sized matmuls).
// Scratch comes from model/layer_memory.hpp, the functions the layers carve their buffers
// with, so predicted and allocated scratch are the same numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/config.hpp"
#include "model/layout.hpp"

namespace rp {

/// What the partitioner and the simulator need to know about one compute layer.
/// Times are seconds for ONE micro-batch; bytes are device bytes.
struct LayerCost {
  double fwd = 0;                 ///< forward (as run in a forward stage)
  double bwd = 0;                 ///< backward including the recompute of its forward (backward stage)
  double tail = 0;                ///< cost inside the fused tail stage (forward + loss + backward)
  int64_t weight_bytes = 0;       ///< device copy of the parameters the layer reads
  int64_t grad_bytes = 0;         ///< device gradient accumulators of those parameters (trainable ones)
  int64_t act_bytes = 0;          ///< one [tokens, hidden] activation (its output / saved input)
  int64_t scratch_bytes = 0;      ///< scratch of a backward call (recompute + backward; stages take the max)
  int64_t scratch_fwd_bytes = 0;  ///< scratch of a forward call (forward stages take the max)
  int64_t io_bytes = 0;           ///< token ids (embedding) or targets (tail) per micro-batch
  /// Saved attention (decoders, DeviceModel::saved_attention): the attention output and its
  /// log-sum-exp per micro-batch, downloaded by forward stages and uploaded by backward ones.
  int64_t attn_o_bytes = 0, attn_lse_bytes = 0;
  /// Frozen parameter groups (ParamGroup::frozen, apply_frozen_groups): of weight_bytes, the
  /// dequantized copies of frozen groups, which are not uploaded as such; instead their
  /// storage form (staging_bytes) is uploaded into a staging buffer the device holds beside
  /// the weights while the stage runs (both less a storage prefix that is the compute copy
  /// itself, ParamGroup::direct_bytes). Uploaded per stage: weight_bytes -
  /// frozen_weight_bytes + staging_bytes.
  /// (Last, so that positional initialisers of the fields above stay valid.)
  int64_t frozen_weight_bytes = 0, staging_bytes = 0;
  /// Sparse (mixture-of-experts) decoders: one micro-batch's router statistics [2E] fp32
  /// (LayerArgs::moe_stats). A stage running any sparse decoder holds two such buffers per
  /// activation slot, the uploaded copy and the one its layers add to (actors/stage_task.cpp);
  /// their transfers (a few KiB per micro-batch) are not counted.
  int64_t router_stats_bytes = 0;
  /// FP8 linears (DeviceModel::fp8_flops > 0): the device cache of the layer's quantized
  /// weights a stage task holds while it runs (Layer::fp8_weight_bytes; actors/stage_task.cpp
  /// allocates one per layer): W's codes in a forward call, W's and W^T's in a backward or tail
  /// call. Stages sum them over their layers.
  int64_t fp8_fwd_bytes = 0, fp8_bwd_bytes = 0;
  /// Disk tier (scheduler/disk_tier.hpp, apply_disk_reads): the storage bytes of the layer's
  /// frozen groups that are not resident in host memory, read from the disk into the host's
  /// read ring before each stage that uploads them. 0 without a disk tier.
  int64_t disk_bytes = 0;
  bool operator==(const LayerCost&) const = default;
};

/// Architecture numbers of a decoder-only model as the cost model reads them: a view of a
/// ModelConfig, built by model_shape_from_config (the one place that copies the fields; a
/// config.json is read by the model's own parser, config_from_json). Tests and benchmarks
/// may fill one directly. A mixture-of-experts model when num_experts > 0. Which decoders are
/// sparse follows ModelConfig::is_moe_layer (Qwen3-MoE): decoder i
/// (0-based) has a sparse MLP block when num_experts > 0, i is not in mlp_only_layers and
/// (i + 1) % decoder_sparse_step == 0; the other decoders have a dense SwiGLU MLP of
/// intermediate_size.
struct ModelShape {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int64_t num_layers = 0;  ///< decoder layers L (compute layers are L + 2)
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool tie_word_embeddings = false;
  bool qk_norm = false;
  bool sandwich_norms = false;           ///< Gemma: two more norms per layer (before and after the MLP)
  bool qk_norm_whole = false;            ///< the q/k norms span a token's whole q and k (OLMo 2), not a head
  bool qkv_bias = false;                 ///< q/k/v projections carry biases (Qwen2, GPT-OSS)
  bool o_proj_bias = false;              ///< o_proj carries a bias (GPT-OSS)
  int64_t num_experts = 0;               ///< routed experts E of a sparse layer (0: a dense model)
  int64_t experts_per_token = 0;         ///< top-k
  int64_t moe_intermediate_size = 0;     ///< FFN width of one expert
  int64_t decoder_sparse_step = 1;       ///< every step-th decoder is sparse
  std::vector<int64_t> mlp_only_layers;  ///< decoders (0-based) with a dense MLP regardless
  /// Sliding-window attention: decoder i (0-based) attends to at most attention_windows[i]
  /// keys (its own position and the window - 1 before it); 0, or i past the end, is full
  /// causal attention. GPT-OSS alternates a 128-token window with full attention.
  std::vector<int64_t> attention_windows;
  /// The window of decoder i (0: full causal attention).
  int64_t attention_window(int64_t i) const {
    return i >= 0 && size_t(i) < attention_windows.size() ? attention_windows[size_t(i)] : 0;
  }
  /// Decoder i (0-based) has a sparse MLP block.
  bool is_moe_layer(int64_t i) const;
  /// Number of decoders with a sparse block.
  int64_t num_moe_layers() const;
  /// Throws std::invalid_argument("<where>: <field>: ...") when a size is not positive (the
  /// dense FFN only when some decoder is dense) or top-k exceeds the experts.
  void validate(const std::string& where) const;
};

/// Shape of a ModelConfig, its mixture-of-experts fields and sliding windows included.
ModelShape model_shape_from_config(const ModelConfig& c);
/// Shape from a Hugging Face config.json object: model_shape_from_config(config_from_json(j,
/// where)), so it reads every key (num_experts or num_local_experts, layer_types and
/// sliding_window, GPT-OSS's intermediate_size as the experts' width, ...) as a run does.
/// Errors: std::invalid_argument("<where>: key '<k>': ...") or validate()'s.
ModelShape model_shape_from_hf_json(const nlohmann::json& j, const std::string& where);

/// DeviceModel::grouped_gemm_efficiency with bucketed expert GEMMs (expert_padded; one batched
/// GEMM per bucket of equal padded row counts): 0.6, as bench_expert_gemm measured them on the
/// H200 at Qwen3-30B-A3B shapes with uniform routing (462-506 TFLOP/s against 790; skewed
/// routing gave 304-340, about 0.41). A training step's kernel profile agrees: the batched
/// kernels took under half the grouped kernels' time.
constexpr double kBucketedGemmEfficiency = 0.6;
/// DeviceModel::bucketed_call_seconds: the GPU's idle time per batched call of the bucketed
/// expert GEMMs (cuBLASLt's pointer-array batches, their algorithm kept per power-of-two class of
/// length and count). The sparse block waits for its routing offsets on the host before it can
/// size the buckets, so the host's set-up of each call leaves the GPU idle except where a batch
/// issued before it still runs; charged once per bucket (expected_bucket_count) of every grouped
/// linear. 15 us fits the runtime's default of 4 streams per grouped linear: Qwen3-30B-A3B LoRA
/// r=32 on attention, fp8 base, 8 x 4096, M=8, cap 10 GiB on an H200 ran 13,491 tokens/s
/// bucketed against 11,973 grouped in one command; the plan gives 13,460 (-0.2%) and 12,094
/// (+1.0%). One stream needed 25 us (the same shape on an H100 SXM: 11,070 bucketed against
/// 11,163 grouped, plan 11,411 and 11,558), and cublasGemmBatchedEx, which chose a kernel for
/// each new length, 80 us (the H200 ran 7,299 against 11,828). Fitted to one model: another
/// model's routing or another GPU's host may differ.
constexpr double kBucketedCallSeconds = 15e-6;

/// Device and precision assumptions of the estimate.
struct DeviceModel {
  double peak_flops = 790e12;  ///< achievable dense GEMM FLOP/s at the compute dtype
  /// FP8 linears (LayerOptions::fp8): the e4m3 GEMM FLOP/s of the dense decoder linears'
  /// forward, recompute and input gradient (their weight gradients stay at peak_flops). 0:
  /// every GEMM runs at peak_flops in the compute dtype.
  double fp8_flops = 0;
  /// With fp8_flops: the dense linears' weight gradients run as e4m3 GEMMs too
  /// (LayerOptions::fp8_weight_gradients), after the amax and transposed quantization of the
  /// input (k, v, up reuse the input codes of q, gate); the output gradient's transposed codes
  /// come from the pass that makes its row codes for the input gradient.
  bool fp8_weight_gradients = false;
  /// Sparse blocks lay their sorted rows out padded (LayerOptions::expert_padded): their
  /// [R, .] scratch holds padded_rows_bound(R) rows (kernels/moe_buckets.hpp). FLOPs unchanged.
  bool expert_padded = false;
  /// With expert_padded: host seconds each batched call of a grouped linear leaves the GPU
  /// idle, once per expected bucket (kBucketedCallSeconds; 0 on the CPU backend, whose grouped
  /// linears make no such calls).
  double bucketed_call_seconds = kBucketedCallSeconds;
  /// The FP8 quantization kernels' share of mem_bandwidth (amax and quantize passes over an
  /// activation or a gradient, bf16 in, codes out): 0.56, as measured on the H200
  /// (bench_fp8_ops_bench: 2.4 TB/s of a 4.25 TB/s copy at [8192, 2048], launch and tail
  /// effects included).
  double fp8_quant_efficiency = 0.56;
  double attention_efficiency = 0.7;  ///< fused attention FLOP/s as a fraction of peak_flops
  /// Grouped (per-expert) GEMMs of a sparse MLP block as a fraction of peak_flops: each expert
  /// multiplies only its routed rows (T * k / E on average), smaller and ragged tiles than a
  /// dense GEMM of T rows. Forward and input gradients: 0.33, as measured on the H200 at
  /// Qwen3-30B-A3B shapes (one cublasGemmGroupedBatchedEx call: 250-274 TFLOP/s against 790
  /// here and 699-740 for one dense GEMM over the same rows; docs/gpu.md). The experts' weight
  /// gradients (fp32 accumulators, per-expert GEMMs on side streams: 87-106 TFLOP/s): 0.12.
  /// Other shapes and GPUs differ; a measured profile replaces them layer by layer.
  double grouped_gemm_efficiency = 0.33;
  double grouped_wgrad_efficiency = 0.12;
  double mem_bandwidth = 4.3e12;  ///< device memory bytes/s (element-wise ops, GEMM operands)
  double pcie_bandwidth = 55e9;   ///< host<->device bytes/s per direction (0: transfers free)
  int64_t elem_bytes = 2;         ///< compute dtype: weights and activations on the device
  int64_t grad_elem_bytes = 4;    ///< gradient accumulator element
  int64_t scratch_elem_bytes =
      2;  ///< element size of layer scratch (the compute dtype, as Layer::scratch_bytes)
  int64_t mlp_chunk_tokens = 0;  ///< decoders' MLP chunk (LayerOptions::mlp_chunk_tokens; <= 0: default)
  bool saved_attention =
      false;  ///< decoders keep the forward's attention output (LayerOptions::save_attention)
  bool tail_recomputes = true;  ///< decoder layers in the tail stage run forward then
                                ///< backward-with-recompute (true for the current Layer API)
  /// LoRA (set from a layout by lora_device_model): the decoders' adapter rank (their [T, r]
  /// scratch), whether adapter dropout keeps a dropped-out input, and whether the decoders'
  /// base weights are frozen (their backward computes no weight gradient).
  int64_t lora_rank = 0;
  bool lora_dropout = false;
  bool frozen_base = false;
  /// Per-expert adapters of rank lora_rank on the sparse blocks' experts (LoraConfig::
  /// target_parameters): gate_up_proj (A [E, r, H], B [E, 2Fe, r]) and down_proj; their grouped
  /// GEMMs of small N or K and their [R, r] / [R, H] scratch (model/moe_block.hpp).
  bool lora_experts_gate_up = false, lora_experts_down = false;
};

/// Sets d's LoRA fields from m (m.lora and whether the first decoder's base group is frozen);
/// a layout without LoRA or frozen decoders clears them.
void lora_device_model(DeviceModel& d, const ModelLayout& m);

/// FLOPs / bytes / seconds of one layer for one micro-batch.
struct LayerEstimate {
  std::string name;                     ///< "embedding", "layer.<i>" (decoder i, 0-based), "tail"
  double fwd_flops = 0, fwd_bytes = 0;  ///< forward
  double bwd_flops = 0, bwd_bytes = 0;  ///< backward with recompute (tail: fused fwd+loss+bwd)
  LayerCost cost;
};

/// Analytic estimate of all L + 2 compute layers for micro-batches of `n_seq` sequences of
/// `seq_len` tokens. Per op: seconds = max(flops / rate, bytes / mem_bandwidth).
/// A sparse decoder (ModelShape::is_moe_layer) counts routed FLOPs: the router GEMM
/// ([T,H] x [H,E]) and the SwiGLU of experts_per_token experts per token, R = T * k rows in
/// grouped GEMMs at grouped_gemm_efficiency (weight gradients at grouped_wgrad_efficiency),
/// never the FLOPs of all E experts. Its bytes read the weights of every expert that receives
/// rows (min(E, R); routing assumed balanced, an imbalance is not modelled), and its
/// weight_bytes / grad_bytes hold all E experts, since a stage uploads every expert of its
/// layers. Scratch: decoder_scratch_bytes with the sparse block's DecoderDims, as the layer
/// carves it.
/// Throws std::invalid_argument for a non-positive shape or device number.
std::vector<LayerEstimate> estimate_layers(const ModelShape& m, int64_t n_seq, int64_t seq_len,
                                           const DeviceModel& d);
/// Just the LayerCost of each estimate.
std::vector<LayerCost> layer_costs(const std::vector<LayerEstimate>& e);

/// Replaces the weight and gradient bytes of every layer that reads a frozen group of `m`
/// (ParamGroup::frozen) by the layout's: weight_bytes = numel * dtype_size(compute) of all its
/// groups, grad_bytes = numel * grad_elem_bytes of its trainable groups only; of its frozen
/// ones, the part of the storage form uploaded straight into the weights
/// (ParamGroup::direct_bytes: a bf16 base on a bf16 device) counts as weights only, the rest
/// as staging_bytes (uploaded, held beside the weights), with frozen_weight_bytes = the
/// compute copy's bytes less that prefix. Layers without frozen groups keep the analytic
/// numbers. Throws std::invalid_argument when costs.size() != m.num_layers().
void apply_frozen_groups(std::vector<LayerCost>& costs, const ModelLayout& m, DType compute,
                         int64_t grad_elem_bytes = 4);

/// Number of parameters of layer `layer` (0 embedding, 1..L decoder, L+1 tail; the tail
/// counts the LM head also when it is tied, because it reads it). A sparse decoder counts
/// its router and all of its experts; with `active`, its router and experts_per_token
/// experts (the weights one token is multiplied by). Throws std::invalid_argument for a
/// layer out of range.
int64_t layer_parameters(const ModelShape& m, int layer, bool active = false);

/// Parameters of the model, tied embeddings counted once; `active` as in layer_parameters
/// (ModelConfig::num_parameters and num_active_parameters for the same model).
int64_t model_parameters(const ModelShape& m, bool active = false);

}  // namespace rp
