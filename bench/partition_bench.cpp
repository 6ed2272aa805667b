// Time to plan (partitioner benchmark): 28-layer dense (Qwen3-1.7B), 64-layer dense
// (Qwen3-32B) and 94-layer MoE (Qwen3-235B-A22B) models. The published system needs
// 2-5 ms for the small ones and ~1.5 s for 94 layers; ours must be at most that.
//
//   build-plan/bench/bench_partition_bench [bench/results/partition.md]
//
// Writes a Markdown report with the command and the machine (uname -a, nproc, CPU model).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/atomic_file.hpp"
#include "bench/bench_main.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/simulator.hpp"

namespace {

std::string shell(const char* cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd, "r"), pclose);
  if (!p) return "?";
  std::string s;
  char buf[512];
  while (fgets(buf, sizeof buf, p.get())) s += buf;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

rp::ModelShape dense(int64_t layers, int64_t hidden, int64_t q, int64_t kv, int64_t ffn, bool tied) {
  rp::ModelShape m;
  m.vocab_size = 151936, m.hidden_size = hidden, m.intermediate_size = ffn, m.num_layers = layers;
  m.num_heads = q, m.num_kv_heads = kv, m.head_dim = 128, m.tie_word_embeddings = tied, m.qk_norm = true;
  return m;
}

struct Case {
  std::string name;
  rp::ModelShape shape;
  int64_t seq;
  int64_t cap;  // bytes, 0 = none
};

int run(int argc, char** argv) {
  if (argc > 2) {
    fmt::print(stderr, "usage: {} [REPORT.md] (default bench/results/partition.md)\n", argv[0]);
    return 2;
  }
  const std::string out_path = argc > 1 ? argv[1] : "bench/results/partition.md";
  rp::ModelShape moe = dense(94, 4096, 64, 4, 0, false);
  moe.num_experts = 128, moe.experts_per_token = 8, moe.moe_intermediate_size = 1536;
  const int64_t GiB = int64_t(1) << 30;
  const std::vector<Case> cases = {
      {"Qwen3-1.7B (28 layers, dense)", dense(28, 2048, 16, 8, 6144, true), 8192, 24 * GiB},
      {"Qwen3-1.7B (28 layers, dense), no cap", dense(28, 2048, 16, 8, 6144, true), 8192, 0},
      {"Qwen3-32B (64 layers, dense)", dense(64, 5120, 64, 8, 25600, false), 8192, 24 * GiB},
      {"Qwen3-32B (64 layers, dense), no cap", dense(64, 5120, 64, 8, 25600, false), 8192, 0},
      {"Qwen3-235B-A22B (94 layers, MoE 128x top-8)", moe, 8192, 141 * GiB},
      {"Qwen3-235B-A22B (94 layers, MoE 128x top-8), no cap", moe, 8192, 0},
  };
  // RTX 4090-like device (the paper's testbed) for the dense models; H200-like for the MoE
  rp::DeviceModel d4090;
  d4090.peak_flops = 165e12, d4090.mem_bandwidth = 1.0e12, d4090.pcie_bandwidth = 25e9;
  rp::DeviceModel dh200;  // defaults: 790 TFLOP/s, 4.3 TB/s, 55 GB/s

  std::string table =
      "| model | device | memory cap | stages (F+T+B) | candidates | packings | plan time median | max | "
      "predicted iteration | bubble |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Case& c : cases) {
    const bool big = c.shape.num_experts > 0;
    const rp::DeviceModel& d = big ? dh200 : d4090;
    auto costs = rp::layer_costs(rp::estimate_layers(c.shape, 1, c.seq, d));
    rp::PartitionOptions o;
    o.gpus = 8;
    o.micro_batches = 16;
    o.pcie_bandwidth = d.pcie_bandwidth;
    o.memory_cap = c.cap;
    std::vector<double> times;
    rp::PartitionResult r;
    const int reps = 200;
    for (int i = 0; i < reps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      r = rp::partition(costs, o);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    rp::SimOptions so;
    so.gpus = o.gpus;
    so.micro_batches = o.micro_batches;
    so.bandwidth = rp::StreamBandwidths::uniform(d.pcie_bandwidth);
    rp::SimResult sr = rp::simulate(r.plan, rp::stage_costs(costs, r.plan, o), so);
    const std::string row =
        fmt::format("| {} | {} | {} | {}+1+{} | {} | {} | {:.3f} ms | {:.3f} ms | {:.1f} ms | {:.2f}% |\n",
                    c.name, big ? "H200-like" : "4090-like",
                    c.cap ? rp::format_bytes(double(c.cap)) : std::string("none"), r.plan.num_forward(),
                    r.plan.num_backward(), r.candidates, r.evaluations, times[times.size() / 2] * 1e3,
                    times.back() * 1e3, sr.iteration_seconds * 1e3, 100 * sr.steady_bubble_ratio);
    fmt::print("{}", row);
    table += row;
  }

  std::string md = "# Partitioner planning time\n\n";
  md += "Target: at most the published 2-5 ms for ~30-layer models and ~1.5 s for 94 layers.\n\n";
  md += fmt::format(
      "Command: `{}` (Release, -O2 -march=native), {} repetitions per row, G = 8, M = 16, one "
      "sequence of 8192 tokens per micro-batch, PCIe charged.\n\n",
      argv[0], 200);
  md += "Machine:\n\n```\n" + shell("uname -a") + "\nnproc: " + shell("nproc") + "\n" +
        shell("grep -m1 'model name' /proc/cpuinfo") + "\n```\n\n";
  md +=
      "Devices: 4090-like = 165 TFLOP/s, 1.0 TB/s, PCIe 25 GB/s; H200-like = 790 TFLOP/s, 4.3 TB/s, "
      "PCIe 55 GB/s. Costs from the analytic model (scheduler/cost_model.hpp); the MoE layer is "
      "approximated analytically (router + 8 of 128 experts with balanced routing; all experts' "
      "weights uploaded).\n\n";
  md += table;
  md +=
      "\n`candidates`: distinct tmax values (tau of every memory-feasible run of layers); `packings`: "
      "greedy O(L) evaluations run (binary search per stage count).\n";
  rp::write_file_atomically(out_path, [&](std::ostream& os) { os << md; });
  fmt::print("wrote {}\n", out_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::guarded_main("bench_partition_bench", [&] { return run(argc, argv); });
}
