#include "cli/train.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/atomic_file.hpp"
#include "base/counted.hpp"
#include "base/host_resources.hpp"
#include "base/output_folder.hpp"
#include "cli/command.hpp"
#include "cli/signal_exit.hpp"
#include "roundpipe/model_source.hpp"
#include "roundpipe/replicas.hpp"
#include "roundpipe/trainer.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/run_setup.hpp"  // kOutputDirFlag

namespace fs = std::filesystem;

namespace rp {
namespace {

/// What --dump-batch may replace: nothing, or an earlier dump (a JSON object of exactly n_seq,
/// seq_len, ids and targets, at most 1 GiB), never a file of the user's.
bool replaceable_dump(const std::string& file) {
  std::error_code ec;
  const auto st = fs::symlink_status(file, ec);
  if (ec || st.type() == fs::file_type::not_found) return true;
  if (st.type() != fs::file_type::regular || fs::file_size(file, ec) > (uint64_t(1) << 30) || ec)
    return false;
  std::ifstream in(file, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || j.size() != 4) return false;
  for (const char* k : {"n_seq", "seq_len", "ids", "targets"})
    if (!j.contains(k)) return false;
  return true;
}

const StopToken* g_stop = nullptr;
bool g_under_mpi = false;  // launched by mpirun / mpiexec (set before the handlers)
/// Standard error is a terminal (set before the handlers): the signal lines then start on a
/// line of their own, after the "^C" the terminal echoed; a log file or pipe gets no blank line.
bool g_err_tty = false;
std::string g_first_line;  // what the first signal prints (built before the handlers)
/// What it prints instead before this run's first step (the evaluation and the sample before
/// training): nothing is in flight to finish, nothing new to save.
std::string g_unstarted_line;
/// This run's first step has started (its first batch went in): lock-free, the handler reads it.
std::atomic<bool> g_stepping{false};
static_assert(std::atomic<bool>::is_always_lock_free);
/// The other replicas on this host, each with the line naming it once it is gone (built
/// before the handlers: the handler only reads it).
std::vector<std::pair<pid_t, std::string>> g_local_peers;

void write_err(const char* s, size_t n) { [[maybe_unused]] auto r = ::write(2, s, n); }

/// The line of the first stop signal. A single process promises its checkpoint. Replicas
/// cannot: the step is saved only if every replica gets there, and mpirun ends the whole job
/// (SIGTERM, then SIGKILL) when one replica dies, which is also the usual source of a
/// SIGTERM under mpirun. Before the run's first step (`stepping` false) a single process has
/// no step in flight to finish and nothing new to save.
std::string first_signal_line(bool under_mpi, int rank, bool stepping) {
  const char* nl = g_err_tty ? "\n" : "";
  if (!under_mpi && !stepping)
    return fmt::format(
        "{}roundpipe: interrupted before the first step: stopping without training or saving anything "
        "(Ctrl-C again to exit now)\n",
        nl);
  if (!under_mpi)
    return fmt::format(
        "{}roundpipe: interrupted: finishing the steps in flight, then saving a checkpoint (Ctrl-C again to "
        "exit now)\n",
        nl);
  return fmt::format(
      "{}roundpipe: replica {}: stop signal: every replica stops after the same step and replica 0 saves it "
      "if "
      "all of them get there (if a replica died, mpirun ends the job first; finished checkpoints are kept)\n",
      nl, rank);
}

/// The line naming each replica on this host that ended: mpirun's SIGTERM to the survivors
/// is how a dead replica usually shows, and Open MPI's own report of it is several lines that
/// `mpirun -q` suppresses. Returns whether one was named. Async-signal-safe (kill, write).
bool name_ended_peers() {
  bool any = false;
  for (const auto& [pid, line] : g_local_peers)
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      write_err(line.data(), line.size());
      any = true;
    }
  return any;
}

/// g_local_peers for this replica (rank `rank`), once every replica has started.
void find_local_peers(int rank) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "this host");
  g_local_peers.clear();
  for (const LocalReplica& p : local_replicas())
    g_local_peers.emplace_back(
        pid_t(p.pid),
        fmt::format("{}roundpipe: replica {} ({}, pid {}) ended unexpectedly; mpirun is ending the job, "
                    "so replica {} stops without saving (finished checkpoints are kept)\n",
                    g_err_tty ? "\n" : "", p.rank, host, p.pid, rank));
}

/// CLOCK_MONOTONIC of the first stop signal in ns (0: none yet); lock-free, so the handler may
/// use it.
std::atomic<int64_t> g_first_signal_ns{0};

// First Ctrl-C, SIGTERM or SIGHUP: stop after the steps in flight and save them as a checkpoint (steps
// still unfinished after the spec's stop_timeout_s are abandoned, unsaved). Second, a second or
// more after the first: leave now (ExitThread removes an unfinished checkpoint's *.tmp-<pid>
// folders; finished ones are kept). A third while that is slow: leave at once.
void on_signal(int) {
  const int saved_errno = errno;
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  const int64_t now = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  int64_t none = 0;
  g_first_signal_ns.compare_exchange_strong(none, now);
  if (!g_stop->request_stop()) {
    // One keypress can arrive twice: a terminal signals the whole foreground process group, and
    // a wrapper in it (timeout, a shell script, a launcher) passes its own copy on. Only a second
    // signal at least a second after the first means "now".
    if (now - g_first_signal_ns.load() < 1000000000) {
      errno = saved_errno;
      return;
    }
    // removes our half-written files and folders and exits (at once if already under way)
    static const char msg[] = "\nroundpipe: interrupted twice, exiting now\n";
    exit_from_handler(msg + (g_err_tty ? 0 : 1), sizeof msg - (g_err_tty ? 1 : 2));
    errno = saved_errno;
    return;
  }
  // Under mpirun, output goes through a pipe that mpirun drains. An mpirun that was itself
  // told to end the job (SIGINT/SIGTERM) stops draining it, and a rank would block on its next
  // line instead of stopping: from now on a line that does not fit is dropped (fcntl is
  // async-signal-safe; a write blocked right now returns once the handler is done).
  if (g_under_mpi)
    for (int fd : {1, 2}) {
      const int fl = ::fcntl(fd, F_GETFL);
      if (fl >= 0) ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    }
  // a peer already known dead or silent: no step can be agreed on any more, say which one
  if (const char* failure = g_under_mpi ? replica_failure_line() : nullptr) {
    static const char head[] =
        "\nroundpipe: stop signal after a replica failure, no checkpoint can be saved: ";
    write_err(head, sizeof head - 1);
    write_err(failure, std::strlen(failure));
    write_err("\n", 1);
  } else if (!(g_under_mpi && name_ended_peers())) {
    const std::string& line = g_stepping.load() ? g_first_line : g_unstarted_line;
    write_err(line.data(), line.size());
  }
  errno = saved_errno;
}

/// Before the first step (loading the model and data, the evaluation before training) a stop
/// signal ends the process at once with one line: nothing is trained or saved yet. Without it
/// SIGUSR1, the clean stop under mpirun, would kill a rank that is still loading ("exited on
/// signal 10").
void on_startup_signal(int) {
  static const char msg[] =
      "\nroundpipe: stop signal before the first step: exiting (nothing was trained or saved)\n";
  write_err(msg + (g_err_tty ? 0 : 1), sizeof msg - (g_err_tty ? 1 : 2));
  remove_unfinished_temporaries();  // e.g. a disk tier's cache being built
  remove_recorded_folders();        // the output folders the run made, while still empty
  std::_Exit(130);
}

/// SIGINT, SIGTERM (batch schedulers stop jobs with it), SIGHUP (the terminal or SSH session
/// closing) and SIGUSR1.
constexpr std::array<int, 4> kStopSignals{SIGINT, SIGTERM, SIGHUP, SIGUSR1};

/// The stop signals request `stop` while alive. SIGUSR1: Open MPI's mpirun forwards it to every
/// rank at once and leaves the job running, while its own SIGINT/SIGTERM ends the job (the
/// ranks get SIGTERM only after odls_base_sigkill_timeout seconds, 1 by default, and SIGKILL
/// as long after that).
class StopOnSignals {
 public:
  // g_stop is set before the handlers are installed (a signal may arrive right after)
  explicit StopOnSignals(const StopToken& stop) : handlers_(kStopSignals, (g_stop = &stop, on_signal)) {}
  ~StopOnSignals() { g_stop = nullptr; }

 private:
  ExitThread exit_;  // destroyed after the handlers are restored: no second signal reaches it then
  SignalHandlers<kStopSignals.size()> handlers_;
};

std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  int t = int(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

void apply_overrides(TrainSpec& spec, const TrainOverrides& ov) {
  if (ov.workers > 0) spec.workers = ov.workers;
  if (!ov.backend.empty()) spec.backend = ov.backend;
  if (ov.output_dir_given && ov.output_dir.empty())
    throw std::invalid_argument("--output-dir: expected a folder, got \"\"");
  if (!ov.output_dir.empty()) {
    spec.output_dir = ov.output_dir;
    // errors about the folder name the flag the user typed, not the spec's key
    spec.settings.push_back({"output_dir", ov.output_dir, true, kOutputDirFlag});
  }
  if (ov.overwrite_output_dir) spec.overwrite_output_dir = true;
  if (ov.resume_given && ov.resume.empty())
    throw std::invalid_argument(
        "--resume: expected a checkpoint folder (checkpoint-<k>/ or final/), got \"\"");
  if (!ov.resume.empty()) spec.resume_from = ov.resume;
  if (!ov.mpi.empty()) spec.mpi = ov.mpi;
  if (ov.replica_timeout_s > 0) spec.replica_timeout_s = ov.replica_timeout_s;
  // an empty name (an unset shell variable) would train the whole run instead of writing a batch
  if (ov.dump_batch_given && ov.dump_batch.empty())
    throw UsageError("--dump-batch: expected a file name, got \"\"");
  // a resumed run has no step 1: the dump was written from a fresh run's data (alone) or never
  // (with --train)
  if (!ov.dump_batch.empty() && !spec.resume_from.empty())
    throw UsageError(fmt::format(
        "--dump-batch: only for a fresh run (it writes the first batch of step 1); this one resumes from {}",
        spec.resume_from));
  if (!ov.dump_batch.empty()) {  // before anything is loaded or written
    std::error_code ec;
    const fs::path parent = fs::absolute(fs::path(ov.dump_batch), ec).parent_path();
    if (ec || !fs::is_directory(parent, ec))
      throw std::invalid_argument(
          fmt::format("--dump-batch {}: cannot write the file (folder '{}' does not exist)", ov.dump_batch,
                      parent.string()));
    // a folder first: one that holds an input is no file that "lies inside" it
    if (fs::is_directory(ov.dump_batch, ec))
      throw UsageError(fmt::format("--dump-batch {}: is a folder; expected a file name", ov.dump_batch));
    check_output_file(spec, ov.dump_batch, "--dump-batch");
    if (!replaceable_dump(ov.dump_batch))
      throw UsageError(fmt::format(
          "--dump-batch {}: a file that is not an earlier --dump-batch output is there; choose another name",
          ov.dump_batch));
  }
}

/// `s` as one word of a POSIX shell: as it is when it needs no quotes, else single-quoted.
std::string shell_quoted(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of(
                                       "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                       "0123456789_./-+:,@%") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// This program as a command typed here: relative to the working folder when it lies below it
/// ("build/roundpipe", "./roundpipe" in build/ itself: a bare name would be looked up in
/// $PATH), "roundpipe" when $PATH finds it, else its absolute path.
std::string this_program() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return "roundpipe";
  const fs::path rel = exe.lexically_relative(fs::current_path(ec));
  if (!ec && !rel.empty() && *rel.begin() != "..")
    return rel.has_parent_path() ? rel.string() : "./" + rel.string();
  const char* path = std::getenv("PATH");
  for (std::string_view rest = path ? path : ""; !rest.empty();) {
    const size_t colon = rest.find(':');
    const fs::path dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    if (!dir.empty() && fs::equivalent(dir / exe.filename(), exe, ec)) return exe.filename().string();
  }
  return exe.string();
}

/// The lines after "done:" naming what the run left, where it exists: the model (final/), its
/// optimizer state (state/final/) with the --resume that goes on from it (which names final/, not
/// the state folder), the TensorBoard logs, and the command that tries the model.
void print_outputs(const TrainSpec& spec, const TrainResult& res) {
  std::error_code ec;
  if (res.checkpoint.empty() || !fs::is_directory(res.checkpoint, ec)) return;
  std::string saved = "model in " + res.checkpoint;
  if (const std::string state = state_dir_of(res.checkpoint); fs::is_directory(state, ec))
    saved += fmt::format(", its optimizer state in {} (go on with --resume {})", state,
                         shell_quoted(res.checkpoint));
  if (const std::string tb = (fs::path(spec.output_dir) / "tensorboard").string();
      spec.tensorboard && fs::is_directory(tb, ec))
    saved += fmt::format(", TensorBoard logs in {}", tb);
  fmt::print("{}\n", saved);
  fmt::print("try it: {} generate {} --chat {}{}\n", shell_quoted(this_program()),
             shell_quoted(res.checkpoint),
             spec.sample_prompt.empty() ? std::string("\"...\"") : shell_quoted(spec.sample_prompt),
             spec.chat_template == "auto" ? std::string() : " --chat-template " + spec.chat_template);
}

/// The progress line of a step (every log_every steps and the last one).
void print_progress(const TrainSpec& spec, const StepReport& r) {
  if (r.replica > 0) return;  // data-parallel replicas: replica 0 prints the (global) progress
  if (r.step % spec.log_every != 0 && r.step != r.total_steps && !r.evaluated) return;
  // fputs: a line dropped during a stop under mpirun (see on_signal) must not throw
  std::fputs(fmt::format(
                 "step {:>5}/{} | loss {:.4f} | epoch {:.2f}{} | {:>8.1f} tokens/s | lr {:.3e}{} | elapsed "
                 "{} | ETA {}\n",
                 r.step, r.total_steps, r.loss, r.epoch,
                 r.evaluated ? fmt::format(" | eval loss {:.4f} (ppl {:.2f})", r.eval_loss, r.eval_perplexity)
                             : std::string(),
                 r.tokens_per_s, r.lr,
                 (r.mfu > 0 ? fmt::format(" | MFU {:.3f}", r.mfu) : std::string()) +
                     fmt::format(" | grad norm {:.3f}", r.grad_norm) +
                     (spec.loss_scaling ? fmt::format(" | scale {:g}", r.loss_scale) : std::string()) +
                     (r.experts > 0 ? fmt::format(" | experts {:.2f}-{:.2f}x even, aux {:.3f}",
                                                  r.expert_load_min, r.expert_load_max, r.aux_loss)
                                    : std::string()) +
                     (r.skipped ? " (skipped)" : ""),
                 fmt_duration(r.elapsed_s), fmt_duration(r.eta_s))
                 .c_str(),
             stdout);
  std::fflush(stdout);
}

/// --dump-batch: step 1's first batch as JSON.
/// Written atomically (a failed write leaves no half file); an error says why ("Read-only file
/// system", "Is a directory"), which "cannot write the file" did not.
void dump_batch(const std::string& file, const TokenBatch& b) {
  const std::string text = nlohmann::json{
      {"n_seq", b.n_seq},
      {"seq_len", b.seq_len},
      {"ids", b.ids},
      {"targets", b.targets}}.dump();
  try {
    write_file_atomically(file, [&](std::ostream& f) { f << text << "\n"; });
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("--dump-batch: {}", e.what()));
  }
}

/// --dump-batch without --train: the first pass of step 1 of a fresh run, as the trainer
/// builds it (the model's header for the tokenizer, the data packed and shuffled with the
/// spec's seed), and nothing else: no weights, no output folder.
void dump_batch_only(const TrainSpec& spec, const std::string& file) {
  validate_spec(spec);
  check_data_paths(spec);
  const ModelSource src = open_model_for_training(spec.model);
  check_batch_fits_host(spec, src.config(), host_available_bytes());
  TokenStream data = load_data_for_training(spec, src.header());
  const TokenBatch b = data.next(spec.sequences_per_step / spec.accumulation);
  dump_batch(file, b);
  fmt::print(
      "wrote {}: the first batch of step 1 ({} of {}, {} with a target); nothing was "
      "trained (add --train to train as well)\n",
      file, counted(b.n_seq, "sequence"), counted(b.seq_len, "token"), b.num_targets());
}

}  // namespace

int run_train(TrainSpec spec, const TrainOverrides& ov) {
  apply_overrides(spec, ov);
  if (!ov.dump_batch.empty() && !ov.train_after_dump) {
    dump_batch_only(spec, ov.dump_batch);
    return 0;
  }
  if (ov.train_after_dump && ov.dump_batch.empty())
    throw UsageError("--train: only with --dump-batch (a run trains anyway)");
  TrainerCallbacks cb;
  cb.on_step = [&](const StepReport& r) { print_progress(spec, r); };
  cb.on_batch = [&](int64_t step, int64_t pass, const TokenBatch& b) {
    g_stepping.store(true);
    if (step == 0 && pass == 0 && !ov.dump_batch.empty()) dump_batch(ov.dump_batch, b);
  };
  StopToken stop;
  g_under_mpi = launched_by_mpi();
  g_err_tty = ::isatty(2) == 1;
  g_first_line = first_signal_line(g_under_mpi, launcher_rank(), true);
  g_unstarted_line = first_signal_line(g_under_mpi, launcher_rank(), false);
  std::optional<SignalHandlers<kStopSignals.size()>> startup(std::in_place, kStopSignals, on_startup_signal);
  // from the first step on, and while the final checkpoint is written (a Ctrl-C cannot cut it)
  std::optional<StopOnSignals> signals;
  cb.on_ready = [&] {
    if (g_under_mpi) find_local_peers(launcher_rank());  // every replica has started by now
    signals.emplace(stop);
  };
  const TrainResult res = Trainer(spec).run(cb, stop);
  signals.reset();
  startup.reset();
  if (res.stopped) {
    // replicas: every rank prints this line with the same step count and exits 130 (the
    // replicas agreed on the step, whichever of them got the signal)
    std::string who, by;
    if (res.replicas > 1) {
      who = fmt::format("replica {} of {}: ", res.replica, res.replicas);
      std::string ranks;
      for (int q : res.stopped_by) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
      by = fmt::format(" (stop asked of replica{} {}; every replica stopped after the same step)",
                       res.stopped_by.size() > 1 ? "s" : "", ranks);
    }
    std::fputs(fmt::format("roundpipe: {}interrupted after {} step{}{}; {}{}\n", who, res.steps_done,
                           res.steps_done == 1 ? "" : "s", by,
                           res.steps_abandoned > 0
                               ? fmt::format("{} in flight did not finish within {:g} s and {} not saved; ",
                                             counted(res.steps_abandoned, "step"), spec.stop_timeout_s,
                                             res.steps_abandoned == 1 ? "was" : "were")
                               : std::string(),
                           !res.checkpoint.empty() ? fmt::format("saved {} (continue with --resume {})",
                                                                 res.checkpoint, res.checkpoint)
                           : !res.latest_checkpoint.empty()
                               ? fmt::format("the newest checkpoint is {} (continue with --resume {})",
                                             res.latest_checkpoint, res.latest_checkpoint)
                               : std::string("no checkpoint was written"))
                   .c_str(),
               stderr);
    return 130;
  }
  if (res.replica > 0) return 0;  // replica 0 prints the summary
  if (res.skipped_steps > 0)
    fmt::print("{} of the steps were skipped (inf/NaN gradients or no target tokens; see the warnings)\n",
               res.skipped_steps);
  if (res.early_stopped) fmt::print("{}\n", res.early_stop_reason);
  if (res.final_step > 0 && res.final_step != res.steps_done)
    fmt::print("final/ holds step {}, the best checkpoint (load_best_model_at_end)\n", res.final_step);
  fmt::print("done: {}{}{}{} in {}, peak device memory {:.1f} MiB per worker, metrics in {}, plan {}\n",
             counted(res.steps_done - res.first_step, "step"),
             res.replicas > 1 ? fmt::format(" on {} replicas", res.replicas) : std::string(),
             res.first_step > 0
                 ? fmt::format(" (resumed at step {}, {} in all)", res.first_step, res.steps_done)
                 : std::string(),
             res.early_stopped ? fmt::format(" (stopped early, of {})", res.total_steps) : std::string(),
             fmt_duration(res.seconds), res.peak_device_bytes / 1048576.0, res.metrics, res.plan);
  if (!res.sample_after.empty()) {
    fmt::print("prompt: {}\n", spec.sample_prompt);
    if (!res.sample_before.empty()) fmt::print("before fine-tuning: {}\n", res.sample_before);
    fmt::print("after fine-tuning:  {}\n", res.sample_after);
  }
  print_outputs(spec, res);
  return 0;
}

}  // namespace rp
