// The device memory peak of a plan across stage switches. Pure function, no threads.
//
// A stage's working set (StageEstimate::work_bytes) is what a worker allocates for that stage
// alone. At a stage switch the worker (actors/worker.cpp) holds more, on the GPU that runs
// both stages:
//   - the retired task: its gradient accumulators until they are on the host and, in its last
//     slot, the outputs still downloading (StageEstimate::retained_bytes); its inputs,
//     weights and scratch are given back when it retires;
//   - the current task: its whole working set, allocated as it starts;
//   - the prefetched next task: its weights (the worker prefetches whenever the cap leaves room,
//     whatever PartitionOptions::weight_buffers the plan was chosen with); a next task that uploads no
//     weights (the embedding's backward) has its working set allocated ahead instead, and the
//     task after it prefetches its weights;
//   - with two or more micro-batches, the early start: while the current task computes its
//     last micro-batch, its other slot already belongs to the next task.
// Stage s of iteration t runs on GPU (pointer + t*S + s) mod G, so the task before stage s on
// its GPU is stage (s - G) mod S and the one after it stage (s + G) mod S (of this iteration
// or a neighbouring one: asynchronous training keeps iterations back to back).
//
// The worker never allocates past its memory cap: a task that does not fit waits for the
// retired one to drain, a prefetch that does not fit waits for the next switch. So with a cap,
// a switch whose sum is over it peaks at the largest part of it that fits.
//
// At 131,072 tokens of LLaMA-3.1-8B with LoRA (one decoder per backward stage) the retired
// stage's slot (dy, saved input, attention output, dx: 4 GiB before the worker gave its inputs
// back at retirement) and the next iteration's first forward stage's weights (the embedding
// with two decoders, 1.8 GiB, against the 0.4 GiB of one decoder) were the 5.8 GiB between the
// largest working set (15.0 GiB) and the measured peak (20.9 GiB).
#pragma once
#include <cstdint>
#include <vector>

#include "scheduler/partition.hpp"

namespace rp {

struct PeakEstimate {
  int64_t bytes = 0;      ///< predicted peak of one GPU's pool (at most the cap when there is one)
  int64_t unbounded = 0;  ///< the same sum when no cap holds the worker back
  int stage = -1;         ///< index (plan order) of the stage running at the peak
  int64_t max_work = 0;   ///< largest working set of a single stage
};

/// Predicted peak over the stage switches of `stages` (one iteration in plan order, as
/// check_plan or partition return them) under `opt` (gpus, micro_batches, memory_cap); file
/// comment. Throws std::invalid_argument for an empty plan or gpus < 1.
PeakEstimate predict_peak(const std::vector<StageEstimate>& stages, const PartitionOptions& opt);

/// For each stage of `stages` (plan order, one iteration): 1 when the memory cap leaves no room
/// to prefetch its weights, so the worker uploads them only once the task before it on its GPU
/// (stage s - G) has ended, and its compute waits for that upload. Refused: the previous task's
/// working set plus these weights exceed opt.memory_cap (the worker retries as the retired task
/// drains, so only what the previous task itself holds counts). The stage after a weightless one
/// (the embedding's own backward stage) is refused only when neither that stage's predecessor nor
/// the weightless stage itself leaves room (the worker prefetches behind a weightless stage).
/// A weightless stage is never refused (nothing to upload); without a cap nothing is. Throws
/// std::invalid_argument as predict_peak.
std::vector<char> prefetch_refused(const std::vector<StageEstimate>& stages, const PartitionOptions& opt);

}  // namespace rp
