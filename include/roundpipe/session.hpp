// The low-level training API: wrap a model in a Session and drive it from your own loop.
// (rp::Trainer, roundpipe/trainer.hpp, runs the whole loop from a spec instead.)
//
//   rp::LoadedModel lm = rp::load_model("model.gguf");       // or a Hugging Face folder
//   rp::ModelLayout layout = rp::make_layout(lm.config);
//   std::vector<std::vector<float>> weights;
//   rp::fill_groups(lm, layout, weights);
//   rp::SessionOptions opt;  opt.workers = 2;  opt.micro_batches = 4;  opt.micro = {1, 512};
//   rp::Session s(layout, std::move(weights), opt);
//   rp::TokenStream data(lm, "data.jsonl", {.seq_len = 512});  // or your own ids and targets
//   rp::LrSchedule lr;  lr.kind = "cosine";  lr.lr = 1e-4;  lr.total_steps = steps;
//   for (int64_t t = 0; t < steps; ++t) {
//     rp::TokenBatch b = data.next(4);             // M * n_seq sequences
//     s.forward_backward(b.ids, b.targets);        // one or more passes per step
//     s.step(lr.at(t));                            // closes the step; returns at once
//     if (t > 0) rp::StepResult r = s.wait(t - 1); // results arrive one step behind (async)
//   }
//   s.synchronize();                               // every step applied
//   std::vector<const float*> ptrs;
//   for (const auto& g : s.master_weights()) ptrs.push_back(g.data());
//   rp::save_hf_checkpoint("out", layout, ptrs, lm.tokenizer_json, lm.chat_template, rp::DType::bf16,
//                          [&](const std::string& tmp) { s.save_optimizer_state(tmp + "/optimizer.bin"); });
//   // with the optimizer state next to the weights the run can be resumed exactly
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "roundpipe/device.hpp"
#include "roundpipe/errors.hpp"
#include "roundpipe/model.hpp"
#include "roundpipe/optimizer.hpp"
#include "roundpipe/plan.hpp"
#include "roundpipe/replicas.hpp"

namespace rp {

/// The profiler and automatic re-planning: every layer call is timed on the device; without
/// an explicit plan the runtime starts from the partition of the analytic costs and re-plans
/// once the measured profile settles.
struct ProfilingOptions {
  bool enabled = true;  ///< time every layer call (steady clocks / CUDA events) into the profile
  /// Automatic plans only (SessionOptions::plan empty): once the profile settles, switch to
  /// the partition of the measured costs when the simulator predicts it is faster.
  bool replan = true;
  double settle_rel_tol = 0.05;     ///< a series is settled when its last relative change is at most this
  int64_t settle_min_samples = 3;   ///< ... and it has at least this many samples
  int64_t settle_max_samples = 16;  ///< decide anyway with this many samples per series (noisy hosts)
  double min_gain = 0.02;           ///< switch only when the predicted iteration time drops by more than this
  /// Receives the one-line re-planning message (default: the runtime's log, spdlog::info).
  std::function<void(const std::string&)> log;
};

/// The disk tier for frozen weights (SessionOptions::frozen_tier): the frozen groups (a LoRA
/// base's matrices, in their storage form) are written once to a cache file and streamed back
/// to the devices through a few host buffers, instead of staying in host memory.
struct FrozenTierOptions {
  /// The cache file (its folder is created). A valid cache of the same frozen weights (the
  /// model layout, each group's formats and bytes, and a checksum of them) is reused as it is;
  /// a missing, stale or damaged one is rebuilt (the reason is logged). Must not be empty.
  std::string path;
  /// Host memory of the read buffers, in GiB (2^30 bytes): as many buffers of the largest
  /// frozen group's bytes (rounded up to 4 KiB) as fit, at least 2 and at most one per frozen
  /// group (more would stay idle). 0: exactly 2. A budget
  /// below two buffers is refused (std::invalid_argument naming frozen_tier.ring_gib
  /// and the least it needs).
  double ring_gib = 0;
  /// Host memory in GiB for frozen groups kept resident instead of streamed: decoder layers'
  /// groups first (each is uploaded twice per iteration), then the others, each kept while its
  /// storage still fits (the rule `roundpipe plan --host-budget-gib` uses, which prints how much
  /// of the base it keeps). 0: every frozen group streams. Refused (std::invalid_argument
  /// naming frozen_tier.resident_gib) when negative or not finite.
  double resident_gib = 0;
  /// The whole run's host memory in GiB (0: not set). The session then decides what stays in
  /// host memory by the rule `roundpipe plan --host-budget-gib` prints (scheduler/disk_tier.hpp,
  /// plan_disk_tier): from the budget less what the process holds before the session allocates
  /// (its code, the device contexts, the caller's data), the trainable state and the read ring
  /// come first; the saved activations next (the saved attention is dropped when it does not
  /// fit beside them, and, with save_attention automatic, also when dropping it keeps more of
  /// the base resident); the frozen groups that fit what is left stay resident (decoders' first)
  /// and the rest streams. It replaces resident_gib (giving both is refused). Refused
  /// (std::invalid_argument naming frozen_tier.host_budget_gib and the least it needs) when
  /// the trainable state and the ring alone do not fit, or when the activations would have to
  /// spill to the disk and the run cannot spill them.
  double host_budget_gib = 0;
  /// Read with O_DIRECT where the file system allows it (false: buffered reads that drop the
  /// page cache behind them).
  bool direct = true;
  /// Read a reused cache whole once at construction and check every entry's checksum: a
  /// damaged one is rebuilt (the reason is logged). false: trust its header; a damaged entry
  /// then fails the run when it is read.
  bool verify_reused = true;
  /// Activation spill: the saved inputs (every micro-batch, every pass in flight) of this many
  /// layers live in a hidden file in the folder of `path` instead of host memory, saving
  /// spill_layers x pass slots x micro_batches x n_seq x seq_len x hidden x the compute dtype's bytes
  /// of host memory (one pass slot's worth with one worker, whose passes share them). Forward
  /// stages write them once computed; the stages that upload them read them back ahead, while
  /// the stage before runs, through a few host staging buffers (act_bytes each, rounded up to
  /// 4 KiB). The layers are chosen lowest index first (their inputs wait longest for the backward
  /// stage), layer 0 never (it has no saved input), and layers that begin a forward stage or the
  /// tail of the session's first plan last (those are read right after they are written). The file has no
  /// name (O_TMPFILE, or created and unlinked at once): nothing is left behind, however the run ends. Saved
  /// attention (SessionOptions::save_attention) is off while layers spill. Also works without frozen groups
  /// (full fine-tuning): then only `path`'s folder is used. 0: off. Refused: a value below 0 or above the
  /// layers with a saved input (the model's layers - 1; std::invalid_argument naming frozen_tier.spill_layers
  /// and the range), and a folder without room for the file (std::runtime_error naming
  /// frozen_tier.spill_layers, the bytes needed and free). A read or write that fails during training fails
  /// the run (RuntimeFailure naming the folder, the layer, the micro-batch and the file offset).
  int spill_layers = 0;
};

/// Frozen groups made on demand instead of handed over in memory (SessionOptions::frozen_source):
/// the session asks for each frozen group it was given no weights for, one group at a time, when
/// it needs the group's bytes (a resident group at construction; a streamed one while the disk
/// tier writes its cache, which a reused cache does not need), so a base larger than the host's
/// memory never exists whole in it.
struct FrozenSource {
  /// Names the weights the source makes (a generator and its seed, or files with their sizes
  /// and modification times). With the model layout and the groups' formats it keys the disk
  /// tier's cache: a cache of the same identity is reused without making any group, so the
  /// identity must change whenever the bytes would. Must not be empty.
  std::string identity;
  /// Writes frozen group g's storage form into `out` (exactly ParamGroup::storage_bytes bytes,
  /// each tensor in its TensorSpec::format at its byte_offset, as quantize_weights lays them
  /// out). Called from the thread constructing the session, at most once per group and
  /// construction; may use threads of its own. An exception it throws leaves the constructor
  /// with the same exception, nothing half-written left behind.
  std::function<void(int group, std::span<std::byte> out)> fill;
};

/// What the disk tier did at construction (Session::frozen_tier).
struct FrozenTierReport {
  bool enabled = false;         ///< a tier is in use (the option set and the model has frozen groups)
  std::string path;             ///< the cache file
  bool built = false;           ///< false: an existing valid cache was reused
  std::string rebuilt_because;  ///< built: why the old file could not be used (missing, stale, damaged)
  /// built over a file that was at the path once the builders' lock was held (the start line
  /// then says "rebuilt because ..."); false: built where no file was, or reused
  bool replaced = false;
  /// another run held the builders' lock first (its build, or its reuse, came before this run's
  /// look at the path; the start line says so)
  bool waited = false;
  uint64_t bytes = 0;  ///< the frozen groups' storage bytes in the file
  double seconds = 0;  ///< checking (and building) the cache
  /// Of `seconds`, those a frozen source (SessionOptions::frozen_source) spent making the groups
  /// a build wrote (0 when nothing was made: a reused cache, or weights handed over in memory).
  double source_seconds = 0;
  bool direct = false;          ///< reads use O_DIRECT
  std::string buffered_reason;  ///< !direct: why not
  std::string engine;           ///< "io_uring" or "pread pool (N threads)"
  size_t ring_buffers = 0, buffer_bytes = 0;
  /// The cache file's sequential O_DIRECT read rate timed at start (up to its first GiB, 8
  /// reads of 4 MiB in flight), GB/s; 0 when the probe failed (logged; training goes on).
  double probe_gbps = 0;
  /// "frozen tier: <path>: reused (N GiB, X s, O_DIRECT); ring K x M MiB" (also logged).
  std::string line;
  uint64_t resident_bytes = 0;     ///< frozen bytes kept in host memory (resident_gib or the budget)
  bool attention_dropped = false;  ///< host_budget_gib turned the saved attention off
  /// host_budget_gib: "frozen tier: host budget 32.0 GiB: process 1.2 GiB, trainable ..., ring
  /// ..., activations ... (saved attention dropped); frozen base X GiB of which Y resident"
  /// (also logged); empty without a budget.
  std::string budget_line;
  /// Activation spill (FrozenTierOptions::spill_layers; reported also when `enabled` is false):
  /// the layers whose saved inputs are on disk (none: off), the spill file's bytes (the host
  /// memory it saves), its folder, whether it uses O_DIRECT, its reads' engine, and the staging
  /// buffers over all workers (spill_staging_bytes each).
  std::vector<int> spill_layers;
  uint64_t spill_bytes = 0;
  std::string spill_folder;
  bool spill_direct = false;
  std::string spill_engine;  ///< the reads' engine: "io_uring" or "pread pool (N threads)"
  size_t spill_staging_buffers = 0, spill_staging_bytes = 0;
  /// "activation spill: N layers (X GiB) to <folder>, staging K x M MiB" (also logged).
  std::string spill_line;
};

/// The frozen tier's reads since the session started (Session::frozen_tier_reads): how many,
/// their storage bytes, and the seconds the tier's reader spent on them (from submitting each
/// read to its result; time waiting for a free ring buffer is left out). Differences of two
/// readings give what an interval read; bytes / seconds is the rate the disk gave while read.
struct FrozenTierReads {
  uint64_t reads = 0, bytes = 0;
  double seconds = 0;
  /// The activation spill's file (spill_layers): the bytes written to it and read back from it
  /// (whole records), the disk traffic `roundpipe plan --disk-gbps` adds to the base's reads.
  uint64_t spill_written = 0, spill_read = 0;
};

struct SessionOptions {
  std::string backend = "cpu";  ///< "cpu" (virtual GPUs), "cuda", or "auto" (cuda if a GPU is visible)
  int workers = 1;              ///< GPUs / virtual GPUs in the pool
  int64_t micro_batches = 1;    ///< M: micro-batches per pass
  MicroBatchShape micro;        ///< sequences per micro-batch and sequence length (tokens)
  bool async = true;            ///< staleness-1 optimizer (false: synchronous, staleness 0)
  /// With async: the devices compute with each version of the weights extrapolated by its last
  /// update, w_k + (w_k - w_{k-1}), an estimate of the version the gradient is applied to
  /// (spec "async_compensation": "predict"; docs/fidelity.md). Costs 4 bytes of host memory per
  /// trainable parameter. Ignored without async.
  bool async_weight_prediction = false;
  AdamWOptions adam;
  int shards = 0;                     ///< optimizer shard actors (0: min(4, cores/2, groups), at least 1)
  int optimizer_threads = 0;          ///< optimizer threads over all shards (0: half the allowed cores)
  bool pin_optimizer_threads = true;  ///< pin them (each shard to its own cores, NUMA-grouped)
  double max_grad_norm = 0;           ///< > 0: clip the global gradient norm (torch clip_grad_norm_)
  bool skip_nonfinite = false;        ///< skip steps whose gradients hold inf/NaN (implied by loss_scaling)
  /// fp16 dynamic loss scaling (torch GradScaler rules): the tail multiplies the loss
  /// gradient by the scale, the optimizer divides it out (fused into the AdamW gradient
  /// factor) before clipping; a step whose gradients hold inf/NaN is skipped (weights,
  /// moments and AdamW step counters untouched) and the scale backs off; it grows after
  /// growth_interval clean steps. Step t's backward uses the scale decided after step t-1
  /// (sync) or t-2 (async: the step whose weights it computes with), so results never depend
  /// on timing. Needs the f16 compute dtype (std::invalid_argument otherwise).
  std::optional<LossScalerOptions> loss_scaling;
  DeviceOptions device;  ///< per-device memory cap, CPU-backend PCIe throttle, CUDA storage dtype
  /// What set device.capacity_bytes, as an error names it ("spec.json: key 'device_memory_gib'"):
  /// a stage that the cap refuses fails naming it, with the cap, to raise. Empty: not named.
  std::string capacity_origin;
  /// Explicit plan, never changed. Default (empty): automatic, the partition of the analytic
  /// costs (FLOPs and bytes per layer) until the profile settles, then possibly the
  /// partition of the measured costs (profiling.replan).
  std::optional<IterationPlan> plan;
  int pass_slots = 2;  ///< passes in flight (each holds its activations in host memory)
  /// Decoders run their MLP over chunks of at most this many tokens (<= 0: 8192), so the
  /// [tokens, ffn] intermediates exist for one chunk at a time (long sequences).
  int64_t mlp_chunk_tokens = 0;
  /// Decoders keep the attention output and its log-sum-exp of the forward in host memory
  /// (per layer and micro-batch: tokens x heads x (head_dim x 2 + 4) bytes in bf16), forward
  /// stages download them and backward stages upload them instead of recomputing the
  /// attention. Empty: on when everything fits 90% of the available host memory.
  std::optional<bool> save_attention;
  bool trace = false;  ///< record stream and task intervals (write_trace)
  /// With trace: also record every protocol message between the actors (scheduler, workers,
  /// optimizer shards: RunStage, ActReady, AcquireWeights / WeightsGranted / ReleaseWeights,
  /// AcquireGradSlot / GradGrant / GradWritten, StageDone, CloseStep, GradSumSq, StepScale,
  /// GroupUpdated) as flow arrows from a slice on the sender's "messages" track to one on the
  /// receiver's, with their group / step / pass / stage / micro-batch as args.
  bool trace_messages = false;
  ProfilingOptions profiling;
  /// Cross-stream transfer priority: parameter and gradient chunks yield to activation
  /// copies of the same direction, and a prefetched stage's weight chunks are packed into
  /// the windows between activation uploads. false: first come, first served everywhere
  /// (also turns off the CPU backend link's own priorities, device.pcie_priorities).
  bool transfer_priorities = true;
  /// In the last micro-batch of a backward or tail stage, each layer's gradients go to the
  /// host as soon as its backward call ran, while the layers below it compute; false: all of
  /// them once the stage finished. Under a memory cap the next stage's start waits for the
  /// finished stage's accumulators to drain, so this shortens that wait (same gradients,
  /// same results either way).
  bool early_gradients = true;
  /// Parameter uploads and gradient downloads above this many bytes are cut into chunks of
  /// it (0: whole copies); with priorities on, an activation copy waits at most one chunk.
  /// Tiny values cost one message and one stream callback per chunk (the spec key insists on
  /// >= 64 KiB).
  size_t transfer_chunk_bytes = size_t(32) << 20;
  /// With priorities on: parameter/gradient chunks in flight at once per direction (1: an
  /// activation copy waits behind at most one chunk; 2 hides the round trip between chunks).
  int transfer_bulk_inflight = 1;
  /// Watchdog: while work is in flight and nothing completed (no copy, micro-batch, optimizer
  /// job or stage task) for this many seconds, log one line naming what the run waits for
  /// (status(): the steps and passes in flight, every worker's stage task, micro-batches and
  /// outstanding copies, every optimizer shard's busy and waiting groups), and again after
  /// every further such period. 0: off.
  double watchdog_s = 60;
  /// Receives the watchdog's line (default: the runtime's log, spdlog::warn).
  std::function<void(const std::string&)> watchdog_log;
  /// Host bytes the backend may page-lock (CUDA: cudaHostRegister) so that copies from and to
  /// them run asynchronously at full PCIe bandwidth. Buffers are pinned whole, in the order
  /// copies touch them most: every pass's buffers (token ids, activations, boundary
  /// gradients, saved attention), the gradient slots, the trainable weights, then the frozen
  /// weights, while they fit what is left of the budget. The rest stays pageable: results are
  /// the same, but the driver stages those copies through its own buffers (slower, and the
  /// issuing thread waits for them). Empty: three quarters of the host's memory
  /// (MemTotal, or a lower cgroup memory.max). 0: pin nothing. The CPU backend pins nothing
  /// but keeps the same accounting (Session::host_pinning).
  std::optional<size_t> pin_budget_bytes;
  /// Data-parallel replicas (roundpipe/replicas.hpp; size > 1): this Session is one of them, and
  /// every parameter group's gradient of a step is summed over all of them as soon as it is
  /// complete here, before clipping and the update, so every replica updates every group
  /// alike. Each replica must then close every step with step(lr, target tokens of the whole
  /// step over all replicas). Null: a single process.
  std::shared_ptr<Replicas> replicas;
  /// Stream the frozen groups from a cache file on a local disk (FrozenTierOptions). Empty, or a
  /// model without frozen groups: they stay in host memory. Errors: std::invalid_argument for
  /// an empty path or a budget below two buffers, std::runtime_error ("frozen_tier.path: ...")
  /// when the cache cannot be written (an unwritable folder, not enough disk space, a file
  /// there that is not a tier cache). A read that fails during training fails the run
  /// (RuntimeFailure naming the file, the entry and its offset). Its spill_layers (activation
  /// spill) works with or without frozen groups.
  std::optional<FrozenTierOptions> frozen_tier;
  /// Frozen groups given neither as fp32 values nor in storage form to the constructor (both
  /// empty) come from here (FrozenSource). Without it such a group is refused.
  std::optional<FrozenSource> frozen_source;
};

/// What one closed step did (Session::wait).
struct StepResult {
  int64_t step = 0;
  double loss_sum = 0,
         tokens = 0;   ///< summed token losses (nats) and target tokens: loss = loss_sum / tokens
  double seconds = 0;  ///< from the step's first pass submission to its last group update
  std::string error;   ///< non-empty if the runtime failed (wait() throws RuntimeFailure then)
  /// Global L2 norm of the true gradients, before clipping (every step: guarded steps sum the
  /// squares before the update, the others in each group's update job, reading only the
  /// gradient); 0 for a step without target tokens.
  double grad_norm = 0;
  bool skipped = false;    ///< inf/NaN gradients, or no target tokens (tokens == 0): the step changed nothing
  float loss_scale = 1.f;  ///< loss scale the step's backward used
  /// Mixture-of-experts models: the load-balancing loss (ModelConfig::aux_loss_coef; without the
  /// coefficient, averaged over the step's micro-batches weighted by their target tokens; its
  /// coefficient times it is part of loss_sum / tokens when the coefficient is on) and the
  /// tokens routed to each expert over the step, summed over the sparse layers (empty for
  /// dense models).
  double moe_aux_loss = 0;
  std::vector<double> expert_tokens;
  /// Data-parallel replicas: seconds the pipeline waited for this step's gradient sums, the
  /// part not hidden behind compute (from the moment a request needed a group's summed
  /// version to the sum's end, merged over the groups; actors/reduce_wait.hpp). 0 in one
  /// process, and for a sum nothing waited for.
  double reduce_wait_s = 0;
};

/// The loss of one evaluation pass (Session::evaluate).
struct EvalResult {
  int64_t id = 0;
  double loss_sum = 0,
         tokens = 0;  ///< summed token losses (nats) and target tokens: loss = loss_sum / tokens
  std::string error;  ///< non-empty if the runtime failed (wait_eval() throws RuntimeFailure then)
};

/// Device-memory pressure seen so far, over all workers (Session::memory_events). Diagnostic:
/// neither count changes a result, only when stages run.
struct MemoryEvents {
  /// Stage starts the device memory cap refused while earlier stages' gradients were still
  /// draining: each waited for a drain to finish and then retried (a retry refused again counts
  /// again; a start refused with nothing draining fails the run instead).
  int64_t start_waits = 0;
  /// Prefetch attempts the cap refused (the next stage's weights do not fit beside the current
  /// stage); the attempt is repeated as the current stage progresses, else the next stage
  /// starts when the current one ends.
  int64_t prefetch_refusals = 0;
};

/// Host buffers the session pinned within its pin budget (Session::host_pinning; bytes).
struct HostPinning {
  size_t budget = 0;                 ///< SessionOptions::pin_budget_bytes, or its default
  size_t pinned_bytes = 0;           ///< pinned (page-locked on the CUDA backend)
  size_t pageable_bytes = 0;         ///< left pageable: they did not fit what was left of the budget
  size_t pageable_frozen_bytes = 0;  ///< the frozen weights among pageable_bytes
};

/// What load_optimizer_state found in the file.
struct OptimizerStateInfo {
  int64_t steps = 0;        ///< steps closed when it was saved: the session continues at this step
  bool has_master = false;  ///< the file held the fp32 master weights (else the constructor's are used)
  bool async = true;        ///< saved by an async (staleness-1) session
};

struct SessionInternals;  // the runtime's own knobs, for its tests (not part of this API)

class Session {
 public:
  /// `group_weights[g]` holds ParamGroup g's fp32 values (layout.groups[g].numel each).
  /// A frozen group (ParamGroup::frozen, e.g. LoRA's base weights) is quantized here into its
  /// storage form (TensorSpec::format per tensor) and its fp32 values are freed: it is never
  /// updated, has no fp32 master, no AdamW moments and no gradient, and the devices dequantize
  /// it after each upload (its host copy and every upload are ParamGroup::storage_bytes).
  /// Throws std::invalid_argument for inconsistent options or weights, DeviceError when
  /// the backend cannot be created.
  Session(const ModelLayout& layout, std::vector<std::vector<float>> group_weights, SessionOptions opt);
  /// The same, with frozen groups' weights already in storage form (big models: no fp32 copy
  /// of the base weights ever exists). `frozen_storage` is empty or has one entry per group;
  /// a non-empty entry g belongs to a frozen group and holds exactly storage_bytes bytes (each
  /// tensor in its TensorSpec::format at its byte_offset, the layout of
  /// kernels/weight_format.hpp's quantize_weights), and group_weights[g] is then empty. The
  /// other groups come as fp32 in group_weights, as above. Both vectors are consumed (moved
  /// in and freed group by group). Throws std::invalid_argument naming the group for a wrong
  /// size, an entry for a trainable group, or a group given both ways.
  Session(const ModelLayout& layout, std::vector<std::vector<float>> group_weights,
          std::vector<std::vector<uint8_t>> frozen_storage, SessionOptions opt);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Enqueues one pass of M micro-batches for the current step. `ids` and `targets` are
  /// [M * micro.n_seq * micro.seq_len] i32, micro-batch after micro-batch; targets < 0
  /// carry no loss. Returns at once (a pass waiting for a free pass slot waits in the
  /// runtime's queue, never here). Throws std::invalid_argument on size or a token id
  /// outside the vocabulary.
  void forward_backward(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets);
  /// The same over packed sequences (several examples per sequence): `positions` (same
  /// shape, i32) is each token's position within its example, restarting at 0 where an
  /// example begins (0 <= positions[s*L+t] <= t in each sequence s). RoPE uses it and causal
  /// attention stays within each example, so a packed sequence computes what its examples
  /// compute one by one. Throws std::invalid_argument for a wrong size or position.
  void forward_backward(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                        const std::vector<int32_t>& positions);
  /// Enqueues a forward-only evaluation pass of M micro-batches (shapes as
  /// forward_backward; with `positions` packed): the forward stages and the tail's loss, no
  /// gradient, no optimizer step, no change to any weight, version or step counter. It reads
  /// the weights the current step's training passes read (version step-1-s: in sync mode the
  /// weights after every closed step, with the staleness-1 optimizer those one update
  /// behind), so evaluations of the same step give the same loss bit for bit whatever runs
  /// around them. Returns at once with the id wait_eval() takes. Throws like forward_backward.
  int64_t evaluate(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets);
  int64_t evaluate(const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                   const std::vector<int32_t>& positions);
  /// Blocks until evaluation pass `id` is done; returns its loss sum and target tokens.
  /// Throws RuntimeFailure if the runtime failed, std::invalid_argument for an unknown id.
  EvalResult wait_eval(int64_t id);
  /// Like wait_eval(id), but gives up after `seconds` (>= 0): std::nullopt when the pass is
  /// not done by then (it goes on; wait again later). Throws like wait_eval().
  std::optional<EvalResult> wait_eval_for(int64_t id, double seconds);
  /// Closes the current step: its gradients (summed over all its passes and divided by
  /// their number of target tokens) update the weights with learning rate `lr`.
  /// A step whose passes hold no target token is skipped (StepResult::skipped, tokens 0): with
  /// no gradient, an update would only move the weights by momentum and decay.
  /// Returns the closed step's index and starts the next step. std::logic_error without a
  /// forward_backward() in the step.
  int64_t step(double lr);
  /// The same, with the gradient divided by `target_tokens` instead of the step's own target
  /// tokens: data-parallel replicas pass the target tokens of the step's passes on every
  /// replica, so the summed gradient is the mean over the global batch (0: the step is
  /// skipped, as above). std::invalid_argument for a negative count.
  int64_t step(double lr, int64_t target_tokens);
  /// Blocks until step `t` is applied to the fp32 master weights; returns its loss sum,
  /// target-token count and wall time. Throws RuntimeFailure if the runtime failed (a device
  /// op, a copy or an optimizer job that failed, an actor of the runtime that died: the
  /// message names it; never a hang on a dead actor), std::invalid_argument for a step not
  /// closed yet or one of the run that saved a loaded optimizer state.
  StepResult wait(int64_t t);
  /// Like wait(t), but gives up after `seconds` (>= 0): std::nullopt when step t is not
  /// applied by then (it goes on; wait again later). Throws like wait().
  std::optional<StepResult> wait_for(int64_t t, double seconds);
  /// Waits for every closed step (throws RuntimeFailure like wait()).
  void synchronize();
  /// One line: the steps and passes in flight and what every worker and optimizer shard is
  /// doing and waiting for (what the watchdog logs). Throws RuntimeFailure when the runtime
  /// cannot be asked.
  std::string status() const;
  /// fp32 master weights per parameter group (consistent after synchronize()); empty for a
  /// frozen group (see group_weights_f32).
  const std::vector<std::vector<float>>& master_weights() const;
  /// Group g's weights as fp32 (layout.groups[g].numel values, in the group's tensor order): a
  /// copy of the fp32 master of a trainable group (consistent after synchronize()), the
  /// dequantized storage form of a frozen one (what the devices compute with, rounded to
  /// their compute dtype). For exporting weights. Throws std::out_of_range for a bad g.
  std::vector<float> group_weights_f32(int g) const;
  /// The plan the next pass will be dealt with (it changes once when re-planning switches).
  /// Throws RuntimeFailure when the runtime cannot be asked.
  IterationPlan plan() const;
  /// The plan chosen at construction.
  const IterationPlan& initial_plan() const;
  /// The re-planning lines logged so far (at most one decision per session).
  std::vector<std::string> replan_log() const;
  const ModelLayout& layout() const;
  /// Writes the measured per-layer profile (JSON, atomically) to `path`; `roundpipe plan
  /// --profile` reads it. Throws std::runtime_error("<path>: ...") on I/O errors,
  /// RuntimeFailure when the runtime cannot be asked.
  void save_profile(const std::string& path) const;

  /// Writes everything a bit-identical resume needs besides the data order to the
  /// file `path` (binary, little-endian, versioned, every section XXH3-checksummed):
  ///  - the number of steps closed (N), the optimizer mode (async / sync), the model's
  ///    parameter groups (name, numel) to check a load against;
  ///  - per group the AdamW moments m, v (and vmax with amsgrad), its step counter (number
  ///    of updates applied; skipped steps do not count) and hyper-parameters;
  ///  - the fp32 master weights (version N-1) when `include_master` (leave it out only when
  ///    they are saved elsewhere bit-exactly, e.g. an f32 model.safetensors);
  ///  - async mode: the low-precision copy (compute dtype), which holds version N-2: step N
  ///    computes with it (staleness 1);
  ///  - with loss scaling: the scaler (scale, growth tracker, counters) and the loss scales
  ///    steps N..N+staleness will use (already decided).
  /// Call between steps: after synchronize(), before the next forward_backward()
  /// (std::logic_error otherwise). Atomic: written to "<path>.tmp-<pid>", fsynced and
  /// renamed, so a failure never leaves a partial file and keeps an older one. Throws
  /// std::runtime_error ("<path>: <what>") on I/O errors.
  void save_optimizer_state(const std::string& path, bool include_master = true);
  /// Loads a file written by save_optimizer_state into a new session (before the first
  /// forward_backward(); std::logic_error otherwise) built with the same model layout and
  /// optimizer settings; the session then continues at step N (the next step() returns N,
  /// wait() takes steps >= N). Without master weights in the file, the weights given to the
  /// constructor are the fp32 master. The hyper-parameters must equal opt.adam except lr
  /// (the schedule passes lr per step), loss scaling must be on in both or off in both;
  /// async/sync may differ (a mode switch is not bit-identical: the low-precision copy is
  /// then recast from the master). Errors throw std::runtime_error with one line naming
  /// `path` and what was expected: missing file, bad magic, a format version this build
  /// does not read (files of older releases), truncation, checksum mismatch, trailing
  /// bytes, another model's groups, other hyper-parameters, loss scaling on/off. Mismatches
  /// are found before anything is changed; a corrupted payload may be found after some
  /// groups were loaded: the session then refuses further calls (std::logic_error) and must
  /// be destroyed.
  OptimizerStateInfo load_optimizer_state(const std::string& path);
  /// Number of steps closed so far (after load_optimizer_state: including those of the
  /// run that saved the state).
  int64_t steps_closed() const;
  /// Peak device bytes over all workers.
  size_t peak_device_bytes() const;
  /// What the pin budget let pin (HostPinning); grows when a re-plan adds pass buffers.
  HostPinning host_pinning() const;
  /// Refused stage starts and prefetches so far (MemoryEvents); readable at any time.
  MemoryEvents memory_events() const;
  std::string device_name() const;
  /// What the disk tier did at construction (enabled false without SessionOptions::frozen_tier).
  const FrozenTierReport& frozen_tier() const;
  /// The frozen tier's reads and the activation spill's traffic so far (all zero without them).
  /// Thread-safe; cheap.
  FrozenTierReads frozen_tier_reads() const;
  /// Writes the recorded trace (opt.trace) as Chrome trace JSON. Throws std::runtime_error.
  void write_trace(const std::string& path) const;

 protected:
  struct Impl;
  /// For the runtime's own test harness (a derived class): knobs that are not part of this
  /// API. Embedding programs use the constructor above.
  Session(const ModelLayout& layout, std::vector<std::vector<float>> group_weights, SessionOptions opt,
          const SessionInternals& internals);
  Session(const ModelLayout& layout, std::vector<std::vector<float>> group_weights,
          std::vector<std::vector<uint8_t>> frozen_storage, SessionOptions opt,
          const SessionInternals& internals);
  Impl& impl() { return *impl_; }
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace rp
