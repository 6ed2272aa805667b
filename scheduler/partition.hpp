// Automatic asymmetric partitioner (minimises max(S, G) * tmax over candidate stage times).
//
// A plan (scheduler/plan.hpp) is forward stages over layers 0..a-1, one fused tail stage
// a..L+1 (a >= 1) and backward stages over a-1..0; forward and backward partitions are
// chosen independently. Each stage runs all M micro-batches and its time is
//
//   tau(stage) = max( M * sum(compute),                                  compute stream
//                     (W + M * up) / pcie,        W = weights uploaded once per stage (frozen
//                                                     groups: storage bytes)
//                                                     (a backward stage: not the embedding's)
//                     (G + M * down) / pcie,      G = gradients downloaded once per stage
//                     D / disk )                  D = frozen bytes read from a disk tier
//                                                     (disk: the stage's share of its bandwidth)
//
// so a stage whose PCIe traffic exceeds its compute window is charged its transfer time.
// The objective is the published one, max(S, G_gpus) * tmax with tmax = max tau (RoundPipe,
// arXiv 2604.27085), evaluated on tau. Every stage must fit the per-GPU memory cap. A stage's
// working set (work_bytes) is exactly what a worker allocates for it (actors/stage_task.cpp),
// each buffer charged as the device pool charges it (pool_allocation_bytes):
//
//   work(stage) = W (the weights it uploads; a backward stage: not the embedding's; a frozen
//                 group both its compute-dtype copy and the staging buffer of its storage form)
//               + G (gradient accumulators; backward and tail stages)
//               + min(M, 2) slots * (ids/targets/loss, the uploaded input or dy, dx, and one
//                 activation per layer: outputs, saved inputs; none for the embedding in a
//                 backward stage; with a saved attention also each decoder's attention
//                 output and log-sum-exp)
//               + stage_temporaries(kind, k) activations (dy between a stage's layers)
//               + max scratch over its layers (forward-only scratch in a forward stage)
//   mem(stage)  = work(stage) + (weight_buffers - 1) * W   (room to prefetch the next
//                 stage's weights while this one computes)
//
// A plan runs under any cap >= max work; prefetching needs more. The partitioner asks for
// mem <= cap (automatic_partition in scheduler/replan.hpp retries with weight_buffers 1).
//
// Algorithm: tmax is always the tau of one stage, i.e. of some run of consecutive layers,
// so the candidates are the taus of all memory-feasible runs (forward, backward, tail),
// sorted and deduplicated. For a bound T, the fewest stages with every tau <= T comes from
// the smallest feasible tail start and a greedy O(L) packing of each pass (exact because
// tau and mem are monotone under removing layers from a stage). S(T) does not increase
// with T, so for each stage count s >= G the smallest T reaching s is found by binary
// search; the best max(s, G) * tmax over those is optimal (checked against brute force in
// tests/scheduler/test_partition.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/cost_model.hpp"
#include "scheduler/plan.hpp"

namespace rp {

struct PartitionOptions {
  int gpus = 1;               ///< G: GPUs in the pool
  int64_t micro_batches = 1;  ///< M: micro-batches per iteration
  int64_t memory_cap = 0;     ///< per-GPU bytes a stage may use (0: unlimited)
  double pcie_bandwidth = 0;  ///< host<->device bytes/s per direction (0: transfers free)
  int weight_buffers = 2;     ///< device copies of a stage's weights (2: prefetch)
  int act_slots = 2;          ///< micro-batch slots in flight per stage (upload one early)
  /// Allocation granule of the device pool (kernels/device.hpp pool_allocation_bytes): 256 for
  /// the CPU backend's arenas, kCudaPoolGranule for a GPU; <= 1 charges bytes as given.
  int64_t alloc_granule = 1;
  /// Disk tier (scheduler/disk_tier.hpp): the disk read bytes/s one stage can count on, the
  /// host disk's read bandwidth shared by the GPUs reading at once (disk_stage_bandwidth).
  /// A stage's LayerCost::disk_bytes are read at this rate, and that time is charged against
  /// its compute window as PCIe time is. 0: no disk reads (or a free disk).
  double disk_bandwidth = 0;
};

/// Predicted time and memory of one stage.
struct StageEstimate {
  Stage stage;
  double compute_seconds = 0;       ///< M * sum of the layers' costs for this stage kind
  double upload_seconds = 0;        ///< (weights + M * activation uploads) / pcie
  double download_seconds = 0;      ///< (gradients + M * activation downloads) / pcie
  double seconds = 0;               ///< tau: max of the three
  int64_t weight_bytes = 0;         ///< one copy of the stage's weights (with frozen groups' staging buffers)
  int64_t weight_upload_bytes = 0;  ///< weight bytes uploaded per stage (frozen groups: their storage form)
  int64_t grad_bytes = 0;           ///< gradient accumulators (0 for forward stages)
  int64_t act_up_bytes = 0;         ///< uploaded per micro-batch (ids, inputs, saved activations, dy)
  int64_t act_down_bytes = 0;       ///< downloaded per micro-batch (saved activations, dx, loss)
  int64_t work_bytes = 0;           ///< device bytes a worker allocates to run the stage (file comment)
  int64_t memory_bytes = 0;         ///< work_bytes plus room for the next stage's weights (file comment)
  int64_t slot_bytes = 0;           ///< one micro-batch slot of work_bytes (as charged)
  /// What a retired task still holds while the next task on its GPU starts (actors/worker.cpp,
  /// maybe_finish; release_retired_inputs in actors/stage_task.hpp): its gradient accumulators
  /// until they are on the host, and in its last slot the outputs still downloading (a forward
  /// stage's layer outputs and saved attention, a backward or tail stage's dx and loss), its
  /// inputs already given back. scheduler/stage_peak.hpp adds it to the next task's working set.
  int64_t retained_bytes = 0;
  int64_t disk_read_bytes =
      0;                    ///< frozen bytes read from the disk tier before the stage (LayerCost::disk_bytes)
  double disk_seconds = 0;  ///< disk_read_bytes / disk_bandwidth (0 without one)
  bool transfer_bound() const { return seconds > compute_seconds; }
};

struct PartitionResult {
  IterationPlan plan;
  std::vector<StageEstimate> stages;  ///< same order as plan.stages
  double tmax = 0;                    ///< slowest stage's seconds
  double objective = 0;               ///< max(S, gpus) * tmax
  int64_t candidates = 0;             ///< distinct tmax candidates
  int64_t evaluations = 0;            ///< greedy packings run
};

/// Time and memory of `stage` (any kind, any layer range) under `opt`. Throws
/// std::invalid_argument for a range outside `costs`.
StageEstimate estimate_stage(const std::vector<LayerCost>& costs, const Stage& stage,
                             const PartitionOptions& opt);

/// Estimates of every stage of `plan` after validate_plan(plan, where); throws
/// std::invalid_argument("<where>: ...") when the plan is malformed, does not match
/// costs.size(), or a stage exceeds the memory cap (naming the stage, its bytes and the cap).
std::vector<StageEstimate> check_plan(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                                      const PartitionOptions& opt, const std::string& where);

/// An explicit `plan` as a PartitionResult: check_plan's estimates, their tmax and objective (no
/// candidates or packings). Throws what check_plan throws.
PartitionResult plan_result(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                            const PartitionOptions& opt, const std::string& where);

/// max(S, gpus) * max tau of the estimates.
double plan_objective(const std::vector<StageEstimate>& stages, int gpus);

/// The best plan under the objective (file comment). Throws std::invalid_argument for
/// fewer than 3 layers, gpus < 1, micro_batches < 1, negative costs, and
/// std::runtime_error naming the layer that cannot fit under the memory cap
/// ("layer 5 (decoder 4) needs 30.1 GiB as a backward stage on its own ...").
PartitionResult partition(const std::vector<LayerCost>& costs, const PartitionOptions& opt);

/// "1.50 GiB"-style text for a byte count.
std::string format_bytes(double bytes);

}  // namespace rp
