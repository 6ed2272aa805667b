// Partitions whose stage switches can prefetch. The partitioner (scheduler/partition.hpp) sizes
// each stage by its own memory; a switch where the next stage's weights do not fit beside the
// stage before it (prefetch_refused in scheduler/stage_peak.hpp) makes the worker upload them
// only when that stage ends, and the GPU waits for the whole upload. With tied embeddings the
// last backward stage holds the embedding's fp32 gradient beside its own, and the next pass's
// first forward stage uploads the embedding with its decoders: Qwen3-1.7B at a 6.7 GiB cap waited
// about 62 ms a step there on an H200 (1.71 s steps).
//
// refine_for_prefetch moves layers at such a switch: out of the stage before it into that
// stage's neighbour of the same pass, out of the refused stage into its neighbour, or splits one
// of the two, and keeps the candidate the bubble simulator (scheduler/simulator.hpp, which
// charges a refused prefetch) predicts fastest, round after round while one gains.
#pragma once
#include <vector>

#include "scheduler/partition.hpp"
#include "scheduler/simulator.hpp"

namespace rp {

/// A candidate must beat the current plan's predicted iteration time by this fraction.
inline constexpr double kPrefetchRefineMinGain = 0.002;

/// Rounds of moves at most (each fixes or improves one switch).
inline constexpr int kPrefetchRefineRounds = 4;

/// `r` (a partition of `costs` under `opt`) with its refused prefetches moved where a candidate
/// plan predicts a faster iteration (file comment); `r` itself when no switch is refused, there
/// is no memory cap, or no candidate gains kPrefetchRefineMinGain. The replays all candidates
/// take together are bounded (a deep plan on a large pool tries its first candidates only). Every candidate
/// keeps each stage within the cap as partition() does (with opt.weight_buffers > 1 its memory_bytes, else
/// its work_bytes). `sim`: the simulation's options (refine_sim_options(opt) when the caller has
/// none of its own); its gpus and micro_batches are set to opt's. The
/// result's candidates and evaluations are r's; its stages, tmax and objective the new plan's.
PartitionResult refine_for_prefetch(const std::vector<LayerCost>& costs, PartitionResult r,
                                    const PartitionOptions& opt, SimOptions sim);

/// The SimOptions a plan under `opt` is compared with: its GPUs, micro-batches and weight
/// buffers, every copy stream at opt.pcie_bandwidth.
SimOptions refine_sim_options(const PartitionOptions& opt);

}  // namespace rp
