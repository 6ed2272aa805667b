// `roundpipe train`'s command line (cli/train.hpp, add_train_command): the spec, its overrides
// and the spec settings given as flags.
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/error_text.hpp"
#include "cli/command.hpp"
#include "cli/train.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

TrainCommand add_train_command(CLI::App& app) {
  struct Options {
    std::string spec_path;
    TrainOverrides ov;
    std::vector<std::string> sets;
    std::string lr, seq_len, data, model, eval_data;
  };
  auto o = std::make_shared<Options>();
  auto* c = app.add_subcommand("train", "run a JSON experiment spec (see docs/spec.md)");
  c->add_option("spec", o->spec_path, "experiment spec (JSON)")->required();
  c->add_option("--steps", o->ov.steps, "override the spec's number of steps (replaces its \"epochs\")")
      ->check(integer_check(int64_t(1), int64_t(1) << 40));
  c->add_option("--workers", o->ov.workers, "override the number of workers (GPUs or virtual GPUs)")
      ->check(integer_check(1, kMaxWorkers));
  c->add_option("--backend", o->ov.backend, "override the backend (auto, cpu, cuda)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  auto* output_opt = c->add_option("--output-dir", o->ov.output_dir, "override the output directory");
  c->add_flag("--overwrite-output-dir", o->ov.overwrite_output_dir,
              "start over in an output directory that holds an earlier run's checkpoints (replacing them)");
  auto* dump_opt = c->add_option(
      "--dump-batch", o->ov.dump_batch,
      "write the first batch of step 1 (ids, targets) as JSON and exit without training (with --train: "
      "then train)");
  // --train alone is a usage error (exit 2), caught by CLI11 like any other
  c->add_flag("--train", o->ov.train_after_dump, "with --dump-batch: train after writing the batch")
      ->needs(dump_opt);
  // spec keys from the command line: applied to the file's JSON before it is checked
  c->add_option("--set", o->sets,
                "set a spec key, repeatable: KEY=VALUE, nested keys with dots (lora.r=8, optimizer.lr=1e-4); "
                "VALUE is JSON when it parses as JSON, else a string (null removes the key); checked like "
                "the file's keys")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  c->add_option("--lr", o->lr, "the spec's optimizer.lr (as --set optimizer.lr=LR)");
  c->add_option("--seq-len", o->seq_len, "the spec's seq_len (as --set seq_len=N)");
  c->add_option("--data", o->data, "the spec's data file (as --set data=PATH)");
  c->add_option("--model", o->model, "the spec's model (as --set model=PATH)");
  c->add_option("--eval-data", o->eval_data, "the spec's eval_data file (as --set eval_data=PATH)");
  auto* resume_opt =
      c->add_option("--resume", o->ov.resume,
                    "continue from a checkpoint folder (checkpoint-<k>/ or final/ of an earlier run)");
  c->add_option(
       "--mpi", o->ov.mpi,
       "data-parallel replicas over MPI: auto (join the job when started by mpirun, e.g. `mpirun -np 4 "
       "roundpipe train spec.json`; each replica runs accumulation / N of every step's passes), on, off "
       "(overrides the spec's \"mpi\"; README \"Several machines\")")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  c->add_option("--replica-timeout", o->ov.replica_timeout_s,
                "seconds a silent replica may take before the others stop with an error naming it (spec "
                "replica_timeout_s, default 60)")
      ->check(finite_number_check(false, " of seconds"));

  TrainCommand t;
  t.app = c;
  t.run = [o, c, resume_opt, output_opt, dump_opt] {
    o->ov.resume_given = resume_opt->count() > 0;
    o->ov.output_dir_given = output_opt->count() > 0;
    o->ov.dump_batch_given = dump_opt->count() > 0;
    // the shorthand flags first, then --set in order (a later setting of a key wins)
    std::vector<SpecSetting> settings;
    auto shorthand = [&](const char* flag, const char* key, const std::string& value, bool as_string) {
      if (c->get_option(flag)->count() > 0)
        settings.push_back({key, value, as_string, fmt::format("{} {}", flag, excerpt(value))});
    };
    shorthand("--lr", "optimizer.lr", o->lr, false);
    shorthand("--seq-len", "seq_len", o->seq_len, false);
    shorthand("--data", "data", o->data, true);
    shorthand("--model", "model", o->model, true);
    shorthand("--eval-data", "eval_data", o->eval_data, true);
    for (const std::string& s : o->sets) try {
        settings.push_back(parse_set_option(s));
      } catch (const std::invalid_argument& e) {  // no KEY=VALUE: the command line's fault
        throw UsageError(e.what());
      }
    // --steps last: it replaces the steps or epochs of the file and of any --set, before the
    // spec (and its learning-rate schedule) is checked
    if (o->ov.steps > 0) {
      const std::string origin = fmt::format("--steps {}", o->ov.steps);
      settings.push_back({"epochs", "null", false, origin});
      settings.push_back({"steps", std::to_string(o->ov.steps), false, origin});
    }
    return run_train(load_spec(o->spec_path, settings), o->ov);
  };
  return t;
}

}  // namespace rp
