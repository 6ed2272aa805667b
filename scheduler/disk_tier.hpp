// The disk tier of a plan: frozen weights and saved activations that do not fit the host
// memory budget, kept on a local disk (NVMe) instead.
//
// A LoRA or frozen-base run may keep its frozen base weights in a cache file on a local disk:
// each pipeline stage reads its layers' storage form into a bounded ring of pinned host
// buffers (O_DIRECT), and the transfer engine uploads them from there. A ring does not keep a
// stage's weights between its forward and its backward stage, so every streamed group is read
// once per stage that uploads it. When the host budget cannot hold a pass's saved activations
// either, the plan first drops the saved attention (backward recomputes it); when that is not
// enough, it drops the attention and spills the activations that do not fit: written after
// the forward stage, read back ahead of the backward stage, once each per iteration.
//
// What is resident, per iteration (B the budget, all in bytes):
//   trainable  = master + moments + low-precision copy + gradients (host_memory_need)
//   ring       = ring_buffers x the largest frozen group, 4 KiB-aligned (the runtime's read buffers)
//   needs B >= trainable + ring, else DiskPlan::fits is false (minimum_budget says how much)
//   room       = B - trainable - ring
//   activations: kept when activations + attention <= room; else, with saved attention,
//                attention dropped when activations alone <= room; else attention dropped and
//                whole layers' saved inputs spill (layers 1..L-1 only), their staging buffers
//                taken from the room too (place_host_budget); spill = spilled layers' inputs / slots
//                written and read per iteration
//   frozen groups: resident while they fit the room left, decoders' groups first, spread over the depth (they
//   are
//                read twice, by their forward and backward stages), the others after; the
//                rest stream: read bytes = sum over stages of their streamed groups' storage
//   disk seconds = (reads + spill) / read bandwidth + spill / write bandwidth
// When the budget holds everything (host_memory_need's total), nothing streams and no ring is
// allocated. The disk is the host's one device, shared by all its GPUs.
//
// The runtime places by the same rule (place_host_budget: FrozenTierOptions::host_budget_gib,
// with its own ring, the largest frozen group per buffer, and the process's own memory set
// aside first); `roundpipe plan` adds the disk traffic to say whether the disk would bound a step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "roundpipe/model.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/host_memory.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/simulator.hpp"

namespace rp {

/// Staging buffers per worker and direction of the activation spill (the runtime's default; reads
/// get at least one per spilled layer, the most a micro-batch of a backward stage holds).
constexpr size_t kDefaultSpillStaging = 4;

/// The host's disk and the host memory budget it backs.
struct DiskTier {
  double read_bandwidth = 0;   ///< bytes/s (0: no disk tier)
  double write_bandwidth = 0;  ///< bytes/s (0: read_bandwidth)
  double host_budget = 0;      ///< host bytes the run's buffers may fill (after set_aside)
  double set_aside = 0;        ///< bytes of the given budget kept for the process (not in host_budget)
  int ring_buffers = 2;        ///< pinned read buffers, each of the largest frozen group (as the runtime's)
  size_t spill_staging = kDefaultSpillStaging;  ///< activation spill staging buffers per worker and direction
  /// HostRun::saved_attention is the runtime's automatic save_attention (unset): the attention
  /// also goes when that keeps more of the base resident. false: kept as asked while it fits.
  bool automatic_attention = true;
  bool enabled() const { return read_bandwidth > 0; }
  double write_rate() const { return write_bandwidth > 0 ? write_bandwidth : read_bandwidth; }
};

/// Host memory a whole-run budget keeps beyond the run's own buffers (thread stacks, the actor
/// system, the allocator's slack, the caller's token batches): the runtime sets it aside, with
/// what the process holds before the session allocates, before it places anything.
constexpr double kHostBudgetMargin = 0.5 * double(uint64_t(1) << 30);
/// What `roundpipe plan` assumes the process holds before the session allocates (code, the CUDA
/// context; measured about 0.3 GiB on an H200 host), which training measures instead.
constexpr double kProcessEstimate = 0.3 * double(uint64_t(1) << 30);

/// A 7 GB/s NVMe drive (PCIe 4.0 x4 sequential reads), the reference of the tokens-to-hide figure.
constexpr double kReferenceNvmeBytesPerSecond = 7e9;

/// What the budget keeps, what streams and what the disk does per iteration.
struct DiskPlan {
  bool fits = true;                  ///< the budget holds everything, or at least minimum_budget
  double minimum_budget = 0;         ///< trainable + ring: less cannot run with this tier
  double trainable_bytes = 0;        ///< master, moments, low-precision copy, gradients
  double ring_bytes = 0;             ///< ring_buffers x the largest frozen group (0: nothing streams)
  double frozen_bytes = 0;           ///< every frozen group's storage
  double resident_bytes = 0;         ///< of frozen_bytes, kept in host memory
  double activation_bytes = 0;       ///< saved activations kept in host memory (all pass slots)
  bool saved_attention = true;       ///< the decoders keep their attention output
  bool attention_dropped = false;    ///< saved attention was asked for and dropped to fit
  double spill_bytes = 0;            ///< activations written and read back per iteration
  std::vector<char> streamed;        ///< per group of the layout: read from the disk
  std::vector<int64_t> stage_reads;  ///< per plan stage: streamed frozen bytes it reads
  double read_bytes = 0;             ///< per iteration: stage reads + spill
  double write_bytes = 0;            ///< per iteration: spill
  double seconds = 0;                ///< per iteration, at the tier's bandwidths
  int64_t micro_batches = 1;         ///< of the run (the spill's split per micro-batch)
  int spilled_layers = 0;            ///< layers whose saved inputs spill (plan_disk_tier)
  double staging_bytes = 0;          ///< the spill's staging buffers (plan_disk_tier)
  bool dropped_for_base = false;     ///< saved attention dropped to keep more of the base (plan_disk_tier)
  double least_budget = 0;           ///< plan_disk_tier, when !fits: the least host_budget that places
};

/// Frozen groups in the order they stay resident when the host has room for some: the
/// decoders' first (each is read by two stages, its forward and its backward), in bit-reversed
/// order of their index so that the ones kept are spread evenly over the depth (every stage
/// reads a share, overlapping every stage's compute), then the others.
std::vector<int> residency_order(const ModelLayout& m);
/// Per group of `m`: 1 when frozen and streamed from the disk, keeping frozen groups resident in
/// residency_order while their storage fits `room` bytes (a group that does not fit streams and
/// the next ones are tried). `resident` (may be null): the bytes kept.
std::vector<char> streamed_groups(const ModelLayout& m, double room, double* resident = nullptr);
/// The largest frozen group's storage bytes rounded up to 4 KiB (one read buffer of the ring), 0
/// without frozen groups. `name` (may be null): that group's name, untouched without one.
double largest_frozen_group(const ModelLayout& m, std::string* name = nullptr);

/// The frozen storage bytes each stage of `plan` uploads (ModelLayout::groups_uploaded) of
/// the groups with streamed[g] (all frozen groups when `streamed` is empty).
std::vector<int64_t> stage_frozen_reads(const ModelLayout& m, const IterationPlan& plan,
                                        const std::vector<char>& streamed = {});

/// What a host budget of `budget` bytes keeps for `run` on `m` with a read ring of `ring_bytes`
/// (the file comment's rules, the disk traffic aside): DiskPlan's fits, minimum_budget,
/// trainable, ring (0 when everything fits and nothing streams), frozen, resident, activation and
/// spill bytes, saved_attention / attention_dropped and streamed; stage_reads, read/write bytes
/// and seconds stay 0. The runtime's host_budget_gib and plan_disk_tier both place by it.
/// Throws host_memory_need's errors.
DiskPlan place_in_host_budget(const ModelLayout& m, const HostRun& run, double budget, double ring_bytes);

/// What a host budget holds once the activation spill's own limits and costs are counted: the
/// spill moves whole layers' saved inputs (one layer's is activations / (L + 1), all pass slots),
/// only layers 1..L-1 have one (so at most L - 1 spill; layer 0's input and the two sets of
/// boundary gradients stay), and its staging buffers, workers x (staging + max(staging,
/// spilled)) records of one layer's input per micro-batch and slot (4 KiB-aligned), come off the
/// budget. With automatic saved attention (run.saved_attention and `automatic_attention`), the
/// attention is also dropped when that keeps more of the base resident (each decoder group kept
/// saves two reads per iteration; recomputing the attention costs less). `roundpipe plan` and
/// the runtime's host_budget_gib both place by it.
struct BudgetPlacement {
  DiskPlan disk;                  ///< place_in_host_budget's, its spill_bytes the whole layers spilled
  bool dropped_for_base = false;  ///< saved attention dropped (automatic) to keep more of the base
  int spilled = 0;                ///< layers whose saved inputs go to the disk
  int most_spilled = 0;           ///< layers that can spill: all but the first
  double staging_bytes = 0;       ///< the spill's staging buffers, all workers
  double activations = 0;         ///< every saved input, all pass slots
  double per_layer = 0;           ///< one layer's saved inputs, all pass slots
  /// The run fits: the trainable state and ring, and activations the spill can bring into room.
  bool places() const { return disk.fits && spilled <= most_spilled; }
};
/// The placement of `run` on `m` in `room` host bytes (the budget less what is set aside) with a
/// read ring of `ring_bytes` and `staging` spill buffers per worker and direction.
BudgetPlacement place_host_budget(const ModelLayout& m, const HostRun& run, double room, double ring_bytes,
                                  size_t staging, bool automatic_attention);
/// The least room in which place_host_budget places (to within a few bytes; a figure rounded up
/// from it should be checked with places()).
double least_host_room(const ModelLayout& m, const HostRun& run, double ring_bytes, size_t staging,
                       bool automatic_attention);

/// The disk plan of `run` on `m` under `tier` for `plan`: place_host_budget's placement (with
/// tier.automatic_attention), fits false
/// where it does not place (least_budget then says from which budget it would). With
/// !tier.enabled() everything is resident and nothing is read. Throws std::invalid_argument
/// for a plan of another layer count or host_memory_need's errors.
DiskPlan plan_disk_tier(const ModelLayout& m, const HostRun& run, const DiskTier& tier,
                        const IterationPlan& plan);

/// Sets every layer's LayerCost::disk_bytes: the storage of its streamed groups (groups_of).
void apply_disk_reads(std::vector<LayerCost>& costs, const ModelLayout& m, const std::vector<char>& streamed);

/// The read bandwidth one stage can count on when `gpus` GPUs share the host's disk: read / G
/// (PartitionOptions::disk_bandwidth).
double disk_stage_bandwidth(const DiskTier& tier, int gpus);

/// Adds the disk traffic of `d` to the simulator's stage costs of `plan`: each stage's
/// streamed frozen read, and per micro-batch the spill (d.spill_bytes / M), written by the
/// forward stages and read back by the backward stages in proportion to the activation bytes
/// each downloads / uploads per micro-batch.
void add_disk_costs(std::vector<StageCost>& costs, const IterationPlan& plan, const DiskPlan& d);

/// Tokens per iteration from which the disk hides under the compute of `gpus` GPUs: N with
/// N x compute_per_token / gpus = stream / read + N x spill_per_token x (1 / read + 1 / write),
/// rounded up; 0 when nothing is read; infinity when the spill alone outpaces the compute.
/// `stream_bytes` is the frozen bytes read per iteration (independent of N),
/// `spill_per_token` the spilled bytes per token, `compute_per_token` the compute seconds of
/// all stages per token.
double tokens_to_hide(double stream_bytes, double spill_per_token, double compute_per_token, int gpus,
                      double read_bandwidth, double write_bandwidth);

}  // namespace rp
