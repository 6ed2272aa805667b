// Optimizer shard actors: each owns a disjoint set of parameter groups (their fp32
// master weights and AdamW moments) and enforces the per-layer protocol for them
// (rules 1, 3, 4 and 5 of docs/protocol.md; rule 2 is the workers' one-copy-per-direction):
//
//  iteration t computes with weights version v(t) = max(t - 1 - s, -1), s = staleness
//  (1 async, 0 sync); version k = the weights after step k, -1 = the initial weights.
//  1. AcquireWeights(g, t) is granted only once version v(t) of g is published.
//  3. AcquireGradSlot(g, t) is granted only after step t-1 consumed g's gradient, and to
//     one writer at a time (the first of a step overwrites, later ones accumulate).
//  4. g's update for step t runs when all its gradient contributions of step t are
//     written, in the order they complete (no global barrier).
//  5. The low-precision copy of version k is written only after every upload of every
//     iteration <= k + s finished; until then the fp32 update waits in the master and
//     the copy is cast when allowed. One outstanding step per group.
// Shards are detached actors (own thread); each owns a persistent ThreadPool (`threads`
// workers, pinned to `cpus`) that runs AdamW, the gradient's sum of squares and deferred
// casts. A detached shard submits each update, deferred cast and sum of squares to a job thread of its own
// and goes on answering requests for its other groups; the group stays busy (no grant, no
// transition) until the job reports back, so the rules hold per group as before. Guarded steps (ShardOptions::guard: global-norm clipping, loss scaling, inf/NaN
// skipping): once group g's gradient of step t is complete the shard sends GradSumSq{t, g}
// to the scheduler and updates g only when StepScale{t} arrived (skip: no update at all, the
// version still advances so the protocol moves on).
#pragma once
#include <vector>

#include <caf/all.hpp>

#include "actors/pass_buffers.hpp"
#include "model/layout.hpp"
#include "optimizer/adamw.hpp"

namespace rp {

struct ShardGroup {
  int group = 0;
  std::vector<float>* master = nullptr;  ///< fp32 optimizer copy (owned by the Session)
  AdamWState* state = nullptr;           ///< moments and step counter (owned by the Session)
  int uploads_per_pass = 0;              ///< stages of one pass that upload this group (used when
                                         ///< CloseStep carries no per-group totals)
  int grads_per_pass = 0;                ///< stages of one pass that produce its gradient (same)
};

struct ShardOptions {
  int staleness = 1;
  AdamWOptions adam;
  int threads = 1;  ///< host threads per AdamW update and low-precision cast (a persistent pool)
  std::vector<int> cpus;  ///< pin those threads to these cores (empty: not pinned)
  bool guard = false;     ///< wait for StepScale per step (see above)
  /// Spawn the shard on its own thread (production). Tests that drive the protocol with
  /// CAF's deterministic test coordinator set false: a detached actor runs on a private
  /// thread that the coordinator does not schedule.
  bool detached = true;
  /// Testing only (tests/actors/test_protocol_guards.cpp): 1..5 switches off the guard of
  /// that rule (numbering of the file comment above; 2 = the shard's half of rule 2, one
  /// gradient writer at a time), so the protocol tests can show they catch its absence.
  /// 0 = every guard on. Never set outside tests.
  int disable_rule = 0;
};

/// Spawns an optimizer shard owning `groups` (detached unless opt.detached is false);
/// reports GroupUpdated to `scheduler`.
caf::actor spawn_optimizer_shard(caf::actor_system& sys, std::vector<ShardGroup> groups,
                                 ParamStore* store, ShardOptions opt, caf::actor scheduler);

}  // namespace rp
