// The weights a training run starts from when it trains LoRA adapters: the base model frozen
// in its storage form, the adapters initialised as PEFT does or read from an adapter folder
// (a PEFT folder named by the spec's "adapter", or the checkpoint a LoRA run resumes from:
// its checkpoints are adapter folders), and the merged model that generation and evaluation
// callbacks see.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/model.hpp"
#include "roundpipe/model_source.hpp"
#include "roundpipe/session.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

class Session;

/// What a Session is built from: one entry per layout group in each vector, fp32 values for a
/// trainable group (frozen[g] empty) and the storage form for a frozen one (trainable[g] empty;
/// ParamGroup::storage_bytes bytes, each tensor at its byte_offset in its format).
struct RunWeights {
  ModelLayout layout;
  std::vector<std::vector<float>> trainable;
  std::vector<std::vector<uint8_t>> frozen;
  /// Set when the frozen groups are left to the session to read from the model files as it
  /// needs them (a run with a disk tier: frozen[g] empty), SessionOptions::frozen_source.
  std::optional<FrozenSource> source;
};

/// True when the spec trains LoRA adapters (a "lora" object or an "adapter" folder).
inline bool trains_lora(const TrainSpec& spec) { return spec.lora.has_value() || !spec.adapter.empty(); }

/// The LoRA run's layout and weights from the base model `base` (read tensor by tensor: the
/// frozen groups straight into their storage form, read_base_groups) and, when `adapter_dir`
/// is not empty, the PEFT adapter folder there. The LoRA settings are spec.lora's, else the
/// adapter's (with spec.seed). A tied base that the adapter unties (roundpipe/adapter.hpp) is
/// untied first, so `base.config()` may change. Throws std::invalid_argument /
/// std::runtime_error with one line naming the spec key or the adapter file, or the model when
/// its storage form does not fit the host's available memory.
/// `lazy` (the same ModelSource as `base`, shared): with spec.frozen_tier set, the frozen groups
/// are not read here but by RunWeights::source when the session asks (its disk tier writes its
/// cache group by group, and reads none when a valid cache of the same files is reused), so a
/// base larger than host memory is never in it whole.
RunWeights lora_run_weights(const TrainSpec& spec, ModelSource& base, const std::string& adapter_dir,
                            std::shared_ptr<const ModelSource> lazy = nullptr);

/// The storage form a LoRA run keeps `base` in when the spec does not name one
/// (TrainSpec::lora_base_format_from_model): the float form (f32, f16, bf16) that every weight
/// matrix of the base is stored in, else (a quantized or mixed base) bf16. `why` gets the
/// reason, for the start-up log.
WeightFormat base_format_of_model(const ModelSource& base, std::string& why);

/// Group g's fp32 weights for every group of the session's layout (frozen ones dequantized):
/// what the adapter files and the merge read.
std::vector<std::vector<float>> all_group_weights(const Session& session);

/// The plain model the LoRA session computes (adapters folded into the base: W + s B A, equal
/// to merge_adapters of all_group_weights), for generation, evaluation callbacks and
/// final-merged/: the layout of make_layout(config) and its fp32 groups, built group by group
/// (host memory: the fp32 model once). Throws std::invalid_argument for a session without
/// adapters.
struct PlainModel {
  ModelLayout layout;
  std::vector<std::vector<float>> groups;
};
PlainModel merged_model(const Session& session);

}  // namespace rp
