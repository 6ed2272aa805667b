// Reading the spec's sub-objects (trainer/spec.cpp reads the top-level keys and checks the
// whole): "frozen_tier", "loss_scaling", "optimizer", and "lora" with "adapter" and
// "merge_adapters". Errors are JsonFields' one-line key errors, naming the nested key.
#pragma once
#include "base/json_fields.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

/// "frozen_tier": {"path", "ring_gib", "resident_gib", "host_budget_gib", "spill_layers"}.
void read_frozen_tier(const JsonFields& f, TrainSpec& s);
/// "loss_scaling": true/false or the scaler's settings (on by default for f16 compute).
void read_loss_scaling(const JsonFields& f, TrainSpec& s);
/// "optimizer": the Adam settings and the learning-rate schedule.
void read_optimizer(const JsonFields& f, TrainSpec& s);
/// The rules of a LoraConfig, for a spec file and a spec built in code alike; `f` carries the
/// prefix "lora." so the messages name the nested key.
void check_lora(const JsonFields& f, const LoraConfig& l);
/// "lora" (LoRA settings), "adapter" and "merge_adapters".
void read_lora(const JsonFields& f, TrainSpec& s);

}  // namespace rp
