// Buffer counts of a stage task that the worker (actors/stage_task.cpp) and the partitioner's
// memory model (scheduler/partition.cpp) must agree on. Pure, header-only.
#pragma once
#include <algorithm>
#include <cstdint>

#include "scheduler/plan.hpp"

namespace rp {

/// Activation-sized temporaries a stage task holds while it computes: a backward or tail stage
/// of k layers passes dy from layer to layer through min(k - 1, 2) of them (alternating); a
/// forward stage writes each layer's output into its slot and needs none.
inline int stage_temporaries(StageKind kind, int layers) {
  if (kind == StageKind::forward) return 0;
  return std::clamp(layers - 1, 0, 2);
}

/// Double-buffer slots a stage task allocates: one per micro-batch, at most two.
inline int stage_slots(int64_t micro_batches) { return int(std::clamp<int64_t>(micro_batches, 0, 2)); }

}  // namespace rp
