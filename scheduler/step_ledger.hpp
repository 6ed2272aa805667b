// The scheduler's bookkeeping of steps, passes and evaluations. A plain class (no CAF, no
// threads, no device): the scheduler actor (actors/scheduler_actor.cpp) feeds it the events it
// receives and carries out the actions it returns, in order; the actor keeps only what needs
// CAF (the peers, the response promises, the host buffers of the passes and their plans).
//
// The rules it keeps:
//  - passes are dealt first come, first served, each when a pass slot is free (slot 0 first;
//    a freed slot is the next one taken) and, with loss scaling, the scale of its step is
//    decided: step t's backward runs with the scale decided after step t-1-staleness (steps
//    0..staleness: the initial scale), so every pass of a step runs with the same scale,
//    whatever the timing;
//  - a training pass's LoRA dropout masks are numbered step * 2^16 + its index among the
//    step's training passes; evaluation passes have none (-1) and take no index;
//  - a step is closed towards the shards (close_step) once the Session closed it and every
//    pass submitted for it is dealt, so the per-group upload and gradient totals, which
//    depend on each pass's plan, are final; an evaluation pass tagged with the step counts
//    as one of its passes (its uploads read that step's weights) with no gradient;
//  - the gradient is divided by the step's target tokens: those of its own training passes,
//    or the count the Session gave (data-parallel replicas: every replica's); a step without
//    target tokens has no gradient and is skipped (grad_scale 0);
//  - guarded steps: once every trainable group's sum of squares is in (added in group
//    order), decide_step decides skip, clip and the new loss scale, and every shard hears it
//    (step_scale); unguarded steps: the update jobs' sums give the step's gradient norm;
//  - a step is done once it is closed, every trainable group reported its update and every
//    pass's every stage reported (the tail's report, with the loss, may come after the last
//    group update it caused); an evaluation is done when its pass's every stage reported;
//  - after a failure nothing more is dealt and every result carries the failure.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optimizer/loss_scale.hpp"
#include "roundpipe/session.hpp"  // StepResult, EvalResult

namespace rp {

/// One thing the scheduler must do.
struct LedgerAction {
  enum class Kind : uint8_t {
    close_step,  ///< send CloseStep(step, passes, grad_scale, lr, uploads, grads) to every shard
    step_scale,  ///< send StepScale(step, skip, grad_scale) to every shard
    step_done,   ///< answer the step's waiters with `step_result`
    eval_done,   ///< answer the evaluation's waiters with `eval_result`
    deal,        ///< a pass slot was freed or a loss scale decided: deal what next_deal() gives
  };
  Kind kind = Kind::deal;
  int64_t step = 0;
  int64_t passes = 0;    ///< close_step: the passes submitted for the step
  float grad_scale = 0;  ///< close_step: 1 / tokens (0: skipped); step_scale: decide_step's
  double lr = 0;         ///< close_step
  bool skip = false;     ///< step_scale
  /// close_step: per group, the step's uploads and gradient contributions over its passes
  /// (empty without a layout: the shards then use their per-pass counts).
  std::shared_ptr<const std::vector<int>> uploads, grads;
  StepResult step_result;  ///< step_done
  EvalResult eval_result;  ///< eval_done
};

/// A pass to deal now (next_deal), then to record with dealt().
struct PassDeal {
  int64_t pass = 0;  ///< the global pass number (0, 1, ... in dealing order)
  int64_t step = 0;
  int64_t eval = -1;          ///< >= 0: an evaluation pass
  int slot = 0;               ///< the pass slot (host buffers) it uses until its last stage reports
  float loss_scale = 1.f;     ///< the scale its backward runs with (its step's)
  int64_t dropout_pass = -1;  ///< set by dealt(): the id of its LoRA dropout masks, -1 for none
};

/// What one stage task reported (StageDone).
struct StageReport {
  double loss_sum = 0, loss_count = 0;
  double aux_weighted = 0;            ///< sparse models' tails: target tokens x load-balancing loss
  std::vector<double> expert_tokens;  ///< sparse models' tails: assignments per expert
};

class StepLedger {
 public:
  struct Options {
    int num_groups = 0;
    std::vector<char> frozen;           ///< per group, 1: frozen (no shard reports it); empty: none
    int pass_slots = 1;                 ///< passes in flight at most (>= 1)
    bool guard = false;                 ///< guarded steps: decide once every GradSumSq is in
    double max_grad_norm = 0;           ///< guarded steps: > 0 clips the global norm to this
    LossScaler* loss_scaler = nullptr;  ///< not owned; null: no loss scaling
    int staleness = 1;                  ///< 1 async, 0 sync
    /// Seconds on a steady clock (StepResult::seconds); empty: std::chrono::steady_clock.
    std::function<double()> clock;
  };
  /// Throws std::invalid_argument for pass_slots < 1, staleness < 0 or num_groups < 0.
  explicit StepLedger(Options o);

  // ---- passes ------------------------------------------------------------------------------
  /// A pass of `step` was submitted; `target_tokens`: its targets >= 0 (training passes; an
  /// evaluation pass, eval >= 0, adds none). It waits in a queue until next_deal() gives it.
  void submit_pass(int64_t step, int64_t eval, double target_tokens);
  /// The next pass to deal now, taken off the queue with its slot and pass number; nullopt
  /// while the queue is empty, no slot is free, its step's loss scale is not decided yet,
  /// or the run failed.
  std::optional<PassDeal> next_deal();
  /// `d` is dealt with a plan of `stages` stages making `uploads` and `grads` per group
  /// (empty: not counted); sets d.dropout_pass and appends close_step when the step is ready.
  void dealt(PassDeal& d, int stages, const std::vector<int>& uploads, const std::vector<int>& grads,
             std::vector<LedgerAction>& out);
  /// A stage of pass `pass` reported; a pass not in flight is ignored. The pass's last
  /// report appends eval_done (evaluations), step_done (when it completes the step) and deal.
  void stage_done(int64_t pass, const StageReport& r, std::vector<LedgerAction>& out);

  // ---- steps -------------------------------------------------------------------------------
  /// The Session closed `step` with `lr`; `tokens` >= 0 replaces the step's own target tokens
  /// as the gradient's divisor (data-parallel replicas), < 0 keeps them.
  void close_requested(int64_t step, double lr, double tokens, std::vector<LedgerAction>& out);
  /// Guarded steps: a group's sum of squares of the step's raw gradient. The last trainable
  /// group's appends step_scale (and deal with loss scaling). Throws std::invalid_argument
  /// for a group reported twice.
  void grad_sumsq(int64_t step, int group, double sumsq, std::vector<LedgerAction>& out);
  /// A group's update of the step is in the fp32 master (`sumsq`: unguarded steps, the raw
  /// gradient's sum of squares); may append step_done.
  void group_updated(int64_t step, int group, double sumsq, std::vector<LedgerAction>& out);

  // ---- results -----------------------------------------------------------------------------
  /// The step's result once it is done, or with the failure once the run failed; nullopt:
  /// wait for step_done. A step not seen before is entered (it shows in describe()).
  std::optional<StepResult> step_result(int64_t step);
  /// The same for evaluation `id`.
  std::optional<EvalResult> eval_result(int64_t id);
  /// The run failed with `what`; false when it had failed already (the first failure wins).
  bool fail(const std::string& what);
  const std::string& failed() const { return failed_; }

  // ---- loss scales -------------------------------------------------------------------------
  /// A resumed run continues at `step` with the scales of steps step..step+staleness (loss
  /// scaling; ignored without). False once any step was entered (a pass, a close, a wait),
  /// or, with loss scaling, for a count other than staleness + 1.
  bool resume_at(int64_t step, const std::vector<float>& scales);
  /// The scales decided for steps step, step+1, ... (at most staleness + 1, stopping at the
  /// first one not decided).
  std::vector<float> loss_scales_from(int64_t step) const;

  // ---- inspection --------------------------------------------------------------------------
  /// Passes queued or in flight, or steps closed by the Session and not done.
  bool busy() const;
  /// "step 3: pass 7 2/5 stages done, 1 of 4 groups updated; ..." or "nothing in flight".
  std::string describe() const;
  int64_t passes_dealt() const { return next_pass_; }
  int trainable_groups() const { return trainable_; }

 private:
  struct Step {
    int64_t passes_submitted = 0, passes_dealt = 0, passes_done = 0;
    int64_t train_passes_dealt = 0;  ///< of them, training passes (numbering the dropout masks)
    bool close_requested = false, closed = false, done = false;
    double lr = 0;
    std::vector<int> uploads, grads;  ///< per group, over the passes dealt
    double tokens = 0;                ///< target tokens of its training passes
    double scale_tokens = -1;         ///< the Session's count (replicas); < 0: `tokens`
    double norm_tokens() const { return scale_tokens >= 0 ? scale_tokens : tokens; }
    double loss_sum = 0, loss_count = 0, aux_weighted = 0;
    std::vector<double> expert_tokens;
    int groups_updated = 0;
    float loss_scale = 1.f;
    StepDecision decision;
    double t_first = 0, seconds = 0;
  };
  struct Pass {
    int64_t step = 0, eval = -1;
    int slot = 0, stages_done = 0, stages = 0;
  };
  struct Eval {
    double loss_sum = 0, loss_count = 0;
    bool done = false;
  };
  struct Queued {
    int64_t step = 0, eval = -1;
  };

  double now() const;
  StepResult result_of(int64_t step, const Step& s, const std::string& err) const;
  int trainable_index(int group) const;
  void close_if_ready(int64_t step, std::vector<LedgerAction>& out);
  void finish_if_done(int64_t step, std::vector<LedgerAction>& out);

  Options o_;
  int trainable_ = 0;
  std::vector<int> norm_index_;  ///< per group: its index among the trainable ones, -1 frozen
  std::unique_ptr<StepNormReducer> norms_;
  std::vector<int> free_slots_;  ///< taken from the back
  std::deque<Queued> queue_;
  std::map<int64_t, Step> steps_;
  std::map<int64_t, Pass> passes_;
  std::map<int64_t, Eval> evals_;
  std::map<int64_t, float> scale_for_step_;  ///< loss scaling: decided scales by step
  int64_t next_pass_ = 0;
  std::string failed_;
};

}  // namespace rp
