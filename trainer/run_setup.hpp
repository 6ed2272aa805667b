// The steps of a training run before its loop: checks that need no model, loading the model
// and the data (with their log lines), and the Session options of a spec.
#pragma once
#include <string>
#include <vector>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
#include "roundpipe/model_source.hpp"
#include "roundpipe/session.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

/// An exclusive advisory lock (flock) on a run's output folder, held for the run's life, so a
/// second run into the same folder fails at once instead of interleaving its checkpoints and
/// metrics with the first one's. Creates the folder when it does not exist (created()); a path
/// that is a file is left to prepare_output_dir's error. Throws std::invalid_argument
/// "<output_dir_origin>: '<dir>' is in use by another roundpipe run ..." when
/// another process (or another run of this one) holds the lock. On a file system without
/// flock it logs a warning and runs unlocked.
class OutputDirLock {
 public:
  OutputDirLock() = default;
  explicit OutputDirLock(const TrainSpec& spec);
  ~OutputDirLock();
  OutputDirLock(OutputDirLock&& o) noexcept;
  OutputDirLock& operator=(OutputDirLock&& o) noexcept;
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;
  /// The folder did not exist before this lock made it.
  bool created() const { return !made_.empty(); }
  /// Removes the folders this lock made (the output folder and the parents it had to make),
  /// deepest first, each only while it is empty: a run that wrote nothing leaves no folder it
  /// made, and never touches one that was there before.
  void remove_made_if_empty() const;

 private:
  int fd_ = -1;
  std::vector<std::string> made_;  ///< the folders made, deepest first
};

/// The file a run leaves in its output folder to record that the folder's run outputs
/// (kRunOutputNames, checkpoint-<n>/) are roundpipe's: a later run replaces them only then.
inline constexpr const char* kRunMarkerFile = "roundpipe_run.json";

/// Refuses (std::invalid_argument, one line naming `what`) a file the run would write outside
/// its output folder (`--dump-batch`, `metrics_jsonl`) when it is, or lies inside, one of the
/// run's inputs: the spec file, model, data, eval_data, adapter or the resumed checkpoint.
void check_output_file(const TrainSpec& spec, const std::string& file, const std::string& what);

/// Where the spec key `key` (dotted: "frozen_tier.path") came from, as errors name it: the
/// origin of the last command-line setting that wrote it or an object holding it ("--set
/// frozen_tier={...}"), else the spec file (spec.source).
std::string setting_origin(const TrainSpec& spec, const std::string& key);

/// The command-line flag that sets output_dir, as its setting's origin names it (errors about
/// the folder then name the flag the user typed, not a spec key).
inline constexpr const char* kOutputDirFlag = "--output-dir";

/// How an error about output_dir names what gave it: "--output-dir" when that flag did,
/// else "<where>: key 'output_dir'", where is the spec file or the --set that wrote it
/// (setting_origin).
std::string output_dir_origin(const TrainSpec& spec);

/// Checks where a run may write, before the folder is created or locked: output_dir must not
/// be the root folder, $HOME, the working directory or a folder holding it, nor be, hold or
/// lie inside an input (model, data, eval_data, adapter; a resume_from that is a checkpoint,
/// unless it lies directly in output_dir: the run being continued). Throws
/// std::invalid_argument("<output_dir_origin>: ..."), one line naming the input's key.
/// A frozen_tier.path (with the folder its lock, temporary and spill files go to) inside
/// output_dir, or equal to the metrics_jsonl file, is refused as "<where>: key
/// 'frozen_tier.path': ...", where is the --set that wrote it or the spec file.
void check_output_dir(const TrainSpec& spec);

/// The output folder must be a folder (or not exist) the run can write into (access(2)) and its
/// final/ a checkpoint folder;
/// leftovers of killed roundpipe runs in it are cleaned (logged; look-alikes roundpipe did not
/// mark get one warning line and are left alone). The run outputs already there (metrics.csv,
/// profile.json, checkpoints, ...) must be recorded as roundpipe's (kRunMarkerFile), and a
/// fresh run is refused where an earlier run left checkpoints unless
/// spec.overwrite_output_dir. A frozen_tier.path inside output_dir is refused again, now that
/// a link to the new folder resolves (check_output_dir). Throws std::invalid_argument naming
/// output_dir_origin.
void prepare_output_dir(const TrainSpec& spec);

/// --overwrite-output-dir (a fresh run, no resume): removes what an earlier run recorded in the
/// output folder (kRunMarkerFile) provably wrote there, so that no checkpoint-<n>/ of it is
/// left for a later --resume or a reader to mix with this run's: metrics.csv, metrics.jsonl,
/// profile.json, trace.json, stop_status.txt, the event files of tensorboard/, and of every
/// checkpoint-<n>/, final/, final-merged/ and state/<name>/ the files its roundpipe_manifest.json
/// lists (a folder without one, from an earlier release, as a whole), then each folder left
/// empty. Anything else (the user's files, also inside those folders) stays. Nothing is done
/// in a folder without kRunMarkerFile. Returns one line saying what went and what stayed ("" when
/// nothing was there).
std::string clear_earlier_run(const TrainSpec& spec);

/// A fresh run (no resume, no --overwrite-output-dir) in an output folder an earlier run
/// recorded (kRunMarkerFile) and left without checkpoints (one stopped before its first:
/// prepare_output_dir refused any with them): that run's event files in tensorboard/ go, as its
/// metrics.csv is replaced, so TensorBoard does not show two runs' steps as one. Anything else
/// there stays. Returns one line saying what went ("" when nothing did).
std::string clear_earlier_events(const TrainSpec& spec);

/// Writes kRunMarkerFile into the output folder unless it is there; true when it wrote it
/// (a run stopped before its first step removes it again).
bool mark_output_dir(const TrainSpec& spec);

/// spec.model (unless a full fine-tuning run resumes from a checkpoint, which holds the
/// weights), spec.data and spec.eval_data (when given) exist and can be read (a file opens, a
/// folder lists), checked before the model is loaded: throws std::invalid_argument
/// "<where>: key 'data': <path>: <the OS reason>" (key 'model', 'eval_data' likewise), where is
/// the command-line setting that gave the path (setting_origin: "--data x.jsonl"), else the spec
/// file.
void check_data_paths(const TrainSpec& spec);

/// The run's first log line about the optimizer, saying which mode is the default and how to
/// switch: "optimizer: AdamW (lr 0.0001, weight decay 0, clipping off), staleness 1 (async, the
/// default; \"async\": false for a synchronous step)".
std::string optimizer_line(const TrainSpec& spec);

/// "compute_dtype": "f16" needs the CUDA backend. Throws std::invalid_argument.
void check_compute_dtype(const TrainSpec& spec);

/// Throws std::runtime_error("<model>: the model carries no tokenizer (tokenizer.json)").
void require_tokenizer(const LoadedModel& model);

/// load_model(path) with the "loading model" / "model: ..." log lines; the model must carry
/// a tokenizer.
LoadedModel load_model_for_training(const std::string& path);
/// The same for a LoRA run's base: ModelSource::open(path), no tensor read yet.
ModelSource open_model_for_training(const std::string& path);

/// Before the model's buffers and the data are allocated: refuses (std::invalid_argument, one
/// line naming the key) a batch shape whose smallest host buffers alone exceed
/// `available_bytes` (0: unknown, nothing is refused). Key 'seq_len': one sequence's tokens (its
/// packed row and its place in a batch) and one layer's activation of it; key
/// 'sequences_per_step': a pass's token batch and one layer's activation of a micro-batch. Every
/// run holds at least these at once, whatever the plan, so a shape over them can never run.
void check_batch_fits_host(const TrainSpec& spec, const ModelConfig& c, size_t available_bytes);

/// Before the session starts: when the run's host memory (scheduler/host_memory.hpp, the model
/// `roundpipe plan` prints) is over kHostHeadroom of this machine's memory, logs one warning
/// with the need and each change that lowers it (host_memory_alternatives), so a run that
/// the session then refuses, or that the kernel ends out of memory, said what to change.
/// Returns the warning's text ("" when the run fits or the memory is unknown). `replicas`:
/// the data-parallel processes (an advised accumulation stays a multiple of them).
std::string warn_host_memory(const TrainSpec& spec, const ModelLayout& layout, int replicas = 1);

/// The training sequences of spec.data with the model's tokenizer (log lines "loading data"
/// and "data: ..."). Throws std::invalid_argument naming spec.source and 'seq_len' when no
/// sequence keeps a target.
TokenStream load_data_for_training(const TrainSpec& spec, const LoadedModel& model);

/// The evaluation batches of a spec (its eval_data file, or the sequences eval_fraction
/// held out of `train`), n_seq sequences each; empty without evaluation. Logs "eval: ...".
std::vector<TokenBatch> load_eval_batches(const TrainSpec& spec, const LoadedModel& model,
                                          const TokenStream& train);

/// "epochs": sets spec.steps to ceil(epochs x training_sequences / sequences_per_step) (at
/// least 1) and a decaying schedule's total_steps, when 0, to it; returns the line the run logs
/// ("epochs: 1.5 x 15 training sequences / 2 per step = 12 steps ..."). No-op ("") without
/// epochs. Throws std::invalid_argument "<spec.source>: key 'epochs': ..." when the steps are
/// fewer than lr_schedule.warmup_steps or beyond 2^52.
std::string resolve_epochs(TrainSpec& spec, int64_t training_sequences);

/// The Session options a spec asks for (an explicit "plan" is parsed against `layout`).
SessionOptions session_options_of(const TrainSpec& spec, const ModelLayout& layout);

}  // namespace rp
