// Iteration plans: which layers each pipeline stage runs.
//
// One iteration is a linear sequence of stages:
//   forward stages F1..Fk  (layers 0..a-1 split into runs; layer 0 = embedding)
//   one fused tail stage   (layers a..L+1: forward, loss, backward; L+1 = tail)
//   backward stages Bj..B1 (layers a-1..0 split into runs, each recomputing its forward)
// Forward and backward partitions may differ (asymmetric splitting: a backward with
// recompute costs about three forwards). Layer indices: 0 embedding, 1..L decoders, L+1
// tail (final norm, LM head, loss). Stages are dealt to the GPUs round-robin.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace rp {

enum class StageKind : uint8_t { forward, tail, backward };
const char* stage_kind_name(StageKind k);

struct Stage {
  StageKind kind = StageKind::forward;
  int first = 0;  ///< lowest layer index of the stage (inclusive)
  int last = 0;   ///< highest layer index (inclusive)
  int num_layers() const { return last - first + 1; }
  /// Layers in execution order: ascending for forward, first..last then back for the
  /// tail stage's forward part, descending for backward.
  std::vector<int> layers() const;
  /// "F[0-13]", "T[29-29]", "B[28-23]" (a backward stage from its highest layer down), as
  /// IterationPlan::summary() writes the stage.
  std::string label() const;
  bool operator==(const Stage&) const = default;
};

/// Stages of one iteration in execution order: forward stages, the tail, backward stages.
struct IterationPlan {
  int num_layers = 0;  ///< embedding + decoders + tail = L + 2
  std::vector<Stage> stages;
  int num_forward() const;
  int num_backward() const;
  /// Human-readable one-line summary, e.g. "F[0-7] F[8-15] T[16-31] B[15-12] ...".
  std::string summary() const;
};

/// Checks that `p` covers the model exactly once per pass (forward stages ascending and
/// contiguous from layer 0, one tail stage ending at the last layer, backward stages
/// descending and contiguous down to layer 0). Throws std::invalid_argument with the
/// reason, prefixed by `where`; a stage is named by its index from 0 in `p.stages` and its
/// label ("stage 3 B[28-23]"), as `roundpipe plan`'s table and summary line show it.
void validate_plan(const IterationPlan& p, const std::string& where);

/// Uniform plan: forward stages of `fwd_layers` layers, a tail stage holding the tail
/// plus its `tail_decoders` preceding decoder layers, backward stages of `bwd_layers`.
/// Throws std::invalid_argument on non-positive sizes or too many tail decoders.
IterationPlan make_uniform_plan(int num_layers, int fwd_layers, int bwd_layers, int tail_decoders = 0);

/// Uniform asymmetric 3:1 split (backward with recompute costs about 3x forward) sized so
/// that there are at least `num_workers` backward stages when the model is deep enough. Not
/// the runtime's default (that is the partition of the analytic costs): the fallback when no
/// partition fits the memory cap, and the base of a spec plan that gives only some of
/// forward_layers / backward_layers.
IterationPlan make_default_plan(int num_layers, int num_workers);

/// Plan from a spec object: either {"forward_layers": k, "backward_layers": j,
/// "tail_decoders": t} or explicit {"forward": [[a,b],...], "tail": [a,b],
/// "backward": [[b,a],...]}. Validated; errors (std::invalid_argument) name `where` and
/// the key. Null is make_default_plan; an empty object is refused (no plan given on purpose).
IterationPlan plan_from_json(const nlohmann::json& j, int num_layers, int num_workers,
                             const std::string& where);

/// What plan_from_json checks without the model: an object (or null), not empty, only its
/// keys, one of the two forms, the explicit form's stages as [a, b] pairs of integers, the
/// uniform form's counts as integers (forward_layers and backward_layers >= 1, tail_decoders
/// >= 0). Lets a spec be refused before a model loads; errors as plan_from_json's.
void check_plan_json(const nlohmann::json& j, const std::string& where);

}  // namespace rp
