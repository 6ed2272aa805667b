// `roundpipe train SPEC.json`: the main job.
#pragma once
#include <string>

#include "cli/spec.hpp"

namespace rp {

struct TrainOverrides {
  int64_t steps = -1;       ///< > 0 replaces spec.steps
  int workers = -1;         ///< > 0 replaces spec.workers
  std::string backend;      ///< non-empty replaces spec.backend
  std::string output_dir;   ///< non-empty replaces spec.output_dir
  std::string dump_batch;   ///< non-empty: write step 1's batch (ids, targets) here as JSON
  std::string resume;       ///< non-empty replaces spec.resume_from: continue from this checkpoint folder
  bool resume_given = false; ///< --resume was on the command line (an empty value is an error)
};

/// Runs the training job of `spec`: loads model and data, builds a Session, prints one
/// progress line per step (step, loss, tokens/s, learning rate, elapsed, ETA), appends
/// metrics to <output_dir>/metrics.csv and writes HF checkpoints atomically
/// (<output_dir>/checkpoint-<step>/ every save_every steps and <output_dir>/final/), each
/// with the optimizer state (optimizer.bin) and the trainer state (trainer_state.json), and
/// the measured per-layer profile in <output_dir>/profile.json (also written on Ctrl-C;
/// `roundpipe plan --profile` reads it). Without a "plan" key the plan is automatic and
/// re-planned once from the profile (one log line).
/// With spec.resume_from (or ov.resume) the run continues from such a checkpoint: weights,
/// optimizer state, loss scaler, learning-rate step and data position are restored, so it
/// reproduces the uninterrupted run bit for bit (same spec; differences are warned about).
/// Returns the process exit code (0 ok, 1 error, 130 interrupted). Errors are printed as
/// one line "roundpipe: error: ...".
int run_train(TrainSpec spec, const TrainOverrides& ov);

}  // namespace rp
