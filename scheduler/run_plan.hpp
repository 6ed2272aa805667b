// The run plan: what a training run will do, decided from its inputs alone (no device, no
// host query): whether the decoders keep their attention output, the host memory that needs,
// the analytic per-layer costs, and the stage plan (explicit, automatic, or the uniform plan
// when the automatic one does not fit). The Session, `roundpipe plan` and bench_throughput
// all call plan_run, so the plan a command predicts is the plan a run with the same inputs
// starts from.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "roundpipe/model.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/plan.hpp"

namespace rp {

class Profile;

/// Device numbers of the analytic estimate for a backend ("cpu" or "cuda") computing in
/// `compute`: CUDA the H200-like defaults of DeviceModel; the CPU backend a few cores of
/// Eigen fp32 GEMM (50 GFLOP/s, 10 GB/s) and its emulated link of `cpu_link_bytes_per_s`
/// (DeviceOptions::pcie_bytes_per_s; 0: unthrottled, transfers free). Element sizes are the
/// compute dtype's. `fp8` (DeviceOptions::fp8): the FP8 linears' GEMMs at kFp8SpeedupH200 x
/// peak_flops, their weight caches and scratch in each stage's memory; `fp8_wgrad`
/// (DeviceOptions::fp8_weight_gradients) their weight gradients too; `expert_padded`
/// (DeviceOptions::expert_gemm_bucketed) the sparse blocks' padded scratch. The Session and
/// bench_throughput both plan with this, so the plan a benchmark prints is the one its run uses.
DeviceModel backend_device_model(const std::string& backend, double cpu_link_bytes_per_s, DType compute,
                                 bool fp8 = false, bool fp8_wgrad = false, bool expert_padded = false);

/// What the run's host memory is checked against (the Session's checks).
struct HostBudget {
  int pass_slots = 2;                  ///< SessionOptions::pass_slots (one worker: one shared slot)
  bool weight_prediction = false;      ///< async weight prediction: one more fp32 per trainable parameter
  size_t available_bytes = 0;          ///< what the run may use, its handed-over weights included; 0: unknown
  bool device_arenas_on_host = false;  ///< the CPU backend: every worker's device memory is host memory too
};

struct RunPlanInputs {
  const ModelLayout* layout = nullptr;  ///< the model with its frozen groups and adapters (required)
  MicroBatchShape micro;                ///< one micro-batch
  int64_t micro_batches = 1;            ///< per pass (M)
  int workers = 1;                      ///< GPUs (G)
  DType compute = DType::bf16;          ///< compute dtype: activations, low-precision copy, frozen uploads
  /// The analytic device numbers (backend_device_model or a caller's); plan_run sets its
  /// saved_attention, mlp_chunk_tokens and LoRA fields.
  DeviceModel device;
  int64_t mlp_chunk_tokens = 0;       ///< decoders' MLP chunk (0: the layers' default)
  int64_t device_capacity = 0;        ///< bytes per worker a stage may use (0: unlimited)
  int64_t alloc_granule = 1;          ///< the device pool's granule (Device::allocation_granule)
  std::optional<IterationPlan> plan;  ///< explicit plan; else automatic
  /// When no automatic plan fits under device_capacity: start from the uniform plan and say
  /// so in RunPlan::log_line (the Session, whose profile may find one later), or throw the
  /// partitioner's std::runtime_error (false: `roundpipe plan`, bench_throughput).
  bool uniform_fallback = false;
  /// SessionOptions::save_attention: nullopt is automatic, on when host memory allows it
  /// (everything within 90% of host->available_bytes; on when that is unknown).
  std::optional<bool> save_attention;
  /// The host memory to check (the Session): throws when the need exceeds it. Without it
  /// nothing about host memory is computed or checked.
  std::optional<HostBudget> host;
  /// Measured costs replacing the analytic ones where measured (`roundpipe plan --profile`),
  /// frozen groups applied again; the automatic plan is made from them. nullptr: none.
  const Profile* profile = nullptr;
};

struct RunPlan {
  bool saved_attention = false;  ///< the decoders keep their attention output
  /// Host bytes the session allocates: AdamW moments, low-precision copy and gradient slot
  /// per trainable parameter (and the weight prediction's fp32), frozen storage, pass slots
  /// (with saved attention when on). That is host_memory_need(layout, run).total() less the
  /// fp32 masters, which the caller hands over already allocated (counted in
  /// HostBudget::available_bytes instead). 0 without RunPlanInputs::host.
  size_t host_bytes = 0;
  /// The CPU backend (HostBudget::device_arenas_on_host): the virtual GPUs' host bytes, each
  /// worker's largest stage under the cap; 0 otherwise.
  size_t device_arena_bytes = 0;
  DeviceModel device;               ///< the inputs' with its fields set as the layers run
  std::vector<LayerCost> analytic;  ///< analytic costs, frozen groups applied (L + 2 layers)
  std::vector<LayerCost> costs;     ///< what the plan was made from: analytic, or the profile's
  PartitionOptions partition;       ///< as the plan was made (weight_buffers 1 when prefetch did not fit)
  IterationPlan plan;               ///< validated, of the layout's layer count
  std::optional<PartitionResult> automatic;  ///< the partitioner's result when the plan is automatic
  std::string log_line;                      ///< the uniform fallback's line; empty otherwise
};

/// The run plan of `in`. Throws std::invalid_argument for a missing layout or non-positive
/// shape, a malformed explicit plan ("plan: ..."; "plan has N layers, the model has M"), and
/// (with in.host) a host need over the budget: one line saying what it needs, what is
/// available and what to lower. Throws the partitioner's std::runtime_error when no
/// automatic plan fits and in.uniform_fallback is false.
RunPlan plan_run(const RunPlanInputs& in);

}  // namespace rp
