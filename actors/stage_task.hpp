// A stage task as a worker holds it (actors/worker.cpp): the stage of one pass, its device
// buffers and its per-micro-batch progress (scheduler/stage_progress.hpp: the rules), plus the pieces of the
// worker that only read the task and the worker's context: allocating its buffers and building its layer
// calls.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "actors/activation_spill.hpp"
#include "actors/frozen_tier.hpp"
#include "actors/layer_timer.hpp"
#include "actors/messages.hpp"
#include "actors/worker.hpp"
#include "kernels/device.hpp"
#include "kernels/weight_format.hpp"
#include "scheduler/stage_progress.hpp"
#include "scheduler/upload_windows.hpp"

namespace rp {

/// Device buffers of one double-buffer slot (micro-batches m with m % 2 == slot).
struct Slot {
  DeviceBuffer ids, targets, in, out, loss;
  DeviceBuffer pos;              ///< packed passes, stages with decoders: RoPE positions i32[T]
  std::vector<DeviceBuffer> xs;  ///< per layer of the stage: its input (or forward output)
  /// per layer of the stage, decoders with a saved attention only: its attention output and
  /// log-sum-exp (written by forward, read by backward)
  std::vector<DeviceBuffer> attn_o, attn_lse;
  /// stages with sparse (mixture-of-experts) decoders: the micro-batch's router statistics
  /// [2E] fp32 (PassBuffers::moe_stats) as uploaded (an input: the slot's next micro-batch may
  /// overwrite it once this one is computed), and the copy the layers add to, which forward and
  /// tail stages download (an output: kept until it is down)
  DeviceBuffer moe_stats_in, moe_stats;
};

struct Task {
  uint64_t id = 0;  ///< worker-local sequence number (callbacks find tasks by it)
  RunStage rs;
  std::vector<int> layers;       ///< execution order
  std::vector<int> groups;       ///< parameter groups whose weights it uploads (ModelLayout::groups_uploaded)
  std::vector<int> grad_groups;  ///< groups whose gradient this stage produces
  std::map<int, DeviceBuffer> dparam, dgrad;
  /// Frozen groups: the uploaded storage form (ParamGroup::storage_bytes) after its direct
  /// prefix (ParamGroup::direct_bytes, uploaded straight into dparam), dequantized into dparam
  /// on the compute stream once it landed, then freed (dequant_order: the groups whose
  /// dequantization is issued and not yet reported done, in stream order). No entry when the
  /// whole storage is the compute copy.
  std::map<int, DeviceBuffer> dstage;
  /// Per group: chunk copies still to land beyond one per chunk (a chunk of a frozen group that
  /// spans its direct prefix and its staged part is two copies; Worker::send_pieces).
  std::map<int, int> extra_copies;
  std::deque<int> dequant_order;
  /// Frozen groups streamed from the disk tier: the read buffer each uploads from, held until
  /// the group's last chunk landed (a task that goes away gives them back with it).
  std::map<int, FrozenLease> frozen_leases;
  /// Saved inputs it uploads that spill to disk (WorkerContext::spill): asked for when the task
  /// is prepared, held per micro-batch until its inputs landed (a task that goes away gives them back).
  SpillReads spill_reads;
  std::shared_ptr<UploadWindows> uploads;  ///< the weights' chunks and windows (upload_windows.hpp)
  DeviceBuffer scratch, tmp[2];
  /// FP8 decoders (LayerOptions::fp8), per layer of the stage: its weights' FP8 codes
  /// (LayerArgs::fp8_weights), quantized by the layer's calls of micro-batch 0 and read by
  /// the others; empty buffers for other layers.
  std::map<int, DeviceBuffer> dfp8;
  Slot slot[2];
  /// Which micro-batches are uploaded, computed, downloaded, and which slots the task holds
  /// (allocated; early start may hand it one before it is current).
  StageProgress progress;
  bool work_ready = false;  ///< allocate_work done (a start refused for memory waits without it)
  int64_t M = 0;
  int params_pending = 0;
  /// gradient groups not yet on the host (new_task sets it to grad_groups.size())
  int grads_pending = 0;
  /// gradient groups whose drain was asked for (GradsFinal inside the last micro-batch, or retirement)
  std::set<int> grads_draining;
  double t_start = 0;
  std::chrono::steady_clock::time_point wall_start;
};

/// The buffers a task needs only while it computes: the gradient accumulators of
/// t.grad_groups (zeroed on the compute stream), scratch for its largest layer (forward-only
/// scratch in a forward stage), the FP8 weight caches of FP8 decoders, its activation slots (one per
/// micro-batch up to two) unless already allocated (allocate_slot), and stage_temporaries() activation-sized
/// temporaries. A prefetched task holds just its weights (and the slots early start handed it) until it
/// becomes current. Throws DeviceOutOfMemory when the device's cap refuses an allocation (what was allocated
/// stays in t).
void allocate_work(const WorkerContext& ctx, Task& t);

/// Allocates double-buffer slot j of `t` (the activations of micro-batches m % 2 == j):
/// token ids (first stage), targets and loss (tail), the uploaded input or dy, dx (backward
/// and tail stages after the first), and one activation per layer (saved inputs or forward
/// outputs); each activation is t.rs.buffers->act_bytes. Throws DeviceOutOfMemory.
void allocate_slot(const WorkerContext& ctx, Task& t, int j);

/// Slot j of a task that computed its last micro-batch there and still downloads its
/// outputs: gives back what no copy reads any more, the inputs (ids, positions, targets, the
/// uploaded input or dy, the uploaded router statistics; a backward or tail stage's saved
/// inputs and attention; a backward stage's router statistics), keeping the outputs in
/// flight (a forward stage's layer outputs, saved attention and router statistics; dx, the
/// loss and the tail's router statistics). StageEstimate::retained_bytes counts what is kept.
void release_retired_inputs(Task& t, int j);

/// The arguments of `layer` for micro-batch m of t (its slot m % 2): ops, micro-batch shape, device weights
/// (null for a group the stage does not upload, ModelLayout::groups_uploaded), gradient
/// accumulators (backward and tail stages; null for frozen groups), scratch, token ids and the
/// LoRA dropout id (RunStage::dropout_pass). Activations are left
/// for the caller.
LayerArgs layer_args(const WorkerContext& ctx, const Task& t, int layer, int64_t m);

/// Element offsets in frozen group g of the fp8-stored linears that the FP8 decoder of t whose
/// base group is g runs from their codes (Layer::fp8_stored_tensors; LayerArgs::
/// fp8_stored_base): the uploader copies those as they are where the device has the per-row-
/// scale FP8 GEMM. Empty when no layer of t has g as its base group.
std::vector<int64_t> fp8_stored_offsets(const WorkerContext& ctx, const Task& t, int g);

/// On the compute stream: dequantizes `parts` (Ops::dequantize_many) and copies the `stored`
/// parts (fp8 storage of the fp8_stored_offsets tensors) as they are where
/// ops.gemm_fp8_rows_supported(), else dequantizes them too.
void dequantize_frozen(Ops& ops, std::vector<DequantPart>& parts, const std::vector<DequantPart>& stored);

/// A training pass's tail stage is done: adds to `sd` the load-balancing loss of each
/// micro-batch from its router statistics (PassBuffers::moe_stats, then those of the whole
/// forward pass): aux_weighted, loss_sum (coefficient x aux x target tokens) and the expert
/// assignments per expert. Nothing for dense models.
void add_router_statistics(const ModelLayout& m, const PassBuffers& pb, StageDone& sd);

/// The layer calls of micro-batch m of t, in stream order: a forward stage's layers
/// forward (xs[i] is layer i's output); a tail stage forward through its decoders, then the
/// tail's loss + backward and the decoders backward; a backward stage each layer's
/// recompute + backward from its saved input, dy flowing through the temporaries. The tail
/// stage of an evaluation pass (RunStage::eval) runs its decoders forward and the tail's
/// loss only.
void build_layer_calls(const WorkerContext& ctx, Task& t, int64_t m, LayerCalls& fwd, LayerCalls& bwd);

/// For each call of `bwd` (build_layer_calls of a task's micro-batch): the trainable groups of
/// `grad_groups` that no later call of `bwd` touches, in call order; the last call's are left
/// out (the launch's completion covers them). A group two calls share (a tied embedding and LM
/// head in one stage) is final after the later one.
std::vector<std::vector<int>> grads_final_after(const ModelLayout& m, const LayerCalls& bwd,
                                                const std::vector<int>& grad_groups);

/// Runs micro-batch m of t on the compute stream (build_layer_calls; with ctx.profile timed per
/// layer and reported to the scheduler; traced as one interval) and sends ComputeDone to `me`
/// from the stream's callback thread, whatever happens there (an error: its one line). In the
/// last micro-batch of a training stage with ctx.early_gradients, a then() callback after each
/// backward call whose groups are final (grads_final_after) sends GradsFinal, so those
/// gradients drain while the calls below run.
void launch_compute(const WorkerContext& ctx, Task& t, int64_t m, WorkerActor me);

}  // namespace rp
