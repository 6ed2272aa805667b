// `roundpipe plan --disk-gbps`: the plan with a disk tier for frozen weights and spilled
// activations (scheduler/disk_tier.hpp): the disk-aware partition, the simulator's disk
// stream, and the plan's disk section (bytes, seconds, the bound, tokens to hide the disk).
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/plan.hpp"
#include "scheduler/disk_tier.hpp"
#include "scheduler/run_plan.hpp"
#include "scheduler/simulator.hpp"

namespace rp {

/// Where the disk tier's host budget came from.
struct DiskBudgetSource {
  /// As the plan's disk line says it: "--host-budget-gib", "--host-budget-gib, default 90% of
  /// --host-gib" or "..., default 90% of this machine's memory".
  std::string text;
  /// The flag a budget too small is blamed on: the one that set it (--host-gib when the budget
  /// is its default share of it), --host-budget-gib when neither was given.
  std::string flag;
  /// After the bytes given in that error: "", " (90% of --host-gib 2)", " (90% of this machine's memory)".
  std::string note;
};

/// A run plan made with the disk tier, and that tier's plan.
struct DiskRun {
  DiskTier tier;
  DiskBudgetSource budget;  ///< which option set tier.host_budget
  RunPlan run;              ///< partitioned with each stage's disk reads charged
  DiskPlan disk;
  /// The saved attention fits the budget but was dropped, as training's automatic
  /// save_attention does (place_host_budget): the memory it frees keeps more of the base resident.
  bool attention_dropped_to_save_reads = false;
};

/// The disk tier of o: --disk-gbps, --disk-write-gbps and the host budget (--host-budget-gib,
/// else kHostHeadroom x --host-gib, else kHostHeadroom x this machine's memory), and where that
/// came from (`budget`). Throws UsageError for a rate or budget out of range, or
/// --disk-write-gbps / --host-budget-gib / --disk-ring without --disk-gbps.
DiskTier disk_tier_of(const PlanCommandOptions& o, DiskBudgetSource* budget = nullptr);

/// The error for a disk tier's option `flag` (what it does: `what`) without the tier: "give
/// --disk-gbps with it", or, where --disk-gbps 0 was given, that it turns the tier off
/// (disk_tier_of; resolve_plan_flags for --disk-ring given as the default's).
std::string disk_option_without_tier(const PlanCommandOptions& o, const char* flag, const char* what);

/// The plan of `in` (plan_run) under o's disk tier. Candidates: the plain partition with each
/// stage charged its streamed bytes (LayerCost::disk_bytes at disk_stage_bandwidth), and the
/// partitions made again with the reads charged at 1, 0.8, 0.6, 0.4 and 0.25 of that share
/// (their disk plans recomputed); with the saved attention kept when the budget holds it, and
/// dropped. The one the simulator (`so`, with the disk) gives the shortest iteration is
/// returned. nullopt without --disk-gbps. Throws UsageError naming the budget's option, what
/// the tier needs and what was given when the budget cannot hold the trainable state and the
/// read ring.
std::optional<DiskRun> plan_with_disk(const PlanCommandOptions& o, const ModelLayout& layout,
                                      const RunPlanInputs& in, const SimOptions& so);

/// The simulator's stage costs of `r`'s plan with the disk traffic, and the disk's rates set in `so`.
std::vector<StageCost> disk_stage_costs(const DiskRun& r, SimOptions& so);

/// The plan's disk section: the budget and what it keeps, the dropped attention or the spill,
/// per-iteration bytes and seconds, what bounds the step, the prediction with the disk
/// (`with_disk`) and without it, and the tokens per iteration from which the disk hides (at
/// its rate and at a 7 GB/s NVMe).
void print_disk_tier(std::FILE* out, const DiskRun& r, const SimResult& with_disk, const SimResult& without,
                     int64_t tokens);

}  // namespace rp
