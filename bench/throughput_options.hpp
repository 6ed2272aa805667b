// bench_throughput's command line: its options (the flags, defaults and help text are in
// throughput_options.cpp), the checks that refuse a bad one in one line and exit 2 before anything
// is built, the --preset shapes, and the model configuration the options describe.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "model/lora.hpp"
#include "roundpipe/model.hpp"

namespace bench::throughput {

/// The parsed options, under their flags' names (a preset's shape written over the flags'); the
/// defaults are the Qwen3-1.7B shape at seq 8192, 8 sequences per step.
struct Options {
  std::string backend = "cuda", trace, results, dtype = "bf16", plan_json;
  int workers = 1, layers = 28, steps = 6, warmup = 2;
  int64_t hidden = 2048, heads = 16, kv = 8, hd = 128, ffn = 6144, vocab = 151936, seq = 8192, seqs = 8,
          micro = 8;
  bool sync = false, qwen3 = true, no_prio = false, fp8 = false, fp8_wgrad = false, fp8_direct = false;
  bool bf16_wgrad = false;
  bool late_gradients = false;  ///< --late-gradients: SessionOptions::early_gradients off (A/B)
  bool force = false;           ///< --force: --trace and --profile-out may replace an existing file
  int64_t chunk_bytes = 32 << 20;
  int bulk_inflight = 1;
  int64_t mlp_chunk = 0;
  std::string preset, expert_gemm = "bucketed";
  double cap = 139;
  double pin_budget_gib = -1;  ///< < 0: the runtime's default
  // the disk tier of the frozen base (--frozen-tier) and the activation spill beside it
  std::string frozen_tier;
  double tier_ring_gib = 0, tier_resident_gib = 0, tier_host_budget_gib = 0;
  int tier_spill_layers = 0;
  std::string profile_out;
  double cap_above_plan = 0;
  bool no_save_attention = false;
  // mixture of experts (Qwen3-MoE)
  int64_t experts = 0, top_k = 2, expert_ffn = 0, sparse_step = 1;
  bool expert_gemm_given = false;  ///< --expert-gemm on the command line
  // LoRA on a frozen base
  int64_t lora_r = 0;
  double lora_alpha = 0;
  std::string lora_targets = "all-linear", base_format = "bf16";
  // set by --preset
  bool tied = true, gpt_oss = false;
  double rope_theta = 1e6;
};

/// A bad argument: one line "bench_throughput: <line>" on stderr, exit 2 (as the option checks; a
/// failed run exits 1).
[[noreturn]] void usage_error(const std::string& line);

/// Parses argv into `opt`, refuses options that only mean something beside another, checks that
/// the output files' folders can be written and applies --preset. nullopt when parsed; 0 after
/// --help (printed); a bad argument exits 2 through usage_error.
std::optional<int> parse(int argc, char** argv, Options& opt);

/// The model configuration of `opt` (a bad shape, or --expert-gemm on a model without a sparse
/// decoder, exits 2 through usage_error).
rp::ModelConfig model_config(const Options& opt);

/// The LoRA configuration of `opt`; nullopt for full fine-tuning (--lora-r 0).
std::optional<rp::LoraConfig> lora_config(const Options& opt);

}  // namespace bench::throughput
