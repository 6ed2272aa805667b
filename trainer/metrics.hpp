// metrics.csv of a training run: one row per step (docs/spec.md lists the columns).
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "roundpipe/trainer.hpp"

namespace rp {

class MetricsFile {
 public:
  static constexpr const char* kHeader =
      "step,loss,target_tokens,tokens_per_s,lr,elapsed_s,grad_norm,loss_scale,skipped,eval_loss,eval_"
      "perplexity,aux_loss,expert_load_min,expert_load_max,epoch\n";
  /// The last column of a run of data-parallel replicas (StepReport::reduce_wait_s).
  static constexpr const char* kReplicaColumn = "reduce_wait_s";

  /// A fresh run (`resume_step` 0) creates or truncates `path` and writes the header; a run
  /// resumed at `resume_step` keeps the rows of steps <= resume_step (those of a later,
  /// abandoned attempt go) and appends after them. `replicas`: a run of data-parallel
  /// replicas, whose rows end with kReplicaColumn. Throws std::runtime_error("<path>: ...").
  MetricsFile(const std::string& path, int64_t resume_step, bool replicas = false);
  /// Appends the row of `r` and flushes it (a killed run keeps every reported step). Throws
  /// std::runtime_error("<path>: cannot write the row of step N: <errno text>") when the write
  /// fails (a full disk): the run stops at once.
  void write(const StepReport& r);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream csv_;
  bool replicas_ = false;
};

/// The JSON-lines twin of metrics.csv (spec "metrics_jsonl") for a tracker to tail: one object
/// per reported step with the same fields as a metrics.csv row ({"step", "loss",
/// "target_tokens", "tokens_per_s", "lr", "elapsed_s", "grad_norm", "loss_scale", "skipped",
/// ["eval_loss", "eval_perplexity",] ["aux_loss", "expert_load_min", "expert_load_max",]
/// "epoch", ["reduce_wait_s"]}; a field metrics.csv leaves empty is absent), and {"step": 0,
/// "eval_loss", "eval_perplexity"} for the evaluation before training. Each line is flushed as
/// it is written. The file is opened at the first step (a run stopped before it writes none):
/// a fresh run truncates it, a run resumed at step k keeps its lines of steps <= k.
class MetricsJsonl {
 public:
  MetricsJsonl(std::string path, int64_t resume_step, bool replicas)
      : path_(std::move(path)), resume_step_(resume_step), replicas_(replicas) {}
  /// The evaluation before training: written with the first step's line.
  void eval_before_training(double loss, double perplexity);
  /// Appends the line of `r`. Throws std::runtime_error("<path>: ...") when it cannot write.
  void write(const StepReport& r);
  const std::string& path() const { return path_; }

 private:
  void append(const nlohmann::json& line, int64_t step);
  std::string path_;
  int64_t resume_step_;
  bool replicas_;
  std::ofstream out_;
  nlohmann::json pending_;  ///< the step-0 line until the file is open
};

/// Keeps the header and the rows of steps <= `step` of an existing metrics file (a torn
/// last line of a killed run is dropped), replacing it atomically; creates the file with
/// `header` when it does not exist. Throws std::runtime_error("<path>: ...") on I/O errors.
void truncate_metrics(const std::string& path, int64_t step, const std::string& header);

}  // namespace rp
