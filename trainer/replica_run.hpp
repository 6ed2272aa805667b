// Data-parallel replicas in the trainer (README "Several machines"): which replicas a run
// joins, and the trainer's small exchanges between them. Every replica runs the same loop
// over the same data stream: it reads every pass of a step (so the data position, the
// global target-token count and the checkpoint's state are the same everywhere) and trains
// only its own contiguous share of them, passes [rank * A / N, (rank + 1) * A / N) of the A
// passes of a step. Replica 0 writes every file (checkpoints, metrics, profile, trace).
#pragma once
#include <memory>
#include <vector>

#include "roundpipe/replicas.hpp"
#include "roundpipe/session.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

/// The replicas `spec.mpi` asks for: null for a single process ("off", or "auto" outside
/// mpirun). Throws std::invalid_argument (one line naming the key) when MPI is asked for but
/// not built in, or when spec.accumulation is not a multiple of the replica count.
std::shared_ptr<Replicas> replicas_for(const TrainSpec& spec);

/// Every replica's `values` summed element by element in rank order 0..N-1 (the same double
/// on every replica); `values` itself without replicas.
std::vector<double> sum_over(Replicas* r, const std::vector<double>& values);

/// Makes `s`, this replica's result of a step, the step's result over the global batch: the
/// loss sum (nats, the load-balancing term included), the target tokens, the load-balancing
/// loss weighted by target tokens and the tokens routed to each of the model's `experts`
/// experts (0: a dense model) are summed over the replicas in rank order 0..N-1, so every
/// replica reports what one process training all the step's passes reports, to the rounding
/// of the sum order. moe_aux_loss becomes the global token-weighted mean, reduce_wait_s the
/// most any replica waited for the step's gradient sums. Unchanged without
/// replicas. Every replica must pass the same `experts`. Throws ReplicaFailure when the
/// exchange fails.
void combine_step(Replicas* r, StepResult& s, int64_t experts);

/// Whether pass `a` of a step's `accumulation` passes is this replica's.
inline bool my_pass(const Replicas* r, int64_t a, int64_t accumulation) {
  if (!r || r->size() <= 1) return true;
  return a / (accumulation / r->size()) == r->rank();
}

}  // namespace rp
