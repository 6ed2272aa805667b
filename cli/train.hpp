// `roundpipe train SPEC.json`: the command-line face of rp::Trainer (roundpipe/trainer.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "roundpipe/spec.hpp"

namespace CLI {
class App;
}

namespace rp {

struct TrainOverrides {
  int64_t steps = -1;                 ///< > 0: given to load_spec as steps=N with epochs removed
  int workers = -1;                   ///< > 0 replaces spec.workers
  std::string backend;                ///< non-empty replaces spec.backend
  std::string output_dir;             ///< non-empty replaces spec.output_dir
  bool output_dir_given = false;      ///< --output-dir was on the command line (an empty value is an error)
  bool overwrite_output_dir = false;  ///< sets spec.overwrite_output_dir
  std::string dump_batch;  ///< non-empty: write step 1's first batch (ids, targets) here as JSON and exit
  bool dump_batch_given = false;  ///< --dump-batch was on the command line (an empty value is an error)
  bool train_after_dump = false;  ///< with dump_batch: train afterwards (--train) instead of exiting
  std::string resume;         ///< non-empty replaces spec.resume_from: continue from this checkpoint folder
  bool resume_given = false;  ///< --resume was on the command line (an empty value is an error)
  std::string mpi;            ///< non-empty replaces spec.mpi (auto, on, off)
  double replica_timeout_s = -1;  ///< > 0 replaces spec.replica_timeout_s
};

/// Runs the training job of `spec` with the command line's overrides through rp::Trainer,
/// printing one progress line per spec.log_every steps (step, loss, tokens/s, learning
/// rate, [grad norm, loss scale,] elapsed, ETA) and a closing line. Ctrl-C, SIGTERM or SIGUSR1
/// stops the run after the steps in flight and saves them as checkpoint-<n> (a second signal
/// exits at once). Data-parallel replicas stop together after the same step whichever of
/// them got the signal, and each prints the closing line "roundpipe: replica <r> of <n>:
/// interrupted after <k> steps (stop asked of replica <q>; ...); ...". Returns the process
/// exit code (0 ok, 130 interrupted, on every replica); errors throw (main() prints them as
/// one line "roundpipe: error: ...").
/// With ov.dump_batch and without ov.train_after_dump it only writes the first batch of step 1
/// of a fresh run (reading the model's header and tokenizer and the data, no weights) and
/// returns 0: nothing is trained and the output folder is not touched.
int run_train(TrainSpec spec, const TrainOverrides& ov);

/// The `train` subcommand registered on a CLI11 app: `app` is set when the command line chose
/// it; `run` (after parsing) loads the spec with the command line's settings (the shorthand
/// flags --lr, --seq-len, --data, --model, --eval-data first, then each --set in order: a later
/// setting of a key wins) and calls run_train, returning its exit code. Errors throw, as
/// run_train's.
struct TrainCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
TrainCommand add_train_command(CLI::App& app);

}  // namespace rp
