// `roundpipe plan`: find the forward / tail / backward partition of a model for a GPU
// pool, print each stage's predicted time and memory, the predicted iteration time,
// tokens/s and bubble ratio, and optionally write the simulated timeline as a Chrome
// trace. Works from a bare config.json (no weights, no GPU). See docs/plan.md.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "scheduler/cost_model.hpp"
#include "scheduler/host_memory.hpp"
#include "scheduler/run_plan.hpp"

namespace CLI {
class App;
}

namespace rp {

/// Decoder layers `roundpipe plan` partitions at most (load_model_shape refuses more).
constexpr int64_t kMaxPlanLayers = 1024;

/// The most host memory `--host-gib` and `--host-budget-gib` take, GiB (1 PiB): past it the
/// sizes printed overflow ("inf TiB").
constexpr double kMaxHostGib = 1048576;

/// Default read-ring buffers of the disk tier (`--disk-ring`).
constexpr int kDefaultDiskRing = 2;

struct PlanCommandOptions {
  std::string model;                ///< folder with config.json, a config.json, or a .gguf
  int gpus = 8;                     ///< G
  int64_t seq_len = 8192;           ///< tokens per sequence
  int64_t micro_batches = 16;       ///< M
  int64_t sequences_per_micro = 1;  ///< sequences per micro-batch
  std::string profile;              ///< measured profile (scheduler/profile.hpp JSON), optional
  std::string memory_cap;           ///< per-GPU cap, e.g. "24GiB" (empty: unlimited)
  std::string trace;                ///< Chrome trace output path, optional
  bool force = false;               ///< --force: --trace may replace an existing file
  double peak_tflops = 790;         ///< achievable dense GEMM TFLOP/s
  /// FP8 linears (the spec's "fp8": true): the dense decoder linears' forward, recompute and
  /// input gradient at fp8_tflops (0: the --gpu preset's achievable FP8 rate, else
  /// kFp8SpeedupH200 x peak_tflops).
  bool fp8 = false;
  /// With fp8: the weight gradients in FP8 too ("fp8_weight_gradients"), the default in full
  /// fine-tuning; bf16_wgrad keeps them in bf16. A --frozen or --lora-r run has none.
  bool fp8_wgrad = false;
  bool bf16_wgrad = false;
  double fp8_tflops = 0;
  double hbm_gbps = 4300;        ///< device memory GB/s
  double pcie_gbps = 55;         ///< host<->device GB/s per direction (0: free)
  int iterations = 0;            ///< simulated iterations (0: enough for whole deal cycles)
  bool sync = false;             ///< synchronous optimizer (staleness 0) in the simulation
  bool max_seq = false;          ///< find the longest sequence whose plan fits memory_cap instead
  int64_t mlp_chunk_tokens = 0;  ///< decoders' MLP chunk (LayerOptions::mlp_chunk_tokens; 0: default)
  bool save_attention =
      true;  ///< decoders keep the forward's attention output (SessionOptions::save_attention)
  /// "": trainable weights. Else a storage format (f32, bf16, f16, q8_0, q4_0, nf4): every
  /// parameter group frozen in it (freeze_group): no gradient accumulators or downloads,
  /// storage-sized uploads, staging buffers. With lora_r > 0 the storage of LoRA's base.
  std::string frozen;
  /// LoRA (> 0): adapters of this rank on lora_targets (comma-separated module names or
  /// "all-linear"; a sparse decoder's experts get none, as make_layout(config, lora)), the
  /// base frozen in `frozen` (bf16 when empty). The adapters are trainable groups.
  int64_t lora_r = 0;
  std::string lora_targets = "all-linear";
  /// Mixture-of-experts models: DeviceModel::grouped_gemm_efficiency (0: by expert_gemm,
  /// DeviceModel's default for "grouped", kBucketedGemmEfficiency for "bucketed").
  double grouped_gemm_efficiency = 0;
  /// The spec's "expert_gemm": "bucketed" (its default) or "grouped" (DeviceModel::expert_padded).
  std::string expert_gemm = "bucketed";
  /// Data-parallel replicas (scheduler/replica_cost.hpp): `nodes` nodes of `gpus` GPUs each,
  /// a network of net_gbps Gbit/s per node and direction with net_latency_us per message;
  /// `accumulation` iterations per step on each node. nodes 1: no reduction is reported.
  int nodes = 1;
  double net_gbps = 100;
  double net_latency_us = 10;
  int64_t accumulation = 1;
  /// A device preset (scheduler/gpu_presets.hpp, e.g. "RTX 4090"): apply_gpu_preset fills
  /// peak_tflops, fp8_tflops, hbm_gbps, pcie_gbps and memory_cap from it unless given. "": none.
  std::string gpu;
  /// Host memory the run may use, GiB (0: this machine's, host_total_bytes); the plan
  /// prints the run's host need against it and, when over, what to change.
  double host_gib = 0;
  /// Disk tier (scheduler/disk_tier.hpp, cli/plan_disk.hpp): the host disk's read and write
  /// GB/s (0: no tier; write 0: the read rate), the host bytes the run may fill, GiB (0:
  /// kHostHeadroom x host_gib or this machine's memory), and the read ring's buffers.
  double disk_gbps = 0, disk_write_gbps = 0, host_budget_gib = 0;
  int disk_ring = kDefaultDiskRing;
  /// --disk-gbps was on the command line (as 0: the tier turned off; resolve_plan_flags).
  bool disk_gbps_given = false;
  /// --expert-gemm was on the command line (resolve_plan_flags): only a given "bucketed" is
  /// refused on a model without a sparse layer; the default plans every model.
  bool expert_gemm_given = false;
  /// --plan: predict this plan instead of the partitioner's: JSON as in a spec's "plan" key,
  /// given inline or as a file holding that object or a whole spec (its "plan" key). "": automatic.
  std::string plan;
};

/// Fills the fields of o that preset o.gpu sets (peak_tflops, fp8_tflops, hbm_gbps, pcie_gbps
/// from achievable_rates, memory_cap from the preset's memory size) except the flags named in
/// `given` ("--peak-tflops", "--fp8-tflops", "--hbm-gbps", "--pcie-gbps", "--memory-cap"), which the
/// command line set and which win. Does nothing when o.gpu is empty. Throws UsageError
/// ("--gpu: unknown GPU 'x'; known: RTX 3090, ...") for a name no preset has.
void apply_gpu_preset(PlanCommandOptions& o, const std::vector<std::string>& given);

/// The flags whose presence resolve_plan_flags looks at (every other flag only sets its field).
inline constexpr const char* kPlanFlagsResolved[] = {
    "--gpu",      "--peak-tflops",    "--fp8-tflops",   "--hbm-gbps",  "--pcie-gbps", "--memory-cap",
    "--net-gbps", "--net-latency-us", "--accumulation", "--disk-ring", "--disk-gbps", "--expert-gemm",
    "--plan"};

/// What `roundpipe plan` does with its parsed flags before planning, shared with the Python
/// module's plan(): `given` holds the flags of kPlanFlagsResolved that were given, with their
/// text ("--gpu", "H200"). Requires o.model, applies the --gpu preset (apply_gpu_preset; the
/// rates given win) and refuses a network flag without --nodes > 1 and --disk-ring without
/// --disk-gbps (noting o.disk_gbps_given and o.expert_gemm_given). Throws UsageError, one line.
void resolve_plan_flags(PlanCommandOptions& o, const std::vector<std::pair<std::string, std::string>>& given);

/// `plan --list-gpus`: the preset table, data sheet and planned rates side by side, with
/// the H200's measurements and the efficiency factors.
void print_gpu_presets(std::FILE* out);

/// The host-memory section of the plan: what the run needs (scheduler/host_memory.hpp), the
/// budget (o.host_gib or this machine's memory) and, when the need is over kHostHeadroom of
/// it, each change that lowers it with its need and, from `tokens_per_s` (nullopt: no plan
/// fits the GPUs' memory), its predicted speed. With a disk tier (`tier_budget_bytes`, its whole
/// host budget) the need is what the run would hold without the tier: the section says so and
/// that the tier keeps the run within the budget instead of warning.
void print_host_memory(std::FILE* out, const PlanCommandOptions& o, const ModelConfig& c,
                       const std::function<std::optional<double>(const PlanCommandOptions&)>& tokens_per_s,
                       std::optional<double> tier_budget_bytes = std::nullopt);

/// What o's run keeps in host memory (scheduler/host_memory.hpp): its LoRA, frozen form, batch
/// shape, GPUs and saved attention.
HostRun host_run_of(const PlanCommandOptions& o);

/// Registers --disk-gbps, --disk-write-gbps, --host-budget-gib and --disk-ring on `plan`.
void add_disk_options(CLI::App& plan, PlanCommandOptions& o);

/// Registers the `plan` subcommand on `app`; it runs from its callback, prints errors as
/// one line "roundpipe: error: ..." and then exits with code 1 (CLI::RuntimeError).
void add_plan_command(CLI::App& app);

/// The flags' values, before the model loads: a UsageError naming the first one out of range.
void check_plan_options(const PlanCommandOptions& o);
/// What numeric flag `flag` of `plan` expects ("an integer in 1..1024"): the words of its
/// one-line error both when its text is no number of its type (add_number_option) and when
/// its value is out of range (check_plan_options). A flag without them is a logic_error.
const std::string& plan_flag_expects(std::string_view flag);
/// --lora-r: 0 (no adapters) or a rank LoraConfig accepts, else a UsageError.
void check_lora_r(int64_t r);
/// --frozen's storage form (bf16 when not given); a UsageError for another name.
WeightFormat frozen_format(const PlanCommandOptions& o);

/// Plans and prints the report to `out`. Throws std::invalid_argument / std::runtime_error
/// with a one-line message naming the option, file or layer.
void run_plan(const PlanCommandOptions& o, std::FILE* out);

/// The longest sequence (a multiple of 1024 tokens, micro-batches of o.sequences_per_micro
/// sequences) for which some plan's stages fit o.memory_cap (required) on a GPU pool, by
/// bisection over the partitioner's memory model; 0 when not even 1024 tokens fit. Each
/// step plans with room to prefetch the next stage's weights when possible, else without
/// (automatic_partition).
/// With `without_waiting`, the longest whose predicted peak across stage switches
/// (scheduler/stage_peak.hpp, PeakEstimate::unbounded) fits too, so no stage waits for the one
/// before it to drain. That property is not monotonic in the length (the partitioner sizes
/// stages by working set, so a shorter sequence may get larger stages whose switches do not
/// fit), so it is found by a scan down from the working-set bound (64 coarse steps, then
/// 1024-token refinement), not by bisection.
int64_t longest_sequence(const PlanCommandOptions& o, int64_t memory_cap, bool without_waiting = false);

/// What `roundpipe plan` passes plan_run (scheduler/run_plan.hpp) for `layout` (the model
/// with o's --frozen / --lora-r applied) at sequences of `seq` tokens under `memory_cap` bytes
/// per GPU (0: none): the flags' device numbers, a bf16 GPU's pool granule, no host check.
RunPlanInputs plan_inputs(const ModelLayout& layout, const PlanCommandOptions& o, int64_t seq,
                          int64_t memory_cap);

/// The explicit plan of --plan `text` for a model of `num_layers` layers (embedding, decoders,
/// tail) on `gpus` GPUs: inline JSON (text starting with '{'), else a file holding the plan
/// object or a spec with a "plan" key. Throws std::invalid_argument with one line naming --plan
/// or the file (unreadable, not JSON, no "plan" key, or a plan plan_from_json refuses).
IterationPlan given_plan(const std::string& text, int num_layers, int gpus);

/// Byte size from text: a number with an optional unit B, KB/MB/GB/TB (powers of 1000),
/// KiB/MiB/GiB/TiB or K/M/G/T (powers of 1024), e.g. "24GiB", "1.5e10", "512 MiB".
/// Throws std::invalid_argument("<what>: ...").
int64_t parse_byte_size(const std::string& s, const std::string& what);

/// Shape of the model at `path`: a folder holding config.json, a config.json (dense or
/// Qwen3-MoE, through rp::load_config_file), or a .gguf file (metadata only). `description` receives a
/// one-line summary. Throws std::runtime_error naming the file.
ModelShape load_model_shape(const std::string& path, std::string* description = nullptr);

}  // namespace rp
