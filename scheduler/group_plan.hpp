// Per-parameter-group bookkeeping of a plan: how often one pass uploads each group and
// produces its gradient, and which optimizer shard owns each group. Pure functions of the
// model layout and the plan, no actors.
#pragma once
#include <vector>

#include "model/layout.hpp"
#include "scheduler/plan.hpp"

namespace rp {

/// Counts, for one pass of `plan`, how many stages upload (`uploads`) and how many produce
/// the gradient of (`grads`) each parameter group of `m`. Frozen groups count 0 in both: they
/// are never requested from a shard and have no gradient.
void count_per_pass(const ModelLayout& m, const IterationPlan& plan, std::vector<int>& uploads,
                    std::vector<int>& grads);

/// The shard (0..shards-1) owning each group of `m`: largest groups first, each to the least
/// loaded shard by element count (LPT). A group of at least total/shards elements (the
/// embedding of a large-vocabulary model) keeps its shard to itself while other shards
/// remain: a shard answers no request while it updates a group, and so long an update would
/// hold up the weight grants of every layer sharing its shard. Frozen groups belong to no
/// shard (-1) and count in no load. Throws std::invalid_argument
/// for shards < 1.
std::vector<int> assign_shards(const ModelLayout& m, int shards);

}  // namespace rp
