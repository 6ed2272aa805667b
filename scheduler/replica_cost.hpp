// Predicted cost of data-parallel replicas (README "Several machines"; `roundpipe plan
// --nodes N --net-gbps B`): N nodes, each a whole RoundPipe pipeline, sum every trainable
// group's fp32 gradient after each step with the runtime's reduction (dist/mpi: each node
// sends every other node its copy of that node's shard, sums the shard it owns in rank order
// and sends the sum to every node), so each node sends and receives 2 (N-1)/N of the
// gradient's bytes per step, in 2 (N-1) messages per group.
//
// Timing model, per step: the gradients complete in backward order (tail, last decoder, ...,
// embedding) spread over the step's last iteration in proportion to each layer's backward
// cost, the embedding's at the step's end; one link per node carries the reductions one
// after the other, each taking bytes / bandwidth plus a per-message latency.
//  - synchronous optimizer: the next step needs every group updated, so what the link still
//    has to do after the step's end is exposed: step = compute + max(0, last sum's end - end);
//  - staleness-1 (async): a group's sum must be done before the next step writes that group's
//    gradient, about one step after it completed, so reductions hide under the next step as
//    long as the link keeps up: step = max(compute, longest queue a group waited + its sum).
// Not modelled: the CPU's summing (memory-bound, far faster than any network), contention of
// the reduction with the host<->device copies, and the clipping norm's extra round trip.
#pragma once
#include <vector>

#include "scheduler/cost_model.hpp"

namespace rp {

struct ReductionEstimate {
  double values = 0;           ///< gradient values summed per step (trainable parameters)
  double bytes_per_node = 0;   ///< sent by each node per step (as many received)
  double link_s = 0;           ///< time the link is busy per step
  double exposed_sync_s = 0;   ///< synchronous optimizer: link time after the step's last gradient
  double exposed_async_s = 0;  ///< staleness 1: step time added because the link cannot keep up
  double step_sync_s = 0, step_async_s = 0;  ///< predicted step times
  int64_t passes_to_hide = 1;  ///< staleness 1: the fewest iterations per step whose compute covers link_s
};

/// `costs`: the layers (embedding, decoders, tail) as the partitioner sees them, each summed
/// as LayerCost::grad_bytes / grad_elem_bytes fp32 values; `iteration_s`: one iteration (pass)
/// of a node; `passes`: iterations per step on one node; `net_bytes_per_s` per node and
/// direction; `latency_s` per message. `tied`: the tail's accumulators include the embedding's
/// (a tied LM head): that group is one host gradient, summed once, when the embedding's
/// backward completes it. std::invalid_argument for non-positive sizes.
ReductionEstimate estimate_reduction(const std::vector<LayerCost>& costs, int64_t grad_elem_bytes, int nodes,
                                     double net_bytes_per_s, double latency_s, double iteration_s,
                                     int64_t passes, bool tied = false);

}  // namespace rp
