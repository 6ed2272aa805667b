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
// cap, device error) is one line on stderr and exit 1; a bad argument (a value of the wrong kind
// or out of range, a flag given twice or without its value, an option without the one it needs,
// --seqs not a multiple of --micro, an output file whose folder is missing) one line naming the
// flag and exit 2. --help describes every flag, its unit and default, and which a --preset sets.
// The options, their checks, the presets and the model they describe: throughput_options.hpp.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/host_resources.hpp"
#include "base/json_text.hpp"
#include "bench/bench_main.hpp"
#include "bench/random_weights.hpp"
#include "bench/throughput_options.hpp"
#include "bench/tier_option_names.hpp"
#include "kernels/device.hpp"
#include "model/fp8_linear.hpp"  // fp8_wgrad_reach
#include "model/lora.hpp"
#include "model/model_flops.hpp"
#include "roundpipe/session.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/replan.hpp"
#include "scheduler/run_plan.hpp"
#include "scheduler/stage_peak.hpp"

namespace {

using bench::throughput::Options;
using bench::throughput::usage_error;

constexpr double kGiB = double(1ull << 30);

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

/// The session's options from the command line's (a bad --plan or --tier-spill-layers exits 2).
rp::SessionOptions session_options(const Options& opt, const rp::ModelLayout& m) {
  rp::SessionOptions o;
  o.backend = opt.backend;
  o.workers = opt.workers;
  o.micro_batches = opt.micro;
  o.micro = {opt.seqs / opt.micro, opt.seq};
  o.async = !opt.sync;
  o.device.capacity_bytes = size_t(opt.cap * kGiB);
  o.device.dtype = opt.dtype == "f16" ? rp::DType::f16 : rp::DType::bf16;
  if (opt.dtype == "f16") o.loss_scaling = rp::LossScalerOptions{};  // fp16 needs dynamic loss scaling
  o.device.fp8 = opt.fp8;
  // FP8 weight gradients by default with --fp8; a LoRA run's frozen base computes none
  o.device.fp8_weight_gradients = opt.fp8 && !opt.bf16_wgrad && opt.lora_r == 0;
  o.device.fp8_stored_direct = opt.fp8 && opt.fp8_direct;
  o.device.expert_gemm_bucketed = opt.expert_gemm == "bucketed";
  o.trace = !opt.trace.empty();
  if (!opt.plan_json.empty()) {
    try {
      const nlohmann::json j =
          rp::parse_json_text(opt.plan_json, "--plan", {.unique_keys = true, .lines = false});
      if (!j.is_object()) usage_error("--plan: expected a plan object (JSON as in a spec's \"plan\" key)");
      o.plan = rp::plan_from_json(j, int(m.num_layers()), opt.workers, "--plan");
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
  }
  o.transfer_priorities = !opt.no_prio;
  o.early_gradients = !opt.late_gradients;
  o.transfer_chunk_bytes = size_t(opt.chunk_bytes);
  o.transfer_bulk_inflight = opt.bulk_inflight;
  o.mlp_chunk_tokens = opt.mlp_chunk;
  if (opt.pin_budget_gib >= 0) o.pin_budget_bytes = size_t(opt.pin_budget_gib * kGiB);
  if (opt.no_save_attention) o.save_attention = false;  // else automatic (on where host memory allows)
  if (!opt.frozen_tier.empty()) {
    if (opt.tier_spill_layers > m.num_layers() - 1)
      usage_error(
          fmt::format("--tier-spill-layers {}: expected 0..{} (the layers with a saved input: all "
                      "but the first of {})",
                      opt.tier_spill_layers, m.num_layers() - 1, m.num_layers()));
    o.frozen_tier = rp::FrozenTierOptions{opt.frozen_tier, opt.tier_ring_gib, opt.tier_resident_gib};
    o.frozen_tier->host_budget_gib = opt.tier_host_budget_gib;
    o.frozen_tier->spill_layers = opt.tier_spill_layers;
    o.frozen_source = bench::frozen_source(m);
  }
  return o;
}

/// What the planner predicts of the plan the session runs.
struct PlanPrediction {
  rp::IterationPlan plan;     ///< the plan chosen at the cap (or the given one)
  int64_t working_set = 0;    ///< the largest stage's working set
  int64_t with_prefetch = 0;  ///< ... with room for the next stage's weights beside it
  rp::PeakEstimate peak;      ///< the peak across stage switches under the run's cap
};

/// The planner's working set of the plan (the memory model a cap is checked against): the plan
/// the session will choose at this cap (automatic) or the given one: plan_run
/// (scheduler/run_plan.hpp) with the inputs the session passes it. With --cap-above-plan, `o`
/// runs that plan with the cap just above its working set. Prints the "plan" line.
PlanPrediction predict_plan(const Options& opt, const rp::ModelLayout& m, rp::SessionOptions& o) {
  const bool on_cpu = opt.backend == "cpu";  // fp32 virtual GPUs with 256-byte pool rounding
  rp::RunPlanInputs rin;
  rin.layout = &m;
  rin.micro = o.micro;
  rin.micro_batches = opt.micro;
  rin.workers = opt.workers;
  rin.compute = on_cpu ? rp::DType::f32 : o.device.dtype;
  rin.device = rp::backend_device_model(opt.backend, o.device.pcie_bytes_per_s, rin.compute, o.device.fp8,
                                        o.device.fp8_weight_gradients, o.device.expert_gemm_bucketed);
  rin.mlp_chunk_tokens = opt.mlp_chunk;
  rin.device_capacity = int64_t(o.device.capacity_bytes);
  rin.alloc_granule = on_cpu ? 256 : int64_t(rp::kCudaPoolGranule);
  rin.plan = o.plan;
  rin.save_attention = o.save_attention;
  const rp::RunPlan run_plan = rp::plan_run(rin);
  PlanPrediction p;
  p.plan = run_plan.plan;
  // the largest stage's working set, and with room for the next stage's weights beside it (the
  // worker prefetches them when the cap allows, so a generous cap's peak is nearer the latter)
  const std::vector<rp::StageEstimate> stage_est =
      rp::check_plan(run_plan.costs, p.plan, run_plan.partition, "plan");
  for (const auto& e : stage_est) {
    p.working_set = std::max(p.working_set, e.work_bytes);
    p.with_prefetch = std::max(p.with_prefetch, e.memory_bytes);
  }
  if (opt.cap_above_plan > 0) {  // run that plan with the cap just above its working set
    o.plan = p.plan;
    o.device.capacity_bytes = size_t(double(p.working_set) * (1 + opt.cap_above_plan));
  }
  // the peak across stage switches (scheduler/stage_peak.hpp) under the cap the run gets
  rp::PartitionOptions peak_po = run_plan.partition;
  peak_po.memory_cap = int64_t(o.device.capacity_bytes);
  p.peak = rp::predict_peak(stage_est, peak_po);
  std::printf("plan %s: predicted working set %.2f GiB, peak at stage switches %.2f GiB, cap %.2f GiB\n",
              p.plan.summary().c_str(), double(p.working_set) / kGiB, double(p.peak.bytes) / kGiB,
              double(o.device.capacity_bytes) / kGiB);
  return p;
}

/// The "model" line, and with LoRA the adapters' line.
void print_model(const Options& opt, const rp::ModelConfig& c, const rp::ModelLayout& m,
                 const std::optional<rp::LoraConfig>& lora) {
  int64_t frozen_bytes = 0, trainable = 0;
  for (const auto& g : m.groups) g.frozen ? frozen_bytes += g.storage_bytes : trainable += g.numel;
  std::printf("model %s: %.2f B parameters, %.2f B active per token\n", c.architecture.c_str(),
              double(c.num_parameters()) / 1e9, double(c.num_active_parameters()) / 1e9);
  if (lora)
    std::printf("LoRA r=%lld on %s%s, base %s: %.2f GB of frozen weights, %lld trainable parameters\n",
                (long long)lora->r, opt.lora_targets.c_str(),
                c.num_moe_layers() > 0 ? " (attention only in sparse layers)" : "", opt.base_format.c_str(),
                double(frozen_bytes) / 1e9, (long long)trainable);
}

/// The session; the tier's errors name the bench's options, not the spec's keys.
std::unique_ptr<rp::Session> make_session(const rp::ModelLayout& m, std::vector<std::vector<float>> w,
                                          std::vector<std::vector<uint8_t>> frozen,
                                          const rp::SessionOptions& o) {
  try {
    return std::make_unique<rp::Session>(m, std::move(w), std::move(frozen), o);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(bench::tier_option_names(e.what()));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(bench::tier_option_names(e.what()));
  }
}

/// The "session ready" line: start-up time since `t0`, device, plan and host buffers.
void print_session_ready(const rp::Session& s, std::chrono::steady_clock::time_point t0, bool on_cpu) {
  const rp::HostPinning pins = s.host_pinning();
  std::printf(
      "session ready in %.1f s: %s, plan %s; host buffers %s %s, pageable %s (%s frozen weights), pin budget "
      "%s\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), s.device_name().c_str(),
      s.plan().summary().c_str(),
      on_cpu ? "counted as pinned (the CPU backend page-locks nothing)" : "pinned",
      rp::byte_text(double(pins.pinned_bytes)).c_str(), rp::byte_text(double(pins.pageable_bytes)).c_str(),
      rp::byte_text(double(pins.pageable_frozen_bytes)).c_str(), rp::byte_text(double(pins.budget)).c_str());
}

/// The disk tier and the activation spill as the session set them up ("" without them), for the
/// row and the RESULT line; the tier's start line is in the runtime's log (frozen tier: <path>:
/// built|reused ...).
std::string tier_text(const rp::Session& s, const Options& opt) {
  const rp::FrozenTierReport& t = s.frozen_tier();
  std::string text =
      t.enabled
          ? fmt::format(
                ", frozen tier {} x {:.1f} MiB{}{}", t.ring_buffers, double(t.buffer_bytes) / double(1 << 20),
                t.resident_bytes > 0 ? fmt::format(", {:.2f} GiB resident", double(t.resident_bytes) / kGiB)
                                     : std::string(),
                opt.tier_host_budget_gib > 0 ? fmt::format(", host budget {} GiB", opt.tier_host_budget_gib)
                                             : std::string())
          : std::string();
  if (t.probe_gbps > 0) text += fmt::format(", disk probe {:.2f} GB/s", t.probe_gbps);
  if (!t.spill_layers.empty())  // its start line is in the runtime's log too
    text += fmt::format(", activation spill {} layers ({})", t.spill_layers.size(),
                        rp::byte_text(double(t.spill_bytes)));
  return text;
}

/// The timed steps: when each step completed, and the tier's reads at the end of the warm-up and
/// of the last measured step.
struct Timeline {
  std::vector<double> done_at;  ///< seconds, one per step from the first
  rp::FrozenTierReads reads0, reads1;
  double step_seconds = 0;  ///< the median over the measured steps of the time between completions
};

/// Runs --warmup + --steps steps of `n` random tokens, printing a line per step.
Timeline run_steps(rp::Session& s, const Options& opt, int64_t n) {
  std::mt19937 rng(1);
  std::vector<int32_t> ids(n), tg(n);
  Timeline tl;
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const int total = opt.warmup + opt.steps;
  // With a disk tier one more step goes in, unmeasured: the reads it makes while the last measured
  // step runs balance those the first measured step made before the window opened, so the DISK
  // line's window holds whole steps' reads (the tier reads a stage's groups ahead of it).
  const int extra = s.frozen_tier().enabled ? 1 : 0;
  for (int t = 0; t < total + extra; ++t) {
    for (int64_t i = 0; i < n; ++i) ids[i] = int32_t(rng() % opt.vocab);
    for (int64_t i = 0; i < n; ++i) tg[i] = (i + 1) % opt.seq == 0 ? -100 : ids[i + 1];
    s.forward_backward(ids, tg);
    s.step(1e-5);
    if (t >= 1) {
      auto r = s.wait(t - 1);
      tl.done_at.push_back(now());
      if (t == opt.warmup) tl.reads0 = s.frozen_tier_reads();
      if (t == total) tl.reads1 = s.frozen_tier_reads();
      const double loss = r.loss_sum / r.tokens;
      std::printf("step %d loss %.4f (%.2f s)%s\n", t - 1, loss, r.seconds, expert_use(r).c_str());
      std::fflush(stdout);
    }
  }
  if (extra == 0) {
    const rp::StepResult last = s.wait(total - 1);
    tl.done_at.push_back(now());
    if (opt.experts > 0) std::printf("step %d%s\n", total - 1, expert_use(last).c_str());
  } else {
    s.wait(total);
  }
  std::vector<double> dts;
  for (int t = opt.warmup; t < total; ++t) dts.push_back(tl.done_at[t] - tl.done_at[t - 1]);
  std::sort(dts.begin(), dts.end());
  tl.step_seconds = dts[dts.size() / 2];
  return tl;
}

/// The row's and the RESULT line's transfer settings: priorities, the saved attention, the tier.
std::string transfer_text(const Options& opt, const rp::Session& s, const std::string& tier) {
  return std::string(opt.no_prio ? "no priorities" : "priorities") +
         (opt.late_gradients ? ", late gradients" : "") +
         (opt.no_save_attention || s.frozen_tier().attention_dropped || opt.tier_spill_layers > 0
              ? ", attention recomputed"
              : ", attention saved") +
         tier;
}

/// The row's model and batch: LoRA, the decoders' shape (experts or FFN width), the tokens.
std::string shape_text(const Options& opt, const rp::ModelConfig& c,
                       const std::optional<rp::LoraConfig>& lora) {
  return fmt::format(
      "{}L{} H{} {}q/{}kv {}, {}x{} tokens, M={}",
      lora ? fmt::format("LoRA r={} {} base {}, ", lora->r, opt.lora_targets, opt.base_format)
           : std::string(),
      opt.layers, opt.hidden, opt.heads, opt.kv,
      opt.experts > 0
          ? fmt::format("{} experts top-{} Fe{} in {} sparse layers{}", opt.experts, opt.top_k,
                        c.moe_intermediate_size, c.num_moe_layers(), ", " + opt.expert_gemm + " expert GEMMs")
          : fmt::format("F{}", opt.ffn),
      opt.seqs, opt.seq, opt.micro);
}

/// The DISK line: what the measured steps read from the tier's cache file.
void print_disk_reads(const Options& opt, const Timeline& tl) {
  const int total = opt.warmup + opt.steps;
  const double gb = double(tl.reads1.bytes - tl.reads0.bytes) / 1e9,
               secs = tl.reads1.seconds - tl.reads0.seconds;
  const double window = tl.done_at[size_t(total - 1)] - tl.done_at[size_t(opt.warmup - 1)];
  std::printf(
      "DISK frozen tier read %s per iteration (%.1f reads) at %.2f GB/s while reading; the "
      "reader busy %.0f%% of the measured steps\n",
      rp::byte_text(double(tl.reads1.bytes - tl.reads0.bytes) / opt.steps).c_str(),
      double(tl.reads1.reads - tl.reads0.reads) / opt.steps, secs > 0 ? gb / secs : 0.0,
      window > 0 ? 100 * secs / window : 0.0);
}

/// The measured run: the RESULT line (tokens/s, MFU, memory against the prediction), the DISK line
/// with a tier, and the markdown row appended to --results.
/// " + fp8 linears", with " and weight gradients" where FP8 weight gradients ran: only for the
/// linears whose input width is a multiple of 16 ("N of M" when not all); ", base from its stored
/// codes" where an fp8 base ran from them (--fp8-stored-direct), so its rows read apart from the
/// default path's.
std::string fp8_text(const rp::ModelConfig& c, const rp::DeviceOptions& d) {
  const rp::Fp8WgradReach r = rp::fp8_wgrad_reach(c);
  std::string s = " + fp8 linears";
  if (d.fp8_weight_gradients && r.fp8_wgrad == r.linears) s += " and weight gradients";
  else if (d.fp8_weight_gradients && r.fp8_wgrad > 0)
    s += fmt::format(" and weight gradients ({} of {})", r.fp8_wgrad, r.linears);
  if (d.fp8_stored_direct) s += ", base from its stored codes";
  return s;
}

void report(const Options& opt, const rp::ModelConfig& c, const rp::ModelLayout& m,
            const std::optional<rp::LoraConfig>& lora, const rp::Session& s, const rp::SessionOptions& o,
            const PlanPrediction& pred, const Timeline& tl, const std::string& tier) {
  const double dt = tl.step_seconds;
  const double tps = double(opt.micro * o.micro.tokens()) / dt;
  // training FLOPs per token as the trainer counts them (model/model_flops.hpp: 6 per trained
  // matmul weight, 4 per frozen one, a sparse layer's router and top-k experts, the attention)
  const double flops_per_token = rp::model_flops_per_token(m, opt.seq);
  const double mfu = tps * flops_per_token / 790e12;
  const double peak = s.peak_device_bytes() / kGiB;
  const char* attn = std::getenv("RP_CUDA_ATTENTION");
  const std::string xfer = transfer_text(opt, s, tier);
  const std::string chunks =
      opt.chunk_bytes > 0
          ? fmt::format("{} MiB chunks x {}", opt.chunk_bytes / double(1 << 20), opt.bulk_inflight)
          : "no chunks";
  const double rss = max_rss_gib();
  const double weight_gb = weight_bytes_per_iteration(m, s.plan(), rp::dtype_size(o.device.dtype)) / 1e9;
  const std::string row = fmt::format(
      "| roundpipe ({} x {}, {}, {}, attention {}, {}, {}; {}) | {:.0f} | {:.3f} | {:.2f} | {:.1f} | {:.2f} "
      "|",
      opt.workers, opt.backend, opt.sync ? "sync" : "async",
      opt.fp8 ? opt.dtype + fp8_text(c, o.device) : opt.dtype, attn && *attn ? attn : "auto", xfer, chunks,
      shape_text(opt, c, lora), tps, mfu, peak, rss, dt);
  const int64_t predicted = pred.working_set;
  const int64_t predicted_prefetch = std::min(pred.with_prefetch, int64_t(o.device.capacity_bytes));
  std::printf(
      "RESULT tokens/s %.1f  MFU %.3f  peak device memory %.2f GiB (predicted working set %.2f, "
      "measured/predicted %.3f; "
      "with the next stage's weights prefetched %.2f, measured/predicted %.3f; predicted peak at stage "
      "switches "
      "%.2f, measured/predicted %.3f)  host max RSS %.1f GiB  step %.3f s  "
      "weights uploaded %.2f GB per iteration  (%s; %s, %s)\n",
      tps, mfu, peak, double(predicted) / kGiB, double(s.peak_device_bytes()) / double(predicted),
      double(predicted_prefetch) / kGiB,
      double(s.peak_device_bytes()) / double(std::max<int64_t>(predicted_prefetch, 1)),
      double(pred.peak.bytes) / kGiB,
      double(s.peak_device_bytes()) / double(std::max<int64_t>(pred.peak.bytes, 1)), rss, dt, weight_gb,
      s.plan().summary().c_str(), xfer.c_str(), chunks.c_str());
  if (s.frozen_tier().enabled) print_disk_reads(opt, tl);
  if (!opt.results.empty()) {
    std::ofstream f(opt.results, std::ios::app);
    if (!(f << row << "\n") || !f.flush())
      throw std::runtime_error(fmt::format("--results {}: cannot append the row (disk full?)", opt.results));
  }
}

int run(int argc, char** argv) {
  Options opt;
  if (const std::optional<int> code = bench::throughput::parse(argc, argv, opt)) return *code;
  const rp::ModelConfig c = bench::throughput::model_config(opt);
  const std::optional<rp::LoraConfig> lora = bench::throughput::lora_config(opt);
  rp::ModelLayout m = lora ? rp::make_layout(c, *lora) : rp::make_layout(c);
  std::vector<std::vector<float>> w;
  std::vector<std::vector<uint8_t>> frozen;
  // with a disk tier the frozen groups are made one at a time as its cache is written (and not
  // at all when a valid cache is reused): the start-up never holds the whole base
  bench::random_weights(m, w, frozen, /*lazy=*/!opt.frozen_tier.empty());
  rp::SessionOptions o = session_options(opt, m);
  const PlanPrediction pred = predict_plan(opt, m, o);
  const auto t0 = std::chrono::steady_clock::now();
  print_model(opt, c, m, lora);
  const std::unique_ptr<rp::Session> session = make_session(m, std::move(w), std::move(frozen), o);
  rp::Session& s = *session;
  print_session_ready(s, t0, opt.backend == "cpu");
  const std::string tier = tier_text(s, opt);
  const Timeline tl = run_steps(s, opt, opt.micro * o.micro.tokens());
  report(opt, c, m, lora, s, o, pred, tl, tier);
  if (!opt.trace.empty()) s.write_trace(opt.trace);
  if (!opt.profile_out.empty()) s.save_profile(opt.profile_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::guarded_main("bench_throughput", [&] { return run(argc, argv); });
}
