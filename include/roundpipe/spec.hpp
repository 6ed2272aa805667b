// Experiment specs: everything a training run needs, as a JSON file (`roundpipe train
// SPEC.json`; docs/spec.md lists every key) or as this struct (rp::Trainer).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "roundpipe/model.hpp"
#include "roundpipe/optimizer.hpp"

namespace rp {

/// The most workers (GPUs, or the CPU backend's virtual GPUs) one process drives; more machines
/// join as data-parallel replicas (mpirun). Bounds the spec's "workers" and `roundpipe plan --gpus`.
inline constexpr int kMaxWorkers = 1024;

/// One file of a data mixture: its sequences are drawn with probability weight / (the sum of
/// the weights).
struct DataSource {
  std::string path;
  double weight = 1;  ///< > 0
};

/// The data files of a spec: its mixture's, else {data}.
struct TrainSpec;
std::vector<std::string> data_paths(const TrainSpec& spec);
/// The evaluation files of a spec: eval_files, else {eval_data} when given, else none.
std::vector<std::string> eval_data_paths(const TrainSpec& spec);

/// One command-line setting of a spec key (`roundpipe train --set KEY=VALUE`, or a shorthand
/// such as `--lr 1e-4` for optimizer.lr).
struct SpecSetting {
  std::string key;         ///< the key as the spec nests it, dotted: "seq_len", "lora.r", "optimizer.lr"
  std::string value;       ///< JSON text (8, true, [1, 2], "x"), else taken as a plain string
  bool as_string = false;  ///< always a string (paths: --data 123 is the file "123")
  std::string origin;      ///< how errors name it: "--set lora.r=8", "--lr 1e-4"
};

struct TrainSpec {
  std::string source = "spec";  ///< the spec file (error messages name it)
  /// The command-line settings load_spec applied to the file: an error the run finds later in a key
  /// one of them wrote (a frozen_tier.path the cache cannot use) names the setting, not the file.
  std::vector<SpecSetting> settings;
  std::string model;  ///< .gguf file or HF directory
  /// The Hugging Face model id of `model` ("HuggingFaceTB/SmolLM2-135M"): what a LoRA run's
  /// adapter_config.json names as base_model_name_or_path and the model card's base_model.
  /// "": the id `model` names for itself (config.json _name_or_path, GGUF general.source.*),
  /// else the local path (roundpipe/adapter.hpp, base_model_ref).
  std::string base_model_id;
  std::string data;  ///< JSON lines / JSON array file, .txt file or directory of .txt files
  /// "data" given as a list: the files of a weighted mixture (docs/spec.md "Data mixtures"),
  /// `data` then names them all ("a.jsonl (weight 3) + b.parquet (weight 1)") for the log;
  /// empty for one file.
  std::vector<DataSource> data_mixture;
  std::string chat_template = "auto";  ///< auto (the model's own template through the Jinja interpreter;
                                       ///< chatml when it has none) | jinja (the model's, or an error) |
                                       ///< chatml | qwen3 | qwen3-no-think | smollm2 | llama3 (hand-written)
  int64_t seq_len = 128;               ///< tokens per sequence
  int64_t max_examples = 0;            ///< use only the first k supervised examples (0 = all)
  bool packing = false;  ///< several supervised examples per sequence (attention stays within each)
  /// A fresh run (no resume_from) into an output_dir that holds an earlier run's checkpoints
  /// (final/, checkpoint-<n>/) is refused unless this is set, so a finished run is never
  /// replaced by mistake; set, the new run writes over them.
  bool overwrite_output_dir = false;
  std::string eval_data;  ///< evaluation data file ("" = none; or eval_fraction)
  /// "eval_data" given as a list of files: every one evaluated whole (eval_data then names
  /// them all, "a.jsonl + b.parquet"); empty for one file.
  std::vector<std::string> eval_files;
  double eval_fraction = 0;        ///< hold out this fraction of `data`'s sequences for evaluation
  int64_t eval_every = 0;          ///< evaluate every k steps (and after the last); 0 = after the last only
  int64_t sequences_per_step = 4;  ///< global batch, in sequences
  int64_t micro_batches = 2;       ///< M per pass; sequences_per_step / (M * accumulation) per micro-batch
  int64_t accumulation = 1;        ///< forward_backward passes per optimizer step
  /// Optimizer steps. With `epochs` set (a spec gives one of the two) the run derives it from
  /// the data once loaded and this value is not used.
  int64_t steps = 20;
  /// "epochs": train this many passes over the training sequences instead of `steps` (a
  /// number > 0, fractional allowed: 1.5 is one and a half passes). The run's steps are
  /// ceil(epochs * training sequences / sequences_per_step), at least 1, known once the data
  /// is loaded; a decaying lr_schedule whose total_steps is 0 follows them. nullopt: `steps`.
  std::optional<double> epochs;
  AdamWOptions adam;             ///< "optimizer": {lr, betas, eps, weight_decay, amsgrad}
  double max_grad_norm = 0;      ///< "optimizer.max_grad_norm": clip the global norm (0 = off)
  LrSchedule lr_schedule;        ///< "lr_schedule": {kind, warmup_steps, min_lr}; lr from optimizer.lr
  std::string backend = "auto";  ///< auto | cpu | cuda
  int workers = 1;
  bool async = true;
  /// "async_compensation": "none" (default) or "predict" (needs async: weight prediction,
  /// SessionOptions::async_weight_prediction)
  std::string async_compensation = "none";
  nlohmann::json plan;  ///< null = automatic plan; else plan_from_json's object (roundpipe/plan.hpp)
  double device_memory_gib = 24;            ///< per-device pool cap
  double pcie_gbps = 0;                     ///< CPU backend: emulate a PCIe link (GB/s), 0 = off
  bool transfer_priorities = true;          ///< activation copies before parameter/gradient chunks
  int64_t transfer_chunk_bytes = 32 << 20;  ///< parameter/gradient copies cut into chunks of this (0 = none)
  /// "save_attention": keep each decoder's attention output for backward (true/false; absent:
  /// automatic, on when host memory allows; SessionOptions::save_attention)
  std::optional<bool> save_attention;
  int64_t mlp_chunk_tokens =
      0;  ///< decoders' MLP chunk in tokens (0: 8192; SessionOptions::mlp_chunk_tokens)
  /// "pin_budget_gib": host GiB the runtime may page-lock for fast copies (absent: three
  /// quarters of the host's memory; SessionOptions::pin_budget_bytes)
  std::optional<double> pin_budget_gib;
  /// "frozen_tier": {"path": file, "ring_gib": G, "resident_gib": R, "host_budget_gib": B,
  /// "spill_layers": N}: stream the frozen (LoRA base) weights from a cache file on a local disk
  /// through G GiB of host read buffers (absent: 0, two buffers), keeping up to R GiB of them in
  /// host memory (absent: 0, all stream), or what a whole-run host budget of B GiB leaves for
  /// them (absent: 0, no budget; not with R), and keep the saved inputs of N layers in a hidden
  /// file in the same folder instead of host memory (absent: 0; FrozenTierOptions::spill_layers);
  /// SessionOptions::frozen_tier. Absent: the base and the activations stay in host memory.
  struct FrozenTier {
    std::string path;
    double ring_gib = 0;
    double resident_gib = 0;
    double host_budget_gib = 0;
    int64_t spill_layers = 0;
  };
  std::optional<FrozenTier> frozen_tier;
  std::string output_dir = "runs/default";
  int64_t save_every = 0;  ///< also checkpoint every k steps (0 = final only)
  /// "save_total_limit": after each save of checkpoint-<n>, remove the oldest checkpoint-<k>
  /// folders (and their state/) this run series wrote beyond this many, never the best one
  /// (metric_for_best_model) nor the newest; only folders whose files the series recorded
  /// are removed. 0 = keep all.
  int64_t save_total_limit = 0;
  /// "metric_for_best_model": the evaluation metric that ranks checkpoints, "eval_loss" or
  /// "eval_perplexity" ("loss" and "perplexity" name the same). A checkpoint saved at a step
  /// with an evaluation is the best when its metric beats every earlier one's.
  std::string metric_for_best_model = "eval_loss";
  /// "greater_is_better": the direction of metric_for_best_model; false for the losses above
  /// (true is refused for them).
  bool greater_is_better = false;
  /// "load_best_model_at_end": final/ holds the best checkpoint (by metric_for_best_model)
  /// instead of the last step when the last step's evaluation is not better. Needs evaluation
  /// data and save_every a multiple of eval_every (every save has an evaluation).
  bool load_best_model_at_end = false;
  /// "early_stopping": {"patience": N, "threshold": t}: stop the run (saving final/ like a
  /// normal end) once N evaluations in a row did not improve metric_for_best_model on its best
  /// value so far by more than t. Needs evaluation data and eval_every > 0.
  struct EarlyStopping {
    int64_t patience = 1;  ///< evaluations without improvement that stop the run, >= 1
    double threshold = 0;  ///< the least improvement that counts, >= 0 (metric units)
  };
  std::optional<EarlyStopping> early_stopping;
  std::string save_dtype = "bf16";  ///< f32 | bf16 | f16
  bool trace = false;               ///< write output_dir/trace.json
  bool trace_messages = false;  ///< also record the actors' protocol messages as flow arrows (implies trace)
  bool tensorboard = true;
  /// "metrics_jsonl": also write every metrics.csv row as one JSON object per line, flushed as
  /// written, for a tracker to tail. nullopt: off (false); "": output_dir/metrics.jsonl (true);
  /// else that file (a path like the spec's others).
  std::optional<std::string> metrics_jsonl;
  /// A user message the run answers (greedy, at most 64 tokens, the training chat template)
  /// before training and after the last step, to show what fine-tuning changed ("" = none).
  std::string sample_prompt;  ///< write TensorBoard scalar event files into output_dir/tensorboard/
  uint64_t seed = 0;          ///< data order
  int64_t log_every = 1;
  std::string compute_dtype = "bf16";  ///< CUDA backend: bf16 | f16 (the CPU backend computes in f32)
  /// Accumulation of the dense linears' forward and input-gradient GEMMs: "f32" | "f16" (twice
  /// the tensor-core rate on GeForce GPUs; needs compute_dtype f16; docs/gpu.md).
  std::string gemm_accumulate = "f32";
  /// The dense decoder linears' forward, recompute and input-gradient GEMMs in FP8 e4m3 with
  /// fp32 accumulation (DeviceOptions::fp8; docs/gpu.md "FP8 linears"). Needs compute_dtype
  /// bf16; on the CUDA backend a GPU of compute capability 8.9+.
  bool fp8 = false;
  /// With fp8: the dense decoder linears' weight gradients in FP8 too
  /// (DeviceOptions::fp8_weight_gradients; docs/gpu.md "FP8 linears"). Absent: on with fp8 in
  /// full fine-tuning, else off (fp8_weight_gradients_on). true needs fp8 and full fine-tuning.
  std::optional<bool> fp8_weight_gradients;
  /// With fp8 over a LoRA base stored as fp8: run its linears from the stored codes
  /// (DeviceOptions::fp8_stored_direct; docs/gpu.md "FP8 linears"). Needs fp8. Experimental.
  bool fp8_stored_direct = false;
  /// Mixture-of-experts grouped linears: "bucketed" (the default: a padded sorted layout, one
  /// batched GEMM per bucket of experts with similar row counts; DeviceOptions::
  /// expert_gemm_bucketed) | "grouped" (cuBLAS's grouped GEMM). Same results; no effect on a
  /// dense model.
  std::string expert_gemm = "bucketed";
  /// fp16 dynamic loss scaling ("loss_scaling": true/false or {init_scale, growth_factor,
  /// backoff_factor, growth_interval}); default: on iff compute_dtype is f16.
  std::optional<LossScalerOptions> loss_scaling;
  std::string resume_from;  ///< checkpoint folder to resume from ("" = a fresh run)
  /// Watchdog: log what the run waits for after this many seconds without progress (0 = off).
  double watchdog_s = 60;
  /// After a stop request, wait at most this many seconds for the steps in flight; steps still
  /// unfinished then are abandoned (never saved).
  double stop_timeout_s = 60;
  /// A step whose loss or gradient norm is inf/NaN: "stop" ends the run with an error (no
  /// checkpoint of non-finite weights is written), "skip" skips the step (weights and moments
  /// untouched) and counts it. With loss scaling, overflowing steps are always skipped.
  std::string nonfinite = "stop";
  int64_t max_skipped_steps = 20;  ///< this many skipped steps in a row stop the run
  /// "lora": train low-rank adapters (and modules_to_save) on the frozen base weights instead of
  /// every weight; {r, alpha, dropout, target_modules, use_rslora, modules_to_save, seed,
  /// base_format} (LoraConfig; seed defaults to the spec's "seed"). nullopt: full fine-tuning.
  std::optional<LoraConfig> lora;
  /// LoRA: the frozen base's storage form follows the base model instead of
  /// lora->base_format: its weight matrices' dtype when they all are f32, f16 or bf16, else
  /// bf16. A spec file sets it when "lora.base_format" is absent (and for an "adapter" without
  /// "lora"); a spec built in code keeps lora->base_format unless it sets this.
  bool lora_base_format_from_model = false;
  /// "adapter": a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) whose
  /// adapters the run continues to train ("" = fresh adapters). Implies LoRA: without "lora"
  /// the settings come from its adapter_config.json.
  std::string adapter;
  /// "merge_adapters": with LoRA, also write final-merged/: the adapters folded into the base
  /// weights, a plain Hugging Face folder (final/ holds the adapter folder).
  bool merge_adapters = false;
  /// Data-parallel replicas over MPI (README "Several machines"): "auto" joins the MPI job when
  /// the process was started by mpirun / mpiexec (roundpipe/replicas.hpp launched_by_mpi) and
  /// runs alone otherwise, "on" always initialises MPI (a single process becomes a job of
  /// one), "off" never does (each process trains alone). With N replicas each runs
  /// accumulation / N of every step's passes (accumulation must be a multiple of N), so
  /// sequences_per_step stays the global batch and results equal one process's.
  std::string mpi = "auto";
  /// Replicas: a peer that sends nothing (not even its heartbeat) for this many seconds fails
  /// the run on every other replica with one line naming it.
  double replica_timeout_s = 60;
};

/// Parses a spec object. Unknown keys, wrong types and inconsistent values throw
/// std::invalid_argument with one line "<where>: key '<key>': expected <what>, got <value>".
TrainSpec spec_from_json(const nlohmann::json& j, const std::string& where);
/// Checks a spec built in code with the rules spec_from_json applies (ranges, products of
/// counts, names); Trainer::run calls it. Throws std::invalid_argument naming s.source and
/// the key.
void validate_spec(const TrainSpec& s);
/// Whether the run's dense linears compute their weight gradients in FP8: the spec's
/// fp8_weight_gradients when given, else fp8 in full fine-tuning (no "lora", no "adapter").
bool fp8_weight_gradients_on(const TrainSpec& s);
/// Reads `path` (JSON) and parses it; syntax errors name the file, line, column and the
/// parser's reason ("spec.json:3:12: invalid JSON: syntax error while parsing object - ...").
TrainSpec load_spec(const std::string& path);

/// "KEY=VALUE" -> SpecSetting (origin "--set KEY=VALUE", a long one shortened as errors quote values:
/// rp::excerpt). Throws std::invalid_argument "--set X: expected KEY=VALUE ..." without an '=' or with
/// an empty key, "--set X: key 'K' has an empty part ..." for ".steps", "steps." or "lora..r".
SpecSetting parse_set_option(const std::string& text);
/// Writes each setting into `spec` in order (a later one wins): "a.b" sets key b of the
/// object a, creating a when absent. Throws std::invalid_argument "<origin>: ..." for an empty
/// key part (parse_set_option's line), a path through a value that is not an object, and in a
/// JSON value a number beyond a double's range or a key given twice ("<origin>: key 'a.b.c'
/// given twice", the key path inside the value).
void apply_spec_settings(nlohmann::json& spec, const std::vector<SpecSetting>& settings);
/// load_spec with `settings` applied to the file's JSON before it is parsed, so they are
/// checked exactly like the file's keys; an error caused by a setting names it instead of the
/// file: "--set lora.r=0: key 'lora.r': expected an integer in 1..65536, got 0".
TrainSpec load_spec(const std::string& path, const std::vector<SpecSetting>& settings);
/// The same for a spec's JSON held in memory (`where` names it in errors, as spec_from_json's):
/// `settings` written into `j` before it is parsed, an error they cause naming the setting.
TrainSpec spec_from_json(nlohmann::json j, const std::string& where,
                         const std::vector<SpecSetting>& settings);

}  // namespace rp
