// The training loop as a library: what `roundpipe train` runs, callable from any program.
//
//   rp::Trainer trainer(rp::load_spec("spec.json"));          // or a TrainSpec built in code
//   rp::TrainerCallbacks cb;
//   cb.on_step = [](const rp::StepReport& r) { std::printf("%lld %.4f\n", (long long)r.step, r.loss); };
//   rp::StopToken stop;                                        // stop.request_stop() from any thread
//   rp::TrainResult res = trainer.run(cb, stop);
//   // res.checkpoint: ".../final" (or ".../checkpoint-<n>" when stopped); resume it with
//   // spec.resume_from = res.checkpoint (and more steps)
//
// A run loads the model and the data, builds a Session, and for every step runs
// `accumulation` forward_backward passes of sequences_per_step / accumulation sequences,
// then steps with the learning rate of the schedule. It writes into spec.output_dir:
// metrics.csv (one row per step), checkpoint-<n>/ every save_every steps and final/ (plain
// Hugging Face folders) with their state in state/<name>/ (optimizer_state.bin, the
// optimizer state, and roundpipe_state.json, the trainer's position: a resumed run
// reproduces the uninterrupted one bit for bit),
// profile.json (the measured per-layer profile) and trace.json (spec.trace). docs/spec.md
// describes the files.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "roundpipe/data.hpp"
#include "roundpipe/model.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

/// Asks a running Trainer to stop: the steps in flight finish and are saved as
/// checkpoint-<n> (resume from it); steps still unfinished spec.stop_timeout_s after the
/// request (a stalled run) are abandoned and not saved (TrainResult::steps_abandoned), so a
/// stop always ends the run in bounded time. Copies share one flag. request_stop() may be called from
/// any thread and from a signal handler (it is one lock-free atomic exchange).
class StopToken {
 public:
  StopToken() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  /// Returns true for the first request, false when a stop was already requested.
  bool request_stop() const noexcept { return !flag_->exchange(true); }
  bool stop_requested() const noexcept { return flag_->load(); }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

/// One optimizer step, reported once it is applied (one step behind the pipeline: with the
/// staleness-1 optimizer the next step's passes are already running).
struct StepReport {
  int64_t step = 0;         ///< steps done including this one (1-based)
  int64_t total_steps = 0;  ///< the run ends after this many steps (spec.steps, or what spec.epochs derives)
  /// Passes over the training sequences after this step: sequences consumed / training
  /// sequences (1.25: a quarter into the second pass).
  double epoch = 0;
  int64_t first_step = 0;     ///< steps done before this run (a resumed run), else 0
  double loss = 0;            ///< mean cross-entropy over the step's target tokens (nats)
  int64_t tokens = 0;         ///< tokens of the step (sequences_per_step * seq_len)
  int64_t target_tokens = 0;  ///< tokens with a target in the step (the loss is averaged over them)
  /// All tokens of the steps since the previous report / their own wall time: the time since
  /// that report (for the first step: since the loop started, not the model load) less the
  /// evaluations and checkpoints in between.
  double tokens_per_s = 0;
  double lr = 0;  ///< the learning rate the step used
  /// Global L2 norm of the step's true gradient (before clipping), over every trainable
  /// parameter (and every replica's passes). Always computed: without clipping, loss scaling
  /// or skipping each update job also sums its gradient's squares (the weights are the same).
  double grad_norm = 0;
  double loss_scale = 1;  ///< fp16 loss scale the step's backward used (1 without loss scaling)
  bool skipped = false;   ///< inf/NaN gradients: the step changed nothing
  double elapsed_s = 0;   ///< since run() started
  /// Estimated seconds until the last step: the steady seconds per step (the median of the
  /// recent steps after this run's first, excluding evaluations and checkpoints) times the
  /// steps left, plus the mean measured evaluation time times the evaluations left.
  double eta_s = 0;
  /// Model FLOPs utilisation (CUDA backend; 0 on the CPU): tokens_per_s * (6 * matmul
  /// parameters + 6 * layers * heads * head_dim * seq_len) / (workers * 790e12, the H200's
  /// dense bf16 peak of scheduler/cost_model.hpp's DeviceModel), as bench_throughput.
  double mfu = 0;
  /// Data-parallel replicas: seconds the step waited for its cross-replica gradient sums (the
  /// part the overlap with backward and the next step did not hide; StepResult::reduce_wait_s),
  /// the most of any replica. 0 in one process.
  double reduce_wait_s = 0;
  /// Evaluation after this step (spec eval_data / eval_fraction, every eval_every steps and
  /// after the last): the mean loss over the evaluation set's target tokens, computed by
  /// forward-only passes through the pipeline with the weights the next step trains with
  /// (after every step in sync mode; one update behind with the staleness-1 optimizer).
  bool evaluated = false;
  double eval_loss = 0;        ///< nats per target token
  double eval_perplexity = 0;  ///< exp(eval_loss)
  int64_t eval_tokens = 0;     ///< target tokens evaluated
  /// Mixture-of-experts models (experts > 0): the load-balancing loss of the step (without its
  /// coefficient; StepResult::moe_aux_loss) and the expert utilisation: the tokens routed to
  /// the least and the most used expert over the step, summed over the sparse layers, as a
  /// multiple of the ideal (all routed tokens / experts; 1 and 1 is perfectly balanced).
  int64_t experts = 0;
  double aux_loss = 0, expert_load_min = 0, expert_load_max = 0;
  /// Data-parallel replicas (spec "mpi"): this process's rank (0 without replicas). Every
  /// replica reports the same global loss, token counts, norm and router statistics (aux_loss,
  /// expert loads: every replica's passes, like one process training them all); replica 0
  /// writes the files and prints the progress and the evaluation.
  int replica = 0;
};

/// A checkpoint folder the run wrote.
struct CheckpointReport {
  std::string dir;     ///< "<output_dir>/checkpoint-<n>" or "<output_dir>/final"
  int64_t step = 0;    ///< steps it holds
  double seconds = 0;  ///< time the save took
};

/// The state between two steps, handed to TrainerCallbacks::on_eval: every closed step is
/// applied and nothing is in flight, so the weights belong to exactly `step` steps.
struct EvalContext {
  int64_t step = 0;  ///< steps done
  const ModelLayout& layout;
  const std::vector<std::vector<float>>& weights;  ///< fp32 master weights per parameter group
};

/// Callbacks of a run, all optional, called on the thread that called run(). An exception
/// from a callback ends the run and propagates out of run().
struct TrainerCallbacks {
  /// Once the model, the data and the runtime are ready (a resumed run restored), before the
  /// first step.
  std::function<void()> on_ready;
  std::function<void(const StepReport&)> on_step;
  std::function<void(const CheckpointReport&)> on_checkpoint;
  /// Called every `eval_every` steps (and not after the last one: the final checkpoint
  /// follows) with the pipeline drained: the place for the program's own evaluation. It
  /// costs the pipeline's refill; the results of the run do not change.
  std::function<void(const EvalContext&)> on_eval;
  int64_t eval_every = 0;  ///< 0: never
  /// Called with every batch before its forward_backward pass: step (0-based), pass within
  /// the step (0..accumulation-1) and the batch.
  std::function<void(int64_t step, int64_t pass, const TokenBatch& batch)> on_batch;
};

/// How a run ended.
struct TrainResult {
  int64_t first_step = 0;  ///< steps done before this run (resume), else 0
  int64_t steps_done = 0;  ///< steps done in all, including first_step
  bool stopped = false;    ///< a StopToken ended the run before spec.steps
  /// Stopped: closed steps that did not finish within spec.stop_timeout_s of the request.
  /// They are not saved (a checkpoint holds only completed steps, never a half-applied one);
  /// steps_done counts the steps that completed before them.
  int64_t steps_abandoned = 0;
  int64_t skipped_steps = 0;  ///< steps of this run skipped (inf/NaN gradients, no target tokens)
  std::string checkpoint;     ///< the last checkpoint written by this run ("" when stopped
                              ///< with no new step since the last one, or with steps
                              ///< abandoned: earlier checkpoints are kept)
  /// Stopped: the newest finished checkpoint to resume from: this run's last one, else the one
  /// it resumed from ("" when there is none).
  std::string latest_checkpoint;
  std::string metrics;           ///< path of metrics.csv
  double seconds = 0;            ///< wall time of run()
  size_t peak_device_bytes = 0;  ///< per worker
  std::string plan;              ///< summary of the plan at the end (it may change once by re-planning)
  std::string sample_before,
      sample_after;  ///< spec.sample_prompt's answers ("" without one; before: fresh runs only)
  int replica = 0;   ///< this process's rank among data-parallel replicas (0 without them)
  int replicas = 1;  ///< replicas of the run (1: a single process)
  /// Stopped with replicas: the ranks whose StopToken asked for the stop (a signal may reach
  /// only one of them); every replica stopped after the same step all the same.
  std::vector<int> stopped_by;
  int64_t total_steps = 0;  ///< the steps the run was to train (spec.steps, or derived from spec.epochs)
  /// Early stopping (spec.early_stopping) ended the run after steps_done steps; final/ was saved
  /// as at a normal end (stopped stays false). early_stop_reason says why, in one line.
  bool early_stopped = false;
  std::string early_stop_reason;
  /// The best checkpoint by spec.metric_for_best_model ("" without evaluations at saves) and
  /// its metric and step.
  std::string best_checkpoint;
  double best_metric = 0;
  int64_t best_step = 0;
  /// The steps final/ holds: steps_done, or with spec.load_best_model_at_end the best
  /// checkpoint's step when it beat the last step (0 when no final/ was written).
  int64_t final_step = 0;
};

class Trainer {
 public:
  /// Keeps `spec` (already validated by spec_from_json, or built in code).
  explicit Trainer(TrainSpec spec);
  /// spec_from_json(j, where) / load_spec(path).
  static Trainer from_json(const nlohmann::json& j, const std::string& where);
  static Trainer from_file(const std::string& path);

  const TrainSpec& spec() const { return spec_; }

  /// Runs the job. Before anything is loaded, the output folder, the compute dtype and the
  /// checkpoint to resume from (spec.resume_from) are checked, and the leftovers of killed
  /// runs in the output folder are cleaned. A resumed run takes weights, config and tokenizer
  /// from the checkpoint and restores the optimizer state, loss scaler, learning-rate step
  /// and data position (differences of the spec that change the result are logged as
  /// warnings). Throws std::invalid_argument for a bad spec or output folder,
  /// std::runtime_error("<file>: <what>") for bad model, data or checkpoint files,
  /// RuntimeFailure when the runtime fails, TrainingDiverged when a step's loss or gradient
  /// norm is inf/NaN (spec.nonfinite "stop"), spec.max_skipped_steps steps in a row were
  /// skipped or the loss scale reached its floor (the checkpoints written before are kept; a
  /// checkpoint is never written from non-finite weights); nothing partial is left
  /// (checkpoints are atomic).
  TrainResult run(const TrainerCallbacks& callbacks = {}, const StopToken& stop = {});

 private:
  TrainSpec spec_;
};

}  // namespace rp
