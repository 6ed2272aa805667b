// What a stage task moves between host and device, as the worker (actors/worker_copies.cpp) issues it:
// a new task's weight buffers and upload windows, the copies of a chunk of its weights (a frozen
// group's storage split between the weights and a staging buffer), the input copies of a
// micro-batch before it computes and the output copies after, and the dequantization of a frozen
// group's staged storage. These only read the task and the worker's context and say which bytes
// go where; the worker's protocol (which message issues them, what a landing copy unlocks) stays
// in worker_copies.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "actors/spill_port.hpp"
#include "actors/stage_task.hpp"

namespace rp {

/// ComputeDone::micro_batch of a frozen group's dequantization (not a micro-batch).
constexpr int64_t kDequantized = -1;

/// One host<->device copy: `bytes` from `src` to `dst` (the direction is the caller's).
struct HostCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

/// Leading bytes of frozen group g's storage that are the compute copy itself and go straight
/// into the weights (ParamGroup::direct_bytes; 0 for trainable groups).
int64_t frozen_direct_bytes(const WorkerContext& ctx, int g);

/// Bytes of frozen group g's storage after that prefix: they arrive in a staging buffer and are
/// dequantized into the weights (0: nothing staged; trainable groups).
int64_t frozen_staged_bytes(const WorkerContext& ctx, int g);

/// A task for `rs` with id `id`: its layers, the groups it uploads and those it produces a
/// gradient of, a device buffer per uploaded group (compute dtype) and a staging buffer per frozen
/// group with staged bytes, and the upload windows of the groups' chunks (`windows` prefetch
/// windows; one when a group streams from the disk tier, whose read buffer must not wait on
/// another stage). Nothing is requested or copied yet. Throws DeviceOutOfMemory.
std::unique_ptr<Task> new_task(const WorkerContext& ctx, RunStage rs, uint64_t id, int windows);

/// The copies of `piece` of t's weights (from the disk tier's read buffer when the group is
/// leased, else from the host store): up to the group's direct prefix into t.dparam, after it
/// into t.dstage; a chunk spanning both is two copies and counts one in t.extra_copies.
std::vector<HostCopy> weight_copies(const WorkerContext& ctx, Task& t, const UploadWindows::Piece& piece);

/// The input copies of micro-batch m of t into its slot (m % 2): token ids (first stage),
/// positions, router statistics, the stage's input (a forward stage past the first layer, the
/// tail's saved input), targets (tail), or dy and each layer's saved input and attention
/// (backward). Spilled inputs come from their read buffers (SpillPort::input).
std::vector<HostCopy> input_copies(const Task& t, int64_t m, const SpillPort& spill);

/// The output copies of computed micro-batch m of t: a forward stage's layer outputs (those that
/// spill are handed to SpillPort::output and counted in `spilled`, not returned) and saved
/// attention, a backward or tail stage's dx, the tail's loss, the router statistics.
std::vector<HostCopy> output_copies(Task& t, int64_t m, SpillPort& spill, int& spilled);

/// Frozen group g's storage form is on the device: queues its dequantization into the compute-dtype
/// weights on the compute stream (fp8-stored linears an FP8 decoder runs from their codes are copied
/// as they are) and appends g to t.dequant_order; the stream's report reaches `me` as
/// ComputeDone{t.id, kDequantized, error}.
void launch_dequantize(const WorkerContext& ctx, Task& t, int g, WorkerActor me);

}  // namespace rp
