#include "cli/plan.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checked_math.hpp"
#include "base/counted.hpp"
#include "cli/command.hpp"
#include "cli/plan_disk.hpp"
#include "formats/gguf.hpp"
#include "kernels/device.hpp"
#include "kernels/moe_buckets.hpp"  // expected_bucket_count
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "model/fp8_linear.hpp"  // fp8_wgrad_reach
#include "model/layout.hpp"
#include "model/lora.hpp"
#include "roundpipe/spec.hpp"
#include "scheduler/gpu_presets.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/profile.hpp"
#include "scheduler/replan.hpp"
#include "scheduler/replica_cost.hpp"
#include "scheduler/run_plan.hpp"
#include "scheduler/simulator.hpp"
#include "scheduler/stage_peak.hpp"

namespace fs = std::filesystem;

namespace rp {

namespace {

// "a,b, c" -> {"a", "b", "c"} (empty items dropped)
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  for (size_t a = 0; a <= s.size();) {
    size_t b = std::min(s.find(',', a), s.size());
    std::string item = s.substr(a, b - a);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) v.push_back(item);
    a = b + 1;
  }
  return v;
}

std::string ms(double s) { return fmt::format("{:.2f} ms", s * 1e3); }

std::string layers_text(const Stage& s, int n) {
  auto name = [n](int l) {
    return l == 0 ? std::string("emb") : l == n - 1 ? std::string("tail") : fmt::format("d{}", l - 1);
  };
  const int a = s.kind == StageKind::backward ? s.last : s.first;
  const int b = s.kind == StageKind::backward ? s.first : s.last;
  return a == b ? fmt::format("{} ({})", a, name(a)) : fmt::format("{}-{} ({}..{})", a, b, name(a), name(b));
}

}  // namespace

namespace {

// The model's config (a folder, its config.json or a .gguf's metadata).
ModelConfig plan_config(const PlanCommandOptions& o) {
  std::error_code ec;
  std::string file = o.model;
  if (fs::is_directory(file, ec)) file = (fs::path(file) / "config.json").string();
  if (fs::path(file).extension() == ".gguf") {
    GgufFile g(file);
    return config_from_gguf(g);
  }
  return load_config_file(file);
}

// The layout of a --frozen or --lora-r run (its frozen groups and adapters), or nullopt for
// full fine-tuning.
std::optional<ModelLayout> run_layout(const PlanCommandOptions& o);

DeviceModel device_model(const PlanCommandOptions& o, const std::optional<ModelLayout>& layout) {
  DeviceModel d;
  d.peak_flops = o.peak_tflops * 1e12;
  if (o.fp8) d.fp8_flops = (o.fp8_tflops > 0 ? o.fp8_tflops : kFp8SpeedupH200 * o.peak_tflops) * 1e12;
  d.fp8_weight_gradients = o.fp8 && !o.bf16_wgrad && !layout;  // as the spec's default: full fine-tuning
  d.mem_bandwidth = o.hbm_gbps * 1e9;
  d.pcie_bandwidth = o.pcie_gbps * 1e9;
  d.mlp_chunk_tokens = o.mlp_chunk_tokens;
  d.saved_attention = o.save_attention;
  d.expert_padded = o.expert_gemm == "bucketed";
  d.grouped_gemm_efficiency = o.grouped_gemm_efficiency > 0 ? o.grouped_gemm_efficiency
                              : d.expert_padded             ? kBucketedGemmEfficiency
                                                            : d.grouped_gemm_efficiency;
  if (layout) lora_device_model(d, *layout);  // adapters' scratch; frozen decoders compute no weight gradient
  return d;
}

PartitionOptions partition_options(const PlanCommandOptions& o, int64_t cap) {
  PartitionOptions po;
  po.gpus = o.gpus;
  po.micro_batches = o.micro_batches;
  po.pcie_bandwidth = o.pcie_gbps * 1e9;
  po.memory_cap = cap;
  po.alloc_granule = int64_t(kCudaPoolGranule);  // plans are for GPUs
  return po;
}

std::optional<ModelLayout> run_layout(const PlanCommandOptions& o) {
  if (o.frozen.empty() && o.lora_r == 0) return std::nullopt;
  check_lora_r(o.lora_r);  // the flags' other checks ran before (check_plan_options)
  WeightFormat f = frozen_format(o);
  const ModelConfig c = plan_config(o);
  if (f == WeightFormat::mxfp4 && c.num_experts == 0)
    f = WeightFormat::bf16;  // the experts' form only, as a run
  if (o.lora_r > 0) {        // adapters on a base frozen in f (make_layout freezes it)
    LoraConfig lc;
    lc.r = o.lora_r;
    lc.alpha = double(o.lora_r);
    set_lora_targets(lc, split_list(o.lora_targets));
    lc.base_format = f;
    try {
      return make_layout(c, lc);
    } catch (const std::invalid_argument& e) {
      throw UsageError(
          fmt::format("--lora-targets: {} (the flag also takes experts, experts.gate_up_proj and "
                      "experts.down_proj)",
                      e.what()));
    }
  }
  ModelLayout m = make_layout(c);
  for (int g = 0; g < int(m.groups.size()); ++g) freeze_group(m, g, f);
  return m;
}

// The layout of the planned run: run_layout's, or the plain model's for full fine-tuning.
ModelLayout plan_layout(const PlanCommandOptions& o) {
  std::optional<ModelLayout> m = run_layout(o);
  return m ? std::move(*m) : make_layout(plan_config(o));
}

}  // namespace

// (the plan prints the host need and its alternatives itself: host_memory_need)
RunPlanInputs plan_inputs(const ModelLayout& layout, const PlanCommandOptions& o, int64_t seq, int64_t cap) {
  RunPlanInputs in;
  in.layout = &layout;
  in.micro = {o.sequences_per_micro, seq};
  in.micro_batches = o.micro_batches;
  in.workers = o.gpus;
  in.compute = DType::bf16;  // plans are for bf16 GPUs
  in.device = device_model(o, std::nullopt);
  in.mlp_chunk_tokens = o.mlp_chunk_tokens;
  in.device_capacity = cap;
  in.alloc_granule = int64_t(kCudaPoolGranule);
  in.save_attention = o.save_attention;
  return in;
}

namespace {

// The run plan for sequences of `seq` tokens under `cap`, or nullopt when none fits (with
// `without_waiting`: also when its peak across stage switches does not).
std::optional<RunPlan> plan_at(const PlanCommandOptions& o, int64_t seq, int64_t cap,
                               bool without_waiting = false) {
  const ModelLayout layout = plan_layout(o);
  try {
    RunPlan r = plan_run(plan_inputs(layout, o, seq, cap));
    if (without_waiting && predict_peak(r.automatic->stages, r.partition).unbounded > cap)
      return std::nullopt;
    return r;
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
}

SimOptions sim_options(const PlanCommandOptions& o, const DeviceModel& d) {
  SimOptions so;
  so.gpus = o.gpus;
  so.micro_batches = o.micro_batches;
  so.iterations = o.iterations;
  so.bandwidth = StreamBandwidths::uniform(d.pcie_bandwidth);
  so.staleness = o.sync ? 0 : 1;
  return so;
}

// The predicted tokens/s of the analytic plan of o under its memory cap, or nullopt when no
// plan fits (the host-memory advice's speed of each change).
std::optional<double> predicted_tokens_per_s(const PlanCommandOptions& o) {
  const int64_t cap = o.memory_cap.empty() ? 0 : parse_byte_size(o.memory_cap, "--memory-cap");
  const std::optional<RunPlan> pr = plan_at(o, o.seq_len, cap);
  if (!pr) return std::nullopt;
  const SimResult r = simulate(pr->plan, stage_costs(pr->costs, pr->plan, partition_options(o, cap)),
                               sim_options(o, device_model(o, run_layout(o))));
  return double(o.micro_batches * o.sequences_per_micro * o.seq_len) / r.iteration_seconds;
}

}  // namespace

int64_t longest_sequence(const PlanCommandOptions& o, int64_t cap, bool without_waiting) {
  if (cap <= 0) throw std::invalid_argument("--max-seq needs --memory-cap");
  constexpr int64_t kStep = 1024;
  if (without_waiting) {
    // Fitting without waiting is not monotonic in the length: the partitioner sizes its stages
    // by working set, so a shorter sequence can get stages with more decoders whose switches
    // (retired outputs + the next stage's weights) pass the cap while a longer one's do not.
    // Every length that fits without waiting fits by working set, so scan down from that
    // bound in coarse steps, then refine upwards inside the step that fits.
    const int64_t top = longest_sequence(o, cap, false);
    const int64_t coarse = std::max(kStep, top / 64 / kStep * kStep);
    for (int64_t l = top; l >= kStep; l -= coarse) {
      if (!plan_at(o, l, cap, true)) continue;
      int64_t best = l;
      for (int64_t f = std::min(top, l + coarse - kStep); f > l; f -= kStep)
        if (plan_at(o, f, cap, true)) {
          best = f;
          break;
        }
      return best;
    }
    return 0;
  }
  int64_t lo = 0, hi = kStep;  // lo fits (0: nothing yet), hi is the next guess
  while (plan_at(o, hi, cap)) {
    lo = hi;
    if (hi > (int64_t(1) << 40)) return lo;
    hi *= 2;
  }
  while (hi - lo > kStep) {  // lo fits, hi does not
    const int64_t mid = (lo + hi) / 2 / kStep * kStep;
    if (plan_at(o, mid, cap)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/// --nodes: what summing the gradients over the nodes costs per step and how much of it the
/// next step hides (scheduler/replica_cost.hpp).
static void print_nodes(std::FILE* out, const PlanCommandOptions& o, const std::vector<LayerCost>& costs,
                        const DeviceModel& d, bool tied, double iteration_s, int64_t tokens) {
  const ReductionEstimate e = estimate_reduction(costs, d.grad_elem_bytes, o.nodes, o.net_gbps * 1e9 / 8,
                                                 o.net_latency_us * 1e-6, iteration_s, o.accumulation, tied);
  const double step = iteration_s * double(o.accumulation);
  const double global = double(tokens) * double(o.accumulation) * o.nodes;
  fmt::print(out,
             "\nnodes     {} x {} GPUs, {:g} Gbit/s per node: {:.3g}G gradient values ({}) summed per step; "
             "each node "
             "sends and receives {} (2 (N-1)/N of them), {} on the link\n",
             o.nodes, o.gpus, o.net_gbps, e.values / 1e9, format_bytes(e.values * 4),
             format_bytes(e.bytes_per_node), ms(e.link_s));
  fmt::print(out, "          step of {} per node: compute {}, link busy {:.0f}% of it\n",
             counted(o.accumulation, "iteration"), ms(step), 100 * e.link_s / step);
  fmt::print(out, "          async: {} -> step {}, {:.0f} tokens/s over {} nodes ({:.2f}x one node)\n",
             e.exposed_async_s > 0 ? fmt::format("the link cannot keep up, {} exposed", ms(e.exposed_async_s))
                                   : std::string("hidden under the next step"),
             ms(e.step_async_s), global / e.step_async_s, o.nodes, o.nodes * step / e.step_async_s);
  fmt::print(out,
             "          sync:  {} exposed after the step's last gradient -> step {}, {:.0f} tokens/s "
             "({:.2f}x one node)\n",
             ms(e.exposed_sync_s), ms(e.step_sync_s), global / e.step_sync_s, o.nodes * step / e.step_sync_s);
  if (e.exposed_async_s > 0)
    fmt::print(out,
               "          async hides the sum from --accumulation {} ({} iterations per step on each node)\n",
               e.passes_to_hide, e.passes_to_hide);
}

/// --max-seq: the longest sequence that fits --memory-cap, printed with its notes.
static int64_t print_longest_sequence(const PlanCommandOptions& o, std::FILE* out) {
  const int64_t cap = parse_byte_size(o.memory_cap, "--memory-cap");
  const int64_t best = longest_sequence(o, cap);
  if (best == 0)
    throw std::runtime_error(
        fmt::format("no plan fits {} per GPU even at 1024 tokens per sequence", format_bytes(double(cap))));
  fmt::print(out,
             "longest   {} tokens per sequence fit {} per GPU ({} of {}); {} "
             "without waiting at stage switches (peak below); the plan for it:\n\n",
             best, format_bytes(double(cap)), counted(o.micro_batches, "micro-batch", "micro-batches"),
             counted(o.sequences_per_micro, "sequence"), longest_sequence(o, cap, true));
  if (const int64_t max_pos = plan_layout(o).config.max_position_embeddings; max_pos > 0 && best > max_pos)
    fmt::print(out,
               "note      that is past the model's max_position_embeddings {}: memory allows it, the "
               "model was not trained for it (train warns; plan with --seq {} to stay within it)\n\n",
               max_pos, max_pos);
  return best;
}

namespace {

/// The flags that plan linear compute `mode` (linear_compute_name).
std::string linear_compute_flags(const std::string& mode) {
  return mode == "bf16" ? "without --fp8" : mode == "fp8" ? "with --fp8 --bf16-wgrad" : "with --fp8";
}

/// --profile's linear compute against the plan's (`fp8_wgrad`: DeviceModel::fp8_weight_gradients):
/// a profile measured in another is refused naming the file, its mode and the flags; one that
/// does not record it (written before it was) is a warning on the costs line.
void check_profile_compute(const Profile& profile, const PlanCommandOptions& o, const ModelLayout& planned,
                           bool fp8_wgrad, std::string& source) {
  // as the runtime records it: FP8 weight gradients where some linear's input width allows them
  const std::string mode =
      linear_compute_name(o.fp8, fp8_wgrad && fp8_wgrad_reach(planned.config).fp8_wgrad > 0);
  const std::string given = !o.fp8 ? "no --fp8" : o.bf16_wgrad ? "--fp8 --bf16-wgrad" : "--fp8";
  if (profile.linear_compute.empty()) {
    source += fmt::format(
        "; warning: it does not record the linear compute it was measured in (written before "
        "profiles did), planned as {} ({})",
        mode, given);
    return;
  }
  if (profile.linear_compute == mode) return;
  std::string flags = linear_compute_flags(profile.linear_compute);
  // FP8 weight gradients were measured: a plan over a frozen base cannot have them
  if (profile.linear_compute == "fp8+wgrad" && (o.lora_r > 0 || !o.frozen.empty()))
    flags += " and without --lora-r / --frozen (a frozen base computes no weight gradient)";
  throw std::runtime_error(fmt::format(
      "{}: measured with linear layers in {}, planned in {} ({}); plan it {} or measure a profile in {}",
      o.profile, profile.linear_compute, mode, given, flags, mode));
}

/// --profile: the measured profile (checked against the planned layout and linear compute) and
/// the costs line's words; no profile: the analytic model.
std::optional<Profile> plan_profile(const PlanCommandOptions& o, const PlanCommandOptions& oo,
                                    const ModelLayout& planned, bool fp8_wgrad, std::string& source) {
  source = "analytic (FLOPs and bytes per layer)";
  if (o.profile.empty()) return std::nullopt;
  Profile profile = Profile::load(o.profile);
  if (profile.num_layers() != planned.num_layers())
    throw std::runtime_error(fmt::format("{}: profile of {} layers, the model has {}", o.profile,
                                         profile.num_layers(), planned.num_layers()));
  source = fmt::format("profile {} (calibrating the analytic model)", o.profile);
  if (profile.n_seq() != oo.sequences_per_micro || profile.seq_len() != oo.seq_len)
    source += fmt::format(
        "; warning: measured at {} x {} tokens a micro-batch, planned at {} x {}: the measured layers keep "
        "the measured times, so the plan's are those of the measured shape (measure a profile at {} x {} for "
        "this plan)",
        profile.n_seq(), profile.seq_len(), oo.sequences_per_micro, oo.seq_len, oo.sequences_per_micro,
        oo.seq_len);
  check_profile_compute(profile, o, planned, fp8_wgrad, source);
  return profile;
}

/// The lines before the plan: model, workload, device, costs, and the LoRA / frozen / experts
/// lines where they apply.
/// ", their weight gradients too" where FP8 weight gradients run: for the linears whose input
/// width is a multiple of 16 ("N of M" when not all; none: nothing).
std::string fp8_wgrad_text(bool wgrad, const ModelConfig& planned) {
  if (!wgrad) return "";
  const Fp8WgradReach r = fp8_wgrad_reach(planned);
  if (r.fp8_wgrad == 0) return ", weight gradients bf16: no linear's input width is a multiple of 16";
  if (r.fp8_wgrad == r.linears) return ", their weight gradients too";
  return fmt::format(", the weight gradients of {} of {}", r.fp8_wgrad, r.linears);
}

void print_plan_header(std::FILE* out, const PlanCommandOptions& o, const PlanCommandOptions& oo,
                       const ModelShape& m, const std::string& desc, const std::optional<ModelLayout>& layout,
                       const DeviceModel& d, int64_t cap, int64_t tokens, const std::string& source,
                       const ModelConfig& planned) {
  fmt::print(out, "model     {}\n", desc);
  fmt::print(out, "workload  {}, {} of {} x {} = {} per iteration\n", counted(o.gpus, "GPU"),
             counted(o.micro_batches, "micro-batch", "micro-batches"), o.sequences_per_micro,
             counted(oo.seq_len, "token"), counted(tokens, "token"));
  const GpuPreset* preset = o.gpu.empty() ? nullptr : find_gpu_preset(o.gpu);
  fmt::print(out,
             "device    {}{} TFLOP/s, memory {:.4g} GB/s, PCIe {:.4g} GB/s per direction, memory cap {}\n",
             preset ? fmt::format("{} ({}; plan --list-gpus): ", preset->name,
                                  achievable_rates(*preset).measured ? "measured" : "data sheet x efficiency")
                    : std::string(),
             o.fp8 ? fmt::format("{:.4g} (FP8 linears {:.4g}{})", o.peak_tflops,
                                 device_model(o, std::nullopt).fp8_flops / 1e12,
                                 fp8_wgrad_text(d.fp8_weight_gradients, planned))
                   : fmt::format("{:.4g}", o.peak_tflops),
             o.hbm_gbps, o.pcie_gbps, cap > 0 ? format_bytes(double(cap)) : std::string("none"));
  fmt::print(out, "costs     {}\n", source);
  // mxfp4 is the experts' form (make_layout keeps the other weights bf16)
  std::string form = o.frozen.empty() ? "bf16" : o.frozen;
  if (form == "mxfp4")
    form = m.num_experts > 0 ? "mxfp4 (experts; the other weights bf16)"
                             : "bf16 (mxfp4 applies to "
                               "experts; this model has none)";
  if (o.lora_r > 0) {
    int64_t trainable = 0;
    for (const ParamGroup& g : layout->groups) trainable += g.frozen ? 0 : g.numel;
    fmt::print(
        out,
        "lora      r={} on {}{}, {} trainable parameters; base stored in {} (no gradients; uploads "
        "and staging of the storage form)\n",
        o.lora_r, o.lora_targets,
        m.num_moe_layers() > 0 && !lora_has_expert_targets(*layout->lora) ? " (no expert adapters)" : "",
        trainable, form);
  } else if (!o.frozen.empty()) {
    fmt::print(out,
               "frozen    weights stored in {} (no gradients; uploads and staging of the storage form)\n",
               form);
  }
  if (m.num_experts > 0) {
    fmt::print(out,
               "experts   {}: FLOPs of router + top-{} experts per token ({} GEMMs at {:g} of "
               "peak), bytes and memory of all {} experts\n",
               counted(m.num_moe_layers(), "sparse layer"), m.experts_per_token,
               d.expert_padded ? "bucketed" : "grouped", d.grouped_gemm_efficiency, m.num_experts);
    const int64_t rows = o.seq_len * o.sequences_per_micro * m.experts_per_token;  // one micro-batch's
    if (d.expert_padded && d.bucketed_call_seconds > 0)
      fmt::print(
          out,
          "          bucketed: {:g} us of host time per batched call leaves the GPU idle, one call per "
          "bucket ({} expected per grouped linear of one micro-batch)\n",
          d.bucketed_call_seconds * 1e6, expected_bucket_count(double(rows), std::min(m.num_experts, rows)));
  }
}

/// The plan's line, its stages' table and the predicted peak memory per GPU.
/// `given`: the plan is --plan's, not the partitioner's.
void print_stages(std::FILE* out, const PartitionResult& pr, const PartitionOptions& po, double plan_s,
                  bool given) {
  if (given)
    fmt::print(out, "plan      {} forward + 1 tail + {} backward stages, given with --plan\n",
               pr.plan.num_forward(), pr.plan.num_backward());
  else
    fmt::print(out,
               "plan      {} forward + 1 tail + {} backward stages, found in {:.2f} ms ({} candidates, {} "
               "packings)\n",
               pr.plan.num_forward(), pr.plan.num_backward(), plan_s * 1e3, pr.candidates, pr.evaluations);
  fmt::print(out, "          {}\n\n", pr.plan.summary());

  // the memory column: StageEstimate::memory_bytes where there is room to prefetch, else work_bytes
  fmt::print(out, "          memory = working set (weights, gradients, activations, scratch){}\n",
             po.weight_buffers > 1 ? " + as much again as its weights, to prefetch the next stage's"
                                   : "; no room under the cap to prefetch the next stage's weights");
  fmt::print(out, "{:>5}  {:<8}  {:<24} {:>12} {:>12} {:>12} {:>12}  {:>10}\n", "stage", "kind", "layers",
             "compute", "upload", "download", "time", "memory");
  for (size_t i = 0; i < pr.stages.size(); ++i) {
    const StageEstimate& e = pr.stages[i];
    fmt::print(out, "{:>5}  {:<8}  {:<24} {:>12} {:>12} {:>12} {:>12}  {:>10}{}\n", i,
               stage_kind_name(e.stage.kind), layers_text(e.stage, pr.plan.num_layers), ms(e.compute_seconds),
               ms(e.upload_seconds), ms(e.download_seconds), ms(e.seconds),
               format_bytes(double(po.weight_buffers > 1 ? e.memory_bytes : e.work_bytes)),
               !e.transfer_bound()                                 ? ""
               : e.disk_seconds > 0 && e.disk_seconds >= e.seconds ? "  disk-bound"
                                                                   : "  transfer-bound");
  }

  const PeakEstimate peak = predict_peak(pr.stages, po);
  fmt::print(
      out,
      "\npeak      {} per GPU predicted, as stage {} starts (largest working set {}; stage switches add the "
      "retired stage's outputs in flight and the next stage's prefetched weights){}\n",
      format_bytes(double(peak.bytes)), peak.stage, format_bytes(double(peak.max_work)),
      peak.unbounded > peak.bytes ? fmt::format("; {} without the cap, which makes the worker wait instead",
                                                format_bytes(double(peak.unbounded)))
                                  : std::string());
  const std::vector<char> refused = prefetch_refused(pr.stages, po);
  std::string waits;  // runs of refused stages as "0-126, 130"
  int count = 0;
  for (size_t i = 0; i < refused.size(); ++i) {
    if (!refused[i] || (i > 0 && refused[i - 1])) continue;
    size_t j = i;
    while (j + 1 < refused.size() && refused[j + 1]) ++j;
    waits += (waits.empty() ? "" : ", ") + (i == j ? fmt::format("{}", i) : fmt::format("{}-{}", i, j));
    count += int(j - i + 1);
  }
  if (count > 0)
    fmt::print(
        out,
        "prefetch  the cap leaves no room to upload the weights of {} {} while the stage before {} on its "
        "GPU computes: they go up once that stage ends, and the GPU waits for them (the simulation counts "
        "the wait)\n",
        count == 1 ? "stage" : "stages", waits, count == 1 ? "it" : "each");
}

/// The simulated iteration: its time and tokens/s, the bubble and each GPU's idle time.
void print_simulation(std::FILE* out, const PlanCommandOptions& o, const PartitionResult& pr,
                      const SimResult& r, int64_t tokens) {
  fmt::print(out, "\nslowest stage {}, objective max(S, G) x tmax = {}\n", ms(pr.tmax), ms(pr.objective));
  fmt::print(out, "iteration {} ({} steady state, first iteration {}), {:.0f} tokens/s\n",
             ms(r.iteration_seconds), o.sync ? "synchronous" : "asynchronous", ms(r.first_iteration_seconds),
             double(tokens) / r.iteration_seconds);
  fmt::print(out, "bubble    {:.2f}% steady state, {:.2f}% over {} simulated iterations\n",
             100 * r.steady_bubble_ratio, 100 * r.bubble_ratio, r.iteration_end.size());
  std::string idle;
  for (size_t g = 0; g < r.gpu_idle.size(); ++g)
    idle += fmt::format("{}GPU{} {}", g ? ", " : "", g, ms(r.gpu_idle[g]));
  fmt::print(out, "idle      {} (over {})\n", idle, ms(r.makespan));
}

}  // namespace

void run_plan(const PlanCommandOptions& o, std::FILE* out) {
  check_plan_options(o);
  std::string desc;
  const ModelShape m = load_model_shape(o.model, &desc);
  // the experts' flags would change nothing on a model without sparse layers (bucketed, the
  // default, plans every model: only the flag given is refused)
  const std::string no_experts = m.num_experts > 0 ? "sparse layer" : "experts";
  if (o.expert_gemm_given && o.expert_gemm == "bucketed" && m.num_moe_layers() == 0)
    throw UsageError(fmt::format("--expert-gemm bucketed needs a mixture-of-experts model; {} has no {}",
                                 o.model, no_experts));
  if (o.grouped_gemm_efficiency > 0 && m.num_moe_layers() == 0)
    throw UsageError(
        fmt::format("--grouped-gemm-efficiency {} needs a mixture-of-experts model; {} has no {}",
                    o.grouped_gemm_efficiency, o.model, no_experts));
  if (!o.plan.empty() && o.max_seq)
    throw UsageError("--plan with --max-seq: --max-seq sizes the sequence for the partitioner's own plan");
  if (!o.plan.empty() && o.disk_gbps > 0)
    throw UsageError("--plan with --disk-gbps: the disk tier places its stages itself");
  const std::optional<ModelLayout> layout = run_layout(o);
  const DeviceModel d = device_model(o, layout);
  PlanCommandOptions oo = o;
  if (o.max_seq) oo.seq_len = print_longest_sequence(o, out);
  const ModelLayout planned = plan_layout(o);
  std::string source;
  const std::optional<Profile> profile = plan_profile(o, oo, planned, d.fp8_weight_gradients, source);
  const int64_t cap = o.memory_cap.empty() ? 0 : parse_byte_size(o.memory_cap, "--memory-cap");

  RunPlanInputs rin = plan_inputs(planned, oo, oo.seq_len, cap);
  rin.profile = profile ? &*profile : nullptr;
  if (!o.plan.empty()) rin.plan = given_plan(o.plan, planned.num_layers(), o.gpus);
  const auto t0 = std::chrono::steady_clock::now();
  // --disk-gbps: planned before printing, so that a budget too small is the only line
  const std::optional<DiskRun> disk = plan_with_disk(oo, planned, rin, sim_options(o, d));  // oo: --max-seq's

  const RunPlan run = disk ? disk->run : plan_run(rin);
  const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const PartitionOptions& po = run.partition;
  const std::vector<LayerCost>& costs = run.costs;
  // --plan's stages, estimated as the partitioner estimates its own
  const PartitionResult pr = run.automatic ? *run.automatic : plan_result(costs, run.plan, po, "--plan");
  const int64_t tokens = o.micro_batches * o.sequences_per_micro * oo.seq_len;
  print_plan_header(out, o, oo, m, desc, layout, d, cap, tokens, source, planned.config);
  print_stages(out, pr, po, plan_s, !run.automatic);

  SimOptions so = sim_options(o, d);
  so.record_timeline = !o.trace.empty();
  const SimOptions without_disk = so;
  SimResult r = disk ? simulate(pr.plan, disk_stage_costs(*disk, so), so)
                     : simulate(pr.plan, stage_costs(costs, pr.plan, po), so);
  print_simulation(out, o, pr, r, tokens);
  if (disk)
    print_disk_tier(out, *disk, r, simulate(pr.plan, stage_costs(costs, pr.plan, po), without_disk), tokens);
  if (o.nodes > 1) print_nodes(out, o, costs, d, m.tie_word_embeddings, r.iteration_seconds, tokens);
  print_host_memory(
      out, oo, plan_config(o), [](const PlanCommandOptions& x) { return predicted_tokens_per_s(x); },
      disk ? std::optional<double>(disk->tier.host_budget + disk->tier.set_aside) : std::nullopt);
  if (!o.trace.empty()) {
    write_sim_trace(o.trace, r, pr.plan);
    fmt::print(out, "trace     wrote {} ({} intervals; open in Perfetto or chrome://tracing)\n", o.trace,
               r.timeline.size());
  }
}

void resolve_plan_flags(PlanCommandOptions& o,
                        const std::vector<std::pair<std::string, std::string>>& given) {
  const auto value_of = [&](const std::string& flag) -> const std::string* {
    for (const auto& [f, v] : given)
      if (f == flag) return &v;
    return nullptr;
  };
  if (o.model.empty()) throw UsageError("plan: --model is required (a model folder, config.json or .gguf)");
  if (const std::string* p = value_of("--plan"); p && p->find_first_not_of(" \t\r\n") == std::string::npos)
    throw UsageError("--plan: expected a plan as JSON or a file holding one, got nothing");
  std::vector<std::string> rates;  // the preset's numbers a flag gave win over the preset's
  for (const char* f : {"--peak-tflops", "--fp8-tflops", "--hbm-gbps", "--pcie-gbps", "--memory-cap"})
    if (value_of(f)) rates.push_back(f);
  if (value_of("--gpu")) apply_gpu_preset(o, rates);
  // the network flags describe the sum over nodes: without --nodes they would change nothing
  if (o.nodes == 1)
    for (const char* f : {"--net-gbps", "--net-latency-us", "--accumulation"})
      if (const std::string* v = value_of(f))
        throw UsageError(fmt::format(
            "{} {}: predicts the gradient sum over nodes; give --nodes N (N > 1) with it", f, *v));
  // disk_tier_of sees a ring other than the default's; one given as the default's changes nothing either
  o.disk_gbps_given = value_of("--disk-gbps") != nullptr;
  o.expert_gemm_given = value_of("--expert-gemm") != nullptr;
  if (o.expert_gemm != "bucketed" && o.expert_gemm != "grouped")  // Python's plan() sets it unchecked
    throw UsageError(fmt::format("--expert-gemm '{}': expected grouped or bucketed", o.expert_gemm));
  if (o.disk_gbps == 0 && o.disk_ring == kDefaultDiskRing && value_of("--disk-ring"))
    throw UsageError(disk_option_without_tier(o, "--disk-ring", "sizes the disk tier's read ring"));
}

}  // namespace rp
