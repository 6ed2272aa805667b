// The `roundpipe` command: train, convert, merge, plan, trace, generate.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/command.hpp"
#include "cli/generate.hpp"
#include "cli/merge.hpp"
#include "cli/plan.hpp"
#include "cli/trace.hpp"
#include "cli/train.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/spec.hpp"

int main(int argc, char** argv) {
  CLI::App app{"RoundPipe C++: fine-tune LLMs on GPUs too small to hold them"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags (-q) may also follow the subcommand
  std::string spec_path;
  rp::TrainOverrides ov;
  auto* train = app.add_subcommand("train", "run a JSON experiment spec (see docs/spec.md)");
  train->add_option("spec", spec_path, "experiment spec (JSON)")->required();
  train->add_option("--steps", ov.steps, "override the spec's number of steps")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  train->add_option("--workers", ov.workers, "override the number of workers (GPUs or virtual GPUs)")
      ->check(CLI::Range(1, rp::kMaxWorkers));
  train->add_option("--backend", ov.backend, "override the backend (auto, cpu, cuda)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  auto* output_opt = train->add_option("--output-dir", ov.output_dir, "override the output directory");
  train->add_flag("--overwrite-output-dir", ov.overwrite_output_dir,
                  "start over in an output directory that holds an earlier run's checkpoints (replacing them)");
  train->add_option("--dump-batch", ov.dump_batch, "write the first step's batch (ids, targets) as JSON");
  auto* resume_opt = train->add_option("--resume", ov.resume,
                                       "continue from a checkpoint folder (checkpoint-<k>/ or final/ of an earlier run)");
  train->add_option("--mpi", ov.mpi,
                    "data-parallel replicas over MPI: auto (join the job when started by mpirun, e.g. `mpirun -np 4 "
                    "roundpipe train spec.json`; each replica runs accumulation / N of every step's passes), on, off "
                    "(overrides the spec's \"mpi\"; README \"Several machines\")")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  train->add_option("--replica-timeout", ov.replica_timeout_s,
                    "seconds a silent replica may take before the others stop with an error naming it (spec "
                    "replica_timeout_s, default 60)")
      ->check(rp::finite_number_check(false, " of seconds"));
  std::string in, out, dtype = "f32";
  auto* convert = app.add_subcommand("convert", "convert a GGUF model to a Hugging Face checkpoint folder");
  convert->add_option("input", in, "model.gguf")->required();
  convert->add_option("output", out, "output folder (written atomically)")->required();
  convert->add_option("--dtype", dtype, "f32, bf16 or f16")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  rp::add_merge_command(app);
  rp::add_plan_command(app);
  rp::add_trace_command(app);
  rp::add_generate_command(app);
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "only progress lines and errors");
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    if (cmd != "train" && cmd != "convert" && cmd != "merge" && cmd != "plan" && cmd != "trace" && cmd != "generate") {
      fmt::print(stderr,
                 "roundpipe: error: unknown command '{}' (expected train, convert, merge, plan, trace or generate; see roundpipe "
                 "--help)\n",
                 cmd);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand callback (plan) already printed its error
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::string what = e.what();
    for (auto& c : what)
      if (c == '\n') c = ' ';
    fmt::print(stderr, "roundpipe: error: {} (see roundpipe --help)\n", what);
    return 2;
  }
  spdlog::set_pattern("[%H:%M:%S] %v");
  if (quiet) spdlog::set_level(spdlog::level::warn);
  try {
    if (*train) {
      ov.resume_given = resume_opt->count() > 0;
      ov.output_dir_given = output_opt->count() > 0;
      return rp::run_train(rp::load_spec(spec_path), ov);
    }
    if (*convert) {
      rp::convert_gguf_to_hf(in, out, rp::parse_dtype(dtype));
      fmt::print("wrote {}\n", out);
      return 0;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "roundpipe: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
