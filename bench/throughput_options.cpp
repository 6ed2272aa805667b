// bench_throughput's options: CLI11 registration, the one-line refusals of bad arguments, the
// --preset shapes and the model configuration (throughput_options.hpp).
#include "bench/throughput_options.hpp"

#include "base/output_folder.hpp"
#include "cli/command.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kernels/weight_format.hpp"

namespace bench::throughput {

void usage_error(const std::string& line) {
  std::string one = line;
  std::replace(one.begin(), one.end(), '\n', ' ');
  std::fprintf(stderr, "bench_throughput: %s\n", one.c_str());
  std::exit(2);
}

namespace {

/// An integer flag in [lo, hi]: a value of another kind ("--seq abc") or out of the range is one
/// line in the same words ("--seq: expected an integer >= 2, got abc"); `note` (" (0: none)")
/// follows the help and the range's words; --help shows the default.
template <typename Int>
CLI::Option* integer(CLI::App& app, const std::string& flag, Int& v, const std::string& help,
                     std::type_identity_t<Int> lo,
                     std::type_identity_t<Int> hi = std::numeric_limits<Int>::max(),
                     const std::string& note = "") {
  return rp::add_number_option(app, flag, v, help + note, rp::integer_range_text(lo, hi, note))
      ->check(rp::integer_check(lo, hi, note))
      ->capture_default_str();
}

/// A real flag in [lo, hi] (a decimal number: NaN, infinities and hexadecimal refused): a value of
/// another kind or out of the range is one line "<flag>: expected <what>, got <text>".
CLI::Option* real(CLI::App& app, const std::string& flag, double& v, const std::string& help, double lo,
                  double hi, const std::string& what) {
  CLI::Validator range(
      [lo, hi, what](std::string& text) -> std::string {
        double x = 0;
        const bool ok = rp::whole_number(text, x) && x >= lo && x <= hi;
        return ok ? std::string() : fmt::format("expected {}, got {}", what, text);
      },
      hi == std::numeric_limits<double>::max() ? "FLOAT > 0" : fmt::format("FLOAT in [{} - {}]", lo, hi));
  return rp::add_number_option(app, flag, v, help, what)->check(range);
}

/// The words of a GiB flag's range, `zero_means` (e.g. " (0: none)") after it.
std::string gib_range(const std::string& zero_means) {
  return "a number of GiB from 0 to 1048576" + zero_means;
}

/// A GiB flag: from 0 to 1048576 (1 PiB), `zero_means` after its help and in its refusal.
CLI::Option* gib(CLI::App& app, const std::string& flag, double& v, const std::string& help,
                 const std::string& zero_means) {
  return real(app, flag, v, help + zero_means, 0, double(1 << 20), gib_range(zero_means))
      ->capture_default_str();
}

/// A shape flag that a --preset writes over (`which`: "a --preset other than qwen3-1.7b"): its
/// help says so.
void preset_sets(CLI::Option* o, const std::string& which) {
  o->description(o->get_description() + "; " + which + " sets it, over this flag");
}

/// An output file of the bench, checked before the run (one line and exit 2 instead of an error
/// after every step was measured): its folder exists and can be written; what is already at the
/// path is a regular file (never a folder, link, device or pipe, which the write would replace),
/// and one that the bench would replace (`replaces`: --trace, --profile-out; --results appends)
/// only with --force.
void check_output_file(const std::string& option, const std::string& path, bool replaces, bool force) {
  if (path.empty()) return;
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
    usage_error(fmt::format("{} {}: expected a file in a folder that exists and can be written ({})", option,
                            path, dir.string()));
  // what is at the path: rp::output_file_problem, the rule every writer of an output file shares
  if (const std::string why = rp::output_file_problem(path, !replaces || force); !why.empty())
    usage_error(fmt::format("{} {}: {}", option, path, why));
}

/// An option that only means something beside another: one line instead of being ignored.
void needs(bool given, bool with, const char* what, const char* needed) {
  if (given && !with) usage_error(fmt::format("{} needs {}", what, needed));
}

// The options in the order --help lists them: the shape and the steps, ...
void add_shape_options(CLI::App& app, Options& opt) {
  const std::string preset = "a --preset other than qwen3-1.7b";
  app.add_option("--backend", opt.backend,
                 "compute backend: cuda, cpu (f32 on virtual devices, for tests) or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  integer(app, "--workers", opt.workers, "workers: GPUs the layers are pipelined over", 1, 1024);
  integer(app, "--layers", opt.layers, "decoder layers (a --preset sets it unless given)", 1, 1024);
  preset_sets(integer(app, "--hidden", opt.hidden, "hidden size (model width)", 1), preset);
  preset_sets(integer(app, "--heads", opt.heads, "attention (query) heads", 1), preset);
  preset_sets(
      integer(app, "--kv-heads", opt.kv, "key/value heads (grouped-query attention; divides --heads)", 1),
      preset);
  preset_sets(integer(app, "--head-dim", opt.hd, "width of one attention head (even, for RoPE)", 1), preset);
  preset_sets(integer(app, "--ffn", opt.ffn, "MLP intermediate size of a dense decoder", 0,
                      std::numeric_limits<int64_t>::max(), " (0 only with every decoder sparse)"),
              preset);
  preset_sets(integer(app, "--vocab", opt.vocab, "vocabulary size, tokens", 1), preset);
  // a sequence of one token has no target to predict (the spec refuses seq_len 1 too)
  integer(app, "--seq", opt.seq, "tokens per sequence", 2);
  integer(app, "--seqs", opt.seqs, "sequences per step (a multiple of --micro)", 1);
  integer(app, "--micro", opt.micro, "micro-batches per step", 1);
  integer(app, "--steps", opt.steps, "measured steps", 1, 1000000);
  integer(app, "--warmup", opt.warmup,
          "unmeasured first steps (at least 1: a step's time is from the one before)", 1, 1000000);
  app.add_flag("--sync", opt.sync,
               "synchronous optimizer (staleness 0): each step runs on the weights the step before "
               "updated (default: asynchronous, staleness 1)");
}

// ... the precision, the cap and the outputs, ...
void add_precision_options(CLI::App& app, Options& opt) {
  app.add_flag("--fp8", opt.fp8,
               "dense decoder linears in FP8 e4m3 (forward, recompute, input gradient; in full fine-tuning "
               "the weight gradients too unless --bf16-wgrad)");
  app.add_option("--expert-gemm", opt.expert_gemm,
                 "MoE grouped linears: bucketed (padded layout, the default) or grouped")
      ->capture_default_str()
      ->check(CLI::IsMember({"grouped", "bucketed"}));
  app.add_flag("--fp8-wgrad", opt.fp8_wgrad,
               "with --fp8: their weight gradients in FP8 too (the default with --fp8; a LoRA run has none)");
  app.add_flag("--bf16-wgrad", opt.bf16_wgrad, "with --fp8: keep the weight gradients in bf16");
  app.add_flag("--fp8-stored-direct", opt.fp8_direct,
               "with --fp8 and --base-format fp8: run the base's linears from its codes (experimental)");
  real(app, "--cap-gib", opt.cap, "device memory cap per worker, GiB", 0.001, double(1 << 20),
       "a number of GiB from 0.001 to 1048576")
      ->capture_default_str();
  app.add_option("--trace", opt.trace,
                 "write the run's timeline here as Chrome trace JSON (an existing file needs --force)");
  app.add_option("--results", opt.results, "append a markdown row here");
  app.add_flag("--force", opt.force, "with --trace / --profile-out: replace an existing file");
  app.add_option("--plan", opt.plan_json, "explicit plan (JSON as in a spec's \"plan\" key)");
  app.add_option("--dtype", opt.dtype, "storage dtype on the GPU: bf16 or f16")
      ->check(CLI::IsMember({"bf16", "f16"}))
      ->capture_default_str();
}

// ... the transfers and the disk tier, ...
void add_transfer_options(CLI::App& app, Options& opt) {
  integer(app, "--bulk-inflight", opt.bulk_inflight,
          "parameter/gradient chunks in flight at once (priorities on)", 1, 1024);
  app.add_flag("--no-priorities", opt.no_prio,
               "transfers first come, first served (no cross-stream priority)");
  app.add_flag("--late-gradients", opt.late_gradients,
               "a stage's gradients drain once it finished (default: each layer's as its last backward ran)");
  integer(app, "--chunk-bytes", opt.chunk_bytes,
          "cut parameter/gradient copies into chunks of this many bytes", 0, int64_t(1) << 40,
          " (0: whole copies)");
  integer(app, "--mlp-chunk", opt.mlp_chunk, "decoders' MLP chunk, tokens", 0, int64_t(1) << 30,
          " (0: default)");
  real(app, "--pin-budget-gib", opt.pin_budget_gib,
       "host GiB the runtime may page-lock (default: three quarters of the host's memory)", 0,
       double(1 << 20), gib_range(""));
  app.add_option("--frozen-tier", opt.frozen_tier,
                 "stream the frozen (LoRA base) weights from this cache file (built on the first run)");
  gib(app, "--tier-ring-gib", opt.tier_ring_gib, "host GiB of the tier's read buffers", " (0: two buffers)");
  gib(app, "--tier-resident-gib", opt.tier_resident_gib,
      "host GiB of the frozen base kept resident, decoders first", " (0: all stream)");
  gib(app, "--tier-host-budget-gib", opt.tier_host_budget_gib,
      "the whole run's host GiB: the runtime decides what stays resident", " (0: no budget)");
  integer(app, "--tier-spill-layers", opt.tier_spill_layers,
          "keep the saved inputs of this many layers in a hidden file beside the tier's cache instead of "
          "host memory",
          0, 1 << 20, " (0: none)");
}

// ... the saved attention, the cap above the plan and the profile, ...
void add_run_options(CLI::App& app, Options& opt) {
  app.add_flag("--no-save-attention", opt.no_save_attention,
               "recompute each decoder's attention in backward instead of keeping the forward's output");
  real(app, "--cap-above-plan", opt.cap_above_plan,
       "run the plan chosen at --cap-gib with the cap this fraction above its predicted working "
       "set (e.g. 0.02; 0: off)",
       0, 100, "a fraction from 0 to 100")
      ->capture_default_str();
  app.add_option("--profile-out", opt.profile_out,
                 "write the measured per-layer profile (JSON) here (an existing file needs --force)");
}

// ... then the model: its preset, experts and LoRA.
void add_model_options(CLI::App& app, Options& opt) {
  const std::string moe = "a mixture-of-experts --preset";
  app.add_option(
         "--preset", opt.preset,
         "model shape: qwen3-1.7b (default flags), qwen3-4b, llama3.1-8b, llama3.1-70b, qwen3-30b-a3b, "
         "qwen3-235b-a22b or gpt-oss-20b (a given --layers overrides the preset's depth)")
      ->check(CLI::IsMember({"qwen3-1.7b", "qwen3-4b", "llama3.1-8b", "llama3.1-70b", "qwen3-30b-a3b",
                             "qwen3-235b-a22b", "gpt-oss-20b"}));
  preset_sets(integer(app, "--experts", opt.experts,
                      "mixture of experts (Qwen3-MoE): routed experts per sparse layer", 0, int64_t(1) << 20,
                      " (0: dense)"),
              moe);
  preset_sets(integer(app, "--experts-per-tok", opt.top_k, "experts per token (top-k)", 1), moe);
  preset_sets(integer(app, "--expert-ffn", opt.expert_ffn, "FFN width of one expert (moe_intermediate_size)",
                      0, int64_t(1) << 30, " (0: --ffn)"),
              moe);
  preset_sets(integer(app, "--sparse-step", opt.sparse_step,
                      "every step-th decoder is sparse (decoder_sparse_step)", 1),
              moe);
  integer(app, "--lora-r", opt.lora_r, "LoRA rank on frozen base weights", 0, 65536,
          " (0: full fine-tuning)");
  real(app, "--lora-alpha", opt.lora_alpha, "LoRA alpha (default: 2 x rank)",
       std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::max(), "a finite value > 0");
  app.add_option(
         "--lora-targets", opt.lora_targets,
         "comma-separated modules or all-linear; \"experts\" (or experts.gate_up_proj, experts.down_proj) "
         "adds per-expert adapters to the sparse layers")
      ->capture_default_str();
  app.add_option("--base-format", opt.base_format,
                 "storage of the frozen base weights (LoRA): f32, bf16, f16, q8_0, q4_0, nf4, mxfp4 or fp8")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0", "q4_0", "nf4", "mxfp4", "fp8"}))
      ->capture_default_str();
}

/// The batch, the options that only mean something beside another and the output files' folders:
/// one line and exit 2 each.
void check_options(const CLI::App& app, const Options& opt) {
  // every micro-batch holds the same whole number of sequences
  if (opt.micro < 1 || opt.seqs < opt.micro || opt.seqs % opt.micro != 0)
    usage_error(
        fmt::format("--seqs {} --micro {}: expected --micro >= 1 and --seqs a multiple of --micro (each "
                    "of the --micro micro-batches holds --seqs / --micro sequences, at least one)",
                    opt.seqs, opt.micro));
  const bool tier = !opt.frozen_tier.empty();
  needs(app.count("--tier-ring-gib") > 0, tier, "--tier-ring-gib", "--frozen-tier PATH");
  needs(app.count("--tier-resident-gib") > 0, tier, "--tier-resident-gib", "--frozen-tier PATH");
  needs(app.count("--tier-host-budget-gib") > 0, tier, "--tier-host-budget-gib", "--frozen-tier PATH");
  needs(app.count("--frozen-tier") > 0, tier, "--frozen-tier", "a non-empty path");
  needs(app.count("--tier-spill-layers") > 0, tier, "--tier-spill-layers", "--frozen-tier PATH");
  needs(tier && opt.tier_spill_layers == 0, opt.lora_r > 0, "--frozen-tier",
        "--lora-r R (it streams a LoRA base) or --tier-spill-layers N");
  needs(opt.fp8_direct, opt.fp8, "--fp8-stored-direct", "--fp8");
  needs(opt.fp8_wgrad, opt.fp8, "--fp8-wgrad", "--fp8");
  needs(opt.bf16_wgrad, opt.fp8, "--bf16-wgrad", "--fp8");
  if (opt.fp8_wgrad && opt.bf16_wgrad)
    usage_error(
        "--fp8-wgrad and --bf16-wgrad: expected one of them (with --fp8 the weight gradients are FP8 "
        "unless --bf16-wgrad)");
  if (opt.fp8_wgrad && opt.lora_r > 0)
    usage_error("--fp8-wgrad with --lora-r: a frozen base computes no weight gradient");
  for (const char* o : {"--lora-alpha", "--lora-targets", "--base-format"})
    needs(app.count(o) > 0, opt.lora_r > 0, o, "--lora-r R (a LoRA run)");
  needs(opt.dtype == "f16", opt.backend != "cpu", "--dtype f16",
        "--backend cuda (the cpu backend computes in f32)");
  check_output_file("--results", opt.results, false, opt.force);
  check_output_file("--trace", opt.trace, true, opt.force);
  check_output_file("--profile-out", opt.profile_out, true, opt.force);
  if (!opt.trace.empty() && !opt.profile_out.empty() &&
      rp::overlapping_input(opt.trace, {opt.profile_out}) != "")
    usage_error(
        fmt::format("--trace and --profile-out name the same file '{}': the profile would replace the "
                    "trace; give two names",
                    opt.trace));
}

/// --preset's shape written over the flags' (a given --layers keeps its depth), then the expert
/// options refused without experts.
void apply_preset(const CLI::App& app, Options& opt) {
  const std::string& preset = opt.preset;
  if (preset == "qwen3-4b")
    opt.layers = 36, opt.hidden = 2560, opt.heads = 32, opt.kv = 8, opt.hd = 128, opt.ffn = 9728,
    opt.vocab = 151936;
  if (preset == "llama3.1-8b" || preset == "llama3.1-70b") {
    opt.qwen3 = false, opt.tied = false, opt.rope_theta = 5e5, opt.vocab = 128256, opt.kv = 8, opt.hd = 128;
    if (preset == "llama3.1-8b") opt.layers = 32, opt.hidden = 4096, opt.heads = 32, opt.ffn = 14336;
    else opt.layers = 80, opt.hidden = 8192, opt.heads = 64, opt.ffn = 28672;
  }
  // Qwen3-MoE: every decoder sparse, 128 experts, top-8, untied embeddings (intermediate_size
  // is that of the config.json and unused)
  if (preset == "qwen3-30b-a3b")
    opt.layers = 48, opt.hidden = 2048, opt.heads = 32, opt.kv = 4, opt.hd = 128, opt.ffn = 6144,
    opt.experts = 128, opt.top_k = 8, opt.expert_ffn = 768;
  if (preset == "qwen3-235b-a22b")
    opt.layers = 94, opt.hidden = 4096, opt.heads = 64, opt.kv = 4, opt.hd = 128, opt.ffn = 12288,
    opt.experts = 128, opt.top_k = 8, opt.expert_ffn = 1536;
  if (preset.rfind("qwen3-", 0) == 0 && opt.experts > 0)
    opt.tied = false, opt.vocab = 151936, opt.sparse_step = 1;
  opt.gpt_oss = preset == "gpt-oss-20b";  // examples/configs/gpt-oss-20b.json
  if (opt.gpt_oss)
    opt.qwen3 = false, opt.tied = false, opt.rope_theta = 150000, opt.layers = 24, opt.hidden = 2880,
    opt.heads = 64, opt.kv = 8, opt.hd = 64, opt.ffn = 2880, opt.experts = 32, opt.top_k = 4,
    opt.expert_ffn = 2880, opt.vocab = 201088, opt.sparse_step = 1;
  if (app.count("--layers")) opt.layers = int(app["--layers"]->as<int>());  // fewer of a preset's layers
  for (const char* o : {"--experts-per-tok", "--expert-ffn", "--sparse-step", "--expert-gemm"})
    needs(app.count(o) > 0, opt.experts > 0, o, "--experts E or a mixture-of-experts --preset");
}

}  // namespace

std::optional<int> parse(int argc, char** argv, Options& opt) {
  CLI::App app{"RoundPipe end-to-end throughput benchmark"};
  add_shape_options(app, opt);
  add_precision_options(app, opt);
  add_transfer_options(app, opt);
  add_run_options(app, opt);
  add_model_options(app, opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // in plain words, as roundpipe's ("--seq given twice"); CLI11's own exit codes (105 for a
    // value, ...) would differ per error
    usage_error(rp::parse_error_text(e));
  }
  check_options(app, opt);
  apply_preset(app, opt);
  opt.expert_gemm_given = app.count("--expert-gemm") > 0;
  return std::nullopt;
}

rp::ModelConfig model_config(const Options& opt) {
  rp::ModelConfig c;
  c.architecture = opt.qwen3 ? "qwen3" : "llama";
  c.qk_norm = opt.qwen3;
  c.vocab_size = opt.vocab;
  c.hidden_size = opt.hidden;
  c.intermediate_size = opt.ffn;
  c.num_hidden_layers = opt.layers;
  c.num_attention_heads = opt.heads;
  c.num_key_value_heads = opt.kv;
  c.head_dim = opt.hd;
  c.rope_theta = opt.rope_theta;
  c.max_position_embeddings = std::max<int64_t>(opt.seq, 40960);
  c.tie_word_embeddings = opt.tied;
  if (opt.experts > 0) {
    c.architecture = "qwen3_moe";
    c.num_experts = opt.experts;
    c.num_experts_per_tok = opt.top_k;
    c.moe_intermediate_size = opt.expert_ffn > 0 ? opt.expert_ffn : opt.ffn;
    c.decoder_sparse_step = opt.sparse_step;
    c.norm_topk_prob = true;
  }
  if (opt.gpt_oss) {
    c.architecture = "gpt_oss";
    c.qk_norm = false;
    c.attention_bias = true;
    c.attention_sinks = true;
    c.sliding_window = 128;
    for (int64_t i = 0; i < opt.layers; ++i)
      c.layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 32;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.truncate = false;
    c.max_position_embeddings = std::max<int64_t>(opt.seq, 131072);
  }
  try {
    c.validate();
  } catch (const std::exception& e) {
    usage_error(
        fmt::format("the model's shape (--preset, --layers, --hidden, --heads, --kv-heads, --head-dim, "
                    "--ffn, --vocab, --experts...): {}",
                    e.what()));
  }
  needs(opt.expert_gemm_given, c.num_moe_layers() > 0, "--expert-gemm",
        "a model with experts (a sparse decoder among --layers with --sparse-step)");
  return c;
}

std::optional<rp::LoraConfig> lora_config(const Options& opt) {
  if (opt.lora_r <= 0) return std::nullopt;
  rp::LoraConfig lora;
  lora.r = opt.lora_r;
  lora.alpha = opt.lora_alpha > 0 ? opt.lora_alpha : 2.0 * double(opt.lora_r);
  std::vector<std::string> entries;
  for (size_t a = 0; a <= opt.lora_targets.size();) {
    const size_t b = std::min(opt.lora_targets.find(',', a), opt.lora_targets.size());
    if (b > a) entries.push_back(opt.lora_targets.substr(a, b - a));
    a = b + 1;
  }
  rp::set_lora_targets(lora, entries);
  lora.base_format = rp::parse_weight_format(opt.base_format);
  return lora;
}

}  // namespace bench::throughput
