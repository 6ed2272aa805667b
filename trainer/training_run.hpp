// The state of one Trainer::run() (roundpipe/trainer.hpp) and the steps it takes, spread by
// responsibility over trainer.cpp (setup, the run's start and end), run_steps.cpp (the step
// loop, waiting and reporting, stopping), run_eval.cpp (evaluation and samples) and run_save.cpp
// (checkpoints, final/, and what a stopped or failed run leaves).
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "roundpipe/session.hpp"
#include "roundpipe/trainer.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/checkpoint_rotation.hpp"
#include "trainer/metrics.hpp"
#include "trainer/model_card.hpp"
#include "trainer/progress_clock.hpp"
#include "trainer/replica_run.hpp"
#include "trainer/run_setup.hpp"
#include "trainer/step_watch.hpp"
#include "trainer/tensorboard.hpp"

namespace rp {

/// One run() of a Trainer: what it loaded and where the loop is.
class TrainingRun {
 public:
  TrainingRun(const TrainSpec& spec, const TrainerCallbacks& cb, const StopToken& stop)
      : spec_(spec),
        cb_(cb),
        stop_(stop),
        t0_(std::chrono::steady_clock::now()),
        watch_(spec_),
        series_(spec_) {}
  TrainResult execute();

 private:
  using Clock = std::chrono::steady_clock;
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  std::string path(const std::string& name) const { return spec_.output_dir + "/" + name; }
  void setup();
  void start_session(const ModelLayout& layout, std::vector<std::vector<float>> weights,
                     std::vector<std::vector<uint8_t>> frozen, std::optional<FrozenSource> source);
  int64_t loop();
  std::optional<StepResult> await(int64_t t);
  std::optional<StepResult> await_together(int64_t t);
  bool report(int64_t t);
  bool report_through(int64_t t);
  bool drain(int64_t t);
  void save(const std::string& name);
  void save_profile();
  void save_merged();
  void evaluate(int64_t steps_done);
  void discard_unstarted_outputs();
  /// The checkpoint an error leaves as the last good one ("" when there is none).
  std::string kept_checkpoint() const {
    return !last_checkpoint_.empty() ? last_checkpoint_ : resume_ ? resume_->dir : "";
  }
  /// The end of a failed save's line: "--resume <dir> continues from the last finished
  /// checkpoint" when kept_checkpoint() is still resumable, else why nothing is.
  std::string resume_hint() const;
  /// Rethrows the exception being handled with resume_hint() after its line where it is an
  /// I/O failure (a plain std::runtime_error: a full disk, a read-only folder) or a
  /// FolderConflict; any other type goes on unchanged. Only inside a catch block.
  [[noreturn]] void rethrow_with_resume_hint() const;
  TrainResult finish(int64_t t);
  TrainResult abandon(int64_t t);

  TrainSpec spec_;  // a copy: `epochs` fills in steps once the data is loaded
  const TrainerCallbacks& cb_;
  const StopToken stop_;
  const std::chrono::steady_clock::time_point t0_;
  std::optional<ResumePoint> resume_;
  LoadedModel model_;  // config, tokenizer and chat template (the tensors are dropped once copied)
  BaseModelRef base_;  // the base model as the adapter folders and model cards name it
  std::optional<double> last_loss_, last_eval_loss_;  // of the last reported step / evaluation
  int64_t last_eval_step_ = 0;
  /// Writes the model card of folder `dir` into the new folder about to replace it.
  std::function<void(const std::string&)> card_writer(const std::string& dir,
                                                      ModelCardFacts::Kind kind) const;
  std::optional<TokenStream> data_;
  std::vector<TokenBatch> eval_batches_;                  ///< the evaluation set (empty: no evaluation)
  std::map<int64_t, std::vector<int64_t>> pending_eval_;  ///< steps done -> evaluation passes in flight
  void submit_eval(int64_t steps_done);
  bool collect_eval(int64_t steps_done, StepReport& into, bool drop_at_stop);
  void evaluate_before_training();
  /// spec.sample_prompt's answer with the session's master weights ("" without a prompt).
  std::string sample_text(const char* when);  // "" on replicas other than 0
  std::string sample_before_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<MetricsJsonl> jsonl_;  // spec metrics_jsonl
  std::unique_ptr<TensorBoardWriter> tb_;
  double mfu_per_token_per_s_ = 0;  // MFU of one token per second (CUDA backend), else 0
  void log_scalars(const StepReport& s);
  int64_t start_ = 0;              // steps done before this run
  bool wrote_run_marker_ = false;  // this run wrote the folder's roundpipe_run.json
  /// Until on_ready returns: record_unfinished_file handles of the files a fresh run wrote into
  /// its output folder (its record, metrics.csv's header, the TensorBoard file's version event
  /// and the folder made for it), which a stop signal before the first
  /// step removes with the folders the run made (the CLI's startup handler leaves at once).
  std::vector<int> until_ready_;
  void drop_lone_run_marker();
  OutputDirLock output_lock_;  // the leader's, for the whole run
  int64_t reported_ = -1;      // last step reported
  double last_report_ = 0;     // elapsed() when the step timer last started (the loop, then each report)
  double paused_ = 0;          // seconds since then that belong to no step: evaluations, checkpoints
  std::optional<ProgressClock> clock_;  // tokens/s and ETA from the steps' own times
  int64_t evals_after(int64_t steps_done) const;
  std::string last_checkpoint_;
  std::optional<Clock::time_point> stop_deadline_;  // set when the stop request is first seen
  /// spec.stop_timeout_s as a clock duration.
  Clock::duration stop_budget() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec_.stop_timeout_s));
  }
  /// A single process: sets stop_deadline_ (spec.stop_timeout_s on) when the StopToken's
  /// request is first seen. Replicas: the agreement sets it (stop_agreed).
  void arm_stop_deadline() {
    if (!replicas_ && stop_.stop_requested() && !stop_deadline_)
      stop_deadline_ = Clock::now() + stop_budget();
  }
  /// At most 0.1 s, and not past the stop deadline when there is one.
  double wait_slice() const {
    double slice = 0.1;
    if (stop_deadline_)
      slice = std::min(slice, std::chrono::duration<double>(*stop_deadline_ - Clock::now()).count());
    return std::max(slice, 0.0);
  }
  StepWatch watch_;
  uint64_t checkpoint_bytes_ = 0;  // free disk space a save needs
  // data-parallel replicas (trainer/replica_run.hpp); null: a single process
  std::shared_ptr<Replicas> replicas_;
  bool leader() const { return !replicas_ || replicas_->rank() == 0; }  // writes the files
  int replica_count() const { return replicas_ ? replicas_->size() : 1; }
  void barrier() { sum_over(replicas_.get(), {}); }
  bool stop_agreed();
  /// A stop is under way: the StopToken's request, or with replicas the agreed one (every
  /// replica saw the same exchange say stop, so they all close, report and save the same steps).
  bool stopping() const { return replicas_ ? stop_agreed_ : stop_.stop_requested(); }
  bool stop_agreed_ = false;
  std::vector<int> stop_ranks_;   // replicas: the ranks whose StopToken asked for the stop
  double reduce_wait_total_ = 0;  // replicas: StepReport::reduce_wait_s over the reported steps
  TrainResult execute_steps();
  /// Logs what the disk tier read over `steps` steps in `seconds` since the reading `from`.
  void report_tier_reads(const FrozenTierReads& from, int64_t steps, double seconds) const;
  void derive_epochs();
  double epoch_at(int64_t steps_done) const;
  int64_t epoch_origin_ = 0;  // data position at start_ (sequences)
  void agree_eval(StepReport& s);
  void finish_final(TrainResult& res, int64_t t);
  RunSeriesTracker series_;
  std::optional<int64_t> early_stop_at_;  // early stopping decided after this many steps
  std::string early_stop_reason_;
};

}  // namespace rp
