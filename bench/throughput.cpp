// End-to-end training throughput of the RoundPipe runtime on a model shape with random
// weights (default: Qwen3-1.7B shape, seq 8192, 8 sequences per step; --preset qwen3-4b).
//
//   bench_throughput [--backend cuda] [--workers 1] [--layers 28] [--hidden 2048] [--heads 16]
//                    [--kv-heads 8] [--head-dim 128] [--ffn 6144] [--vocab 151936] [--seq 8192]
//                    [--seqs 8] [--micro 8] [--steps 6] [--warmup 2] [--sync] [--cap-gib 139]
//                    [--dtype bf16|f16] [--plan JSON] [--trace FILE] [--results FILE] [--no-priorities]
//                    [--chunk-bytes N] [--preset qwen3-1.7b|qwen3-4b|...] [--mlp-chunk TOKENS]
//                    [--experts E --experts-per-tok k --expert-ffn Fe] [--lora-r R --base-format nf4]
//                    [--pin-budget-gib G] [--fp8 [--fp8-stored-direct]]
//                    [--frozen-tier PATH [--tier-ring-gib X] [--tier-resident-gib Y | --tier-host-budget-gib
//                    B]]
// --frozen-tier: the frozen (LoRA base) weights stream from a cache file at PATH (built on the
// first run, reused after) through --tier-ring-gib GiB of host read buffers (0: two buffers),
// keeping --tier-resident-gib GiB of them in host memory (decoders' groups first; 0: none), or
// with --tier-host-budget-gib, what the whole run's budget of B GiB leaves for them (the runtime
// decides, and may drop the saved attention); the base's groups are made one at a time as the
// cache is written (none when it is reused). The row and the RESULT line name the tier.
// --fp8: the dense decoder linears' forward, recompute and input-gradient GEMMs in FP8 e4m3, and in
// full fine-tuning their weight gradients too (--bf16-wgrad keeps those bf16) (spec keys "fp8",
// "fp8_weight_gradients"; docs/gpu.md, "FP8 linears"; needs --dtype bf16 and an sm_89+ GPU); MFU
// still counts against the bf16 peak, so the FP8 gain shows as a higher MFU.
// The attention implementation follows RP_CUDA_ATTENTION (auto = cuDNN when available).
// --no-priorities: parameter/gradient copies do not yield to activation copies (first come,
// first served); --chunk-bytes: bulk copies are cut into chunks of N bytes (0: whole copies).
// tokens/s: median over the measured steps of tokens-per-step / (time between consecutive
// step completions). MFU = tokens/s * model_flops_per_token / 790e12 (model/model_flops.hpp, the
// trainer's count too: 6 FLOPs per trained matmul weight incl. the LM head and, of a sparse
// layer, its router and the top-k experts a token is routed to, 4 per frozen (LoRA base)
// weight, plus the causal or sliding-window attention; recompute not counted).
// GPT-OSS: --preset gpt-oss-20b (24 layers, 32 experts top-4 with biases and the clamped SwiGLU,
// attention with biases and sinks, sliding window 128 on every other layer from the first).
// Mixture of experts (Qwen3-MoE): --preset qwen3-30b-a3b / qwen3-235b-a22b, or --experts E
// --experts-per-tok k --expert-ffn Fe [--sparse-step s] on any shape; --layers N keeps the first
// N decoders of a preset (235B on one host). LoRA on a sparse layer reaches its attention, and
// its experts with "experts" in --lora-targets (per-expert adapters on gate_up_proj and
// down_proj, e.g. --lora-r 32 --lora-targets q_proj,k_proj,v_proj,o_proj,experts). A MoE step line adds its
// expert utilisation (least / most used expert against the even share) and load-balancing loss.
// --expert-gemm bucketed|grouped: the experts' grouped linears as one batched GEMM per bucket of a
// padded layout (the default) or as cuBLAS's grouped GEMM (spec key "expert_gemm"). Every row
// reports the peak device memory and the process's peak host memory (max RSS). A failure of the run (memory
// cap, device error) is one line on stderr and exit 1; a bad argument (a value out of range, an
// option without the one it needs, --seqs not a multiple of --micro, an output file whose folder
// is missing) one line and exit 2.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/host_resources.hpp"
#include "bench/bench_main.hpp"
#include "bench/random_weights.hpp"
#include "bench/tier_option_names.hpp"
#include "kernels/device.hpp"
#include "kernels/weight_format.hpp"
#include "model/lora.hpp"
#include "model/model_flops.hpp"
#include "roundpipe/session.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/replan.hpp"
#include "scheduler/run_plan.hpp"
#include "scheduler/stage_peak.hpp"

namespace {

/// A bad argument: one line on stderr, exit 2 (as the option checks; a failed run exits 1).
[[noreturn]] void usage_error(const std::string& line) {
  std::string one = line;
  std::replace(one.begin(), one.end(), '\n', ' ');
  std::fprintf(stderr, "bench_throughput: %s\n", one.c_str());
  std::exit(2);
}

/// CLI11 check of a GiB option: a number >= 0 and <= 1048576; `zero_means` (e.g. " (0: none)")
/// goes into the one-line refusal.
CLI::Validator gib_validator(const std::string& zero_means) {
  return CLI::Validator(
      [zero_means](const std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != 0 || !(x >= 0 && x <= double(1 << 20)))
          return "expected a number of GiB >= 0" + zero_means + " and <= 1048576, got '" + v + "'";
        return "";
      },
      "GiB");
}

/// CLI11 check of a number in [lo, hi] (NaN refused: CLI11's Range lets it through, and its
/// open ranges print 1.8e308): "expected <what> from <lo> to <hi>, got '<v>'".
CLI::Validator number_validator(double lo, double hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](const std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != 0 || !(x >= lo && x <= hi))
          return fmt::format("expected {} from {} to {}, got '{}'", what, lo, hi, v);
        return "";
      },
      "NUMBER");
}

/// A folder `path` (an output file of the bench) can be written in, checked before the run: a
/// missing folder is one line and exit 2 instead of an error after every step was measured.
void check_output_file(const std::string& option, const std::string& path) {
  if (path.empty()) return;
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
    usage_error(fmt::format("{} {}: expected a file in a folder that exists and can be written ({})", option,
                            path, dir.string()));
}

double max_rss_gib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) * 1024.0 / double(1ull << 30);  // ru_maxrss is in KiB on Linux
}

// Bytes of weights uploaded per iteration by `plan`: each stage uploads its groups (frozen ones
// in storage form, trainable ones in the compute dtype).
double weight_bytes_per_iteration(const rp::ModelLayout& m, const rp::IterationPlan& plan, size_t elem) {
  double bytes = 0;
  for (const auto& st : plan.stages)
    for (int g : m.groups_uploaded(st.layers(), st.kind == rp::StageKind::backward)) {
      const auto& grp = m.groups[size_t(g)];
      bytes += grp.frozen ? double(grp.storage_bytes) : double(grp.numel) * double(elem);
    }
  return bytes;
}

// Mixture of experts: the step's expert utilisation, tokens routed to the least and the most
// used expert (summed over the sparse layers) against the even share, and the
// load-balancing loss; "" for dense models.
std::string expert_use(const rp::StepResult& r) {
  if (r.expert_tokens.empty()) return {};
  double total = 0;
  for (double x : r.expert_tokens) total += x;
  const double even = total / double(r.expert_tokens.size());
  const auto [lo, hi] = std::minmax_element(r.expert_tokens.begin(), r.expert_tokens.end());
  return fmt::format(", experts: least used {:.2f}, most used {:.2f} x the even share, aux loss {:.4f}",
                     even > 0 ? *lo / even : 0.0, even > 0 ? *hi / even : 0.0, r.moe_aux_loss);
}

int run(int argc, char** argv) {
  CLI::App app{"RoundPipe end-to-end throughput benchmark"};
  std::string backend = "cuda", trace, results, dtype = "bf16", plan_json;
  int workers = 1, layers = 28, steps = 6, warmup = 2;
  int64_t hidden = 2048, heads = 16, kv = 8, hd = 128, ffn = 6144, vocab = 151936, seq = 8192, seqs = 8,
          micro = 8;
  bool sync = false, qwen3 = true, no_prio = false, fp8 = false, fp8_wgrad = false, fp8_direct = false;
  bool bf16_wgrad = false;
  int64_t chunk_bytes = 32 << 20;
  int bulk_inflight = 1;
  int64_t mlp_chunk = 0;
  std::string preset, expert_gemm = "bucketed";
  double cap = 139;
  app.add_option("--backend", backend)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--workers", workers)->check(CLI::Range(1, 1024));
  app.add_option("--layers", layers);
  app.add_option("--hidden", hidden);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv);
  app.add_option("--head-dim", hd);
  app.add_option("--ffn", ffn);
  app.add_option("--vocab", vocab);
  app.add_option("--seq", seq);
  app.add_option("--seqs", seqs, "sequences per step");
  app.add_option("--micro", micro, "micro-batches per step");
  app.add_option("--steps", steps, "measured steps")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup,
                 "unmeasured first steps (at least 1: a step's time is from the one before)")
      ->check(CLI::Range(1, 1000000));
  app.add_flag("--sync", sync);
  app.add_flag("--fp8", fp8,
               "dense decoder linears in FP8 e4m3 (forward, recompute, input gradient; in full fine-tuning "
               "the weight gradients too unless --bf16-wgrad)");
  app.add_option("--expert-gemm", expert_gemm,
                 "MoE grouped linears: bucketed (padded layout, the default) or grouped")
      ->capture_default_str()
      ->check(CLI::IsMember({"grouped", "bucketed"}));
  app.add_flag("--fp8-wgrad", fp8_wgrad,
               "with --fp8: their weight gradients in FP8 too (the default with --fp8; a LoRA run has none)");
  app.add_flag("--bf16-wgrad", bf16_wgrad, "with --fp8: keep the weight gradients in bf16");
  app.add_flag("--fp8-stored-direct", fp8_direct,
               "with --fp8 and --base-format fp8: run the base's linears from its codes (experimental)");
  app.add_option("--cap-gib", cap, "device memory cap per worker")
      ->check(number_validator(0.001, double(1 << 20), "GiB"));
  app.add_option("--trace", trace);
  app.add_option("--results", results, "append a markdown row here");
  app.add_option("--plan", plan_json, "explicit plan (JSON as in a spec's \"plan\" key)");
  app.add_option("--dtype", dtype, "storage dtype on the GPU")->check(CLI::IsMember({"bf16", "f16"}));
  app.add_option("--bulk-inflight", bulk_inflight,
                 "parameter/gradient chunks in flight at once (priorities on)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--no-priorities", no_prio, "transfers first come, first served (no cross-stream priority)");
  app.add_option("--chunk-bytes", chunk_bytes, "cut parameter/gradient copies into chunks of this (0: none)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  app.add_option("--mlp-chunk", mlp_chunk, "decoders' MLP chunk in tokens (0: default)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  double pin_budget_gib = -1;
  app.add_option("--pin-budget-gib", pin_budget_gib,
                 "host GiB the runtime may page-lock (default: three quarters of the host's memory)")
      ->check(gib_validator(""));
  std::string frozen_tier;
  double tier_ring_gib = 0, tier_resident_gib = 0;
  app.add_option("--frozen-tier", frozen_tier, "stream the frozen (LoRA base) weights from this cache file");
  app.add_option("--tier-ring-gib", tier_ring_gib, "host GiB of the tier's read buffers (0: two buffers)")
      ->check(gib_validator(" (0: two buffers)"));
  app.add_option("--tier-resident-gib", tier_resident_gib,
                 "host GiB of the frozen base kept resident, decoders first (0: all stream)")
      ->check(gib_validator(" (0: all stream)"));
  double tier_host_budget_gib = 0;
  app.add_option("--tier-host-budget-gib", tier_host_budget_gib,
                 "the whole run's host GiB: the runtime decides what stays resident (0: no budget)")
      ->check(gib_validator(" (0: no budget)"));
  int tier_spill_layers = 0;
  app.add_option(
         "--tier-spill-layers", tier_spill_layers,
         "keep the saved inputs of this many layers in a hidden file beside the tier's cache instead of "
         "host memory (0: none)")
      ->check(CLI::Range(0, 1 << 20));
  std::string profile_out;
  double cap_above_plan = 0;
  bool no_save_attention = false;
  app.add_flag("--no-save-attention", no_save_attention,
               "recompute each decoder's attention in backward instead of keeping the forward's output");
  app.add_option(
         "--cap-above-plan", cap_above_plan,
         "run the plan chosen at --cap-gib with the cap this fraction above its predicted working set "
         "(e.g. 0.02)")
      ->check(number_validator(0, 100, "a fraction"));
  app.add_option("--profile-out", profile_out, "write the measured per-layer profile (JSON) here");
  app.add_option(
         "--preset", preset,
         "model shape: qwen3-1.7b (default flags), qwen3-4b, llama3.1-8b, llama3.1-70b, qwen3-30b-a3b, "
         "qwen3-235b-a22b or gpt-oss-20b (a given --layers overrides the preset's depth)")
      ->check(CLI::IsMember({"qwen3-1.7b", "qwen3-4b", "llama3.1-8b", "llama3.1-70b", "qwen3-30b-a3b",
                             "qwen3-235b-a22b", "gpt-oss-20b"}));
  int64_t experts = 0, top_k = 2, expert_ffn = 0, sparse_step = 1;
  app.add_option("--experts", experts,
                 "mixture of experts (Qwen3-MoE): routed experts per sparse layer (0: dense)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  app.add_option("--experts-per-tok", top_k, "experts per token (top-k)");
  app.add_option("--expert-ffn", expert_ffn, "FFN width of one expert (moe_intermediate_size; 0: --ffn)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  app.add_option("--sparse-step", sparse_step, "every step-th decoder is sparse (decoder_sparse_step)");
  int64_t lora_r = 0;
  double lora_alpha = 0;
  std::string lora_targets = "all-linear", base_format = "bf16";
  app.add_option("--lora-r", lora_r, "LoRA rank on frozen base weights (0: full fine-tuning)")
      ->check(CLI::Range(int64_t(0), int64_t(65536)));
  app.add_option("--lora-alpha", lora_alpha, "LoRA alpha (default: 2 x rank)");
  app.add_option(
      "--lora-targets", lora_targets,
      "comma-separated modules or all-linear; \"experts\" (or experts.gate_up_proj, experts.down_proj) "
      "adds per-expert adapters to the sparse layers");
  app.add_option("--base-format", base_format, "storage of the frozen base weights (LoRA)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0", "q4_0", "nf4", "mxfp4", "fp8"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    usage_error(e.what());  // CLI11's own exit codes (105 for a value, ...) would differ per error
  }
  // options that only mean something beside another: one line instead of being ignored
  const auto needs = [&](bool given, bool with, const char* what, const char* needed) {
    if (given && !with) usage_error(fmt::format("{} needs {}", what, needed));
  };
  // every micro-batch holds the same whole number of sequences
  if (micro < 1 || seqs < micro || seqs % micro != 0)
    usage_error(
        fmt::format("--seqs {} --micro {}: expected --micro >= 1 and --seqs a multiple of --micro (each "
                    "of the --micro micro-batches holds --seqs / --micro sequences, at least one)",
                    seqs, micro));
  // a sequence of one token has no target to predict (the spec refuses seq_len 1 too)
  if (seq < 2) usage_error(fmt::format("--seq {}: expected tokens per sequence >= 2", seq));
  needs(app.count("--tier-ring-gib") > 0, !frozen_tier.empty(), "--tier-ring-gib", "--frozen-tier PATH");
  needs(app.count("--tier-resident-gib") > 0, !frozen_tier.empty(), "--tier-resident-gib",
        "--frozen-tier PATH");
  needs(app.count("--tier-host-budget-gib") > 0, !frozen_tier.empty(), "--tier-host-budget-gib",
        "--frozen-tier PATH");
  needs(app.count("--frozen-tier") > 0, !frozen_tier.empty(), "--frozen-tier", "a non-empty path");
  needs(app.count("--tier-spill-layers") > 0, !frozen_tier.empty(), "--tier-spill-layers",
        "--frozen-tier PATH");
  needs(!frozen_tier.empty() && tier_spill_layers == 0, lora_r > 0, "--frozen-tier",
        "--lora-r R (it streams a LoRA base) or --tier-spill-layers N");
  needs(fp8_direct, fp8, "--fp8-stored-direct", "--fp8");
  needs(fp8_wgrad, fp8, "--fp8-wgrad", "--fp8");
  needs(bf16_wgrad, fp8, "--bf16-wgrad", "--fp8");
  if (fp8_wgrad && bf16_wgrad)
    usage_error(
        "--fp8-wgrad and --bf16-wgrad: expected one of them (with --fp8 the weight gradients are FP8 "
        "unless --bf16-wgrad)");
  if (fp8_wgrad && lora_r > 0)
    usage_error("--fp8-wgrad with --lora-r: a frozen base computes no weight gradient");
  for (const char* o : {"--lora-alpha", "--lora-targets", "--base-format"})
    needs(app.count(o) > 0, lora_r > 0, o, "--lora-r R (a LoRA run)");
  needs(dtype == "f16", backend != "cpu", "--dtype f16", "--backend cuda (the cpu backend computes in f32)");
  check_output_file("--results", results);
  check_output_file("--trace", trace);
  check_output_file("--profile-out", profile_out);
  bool tied = true;
  double rope_theta = 1e6;
  if (preset == "qwen3-4b")
    layers = 36, hidden = 2560, heads = 32, kv = 8, hd = 128, ffn = 9728, vocab = 151936;
  if (preset == "llama3.1-8b" || preset == "llama3.1-70b") {
    qwen3 = false, tied = false, rope_theta = 5e5, vocab = 128256, kv = 8, hd = 128;
    if (preset == "llama3.1-8b") layers = 32, hidden = 4096, heads = 32, ffn = 14336;
    else layers = 80, hidden = 8192, heads = 64, ffn = 28672;
  }
  // Qwen3-MoE: every decoder sparse, 128 experts, top-8, untied embeddings (intermediate_size
  // is that of the config.json and unused)
  if (preset == "qwen3-30b-a3b")
    layers = 48, hidden = 2048, heads = 32, kv = 4, hd = 128, ffn = 6144, experts = 128, top_k = 8,
    expert_ffn = 768;
  if (preset == "qwen3-235b-a22b")
    layers = 94, hidden = 4096, heads = 64, kv = 4, hd = 128, ffn = 12288, experts = 128, top_k = 8,
    expert_ffn = 1536;
  if (preset.rfind("qwen3-", 0) == 0 && experts > 0) tied = false, vocab = 151936, sparse_step = 1;
  const bool gpt_oss = preset == "gpt-oss-20b";  // examples/configs/gpt-oss-20b.json
  if (gpt_oss)
    qwen3 = false, tied = false, rope_theta = 150000, layers = 24, hidden = 2880, heads = 64, kv = 8, hd = 64,
    ffn = 2880, experts = 32, top_k = 4, expert_ffn = 2880, vocab = 201088, sparse_step = 1;
  if (app.count("--layers")) layers = int(app["--layers"]->as<int>());  // fewer of a preset's layers
  for (const char* o : {"--experts-per-tok", "--expert-ffn", "--sparse-step", "--expert-gemm"})
    needs(app.count(o) > 0, experts > 0, o, "--experts E or a mixture-of-experts --preset");

  rp::ModelConfig c;
  c.architecture = qwen3 ? "qwen3" : "llama";
  c.qk_norm = qwen3;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv;
  c.head_dim = hd;
  c.rope_theta = rope_theta;
  c.max_position_embeddings = std::max<int64_t>(seq, 40960);
  c.tie_word_embeddings = tied;
  if (experts > 0) {
    c.architecture = "qwen3_moe";
    c.num_experts = experts;
    c.num_experts_per_tok = top_k;
    c.moe_intermediate_size = expert_ffn > 0 ? expert_ffn : ffn;
    c.decoder_sparse_step = sparse_step;
    c.norm_topk_prob = true;
  }
  if (gpt_oss) {
    c.architecture = "gpt_oss";
    c.qk_norm = false;
    c.attention_bias = true;
    c.attention_sinks = true;
    c.sliding_window = 128;
    for (int64_t i = 0; i < layers; ++i)
      c.layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 32;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.truncate = false;
    c.max_position_embeddings = std::max<int64_t>(seq, 131072);
  }
  try {
    c.validate();
  } catch (const std::exception& e) {
    usage_error(
        fmt::format("the model's shape (--preset, --layers, --hidden, --heads, --kv-heads, --head-dim, "
                    "--ffn, --vocab, --experts...): {}",
                    e.what()));
  }
  needs(app.count("--expert-gemm") > 0, c.num_moe_layers() > 0, "--expert-gemm",
        "a model with experts (a sparse decoder among --layers with --sparse-step)");
  std::optional<rp::LoraConfig> lora;
  if (lora_r > 0) {
    lora.emplace();
    lora->r = lora_r;
    lora->alpha = lora_alpha > 0 ? lora_alpha : 2.0 * double(lora_r);
    std::vector<std::string> entries;
    for (size_t a = 0; a <= lora_targets.size();) {
      const size_t b = std::min(lora_targets.find(',', a), lora_targets.size());
      if (b > a) entries.push_back(lora_targets.substr(a, b - a));
      a = b + 1;
    }
    rp::set_lora_targets(*lora, entries);
    lora->base_format = rp::parse_weight_format(base_format);
  }
  rp::ModelLayout m = lora ? rp::make_layout(c, *lora) : rp::make_layout(c);
  std::vector<std::vector<float>> w;
  std::vector<std::vector<uint8_t>> frozen;
  // with a disk tier the frozen groups are made one at a time as its cache is written (and not
  // at all when a valid cache is reused): the start-up never holds the whole base
  bench::random_weights(m, w, frozen, /*lazy=*/!frozen_tier.empty());
  std::mt19937 rng(1);
  rp::SessionOptions o;
  o.backend = backend;
  o.workers = workers;
  o.micro_batches = micro;
  o.micro = {seqs / micro, seq};
  o.async = !sync;
  o.device.capacity_bytes = size_t(cap * double(1ull << 30));
  o.device.dtype = dtype == "f16" ? rp::DType::f16 : rp::DType::bf16;
  if (dtype == "f16") o.loss_scaling = rp::LossScalerOptions{};  // fp16 needs dynamic loss scaling
  o.device.fp8 = fp8;
  // FP8 weight gradients by default with --fp8; a LoRA run's frozen base computes none
  o.device.fp8_weight_gradients = fp8 && !bf16_wgrad && lora_r == 0;
  o.device.fp8_stored_direct = fp8 && fp8_direct;
  o.device.expert_gemm_bucketed = expert_gemm == "bucketed";
  o.trace = !trace.empty();
  if (!plan_json.empty()) {
    try {
      o.plan = rp::plan_from_json(nlohmann::json::parse(plan_json), int(m.num_layers()), workers, "--plan");
    } catch (const nlohmann::json::exception& e) {
      usage_error(fmt::format("--plan: expected a plan as JSON (as a spec's \"plan\" key): {}", e.what()));
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
  }
  o.transfer_priorities = !no_prio;
  o.transfer_chunk_bytes = size_t(chunk_bytes);
  o.transfer_bulk_inflight = bulk_inflight;
  o.mlp_chunk_tokens = mlp_chunk;
  if (pin_budget_gib >= 0) o.pin_budget_bytes = size_t(pin_budget_gib * double(1ull << 30));
  if (no_save_attention) o.save_attention = false;  // else automatic (on where host memory allows)
  if (!frozen_tier.empty()) {
    if (tier_spill_layers > m.num_layers() - 1)
      usage_error(
          fmt::format("--tier-spill-layers {}: expected 0..{} (the layers with a saved input: all "
                      "but the first of {})",
                      tier_spill_layers, m.num_layers() - 1, m.num_layers()));
    o.frozen_tier = rp::FrozenTierOptions{frozen_tier, tier_ring_gib, tier_resident_gib};
    o.frozen_tier->host_budget_gib = tier_host_budget_gib;
    o.frozen_tier->spill_layers = tier_spill_layers;
    o.frozen_source = bench::frozen_source(m);
  }
  // The planner's working set of the plan (the memory model a cap is checked against): the
  // plan the session will choose at this cap (automatic) or the given one: plan_run
  // (scheduler/run_plan.hpp) with the inputs the session passes it.
  const bool on_cpu = backend == "cpu";  // fp32 virtual GPUs with 256-byte pool rounding
  rp::RunPlanInputs rin;
  rin.layout = &m;
  rin.micro = o.micro;
  rin.micro_batches = micro;
  rin.workers = workers;
  rin.compute = on_cpu ? rp::DType::f32 : o.device.dtype;
  rin.device = rp::backend_device_model(backend, o.device.pcie_bytes_per_s, rin.compute, o.device.fp8,
                                        o.device.fp8_weight_gradients, o.device.expert_gemm_bucketed);
  rin.mlp_chunk_tokens = mlp_chunk;
  rin.device_capacity = int64_t(o.device.capacity_bytes);
  rin.alloc_granule = on_cpu ? 256 : int64_t(rp::kCudaPoolGranule);
  rin.plan = o.plan;
  rin.save_attention = o.save_attention;
  const rp::RunPlan run_plan = rp::plan_run(rin);
  const std::vector<rp::LayerCost>& costs = run_plan.costs;
  const rp::PartitionOptions& po = run_plan.partition;
  const rp::IterationPlan planned = run_plan.plan;
  // the largest stage's working set, and with room for the next stage's weights beside it (the
  // worker prefetches them when the cap allows, so a generous cap's peak is nearer the latter)
  int64_t predicted = 0, predicted_prefetch = 0;
  const std::vector<rp::StageEstimate> stage_est = rp::check_plan(costs, planned, po, "plan");
  for (const auto& e : stage_est) {
    predicted = std::max(predicted, e.work_bytes);
    predicted_prefetch = std::max(predicted_prefetch, e.memory_bytes);
  }
  if (cap_above_plan > 0) {  // run that plan with the cap just above its working set
    o.plan = planned;
    o.device.capacity_bytes = size_t(double(predicted) * (1 + cap_above_plan));
  }
  // the peak across stage switches (scheduler/stage_peak.hpp) under the cap the run gets
  rp::PartitionOptions peak_po = po;
  peak_po.memory_cap = int64_t(o.device.capacity_bytes);
  const rp::PeakEstimate peak_est = rp::predict_peak(stage_est, peak_po);
  std::printf("plan %s: predicted working set %.2f GiB, peak at stage switches %.2f GiB, cap %.2f GiB\n",
              planned.summary().c_str(), double(predicted) / double(1ull << 30),
              double(peak_est.bytes) / double(1ull << 30),
              double(o.device.capacity_bytes) / double(1ull << 30));
  auto t0 = std::chrono::steady_clock::now();
  int64_t frozen_bytes = 0, trainable = 0;
  for (const auto& g : m.groups) g.frozen ? frozen_bytes += g.storage_bytes : trainable += g.numel;
  std::printf("model %s: %.2f B parameters, %.2f B active per token\n", c.architecture.c_str(),
              double(c.num_parameters()) / 1e9, double(c.num_active_parameters()) / 1e9);
  if (lora)
    std::printf("LoRA r=%lld on %s%s, base %s: %.2f GB of frozen weights, %lld trainable parameters\n",
                (long long)lora->r, lora_targets.c_str(),
                c.num_moe_layers() > 0 ? " (attention only in sparse layers)" : "", base_format.c_str(),
                double(frozen_bytes) / 1e9, (long long)trainable);
  const auto session = [&] {  // the tier's errors name the bench's options, not the spec's keys
    try {
      return std::make_unique<rp::Session>(m, std::move(w), std::move(frozen), o);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(bench::tier_option_names(e.what()));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(bench::tier_option_names(e.what()));
    }
  }();
  rp::Session& s = *session;
  const rp::HostPinning pins = s.host_pinning();
  std::printf(
      "session ready in %.1f s: %s, plan %s; host buffers %s %s, pageable %s (%s frozen weights), pin budget "
      "%s\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), s.device_name().c_str(),
      s.plan().summary().c_str(),
      on_cpu ? "counted as pinned (the CPU backend page-locks nothing)" : "pinned",
      rp::byte_text(double(pins.pinned_bytes)).c_str(), rp::byte_text(double(pins.pageable_bytes)).c_str(),
      rp::byte_text(double(pins.pageable_frozen_bytes)).c_str(), rp::byte_text(double(pins.budget)).c_str());
  // the tier's start line is in the runtime's log (frozen tier: <path>: built|reused ...)
  std::string tier_text =
      s.frozen_tier().enabled
          ? fmt::format(", frozen tier {} x {:.1f} MiB{}{}", s.frozen_tier().ring_buffers,
                        double(s.frozen_tier().buffer_bytes) / double(1 << 20),
                        s.frozen_tier().resident_bytes > 0
                            ? fmt::format(", {:.2f} GiB resident",
                                          double(s.frozen_tier().resident_bytes) / double(1ull << 30))
                            : std::string(),
                        tier_host_budget_gib > 0 ? fmt::format(", host budget {} GiB", tier_host_budget_gib)
                                                 : std::string())
          : std::string();
  if (s.frozen_tier().probe_gbps > 0)
    tier_text += fmt::format(", disk probe {:.2f} GB/s", s.frozen_tier().probe_gbps);
  if (!s.frozen_tier().spill_layers.empty())  // its start line is in the runtime's log too
    tier_text += fmt::format(", activation spill {} layers ({})", s.frozen_tier().spill_layers.size(),
                             rp::byte_text(double(s.frozen_tier().spill_bytes)));
  const int64_t n = micro * o.micro.tokens();
  std::vector<int32_t> ids(n), tg(n);
  std::vector<double> done_at;
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const int total = warmup + steps;
  double loss = 0;
  // With a disk tier one more step goes in, unmeasured: the reads it makes while the last measured
  // step runs balance those the first measured step made before the window opened, so the DISK
  // line's window holds whole steps' reads (the tier reads a stage's groups ahead of it).
  const int extra = s.frozen_tier().enabled ? 1 : 0;
  rp::FrozenTierReads reads0, reads1;  // at the end of the warm-up and of the last measured step
  for (int t = 0; t < total + extra; ++t) {
    for (int64_t i = 0; i < n; ++i) ids[i] = int32_t(rng() % vocab);
    for (int64_t i = 0; i < n; ++i) tg[i] = (i + 1) % seq == 0 ? -100 : ids[i + 1];
    s.forward_backward(ids, tg);
    s.step(1e-5);
    if (t >= 1) {
      auto r = s.wait(t - 1);
      done_at.push_back(now());
      if (t == warmup) reads0 = s.frozen_tier_reads();
      if (t == total) reads1 = s.frozen_tier_reads();
      loss = r.loss_sum / r.tokens;
      std::printf("step %d loss %.4f (%.2f s)%s\n", t - 1, loss, r.seconds, expert_use(r).c_str());
      std::fflush(stdout);
    }
  }
  if (extra == 0) {
    const rp::StepResult last = s.wait(total - 1);
    done_at.push_back(now());
    if (experts > 0) std::printf("step %d%s\n", total - 1, expert_use(last).c_str());
  } else {
    s.wait(total);
  }
  std::vector<double> dts;
  for (int t = warmup; t < total; ++t) dts.push_back(done_at[t] - done_at[t - 1]);
  std::sort(dts.begin(), dts.end());
  const double dt = dts[dts.size() / 2];
  const double tps = double(n) / dt;
  // training FLOPs per token as the trainer counts them (model/model_flops.hpp: 6 per trained
  // matmul weight, 4 per frozen one, a sparse layer's router and top-k experts, the attention)
  const double flops_per_token = rp::model_flops_per_token(m, seq);
  const double mfu = tps * flops_per_token / 790e12;
  const double peak = s.peak_device_bytes() / double(1ull << 30);
  const char* attn = std::getenv("RP_CUDA_ATTENTION");
  const std::string xfer = std::string(no_prio ? "no priorities" : "priorities") +
                           (no_save_attention || s.frozen_tier().attention_dropped || tier_spill_layers > 0
                                ? ", attention recomputed"
                                : ", attention saved") +
                           tier_text;
  const std::string chunks =
      chunk_bytes > 0 ? fmt::format("{} MiB chunks x {}", chunk_bytes / double(1 << 20), bulk_inflight)
                      : "no chunks";
  const double rss = max_rss_gib();
  const std::string shape = fmt::format(
      "{}L{} H{} {}q/{}kv {}, {}x{} tokens, M={}",
      lora ? fmt::format("LoRA r={} {} base {}, ", lora->r, lora_targets, base_format) : std::string(),
      layers, hidden, heads, kv,
      experts > 0
          ? fmt::format("{} experts top-{} Fe{} in {} sparse layers{}", experts, top_k,
                        c.moe_intermediate_size, c.num_moe_layers(), ", " + expert_gemm + " expert GEMMs")
          : fmt::format("F{}", ffn),
      seqs, seq, micro);
  const double weight_gb = weight_bytes_per_iteration(m, s.plan(), rp::dtype_size(o.device.dtype)) / 1e9;
  std::string row = fmt::format(
      "| roundpipe ({} x {}, {}, {}, attention {}, {}, {}; {}) | {:.0f} | {:.3f} | {:.2f} | {:.1f} | {:.2f} "
      "|",
      workers, backend, sync ? "sync" : "async",
      fp8 ? dtype + (o.device.fp8_weight_gradients ? " + fp8 linears and weight gradients" : " + fp8 linears")
          : dtype,
      attn && *attn ? attn : "auto", xfer, chunks, shape, tps, mfu, peak, rss, dt);
  predicted_prefetch = std::min(predicted_prefetch, int64_t(o.device.capacity_bytes));
  std::printf(
      "RESULT tokens/s %.1f  MFU %.3f  peak device memory %.2f GiB (predicted working set %.2f, "
      "measured/predicted %.3f; "
      "with the next stage's weights prefetched %.2f, measured/predicted %.3f; predicted peak at stage "
      "switches "
      "%.2f, measured/predicted %.3f)  host max RSS %.1f GiB  step %.3f s  "
      "weights uploaded %.2f GB per iteration  (%s; %s, %s)\n",
      tps, mfu, peak, double(predicted) / double(1ull << 30),
      double(s.peak_device_bytes()) / double(predicted), double(predicted_prefetch) / double(1ull << 30),
      double(s.peak_device_bytes()) / double(std::max<int64_t>(predicted_prefetch, 1)),
      double(peak_est.bytes) / double(1ull << 30),
      double(s.peak_device_bytes()) / double(std::max<int64_t>(peak_est.bytes, 1)), rss, dt, weight_gb,
      s.plan().summary().c_str(), xfer.c_str(), chunks.c_str());
  if (s.frozen_tier().enabled) {  // what the measured steps read from the cache file
    const double gb = double(reads1.bytes - reads0.bytes) / 1e9, secs = reads1.seconds - reads0.seconds;
    const double window = done_at[size_t(total - 1)] - done_at[size_t(warmup - 1)];
    std::printf(
        "DISK frozen tier read %s per iteration (%.1f reads) at %.2f GB/s while reading; the "
        "reader busy %.0f%% of the measured steps\n",
        rp::byte_text(double(reads1.bytes - reads0.bytes) / steps).c_str(),
        double(reads1.reads - reads0.reads) / steps, secs > 0 ? gb / secs : 0.0,
        window > 0 ? 100 * secs / window : 0.0);
  }
  if (!results.empty()) {
    std::ofstream f(results, std::ios::app);
    if (!(f << row << "\n") || !f.flush())
      throw std::runtime_error(fmt::format("--results {}: cannot append the row (disk full?)", results));
  }
  if (!trace.empty()) s.write_trace(trace);
  if (!profile_out.empty()) s.save_profile(profile_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::guarded_main("bench_throughput", [&] { return run(argc, argv); });
}
