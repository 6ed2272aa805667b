// A trainer checkpoint: a plain Hugging Face folder `<out>/<name>/` (config, weights,
// tokenizer, generation config: what from_pretrained loads, nothing else) and the
// trainer's own state in `<out>/state/<name>/`: optimizer_state.bin
// (Session::save_optimizer_state) and roundpipe_state.json (TrainerState, with the XXH3-64
// of the weights it belongs to), names no Hugging Face file uses. Each folder is replaced
// atomically, the state first and the weights last; a checkpoint whose state is missing or
// does not match its weights (a save killed in between) is no checkpoint: never resumed,
// never advised. Resuming from one.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <functional>

#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
#include "roundpipe/session.hpp"
#include "roundpipe/spec.hpp"
#include "trainer/trainer_state.hpp"

namespace rp {

/// The state folder of checkpoint folder `dir`: "<parent>/state/<name>" (runs/x/final ->
/// runs/x/state/final).
std::string state_dir_of(const std::string& dir);
inline constexpr const char* kOptimizerStateFile = "optimizer_state.bin";
inline constexpr const char* kRunStateFile = "roundpipe_state.json";

/// n of a "checkpoint-<n>" name (n of at most 18 digits), else -1.
int64_t checkpoint_number(const std::string& name);

/// The checkpoint folders a run left in its output folder `dir`: "final" and "checkpoint-<n>",
/// in name order; empty when there are none, `dir` is not a folder or it is a state/ folder
/// (which holds the trainer state of the checkpoints beside it, under their names).
std::vector<std::string> checkpoints_in(const std::string& dir);
/// The one of `names` (checkpoints_in) a run continues from: "final" when there, else the
/// checkpoint-<n> of the largest n; "" for none.
std::string newest_checkpoint(const std::vector<std::string>& names);

/// Whether `dir` is a folder with a trainer state (state_dir_of(dir)/roundpipe_state.json, or an
/// earlier release's trainer_state.json inside): cheap, reads no weights.
bool looks_like_checkpoint(const std::string& dir);
/// Whether checkpoint folder `dir` can be resumed: the folder, its state folder with
/// roundpipe_state.json and optimizer_state.bin, and the state's weights checksum matching the
/// folder's weights (or an earlier release's trainer_state.json + optimizer.bin inside it).
/// Never throws; reads the weights once for the checksum.
bool resumable_checkpoint(const std::string& dir);
/// newest_checkpoint of those of `names` (in folder `dir`) that are resumable_checkpoint; "" for none.
std::string newest_resumable_checkpoint(const std::string& dir, std::vector<std::string> names);

/// XXH3-64 (hex) of the *.safetensors files of `dir`, in name order: ties a state to its weights.
std::string weights_checksum(const std::string& dir);

/// Writes checkpoint folder `dir` of `session` after `state.step` steps: the fp32 master in
/// `save_dtype`, the tokenizer and chat template of `model`; then state_dir_of(dir) with
/// optimizer_state.bin (with the master unless model.safetensors holds it exactly, i.e.
/// save_dtype f32) and roundpipe_state.json. Call between steps (it synchronizes). Each
/// folder is replaced atomically, the state folder before the weights folder (a failure
/// between them leaves a state without its weights, which resumable_checkpoint refuses); a
/// failure keeps any previous one. A LoRA run's adapter folder names `base.portable()` as
/// base_model_name_or_path and records `base` in kAdapterBaseFile (roundpipe/adapter.hpp).
/// `extra` (optional) adds files to the new folder before it is put in place (the model card).
void save_checkpoint_bundle(Session& session, const std::string& dir, const LoadedModel& model,
                            DType save_dtype, const TrainerState& state, const BaseModelRef& base,
                            const std::function<void(const std::string& tmp_dir)>& extra = {});

/// Writes checkpoint folder `to` (and its state folder) as a byte-for-byte copy of checkpoint
/// `from` and its state: load_best_model_at_end's final/. Each folder is replaced atomically,
/// the state first and the weights last, as save_checkpoint_bundle does, so the copy is a
/// checkpoint of `from`'s step whose state matches its weights. Throws std::runtime_error
/// ("<file>: <what>") when `from` is not a resumable checkpoint or a file cannot be copied; a
/// failure keeps any previous `to`.
void copy_checkpoint_bundle(const std::string& from, const std::string& to);

/// The checkpoint a spec resumes from, checked before anything is loaded.
struct ResumePoint {
  std::string dir;             ///< spec.resume_from without trailing '/'
  TrainerState saved;          ///< its roundpipe_state.json
  std::string optimizer_file;  ///< its optimizer_state.bin
};

/// std::nullopt for a fresh run. Throws (one line naming the file) when spec.resume_from is
/// not a checkpoint folder, its state folder, roundpipe_state.json or optimizer_state.bin is
/// missing or broken, the state belongs to other weights, or it already holds spec.steps
/// steps. Checkpoints of earlier releases (optimizer.bin and trainer_state.json inside the
/// folder) are read too.
std::optional<ResumePoint> check_resume(const TrainSpec& spec);

/// Refuses a resume whose spec trains otherwise than the checkpoint's run, before anything in
/// the output folder is touched: a LoRA checkpoint (adapter_config.json) resumed by a spec for
/// full fine-tuning or for adapters of another rank (lora.r), or a full fine-tuning checkpoint
/// (config.json, no adapter_config.json) resumed by a spec with "lora" or "adapter".
/// std::invalid_argument, one line naming the checkpoint, what it holds, what the spec asks for
/// and the change that resumes it (the "lora" key the checkpoint was trained with, as JSON; the
/// rank). A LoRA checkpoint's adapter_config.json that cannot be read (not JSON, a bad key) is
/// one line naming the file (with the line and column of a syntax error). Nothing for a folder
/// that is neither.
void check_resume_kind(const TrainSpec& spec);

/// Refuses, before any weights load, a resume whose optimizer state belongs to another model:
/// the groups its header lists against the trainable groups of the run's layout, built from
/// configs alone (full fine-tuning: the checkpoint's config.json; LoRA: spec.model's config
/// with the spec's adapters, or the checkpoint's adapter_config.json). std::runtime_error
/// "<optimizer_state.bin>: the state has <n> parameter groups, the model has <m> trainable
/// ones ..." or "...: group <g> is '<name>' with <n> parameters in the state, the model expects
/// ...", the session's own refusal. A model of another architecture is refused first, as
/// check_resume_model refuses it. Nothing when a config cannot be read: the load names that.
void check_resume_state_fits(const ResumePoint& r, const TrainSpec& spec);

/// Refuses a resume whose model differs in architecture from the checkpoint's:
/// std::invalid_argument "<spec>: key 'model': <model> is not the architecture of checkpoint
/// <dir>: <field> <value> (the checkpoint's <value>); ...", naming the first differing field
/// of architecture_of. `model` is the config of the model the run trains on (spec.model; for
/// LoRA its base). The checkpoint's architecture is the one roundpipe_state.json records, or
/// else (full fine-tuning) its config.json; a checkpoint with neither is not checked. A
/// `model` whose numerics_of differ from the recorded ones gets one warning per value naming
/// both (none when the state records none).
void check_resume_model(const ResumePoint& r, const TrainSpec& spec, const ModelConfig& model);

/// Loads the checkpoint's optimizer state into `session` (a new one, built from the
/// checkpoint's weights), checks it against the trainer state, warns about spec differences
/// that change the result, and moves `data` to the saved position. Returns the step the run
/// continues at.
int64_t restore_checkpoint(const ResumePoint& r, const TrainSpec& spec, Session& session, TokenStream& data);

/// A save of checkpoint `<name>` writes its trainer state first (state/<name>, the previous one
/// moved aside to state/<name>.old-<pid>) and its weights last (filled in <name>.tmp-<pid>,
/// then renamed over <name>). A save killed between the two leaves the new state beside the
/// old weights. Before the leftovers of `output_dir` are cleaned this makes every such pair
/// whole again: forward when the waiting weights are complete (their checksum is the one the
/// new state records: they replace the old weights), else back (the old state, whose checksum
/// matches the weights in place, is put back). Acts only on leftovers of dead roundpipe
/// writers (dead_writers_leftover). Returns one line per checkpoint it mended.
std::vector<std::string> mend_interrupted_saves(const std::string& output_dir);

}  // namespace rp
