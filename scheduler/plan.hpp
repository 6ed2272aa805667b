// Iteration plans: which layers each stage runs, and how stages are dealt to GPUs.
//
// One iteration (computation dispatch) is a linear sequence of stages:
//   forward stages F1..Fk  (layers 0..a-1 split into runs; layer 0 = embedding)
//   one fused tail stage   (layers a..L+1: forward, loss, backward; L+1 = tail)
//   backward stages Bj..B1 (layers a-1..0 split into runs, each recomputing its forward)
// Forward and backward partitions may differ (asymmetric stage splitting).
// Layer indices follow model/layout.hpp: 0 embedding, 1..L decoders, L+1 tail.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/layout.hpp"
#include "roundpipe/plan.hpp"  // Stage, IterationPlan, validate_plan, make_*_plan, plan_from_json

namespace rp {

/// Round-robin dealing (computation dispatch): stage s of the sequence goes to worker
/// (pointer + s) mod num_workers. Returns the worker of each stage of `p` and advances
/// `pointer` by the number of stages, so the next iteration continues the deal.
std::vector<int> deal_round_robin(const IterationPlan& p, int num_workers, int64_t& pointer);

/// The stages of a forward-only (evaluation) pass of plan `p`: its forward stages, then its
/// tail stage (run forward through its decoders and the loss only; no backward stages).
IterationPlan evaluation_plan(const IterationPlan& p);

/// Parameter-group uploads of one evaluation pass of `p` (its stages' weights, forward only;
/// frozen groups count 0: they are never requested from a shard).
std::vector<int> evaluation_uploads(const ModelLayout& m, const IterationPlan& p);

}  // namespace rp
