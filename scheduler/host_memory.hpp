// The host memory a training run holds, and what to change when a machine has less.
//
// Every parameter, optimizer state and saved activation of a RoundPipe run lives in host
// memory (docs/architecture.md), so a run's host need follows from the model, the kind of
// training and the batch shape alone. `roundpipe plan` prints it; host_memory_alternatives
// lists the changes that lower it (LoRA instead of full fine-tuning, a 4-bit base, fewer
// sequences per pass, shorter sequences, no saved attention), each with its own need from
// the same host_memory_need, so the advice and the figure it improves on never disagree.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "roundpipe/model.hpp"

namespace rp {

/// What a run keeps in host memory, as `roundpipe plan` and a spec describe it.
struct HostRun {
  /// LoRA rank (> 0: adapters on lora_targets over a base frozen in `frozen`, bf16 when
  /// unset); 0: every weight trainable unless `frozen` is set (all groups frozen then).
  int64_t lora_r = 0;
  std::vector<std::string> lora_targets = {"all-linear"};
  std::optional<WeightFormat> frozen;
  int64_t seq_len = 8192;           ///< tokens per sequence
  int64_t sequences_per_micro = 1;  ///< sequences per micro-batch
  int64_t micro_batches = 16;       ///< micro-batches per pass (M)
  /// passes per optimizer step over all replicas (the spec's "accumulation"): a step's batch is
  /// micro_batches x sequences_per_micro x accumulation sequences
  int64_t accumulation = 1;
  int64_t replicas = 1;         ///< data-parallel processes, each running accumulation / replicas passes
  int workers = 8;              ///< GPUs; one worker shares one pass slot's activations
  int pass_slots = 2;           ///< passes in flight (SessionOptions::pass_slots)
  bool saved_attention = true;  ///< decoders keep the forward's attention output
  int64_t elem_bytes = 2;       ///< compute dtype of the low-precision copy and activations
  bool operator==(const HostRun&) const = default;
};

/// Bytes by kind. Trainable parameters: fp32 master (4), AdamW moments (4 + 4), the
/// low-precision copy the GPUs read (elem_bytes) and the fp32 gradient slot (4); frozen
/// ones: their storage form. Activations: per pass slot, M micro-batches of L + 1 [tokens,
/// hidden] activations (L layers with the embedding and the head: the saved input of every layer
/// past the first, and two sets of boundary gradients, as PassBuffers holds them); saved attention: per pass
/// slot, M x L x tokens x heads x (head_dim x elem_bytes + 4) (the output and its log-sum-exp). As
/// actors/session.cpp sizes its buffers; the process's own code, the tokenized data and the allocator's slack
/// come on top (see kHostHeadroom).
struct HostMemoryNeed {
  double master = 0, moments = 0, weights = 0, gradients = 0, frozen = 0;
  double activations = 0, attention = 0;
  int64_t trainable_params = 0, frozen_params = 0;
  double total() const { return master + moments + weights + gradients + frozen + activations + attention; }
};

/// The fraction of a machine's memory a run may plan to fill; the rest is for the operating
/// system, the data set and the allocator (the runtime turns saved attention on when
/// everything fits 90% of the available memory, SessionOptions::save_attention).
constexpr double kHostHeadroom = 0.9;

/// The host memory of `run` on a model of config `c`. Throws std::invalid_argument naming
/// the field for a bad LoRA setting (make_layout's message) or a non-positive shape.
HostMemoryNeed host_memory_need(const ModelConfig& c, const HostRun& run);
/// The same for a run's own layout (its frozen groups and adapters as built, e.g. with
/// modules_to_save); run's lora_r, lora_targets and frozen are not read.
HostMemoryNeed host_memory_need(const ModelLayout& m, const HostRun& run);

/// One change to a run and what it needs afterwards.
struct HostMemoryChange {
  std::string what;  ///< "LoRA r=16 on all-linear instead of full fine-tuning"
  /// The flags and spec keys that make it: "plan <flags>; spec: <keys>", the keys a JSON
  /// object's members ("\"lora\": {\"r\": 16}") to paste into a spec. Empty for the combination.
  std::string how;
  HostRun run;        ///< the changed run
  double need = 0;    ///< host_memory_need(c, run).total()
  bool fits = false;  ///< need <= kHostHeadroom x budget
};

/// Changes that lower the host need of `run` below kHostHeadroom x `budget_bytes`, each
/// alone, in this order where they apply: LoRA r=16 on all linears instead of full
/// fine-tuning; a 4-bit (nf4) base for LoRA; fewer sequences per pass with the step's batch
/// kept by more accumulation (the largest count that fits, divides the batch each replica runs
/// per step and splits into equal micro-batches, or 1); shorter sequences (the longest power-of-two fraction
/// that fits, or 512 tokens); no saved attention. When none fits alone, a last entry combines them all. Each
/// entry's `need` is host_memory_need of its `run`, and `fits` says whether it is under
/// the budget. Empty when `run` fits already.
std::vector<HostMemoryChange> host_memory_alternatives(const ModelConfig& c, const HostRun& run,
                                                       double budget_bytes);

/// "needs 412.3 GiB: fp32 master 131.2 GiB, moments ..." one line per need (for plan and train).
std::string host_memory_text(const HostMemoryNeed& n);

}  // namespace rp
