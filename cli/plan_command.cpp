// The `roundpipe plan` subcommand's flags (cli/plan.hpp): each numeric one checks its text as
// it is parsed, in the words its range check uses after (plan_flag_expects).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/plan.hpp"
#include "scheduler/cost_model.hpp"

namespace rp {

namespace {

// A numeric flag of `plan`: a value of the wrong kind is one line saying what the flag expects.
template <typename T>
CLI::Option* number(CLI::App& c, const std::string& flag, T& v, const std::string& help) {
  return add_number_option(c, flag, v, help, plan_flag_expects(flag))->capture_default_str();
}

// The batch: its sequences and micro-batches, the profile, the memory cap and the trace.
void add_workload_options(CLI::App& c, PlanCommandOptions& o) {
  number(c, "--seq", o.seq_len, "tokens per sequence");
  number(c, "--micro", o.micro_batches, "micro-batches per iteration (M)");
  number(c, "--sequences-per-micro", o.sequences_per_micro, "sequences per micro-batch");
  c.add_option(
      "--profile", o.profile,
      "measured profile JSON (replaces the analytic costs where measured; its linear compute must be the one "
      "--fp8 and --bf16-wgrad plan)");
  c.add_option("--memory-cap", o.memory_cap, "per-GPU memory a stage may use, e.g. 24GiB (default: none)");
  c.add_option("--trace", o.trace,
               "write the simulated timeline as a Chrome trace JSON (an existing file needs --force)");
  c.add_flag("--force", o.force, "with --trace: replace an existing file");
  c.add_option(
      "--plan", o.plan,
      "predict this plan instead of the partitioner's: JSON as in a spec's \"plan\" key "
      "({\"forward\": [[0, 13], ...], \"tail\": [29, 29], \"backward\": [[28, 23], ...]}), or a file "
      "holding it or a whole spec");
}

// The device's rates and the simulation.
void add_device_options(CLI::App& c, PlanCommandOptions& o) {
  number(c, "--peak-tflops", o.peak_tflops, "achievable dense GEMM TFLOP/s");
  c.add_flag(
      "--fp8", o.fp8,
      "plan a run with \"fp8\": true: the dense decoder linears' forward, recompute and input gradient "
      "(and in full fine-tuning their weight gradients, unless --bf16-wgrad) at --fp8-tflops");
  c.add_flag("--fp8-wgrad", o.fp8_wgrad,
             "with --fp8: the linears' weight gradients in FP8 as well (the default with --fp8 in full "
             "fine-tuning)");
  c.add_flag("--bf16-wgrad", o.bf16_wgrad,
             "with --fp8: \"fp8_weight_gradients\": false, the linears' weight gradients kept in bf16");
  number(c, "--fp8-tflops", o.fp8_tflops,
         "--fp8: achievable e4m3 GEMM TFLOP/s (0: the --gpu preset's, else 1.7 x --peak-tflops as measured "
         "on the H200)");
  number(c, "--hbm-gbps", o.hbm_gbps, "device memory bandwidth, GB/s");
  number(c, "--pcie-gbps", o.pcie_gbps, "host<->device GB/s per direction (0: free)");
  number(c, "--iterations", o.iterations,
         "iterations to simulate (0: enough for whole deal cycles, up to 130; at most 10000)");
  c.add_flag("--sync", o.sync, "simulate the synchronous optimizer (staleness 0)");
  c.add_flag("--max-seq", o.max_seq, "find the longest sequence that fits --memory-cap, and plan it");
  number(c, "--mlp-chunk", o.mlp_chunk_tokens, "decoders' MLP chunk in tokens (0: 8192)");
  c.add_flag(
      "!--no-save-attention", o.save_attention,
      "plan for decoders that recompute their attention in backward (the runtime's save_attention off)");
}

// The run's shape: a frozen or LoRA run, several nodes, the experts' GEMMs.
void add_run_options(CLI::App& c, PlanCommandOptions& o) {
  c.add_option(
      "--frozen", o.frozen,
      "plan a run whose weights are all frozen in this storage form (f32, bf16, f16, q8_0, q4_0, nf4, "
      "mxfp4, fp8), as a LoRA base");
  number(c, "--lora-r", o.lora_r,
         "plan a LoRA run of this rank on a frozen base (stored as --frozen says, default bf16; 0: none)");
  c.add_option("--lora-targets", o.lora_targets,
               "comma-separated modules the adapters reach (q_proj, ..., down_proj) or all-linear, and "
               "\"experts\" (or experts.gate_up_proj, experts.down_proj) for per-expert adapters in sparse "
               "layers")
      ->capture_default_str();
  number(c, "--nodes", o.nodes,
         "data-parallel replicas: predict N nodes of --gpus GPUs each summing gradients over the network "
         "(mpirun -np N roundpipe train; README \"Several machines\")");
  number(c, "--net-gbps", o.net_gbps,
         "--nodes: network bandwidth per node and direction, Gbit/s (100 = 12.5 GB/s)");
  number(c, "--net-latency-us", o.net_latency_us, "--nodes: latency per message, microseconds");
  number(c, "--accumulation", o.accumulation,
         "--nodes: iterations per optimizer step on each node (the spec's \"accumulation\" counts them over "
         "all nodes: this value x --nodes)");
  number(c, "--grouped-gemm-efficiency", o.grouped_gemm_efficiency,
         "mixture-of-experts: the experts' grouped GEMMs (forward, input gradients) as a fraction of "
         "--peak-tflops (0: 0.33 grouped, 0.6 bucketed, measured on the H200 at Qwen3-30B-A3B shapes)");
  c.add_option(
       "--expert-gemm", o.expert_gemm,
       fmt::format("mixture-of-experts: the spec's \"expert_gemm\": bucketed (padded expert rows: ~6% "
                   "more expert scratch, faster GEMM kernels, but {:.0f} us of host time per batched call, "
                   "one call per bucket, over 4 streams: 1.34x grouped end to end on an H100 SXM at "
                   "GPT-OSS-20B, 1.13x on an H200 at Qwen3-30B-A3B) or grouped (cuBLAS's grouped GEMM); "
                   "given as bucketed, refused on a model without a sparse layer",
                   kBucketedCallSeconds * 1e6))
      ->check(CLI::IsMember({"grouped", "bucketed"}))
      ->capture_default_str();
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanCommandOptions>();
  auto* c = app.add_subcommand("plan", "partition a model for a GPU pool and predict its iteration time");
  c->add_option("--model", o->model, "model folder, config.json or .gguf (weights not needed; required)");
  c->add_option("--gpu", o->gpu,
                "device preset: RTX 3090/4090/5090, A100 40GB/80GB, L40S, H100 SXM/PCIe, H200, B200 "
                "(sets --peak-tflops, --hbm-gbps, --pcie-gbps, --memory-cap unless given; --list-gpus)");
  auto list_gpus = std::make_shared<bool>(false);
  c->add_flag("--list-gpus", *list_gpus, "print the device presets (data sheet and planned rates) and exit");
  number(*c, "--host-gib", o->host_gib,
         "host memory for the run, GiB (0: this machine's): the plan says what the run needs and, when "
         "over, what to change");
  number(*c, "--gpus", o->gpus, "GPUs in the pool");
  add_disk_options(*c, *o);
  add_workload_options(*c, *o);
  add_device_options(*c, *o);
  add_run_options(*c, *o);
  c->callback(reporting_errors([o, c, list_gpus] {
    if (*list_gpus) {
      print_gpu_presets(stdout);
      return;
    }
    std::vector<std::pair<std::string, std::string>> given;
    for (const char* f : kPlanFlagsResolved)
      if (const CLI::Option* opt = c->get_option(f); opt->count() > 0)
        given.emplace_back(f, opt->as<std::string>());
    resolve_plan_flags(*o, given);
    // without a rank there are no adapters: the targets would be ignored without a word
    if (c->get_option("--lora-targets")->count() > 0 && o->lora_r == 0)
      throw UsageError("--lora-targets needs --lora-r (the adapters' rank)");
    run_plan(*o, stdout);
  }));
}

}  // namespace rp
