// `roundpipe plan --gpu NAME`, `--list-gpus` and the plan's host-memory section: device
// presets (scheduler/gpu_presets.hpp) and the host need with what to change
// (scheduler/host_memory.hpp).
#include <algorithm>

#include <fmt/format.h>

#include "base/host_resources.hpp"
#include "cli/command.hpp"
#include "cli/plan.hpp"
#include "kernels/weight_format.hpp"
#include "scheduler/gpu_presets.hpp"
#include "scheduler/host_memory.hpp"

namespace rp {

namespace {

bool given_flag(const std::vector<std::string>& given, const char* flag) {
  return std::find(given.begin(), given.end(), flag) != given.end();
}

std::string rate(double tflops) { return tflops > 0 ? fmt::format("{:g}", tflops) : std::string("-"); }

}  // namespace

void apply_gpu_preset(PlanCommandOptions& o, const std::vector<std::string>& given) {
  if (o.gpu.empty()) return;
  const GpuPreset* p = find_gpu_preset(o.gpu);
  if (!p)
    throw UsageError(
        fmt::format("--gpu: unknown GPU '{}'; known: {} (plan --list-gpus)", o.gpu, gpu_preset_names()));
  const GpuRates r = achievable_rates(*p);
  if (!given_flag(given, "--peak-tflops")) o.peak_tflops = r.tflops;
  if (!given_flag(given, "--fp8-tflops")) o.fp8_tflops = r.fp8_tflops;
  if (!given_flag(given, "--hbm-gbps")) o.hbm_gbps = r.memory_gbps;
  if (!given_flag(given, "--pcie-gbps")) o.pcie_gbps = r.pcie_gbps;
  if (!given_flag(given, "--memory-cap")) o.memory_cap = fmt::format("{}GiB", p->memory_gb);
}

void print_gpu_presets(std::FILE* out) {
  fmt::print(
      out,
      "Data sheet: dense tensor TFLOP/s (no sparsity) with fp32 accumulation, and with fp16 accumulation\n"
      "where it is faster (GeForce); memory; PCIe link per direction. Planned: what --gpu plans with.\n\n");
  fmt::print(out, "{:<10} {:>7} {:>7} {:>10} {:>7} {:>9} {:>6} {:>7} {:>10}   {:>8} {:>8} {:>8}\n", "gpu",
             "bf16", "fp16", "fp16/acc16", "fp8", "fp8/acc16", "GB", "GB/s", "PCIe", "TFLOP/s", "GB/s",
             "PCIe");
  for (const GpuPreset& p : gpu_presets()) {
    const GpuRates r = achievable_rates(p);
    fmt::print(
        out, "{:<10} {:>7} {:>7} {:>10} {:>7} {:>9} {:>6g} {:>7g} {:>10}   {:>8.0f} {:>8.0f} {:>8.1f}{}\n",
        p.name, rate(p.bf16_tflops), rate(p.fp16_tflops), rate(p.fp16_acc16_tflops), rate(p.fp8_tflops),
        rate(p.fp8_acc16_tflops), p.memory_gb, p.memory_gbps,
        fmt::format("{}.0 x{} {:.1f}", p.pcie_gen, p.pcie_lanes, pcie_link_gbps(p.pcie_gen, p.pcie_lanes)),
        r.tflops, r.memory_gbps, r.pcie_gbps, r.measured ? "  measured" : "");
  }
  fmt::print(
      out,
      "\nH200 measured by this project (bench/results/throughput.md, cuda_ops.md): bf16 GEMM {:g} TFLOP/s "
      "sustained at the 700 W limit\n(about 790 in a 15 ms burst, 648-666 during training steps; data sheet "
      "{:g}), device copy {:g} GB/s (data sheet {:g}), pinned\nhost copies {:g} GB/s each way (PCIe 5.0 x16: "
      "{:.1f}). The other GPUs plan with their data sheet figures times the H200's ratios:\ncompute {:.3f}, "
      "memory {:.3f}, link {:.3f}. Flags given beside --gpu (--peak-tflops, --hbm-gbps, --pcie-gbps,\n"
      "--memory-cap) override the preset.\n",
      kH200MeasuredTflops, kH200DatasheetTflops, kH200MeasuredMemoryGbps, kH200DatasheetMemoryGbps,
      kH200MeasuredPcieGbps, pcie_link_gbps(5, 16), kComputeEfficiency, kMemoryEfficiency, link_efficiency());
  fmt::print(out, "\nSources:\n");
  for (const GpuPreset& p : gpu_presets()) fmt::print(out, "  {:<10} {}\n", p.name, p.source);
}

HostRun host_run_of(const PlanCommandOptions& o) {
  HostRun r;
  r.lora_r = o.lora_r;
  r.lora_targets.clear();
  for (size_t a = 0; a <= o.lora_targets.size();) {  // "a, b" -> {"a", "b"}
    const size_t b = std::min(o.lora_targets.find(',', a), o.lora_targets.size());
    std::string item = o.lora_targets.substr(a, b - a);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) r.lora_targets.push_back(item);
    a = b + 1;
  }
  if (!o.frozen.empty()) r.frozen = parse_weight_format(o.frozen);
  r.seq_len = o.seq_len;
  r.sequences_per_micro = o.sequences_per_micro;
  r.micro_batches = o.micro_batches;
  r.replicas = o.nodes;  // --accumulation counts one node's iterations per step, the spec's all nodes'
  r.accumulation = o.accumulation * o.nodes;
  r.workers = o.gpus;
  r.saved_attention = o.save_attention;
  return r;
}

namespace {

PlanCommandOptions with_run(PlanCommandOptions o, const HostRun& r) {
  o.lora_r = r.lora_r;
  o.frozen = r.frozen ? weight_format_name(*r.frozen) : "";
  o.seq_len = r.seq_len;
  o.sequences_per_micro = r.sequences_per_micro;
  o.micro_batches = r.micro_batches;
  o.accumulation = r.accumulation / std::max<int64_t>(1, r.replicas);
  o.save_attention = r.saved_attention;
  o.max_seq = false;
  return o;
}

}  // namespace

void print_host_memory(std::FILE* out, const PlanCommandOptions& o, const ModelConfig& c,
                       const std::function<std::optional<double>(const PlanCommandOptions&)>& tokens_per_s,
                       std::optional<double> tier_budget_bytes) {
  const HostRun run = host_run_of(o);
  const HostMemoryNeed need = host_memory_need(c, run);
  if (tier_budget_bytes) {
    fmt::print(out,
               "\nhost      in RAM the run would need {}{}; the disk tier holds it within its host budget "
               "of {} (disk above)\n",
               host_memory_text(need), o.nodes > 1 ? " on each node" : "", byte_text(*tier_budget_bytes));
    return;
  }
  const double budget = o.host_gib > 0 ? o.host_gib * double(int64_t(1) << 30) : double(host_total_bytes());
  fmt::print(out, "\nhost      the run needs {} of host memory{}\n", host_memory_text(need),
             o.nodes > 1 ? " on each node" : "");
  if (!(budget > 0)) return;
  const std::string whose = o.host_gib > 0 ? "--host-gib" : "this machine's memory; --host-gib sets another";
  const double cap = kHostHeadroom * budget;
  if (need.total() <= cap) {
    fmt::print(out, "          fits {:.0f}% of {} ({})\n", 100 * kHostHeadroom, byte_text(budget), whose);
    return;
  }
  fmt::print(out,
             "          over {:.0f}% of {} ({}): `roundpipe train` would run out of memory. Changes that "
             "lower it:\n",
             100 * kHostHeadroom, byte_text(budget), whose);
  for (const HostMemoryChange& ch : host_memory_alternatives(c, run, budget)) {
    const std::optional<double> tps = tokens_per_s(with_run(o, ch.run));
    fmt::print(out, "          - {}: needs {} ({}), {}{}\n", ch.what, byte_text(ch.need),
               ch.fits ? "fits" : "still over",
               tps ? fmt::format("{:.0f} tokens/s", *tps) : "no plan fits the GPUs",
               ch.how.empty() ? "" : "; " + ch.how);
  }
}

}  // namespace rp
