#include "cli/plan_disk.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/host_resources.hpp"
#include "cli/command.hpp"
#include "scheduler/host_memory.hpp"
#include "scheduler/replan.hpp"

namespace rp {

namespace {

constexpr double kGiB = double(int64_t(1) << 30);

std::string ms(double s) { return fmt::format("{:.2f} ms", s * 1e3); }

// "from 41484 tokens per iteration", or "never" when the spill alone outpaces the compute
std::string hidden_text(double n) {
  return std::isfinite(n) ? fmt::format("from {:.0f} tokens per iteration", n)
                          : std::string("never (the spill alone outpaces the compute)");
}

}  // namespace

void add_disk_options(CLI::App& c, PlanCommandOptions& o) {
  const auto add = [&c](const std::string& flag, auto& v, const std::string& help) {
    add_number_option(c, flag, v, help, plan_flag_expects(flag))->capture_default_str();
  };
  add("--disk-gbps", o.disk_gbps,
      "disk tier: the host disk's read GB/s for frozen weights and spilled activations the host "
      "budget cannot hold (0: none; training places them by the same rule with the spec key "
      "frozen_tier.host_budget_gib; spilled activations are a prediction)");
  add("--disk-write-gbps", o.disk_write_gbps,
      "disk tier: write GB/s for spilled activations (0: the read rate)");
  add("--host-budget-gib", o.host_budget_gib,
      "disk tier: host memory the run may fill, GiB (0: 90% of --host-gib or of this machine's)");
  add("--disk-ring", o.disk_ring, "disk tier: pinned read buffers, each the largest stage read");
}

std::string disk_option_without_tier(const PlanCommandOptions& o, const char* flag, const char* what) {
  if (o.disk_gbps_given) return fmt::format("{}: {}, which --disk-gbps 0 turns off", flag, what);
  return fmt::format("{}: {}; give --disk-gbps with it", flag, what);
}

DiskTier disk_tier_of(const PlanCommandOptions& o, DiskBudgetSource* budget) {
  // rates in [1 MB/s, 1 PB/s] and budgets up to 1 PiB: beyond them the seconds and bytes printed
  // overflow or round to nothing
  const auto fail = [](const char* flag, auto v) {
    return UsageError(fmt::format("{}: expected {}, got {}", flag, plan_flag_expects(flag), v));
  };
  for (const auto& [flag, v] :
       {std::pair{"--disk-gbps", o.disk_gbps}, {"--disk-write-gbps", o.disk_write_gbps}})
    if (!std::isfinite(v) || !(v == 0 || (v >= 1e-3 && v <= 1e6)))  // --disk-write-gbps 0: the read rate
      throw fail(flag, v);
  if (!std::isfinite(o.host_budget_gib) ||
      !(o.host_budget_gib == 0 || (o.host_budget_gib >= 1e-3 && o.host_budget_gib <= kMaxHostGib)))
    throw fail("--host-budget-gib", o.host_budget_gib);
  if (o.disk_ring < 2)  // as training: one buffer would leave no read ahead of the upload
    throw fail("--disk-ring", o.disk_ring);
  if (o.disk_gbps == 0) {
    if (o.disk_write_gbps > 0)
      throw UsageError(disk_option_without_tier(o, "--disk-write-gbps", "describes the disk tier"));
    if (o.host_budget_gib > 0)
      throw UsageError(disk_option_without_tier(o, "--host-budget-gib", "sizes the disk tier"));
    if (o.disk_ring != kDefaultDiskRing)
      throw UsageError(disk_option_without_tier(o, "--disk-ring", "sizes the disk tier's read ring"));
  }
  if (o.host_gib > 0 && o.host_budget_gib > o.host_gib)
    throw UsageError(fmt::format("--host-budget-gib: {} GiB is more than the host's --host-gib {} GiB",
                                 o.host_budget_gib, o.host_gib));
  DiskTier t;
  t.read_bandwidth = o.disk_gbps * 1e9;
  t.write_bandwidth = o.disk_write_gbps * 1e9;
  t.ring_buffers = o.disk_ring;
  DiskBudgetSource source{"--host-budget-gib", "--host-budget-gib", ""};
  const std::string share = fmt::format("{:.0f}% of ", 100 * kHostHeadroom);
  if (o.host_budget_gib > 0) {
    t.host_budget = o.host_budget_gib * kGiB;
  } else if (o.host_gib > 0) {
    t.host_budget = kHostHeadroom * o.host_gib * kGiB;
    source = {"--host-budget-gib, default " + share + "--host-gib", "--host-gib",
              fmt::format(" ({}--host-gib {})", share, o.host_gib)};
  } else {
    t.host_budget = kHostHeadroom * double(host_total_bytes());
    source = {"--host-budget-gib, default " + share + "this machine's memory", "--host-budget-gib",
              " (" + share + "this machine's memory)"};
  }
  // as training does: what the process holds before the session allocates (estimated here,
  // measured there) and the margin come off the budget first
  t.set_aside = std::min(t.host_budget, kHostBudgetMargin + kProcessEstimate);
  t.host_budget -= t.set_aside;
  if (budget) *budget = source;
  return t;
}

namespace {

DiskPlan checked_disk_plan(const DiskRun& r, const ModelLayout& layout, const HostRun& hr) {
  DiskPlan d = plan_disk_tier(layout, hr, r.tier, r.run.plan);
  // the least is the same whatever was given: the whole set-aside comes on top (a budget below
  // it has all of itself set aside, which is not what a larger one would need)
  constexpr double set_aside = kHostBudgetMargin + kProcessEstimate;
  if (!d.fits) {
    // the least counts what training counts: the trainable state and ring, and when those fit,
    // the saved inputs no layer can spill and the spill's staging buffers
    const double least = std::max(d.least_budget, d.minimum_budget);
    const std::string activations =
        least > d.minimum_budget
            ? fmt::format(" + saved activations that cannot spill and the spill's staging {}",
                          byte_text(least - d.minimum_budget))
            : std::string();
    // full fine-tuning streams nothing: no ring to name
    const int64_t ring_buffer = largest_frozen_group(layout);
    const std::string ring =
        ring_buffer > 0 ? fmt::format(" + read ring {} x {}", r.tier.ring_buffers, byte_text(ring_buffer))
                        : std::string();
    throw UsageError(fmt::format(
        "{}: the disk tier needs at least {} of host memory ({} set aside for the process + trainable state "
        "{}{}{}), {} given{}",
        r.budget.flag, byte_text(least + set_aside), byte_text(set_aside), byte_text(d.trainable_bytes), ring,
        activations, byte_text(r.tier.host_budget + r.tier.set_aside), r.budget.note));
  }
  return d;
}

}  // namespace

namespace {

// The fastest disk plan of `in` (simulated with the disk, `so`): the partition made without the
// disk with each stage charged its reads, and the partitions made again with the reads charged
// at the disk's share and at smaller ones. Larger stages can need a larger read ring and leave
// less of the base resident, which the partitioner's stage times do not see, so the simulator
// picks; a faster disk or a larger budget then does not predict a slower step than a slower one.
std::pair<DiskRun, double> fastest_disk_plan(const PlanCommandOptions& o, const ModelLayout& layout,
                                             const DiskRun& tier, RunPlanInputs rin, HostRun hr,
                                             bool drop_attention, const SimOptions& so) {
  DiskRun r = tier;
  if (drop_attention) {
    rin.save_attention = false;
    hr.saved_attention = false;
  }
  r.run = plan_run(rin);
  r.disk = checked_disk_plan(r, layout, hr);
  r.disk.attention_dropped = r.disk.attention_dropped || drop_attention;
  const double share_bw = disk_stage_bandwidth(r.tier, o.gpus);
  // c with its own disk plan charged to its stages, and its simulated iteration
  // (the shares often give the same partition: each distinct one is simulated once)
  std::map<std::string, double> simulated;
  auto finish = [&](DiskRun c) {
    c.disk = checked_disk_plan(c, layout, hr);
    c.disk.attention_dropped = c.disk.attention_dropped || drop_attention;
    apply_disk_reads(c.run.costs, layout, c.disk.streamed);
    c.run.partition.disk_bandwidth = share_bw;  // the real share, for the stage table
    c.run.automatic->stages = check_plan(c.run.costs, c.run.plan, c.run.partition, "disk plan");
    auto [it, fresh] = simulated.try_emplace(c.run.plan.summary(), 0.0);
    if (fresh) {
      SimOptions s = so;
      it->second = simulate(c.run.plan, disk_stage_costs(c, s), s).iteration_seconds;
    }
    return std::pair<DiskRun, double>(std::move(c), it->second);
  };
  std::pair<DiskRun, double> best = finish(r);  // the plain partition
  for (double share : {1.0, 0.8, 0.6, 0.4, 0.25}) {
    // partitioned with the reads charged; the new stages change the ring and so what streams:
    // each partition of the sequence is a candidate
    DiskRun c = r;
    std::vector<char> streamed = r.disk.streamed;
    for (int pass = 0; pass < 3; ++pass) {
      apply_disk_reads(c.run.costs, layout, streamed);
      c.run.partition.disk_bandwidth = share * share_bw;
      c.run.partition.weight_buffers = 2;
      c.run.automatic = automatic_partition(c.run.costs, c.run.partition);
      c.run.plan = c.run.automatic->plan;
      auto cand = finish(c);
      const bool same = cand.first.disk.streamed == streamed;
      streamed = cand.first.disk.streamed;
      if (cand.second < best.second) best = std::move(cand);
      if (same) break;
    }
  }
  return best;
}

}  // namespace

std::optional<DiskRun> plan_with_disk(const PlanCommandOptions& o, const ModelLayout& layout,
                                      const RunPlanInputs& in, const SimOptions& so) {
  DiskRun tier;
  tier.tier = disk_tier_of(o, &tier.budget);
  if (!tier.tier.enabled()) return std::nullopt;
  const HostRun hr = host_run_of(o);
  tier.run = plan_run(in);
  // the saved attention goes as training decides with save_attention automatic: when the
  // activations do not fit with it, or dropping it keeps more of the base resident
  const DiskPlan placed = checked_disk_plan(tier, layout, hr);
  auto best = fastest_disk_plan(o, layout, tier, in, hr, placed.attention_dropped, so);
  best.first.attention_dropped_to_save_reads = placed.dropped_for_base;
  return std::move(best.first);
}

std::vector<StageCost> disk_stage_costs(const DiskRun& r, SimOptions& so) {
  std::vector<StageCost> c = stage_costs(r.run.costs, r.run.plan, r.run.partition);
  add_disk_costs(c, r.run.plan, r.disk);
  so.disk_read_bandwidth = r.tier.read_bandwidth;
  so.disk_write_bandwidth = r.tier.write_rate();
  so.disk_ring = r.tier.ring_buffers;
  // a queue on the disk settles slower than the GPUs: four times the default
  if (so.iterations == 0) so.iterations = 4 * default_iterations(int(r.run.plan.stages.size()), so.gpus);
  return c;
}

void print_disk_tier(std::FILE* out, const DiskRun& r, const SimResult& with_disk, const SimResult& without,
                     int64_t tokens) {
  const DiskPlan& d = r.disk;
  const DiskTier& t = r.tier;
  const int G = r.run.partition.gpus;
  fmt::print(
      out,
      "\ndisk      {:.4g} GB/s read, {:.4g} GB/s write, shared by {}; host budget {} ({}; {} of it set aside "
      "for the process, as training does): trainable state {}, read ring {}, activations {}, frozen base {} "
      "of "
      "which {} resident\n",
      t.read_bandwidth / 1e9, t.write_rate() / 1e9, G == 1 ? std::string("1 GPU") : fmt::format("{} GPUs", G),
      byte_text(t.host_budget + t.set_aside), r.budget.text, byte_text(t.set_aside),
      byte_text(d.trainable_bytes),
      d.ring_bytes > 0      ? fmt::format("{} x {}", t.ring_buffers, byte_text(d.ring_bytes / t.ring_buffers))
      : d.frozen_bytes == 0 ? std::string("none (no frozen weights to stream)")
      : d.spill_bytes > 0   ? std::string("none (the frozen base stays in memory)")
                            : std::string("none (everything fits)"),
      byte_text(d.activation_bytes), byte_text(d.frozen_bytes), byte_text(d.resident_bytes));
  if (d.attention_dropped)
    fmt::print(out, "          saved attention dropped {} (backward recomputes it)\n",
               r.attention_dropped_to_save_reads ? "though it fits: that keeps more of the base resident"
                                                 : "to fit the budget");
  if (d.spill_bytes > 0)
    fmt::print(
        out,
        "          activations spilled: the saved inputs of {} {}, {} per iteration, each micro-batch's "
        "written after its forward stage and read back ahead of its backward stage (staging {} over all "
        "workers)\n",
        d.spilled_layers, d.spilled_layers == 1 ? "layer" : "layers", byte_text(d.spill_bytes),
        byte_text(d.staging_bytes));
  double compute = 0, up = 0, down = 0, stream = 0;
  for (const StageEstimate& e : r.run.automatic->stages) {
    compute += e.compute_seconds;
    up += e.upload_seconds;
    down += e.download_seconds;
  }
  for (int64_t b : d.stage_reads) stream += double(b);
  compute /= G;
  const double pcie = std::max(up, down) / G;
  fmt::print(out, "          per iteration: {} read, {} written, {} on the disk\n", byte_text(d.read_bytes),
             byte_text(d.write_bytes), ms(d.seconds));
  // the disk bounds the step when the simulated step is longer with it, not merely when its time
  // exceeds the compute's (reads overlap the compute of other stages)
  const double exposed = with_disk.iteration_seconds - without.iteration_seconds;
  const bool disk_bound = d.seconds > std::max(compute, pcie) && exposed > 0.01 * without.iteration_seconds;
  fmt::print(out, "          bound     disk {} against compute {} and PCIe {} per GPU: {}\n", ms(d.seconds),
             ms(compute), ms(pcie),
             disk_bound ? "the disk bounds the step"
             : d.seconds > std::max(compute, pcie)
                 ? "the disk's time is hidden behind the pipeline"
                 : (compute >= pcie ? "compute bounds the step" : "PCIe bounds the step"));
  fmt::print(out,
             "          iteration {} with the disk, {:.0f} tokens/s ({} for the same stages without it{})\n",
             ms(with_disk.iteration_seconds), double(tokens) / with_disk.iteration_seconds,
             ms(without.iteration_seconds),
             !disk_bound && exposed > 0.01 * without.iteration_seconds
                 ? fmt::format("; {} exposed: reads keep stage order, and a spill is read back only after "
                               "it was written",
                               ms(exposed))
                 : std::string());
  const double per_token = compute * G / double(tokens), spill = d.spill_bytes / double(tokens);
  const double here = tokens_to_hide(stream, spill, per_token, G, t.read_bandwidth, t.write_rate());
  const double nvme =
      tokens_to_hide(stream, spill, per_token, G, kReferenceNvmeBytesPerSecond, kReferenceNvmeBytesPerSecond);
  // a pool of G GPUs may have a drive per GPU, striped: G x the reference rate
  const double nvme_each = kReferenceNvmeBytesPerSecond * double(G);
  const std::string per_gpu =
      G > 1 ? fmt::format(", {} at one per GPU ({:.0f} GB/s)",
                          hidden_text(tokens_to_hide(stream, spill, per_token, G, nvme_each, nvme_each)),
                          nvme_each / 1e9)
            : std::string();
  if (d.read_bytes > 0)
    fmt::print(out, "          hidden {} at this disk, {} at a 7 GB/s NVMe{}; this run has {}\n",
               hidden_text(here), hidden_text(nvme), per_gpu, tokens);
  fmt::print(
      out,
      "          (training places by this rule with the spec key frozen_tier.host_budget_gib, and with "
      "save_attention automatic also drops the saved attention whenever that keeps more of the base "
      "resident; spilled activations are a prediction)\n");
}

}  // namespace rp
