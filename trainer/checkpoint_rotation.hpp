// The checkpoints of a run series (trainer_state.hpp RunSeries): which one is the best by
// metric_for_best_model, which ones save_total_limit removes, and early stopping's rule.
// The rules are pure functions, tested on their own; remove_series_checkpoint is the one place
// that deletes a checkpoint, and only one whose files prove the series wrote it.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "roundpipe/spec.hpp"
#include "trainer/trainer_state.hpp"

namespace rp {

/// spec.metric_for_best_model with Hugging Face's short names spelled out: "eval_loss" or
/// "eval_perplexity".
std::string best_metric_name(const TrainSpec& spec);

/// The value of metric `name` (best_metric_name) for an evaluation of mean loss `eval_loss`.
double metric_value(const std::string& name, double eval_loss);

/// Whether `a` beats `b` strictly (greater_is_better: larger is better, else smaller).
bool metric_better(double a, double b, bool greater_is_better);

/// Hugging Face's EarlyStoppingCallback on one evaluation of value `value`: it counts as an
/// improvement when there is no best yet, or it beats the best by more than es.threshold
/// (bad_evals back to 0), else bad_evals grows by one; the best is then updated whenever
/// `value` beats it at all. True when bad_evals reached es.patience: the run stops.
bool early_stopping_update(EarlyStopState& st, double value, const TrainSpec::EarlyStopping& es,
                           bool greater_is_better);

/// The names of `saved` that save_total_limit `limit` removes: the oldest (smallest step) first
/// until at most `limit` remain, never `best` nor the newest one; the newest and the best are
/// kept even when they alone exceed the limit. Empty for limit 0 (keep all).
std::vector<std::string> checkpoints_beyond_limit(const std::vector<SavedCheckpoint>& saved, int64_t limit,
                                                  const std::string& best);

/// Every entry of folder `dir` that is a regular file (no link), with its size in bytes; an
/// entry of another kind (a folder, a link) is listed with size UINT64_MAX, so it never
/// matches a record. Empty when `dir` cannot be listed.
std::map<std::string, uint64_t> folder_files(const std::string& dir);

/// The record of checkpoint `name` (a folder directly in `output_dir`, just written or
/// verified) after `step` steps: its files and the weights checksum its state records.
/// Throws std::runtime_error("<file>: ...") when its state cannot be read.
SavedCheckpoint record_checkpoint(const std::string& output_dir, const std::string& name, int64_t step,
                                  std::optional<double> metric);

/// Removes checkpoint `c` of the series, `<output_dir>/<c.name>/` and `<output_dir>/state/<c.name>/`,
/// when both provably are what the series wrote: the weights folder holds exactly c.files
/// (names and sizes), the state folder holds only roundpipe_state.json and
/// optimizer_state.bin, and that state records step c.step and the weights checksum
/// c.weights_xxh3. Returns "" when it removed them (or both are gone already), else why it left
/// them alone (one line; nothing was removed). The weights go first: a removal cut short leaves
/// at most a state folder without weights, which no run resumes.
std::string remove_series_checkpoint(const std::string& output_dir, const SavedCheckpoint& c);

/// A run's view of its series: evaluations, early stopping, the best checkpoint and the
/// checkpoints save_total_limit rotates. Every replica keeps one and feeds it the same
/// (agreed) evaluations, so they all decide the same; only the one that writes files records
/// and removes checkpoints.
class RunSeriesTracker {
 public:
  explicit RunSeriesTracker(const TrainSpec& spec) : spec_(spec), metric_(best_metric_name(spec)) {}

  /// A resumed run continues the series of checkpoint `dir` (its state `saved`). When `dir`
  /// lies directly in spec.output_dir its checkpoints and best carry over (and `dir` joins the
  /// checkpoints, `record`: read from disk for save_total_limit); elsewhere only early
  /// stopping's position does (that folder's checkpoints are not this run's to rotate).
  /// Returns a line to log ("" when nothing to say).
  std::string resume(const std::string& dir, const TrainerState& saved, bool record);

  /// The evaluation after `step` steps (its mean loss): remembered for the checkpoint of that
  /// step, and fed to early stopping. True when early stopping ends the run here.
  bool evaluated(int64_t step, double eval_loss);

  /// metric_for_best_model of the evaluation after `step` steps, if there was one.
  std::optional<double> metric_at(int64_t step) const;

  /// The series that checkpoint `name`, saved after `step` steps, records in its state: the
  /// earlier checkpoints, and the best one (this one when its metric beats the best).
  RunSeries series_for(const std::string& name, int64_t step) const;

  /// Checkpoint `name` was saved after `step` steps: the best is updated; with `write` (the
  /// replica that writes files) a checkpoint-<n> is recorded and save_total_limit applied
  /// (remove_series_checkpoint). Returns one line per checkpoint removed or left alone.
  std::vector<std::string> saved(const std::string& output_dir, const std::string& name, int64_t step,
                                 bool write);

  /// load_best_model_at_end: the checkpoint final/ should copy instead of saving the weights
  /// after `step` steps (whose evaluation is metric_at(step)): the best checkpoint when it beats
  /// them; "" when the weights after `step` are (at least as good as) the best.
  std::string best_for_final(int64_t step) const;

  const RunSeries& series() const { return series_; }
  const std::string& metric() const { return metric_; }

 private:
  const TrainSpec& spec_;
  std::string metric_;
  RunSeries series_;
  std::optional<std::pair<int64_t, double>> last_eval_;  ///< step, metric
};

}  // namespace rp
