// What the trainer writes for each checkpoint, in its state folder (state/<checkpoint>/, see
// checkpoint_bundle.hpp), so that a resumed run continues exactly: roundpipe_state.json
// (this file's TrainerState) and optimizer_state.bin (rp::Session::save_optimizer_state).
// docs/spec.md describes both for users.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "roundpipe/model.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

/// One checkpoint-<n> a run series wrote, as its later checkpoints record it for
/// save_total_limit: what proves that a folder of that name is still the one the series wrote
/// before it is removed.
struct SavedCheckpoint {
  std::string name;                       ///< "checkpoint-<n>"
  int64_t step = 0;                       ///< steps it holds
  std::string weights_xxh3;               ///< the weights checksum its state recorded
  std::map<std::string, uint64_t> files;  ///< every file of its weights folder, with its size in bytes
  std::optional<double> metric;           ///< metric_for_best_model at its step (none: no evaluation there)
};

/// The best checkpoint of a run series by metric_for_best_model.
struct BestCheckpoint {
  std::string name;  ///< "checkpoint-<n>" or "final"
  int64_t step = 0;
  std::string metric;  ///< "eval_loss" or "eval_perplexity"
  double value = 0;
};

/// Early stopping's position (TrainSpec::early_stopping), as Hugging Face's
/// EarlyStoppingCallback keeps it.
struct EarlyStopState {
  std::optional<double> best;  ///< the best metric of the evaluations so far
  int64_t bad_evals = 0;       ///< evaluations in a row without an improvement above the threshold
};

/// What a run series (a run and the runs resumed from its checkpoints) knows about its
/// checkpoints and evaluations, carried from checkpoint to checkpoint ("run_series" in
/// roundpipe_state.json) so that a resumed run rotates, ranks and stops as the uninterrupted
/// one would.
struct RunSeries {
  std::vector<SavedCheckpoint> checkpoints;  ///< written before this checkpoint, oldest first
  std::optional<BestCheckpoint> best;
  EarlyStopState early_stopping;
};

/// The trainer's position in a run (roundpipe_state.json).
struct TrainerState {
  int64_t step = 0;                ///< optimizer steps done (the resumed run starts at this step)
  int64_t data_position = 0;       ///< sequences consumed from the data stream (BatchStream::position)
  uint64_t seed = 0;               ///< data order seed (the order depends only on seed and position)
  int64_t sequences_per_step = 0;  ///< spec values the data position was counted with
  int64_t seq_len = 0;
  bool async = true;           ///< optimizer mode of the run that saved it
  std::string save_dtype;      ///< dtype of model.safetensors ("f32": it holds the fp32 master)
  std::string compute_dtype;   ///< the spec's compute_dtype
  std::string model, data;     ///< the spec's model and data paths (informational)
  nlohmann::json lr_schedule;  ///< {kind, lr, min_lr, warmup_steps, total_steps}
  bool packing = false;        ///< the spec's packing (the sequences differ with it)
  double eval_fraction = 0;    ///< the spec's held-out fraction (the training sequences differ with it)
  std::string weights_xxh3;    ///< XXH3-64 (hex) of the checkpoint's *.safetensors ("" = not recorded)
  std::string
      base_format;  ///< LoRA: the storage form of the frozen base ("" = full fine-tuning or not recorded)
  std::optional<int64_t> max_examples;       ///< the spec's max_examples (none: not recorded)
  std::optional<std::string> chat_template;  ///< the spec's chat_template (none: not recorded)
  /// the spec's linear-layer compute: "bf16", "fp8" or "fp8+wgrad" (FP8 weight gradients too);
  /// none: not recorded (files of earlier releases)
  std::optional<std::string> linear_compute;
  nlohmann::json model_config;    ///< architecture_of the trained model (null = not recorded)
  nlohmann::json model_numerics;  ///< numerics_of the trained model (null = not recorded)
  RunSeries series;               ///< checkpoints, best checkpoint, early stopping (empty when not recorded)
};

/// The fields of `c` that fix its architecture, as JSON (model_type, vocab_size, hidden_size,
/// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
/// num_experts, num_experts_per_tok, moe_intermediate_size): a checkpoint of one model cannot
/// continue on a model that differs in any of them.
nlohmann::json architecture_of(const ModelConfig& c);

/// The first field of architecture_of where `saved` (a checkpoint's) and `now` (the model a
/// resumed run trains) differ, as "<field> <now> (the checkpoint's <saved>)"; "" when none
/// (a field `saved` does not record is not compared).
std::string architecture_difference(const nlohmann::json& saved, const nlohmann::json& now);

/// The numbers of `c` that its forward pass uses but its architecture does not fix, as JSON
/// (rope_theta, rms_norm_eps, attn_logit_softcapping, final_logit_softcapping; 0: no cap): a
/// checkpoint continues on a model that differs in them, computing differently from there on.
nlohmann::json numerics_of(const ModelConfig& c);

/// One line per value of numerics_of where `saved` (a checkpoint's) and `now` differ, as
/// "<key> <now> (the checkpoint's <saved>)", a cap of 0 reading "none"; a key `saved` does not
/// record is not compared (an earlier release's checkpoint: nothing).
std::vector<std::string> numerics_differences(const nlohmann::json& saved, const nlohmann::json& now);

/// Whether a run of `spec` on model `model` computes FP8 weight gradients:
/// fp8_weight_gradients_on(spec) and some linear of the model can take them (fp8_wgrad_reach;
/// without a model, the spec's intent).
bool fp8_weight_gradients_run(const TrainSpec& spec, const ModelConfig* model);

/// The run's state after `step` steps with the data stream at `data_position`; `model` (the
/// trained model, or null) makes linear_compute what runs (fp8_weight_gradients_run).
TrainerState trainer_state_of(const TrainSpec& spec, int64_t step, int64_t data_position,
                              const ModelConfig* model = nullptr);

/// Writes `s` as JSON to `path`. Throws std::runtime_error("<path>: ...").
void write_trainer_state(const std::string& path, const TrainerState& s);

/// Reads roundpipe_state.json (or an earlier release's trainer_state.json). Throws std::runtime_error with
/// one line naming `path` and the key for a missing file ("not a resumable checkpoint"), invalid JSON, a
/// missing key or a value of the wrong type or range.
TrainerState read_trainer_state(const std::string& path);

/// Differences between the saved run and `spec` that change what a resumed run computes
/// (seed, batch shape, optimizer mode, learning-rate schedule, data and the keys that shape or
/// draw its examples, a LoRA base's storage form):
/// one readable line each,
/// for warnings. Empty when the resumed run reproduces the original. With `model` (the model
/// the resumed run trains) the linear compute compared is what runs on it: a saved "fp8+wgrad"
/// on a model no linear of which can take FP8 weight gradients ran as "fp8".
std::vector<std::string> resume_differences(const TrainerState& saved, const TrainSpec& spec,
                                            const ModelConfig* model = nullptr);

}  // namespace rp
