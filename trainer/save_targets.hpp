// Before a run trains: every folder it will save must take the save. A save keeps the user's
// files in the folder it replaces (base/atomic_file.hpp, replace_folder), but a file of the
// user's under a name the save writes (a config.json of theirs, a roundpipe_state.json they
// edited, anything in a folder no roundpipe_manifest.json proves roundpipe's) cannot be kept
// and replaced at once: the save would refuse after every step trained. This finds that
// first, naming the file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "roundpipe/spec.hpp"

namespace rp {

/// What kind of folder a save writes: a full fine-tuning run's weights (a Hugging Face folder),
/// a LoRA run's adapter folder, or a checkpoint's trainer state (state/<name>).
enum class SavedFolder { hf_weights, adapter, trainer_state };

/// Whether a save of a folder of kind `kind` may write a file named `name` (roundpipe_manifest.json,
/// config.json, model.safetensors or a shard of it, ..., never README.md: a user's README
/// is kept in place of the model card).
bool save_may_write(SavedFolder kind, const std::string& name);

/// The folders (under spec.output_dir) the run will save after `start` steps done: final/ and
/// state/final/, final-merged/ with merge_adapters (`lora`), and the checkpoint-<n>/ of save_every
/// (n > start, below spec.steps; with epochs every such one already there) with their states.
/// Throws FolderConflict (base/atomic_file.hpp), one line naming the first file of the user's
/// that a save would have to replace, or a target that is a symbolic link or not a folder;
/// nothing is written.
void check_save_targets(const TrainSpec& spec, bool lora, int64_t start);

}  // namespace rp
