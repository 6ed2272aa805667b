// RoundPipe's embedding API: wrap a model in a training session and drive it from
// your own loop.
//
//   rp::LoadedModel lm = rp::load_model("model.gguf");       // or an HF directory
//   rp::ModelLayout layout = rp::make_layout(lm.config);
//   rp::SessionOptions opt;  opt.workers = 2;  opt.micro_batches = 4;  ...
//   rp::Session s(layout, rp::group_weights(lm, layout), opt);
//   for (step...) {
//     s.forward_backward(ids, targets);     // one or more passes per step
//     int64_t t = s.step(lr);               // closes the step; returns at once
//     rp::StepResult r = s.wait(t - 1);     // results arrive one step behind (async)
//   }
//   s.synchronize();  save(s.master_weights());
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "kernels/device.hpp"
#include "model/layer.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/loss_scale.hpp"
#include "scheduler/plan.hpp"

namespace rp {

struct SessionOptions {
  std::string backend = "cpu";   ///< "cpu" (virtual GPUs), "cuda", or "auto" (cuda if a GPU is visible)
  int workers = 1;               ///< GPUs / virtual GPUs in the pool
  int64_t micro_batches = 1;     ///< M: micro-batches per pass
  MicroBatchShape micro;         ///< sequences per micro-batch and sequence length (tokens)
  bool async = true;             ///< staleness-1 optimizer (false: synchronous, staleness 0)
  AdamWOptions adam;
  int shards = 0;                ///< optimizer shard actors (0: min(4, cores/2, groups), at least 1)
  int optimizer_threads = 0;     ///< optimizer threads over all shards (0: half the allowed cores)
  bool pin_optimizer_threads = true;  ///< pin them (each shard to its own cores, NUMA-grouped)
  double max_grad_norm = 0;      ///< > 0: clip the global gradient norm (torch clip_grad_norm_)
  bool skip_nonfinite = false;   ///< skip steps whose gradients hold inf/NaN (implied by loss_scaling)
  /// fp16 dynamic loss scaling (needs an f16 compute dtype; the tail must apply
  /// RunStage::loss_scale to the loss gradient).
  std::optional<LossScalerOptions> loss_scaling;
  DeviceOptions device;          ///< per-device memory cap, CPU-backend PCIe throttle
  std::optional<IterationPlan> plan;  ///< default: make_default_plan(L + 2, workers)
  int pass_slots = 2;            ///< passes in flight (each holds its activations in host memory)
  bool trace = false;            ///< record stream and task intervals (write_trace)
  /// Cross-stream transfer priority (actors/transfer.hpp): parameter and gradient chunks
  /// yield to activation copies of the same direction, and a prefetched stage's weight
  /// chunks are packed into the windows between activation uploads. false: first come,
  /// first served everywhere (also turns off the CPU backend link's own priorities,
  /// device.pcie_priorities).
  bool transfer_priorities = true;
  /// Parameter uploads and gradient downloads above this many bytes are cut into chunks of
  /// it (0: whole copies); with priorities on, an activation copy waits at most one chunk.
  size_t transfer_chunk_bytes = size_t(8) << 20;
};

/// Thrown by wait()/synchronize() when the runtime failed; what() names the worker,
/// stage, micro-batch and the failed operation.
struct RuntimeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Session {
 public:
  /// `group_weights[g]` holds ParamGroup g's fp32 values (layout.groups[g].numel each).
  /// Throws std::invalid_argument for inconsistent options or weights, DeviceError when
  /// the backend cannot be created.
  Session(const ModelLayout& layout, std::vector<std::vector<float>> group_weights, SessionOptions opt);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Enqueues one pass of M micro-batches for the current step. `ids` and `targets` are
  /// [M * micro.n_seq * micro.seq_len] i32, micro-batch after micro-batch; targets < 0
  /// carry no loss. Returns at once (blocks only while all pass slots are in use is
  /// handled by the scheduler's queue, never here). Throws std::invalid_argument on size.
  void forward_backward(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets);
  /// Closes the current step: its gradients (summed over all its passes and divided by
  /// their number of target tokens) update the weights with learning rate `lr`.
  /// Returns the closed step's index and starts the next step.
  int64_t step(double lr);
  /// Blocks until step `t` is applied to the fp32 master weights; returns its loss sum,
  /// target-token count and wall time. Throws RuntimeFailure if the runtime failed.
  StepResult wait(int64_t t);
  /// Waits for every closed step (throws RuntimeFailure like wait()).
  void synchronize();
  /// fp32 master weights per parameter group (consistent after synchronize()).
  const std::vector<std::vector<float>>& master_weights() const;
  const std::vector<AdamWState>& optimizer_states() const;
  const IterationPlan& plan() const;
  const ModelLayout& layout() const;
  /// The loss scaler (null without loss_scaling); save / load it with the optimizer state,
  /// between steps (after synchronize()).
  LossScaler* loss_scaler();
  /// Number of steps closed so far.
  int64_t steps_closed() const;
  /// Peak device bytes over all workers.
  size_t peak_device_bytes() const;
  std::string device_name() const;
  /// Writes the recorded trace (opt.trace) as Chrome trace JSON. Throws std::runtime_error.
  void write_trace(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rp
