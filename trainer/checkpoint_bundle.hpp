// A trainer checkpoint: a Hugging Face folder (the weights, config, tokenizer) plus
// optimizer.bin (Session::save_optimizer_state) and trainer_state.json (TrainerState),
// written atomically together, and resuming from one.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
#include "roundpipe/session.hpp"
#include "roundpipe/spec.hpp"
#include "trainer/trainer_state.hpp"

namespace rp {

/// Writes checkpoint folder `dir` of `session` after `state.step` steps: the fp32 master in
/// `save_dtype`, the tokenizer and chat template of `model`, optimizer.bin (with the master
/// unless model.safetensors holds it exactly, i.e. save_dtype f32) and trainer_state.json.
/// Call between steps (it synchronizes). Atomic: a failure keeps any previous `dir`.
void save_checkpoint_bundle(Session& session, const std::string& dir, const LoadedModel& model, DType save_dtype,
                            const TrainerState& state);

/// The checkpoint a spec resumes from, checked before anything is loaded.
struct ResumePoint {
  std::string dir;     ///< spec.resume_from without trailing '/'
  TrainerState saved;  ///< its trainer_state.json
};

/// std::nullopt for a fresh run. Throws (one line naming the file) when spec.resume_from is
/// not a checkpoint folder, its trainer_state.json or optimizer.bin is missing or broken, or
/// it already holds spec.steps steps.
std::optional<ResumePoint> check_resume(const TrainSpec& spec);

/// Loads the checkpoint's optimizer state into `session` (a new one, built from the
/// checkpoint's weights), checks it against the trainer state, warns about spec differences
/// that change the result, and moves `data` to the saved position. Returns the step the run
/// continues at.
int64_t restore_checkpoint(const ResumePoint& r, const TrainSpec& spec, Session& session, TokenStream& data);

}  // namespace rp
