// Bubble simulator: replays the round-robin schedule of stages (stage s on GPU s mod G)
// on G simulated GPUs, each with one compute stream and four FIFO copy
// streams (activation upload, activation download, parameter upload, gradient download),
// over several iterations, and reports iteration time, bubble ratio and per-GPU idle time.
// A discrete-event replay: each GPU runs its stage tasks by StageProgress
// (scheduler/stage_progress.hpp), the per-micro-batch rules the worker runs, so the two
// cannot drift apart. The rules (they mirror actors/: dispatch, transfer, protocol, staleness):
//  - stage s of iteration t is task q = t*S + s, on GPU (pointer + q) mod G: the deal
//    pointer carries over, so iterations follow each other with no flush;
//  - a GPU runs its tasks in q order, each over micro-batches 0..M-1 in order, one copy per
//    micro-batch and direction;
//  - micro-batch m of stage s > 0 is uploaded once stage s-1 downloaded its output;
//  - act_slots (2) micro-batch slots (StageProgress): the upload of m waits for the compute
//    of m - slots, so inputs arrive one micro-batch early; the compute of m waits for its
//    upload, the task's weights and the download of m - slots; computes run only in the GPU's
//    current task;
//  - a task retires with its last compute: its gradients start down (tail and backward
//    stages) and the next task becomes current while its last outputs still download; early
//    start: a prefetched next task takes each slot the current one finished (its last
//    download there done, all its uploads issued) and uploads into it at once;
//  - parameters of a task are uploaded on the parameter stream into one of weight_buffers
//    buffers, freed when the task weight_buffers back retires (2: prefetched while the
//    previous task computes); with 1 the whole task waits until the previous one finished;
//    a stage whose weights the memory cap does not let the worker prefetch
//    (StageCost::params_after_previous) uploads them once the previous task retired;
//  - parameter integrity / staleness (rule 1 of docs/protocol.md): the upload of layer l for
//    iteration t waits for the optimizer's update of l from iteration t - 1 - staleness
//    (gradient download + optimizer_seconds[l]);
//  - a task finishes once its outputs and gradients are down; at most passes_in_flight
//    iterations are admitted at once (host activation slots).
//  - a disk tier (disk_read_bandwidth > 0): the host's one disk (FIFO) reads each task's
//    weights (disk_read_bytes) in task order, at most disk_ring weight reads ahead of the oldest
//    whose parameters are not on their GPU yet (the ring of pinned buffers); the parameter
//    upload waits for that read. A forward stage writes each micro-batch's spill after its
//    download; a backward task that is its GPU's current or next reads micro-batch m's spill
//    back once every forward stage of its iteration wrote it and m is at most 2 x act_slots
//    ahead of its compute; m's upload waits for that read.
// Not modelled: the memory cap beyond refused prefetches, chunked and priority-arbitrated copies on one
// shared link (the four streams are independent), the worker's prefetch behind a weightless stage. Bubble of
// one isolated uniform iteration: N(N-1) / (M*S + N(N-1)) stage-units (fill/drain).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "scheduler/partition.hpp"
#include "scheduler/plan.hpp"

namespace rp {

/// Cost of one stage of a plan. Seconds per micro-batch; bytes on the copy streams.
struct StageCost {
  double compute = 0;          ///< compute stream seconds per micro-batch
  int64_t act_up_bytes = 0;    ///< activation upload per micro-batch
  int64_t act_down_bytes = 0;  ///< activation download per micro-batch
  int64_t param_bytes = 0;     ///< parameter upload, once per task
  int64_t grad_bytes = 0;      ///< gradient download, once per task (0 for forward stages)
  /// Disk tier (scheduler/disk_tier.hpp): bytes read from the host's disk before the task's
  /// parameters upload (its streamed frozen weights), once per task; per micro-batch, spilled
  /// activations written after its download (forward stages) and read back before its upload
  /// (backward stages).
  int64_t disk_read_bytes = 0, spill_write_bytes = 0, spill_read_bytes = 0;
  /// The memory cap leaves no room to prefetch the stage's weights (prefetch_refused in
  /// scheduler/stage_peak.hpp): they upload only once the previous task on the GPU retired.
  bool params_after_previous = false;
};

/// Bandwidths of the four copy streams, bytes/s; 0 means instantaneous.
struct StreamBandwidths {
  double act_up = 0, act_down = 0, param_up = 0, grad_down = 0;
  /// All four set to one PCIe bandwidth.
  static StreamBandwidths uniform(double bytes_per_second) {
    return {bytes_per_second, bytes_per_second, bytes_per_second, bytes_per_second};
  }
};

struct SimOptions {
  int gpus = 1;                           ///< G
  int64_t micro_batches = 1;              ///< M
  int iterations = 0;                     ///< iterations simulated (0: default_iterations)
  StreamBandwidths bandwidth;             ///< copy streams
  int staleness = 1;                      ///< 1: asynchronous optimizer, 0: synchronous
  std::vector<double> optimizer_seconds;  ///< per compute layer, or empty (0)
  int passes_in_flight = 2;               ///< iterations admitted at once (0: unlimited)
  int weight_buffers = 2;                 ///< parameter buffers per GPU (1: no prefetch)
  int act_slots = 2;                      ///< micro-batch slots per GPU
  int64_t pointer = 0;                    ///< deal pointer before the first iteration
  bool record_timeline = false;           ///< keep every interval (for write_sim_trace)
  /// The host's disk (one for all GPUs): read and write bytes/s (0: no disk traffic is timed).
  /// Reads run in task order, one at a time, weight reads at most disk_ring ahead of the oldest
  /// whose parameters have not finished uploading (the bounded ring of pinned read buffers).
  double disk_read_bandwidth = 0, disk_write_bandwidth = 0;
  int disk_ring = 2;
};

/// One busy interval of one stream.
struct SimInterval {
  enum Stream : uint8_t { compute, act_up, act_down, param_up, grad_down, disk };
  int gpu = 0;  ///< -1 for the host's disk
  Stream stream = compute;
  int iteration = 0;
  int stage = 0;
  int64_t micro = -1;  ///< -1 for per-task transfers (parameters, gradients)
  double start = 0, end = 0;
};

struct SimResult {
  double iteration_seconds = 0;        ///< steady state: mean gap between the ends of the
                                       ///< iterations of the second half, over whole deal cycles
                                       ///< when possible (the makespan when iterations == 1)
                                       ///< and, with a disk tier, at least the disk's busy
                                       ///< time per iteration
  double first_iteration_seconds = 0;  ///< end of iteration 0 (includes the pipeline fill)
  double makespan = 0;                 ///< end of the last iteration
  double bubble_ratio = 0;             ///< 1 - compute busy / (G * makespan), whole run
  double steady_bubble_ratio = 0;      ///< 1 - compute per iteration / (G * iteration_seconds)
  std::vector<double> iteration_end;   ///< per iteration, seconds
  std::vector<double> gpu_busy;        ///< compute seconds per GPU over the run
  std::vector<double> gpu_idle;        ///< makespan - gpu_busy
  std::vector<SimInterval> timeline;   ///< when record_timeline
  double disk_busy = 0;                ///< seconds the host's disk read or wrote over the run
};

/// Deal cycles a default replay covers at most: a cycle of G / gcd(S, G) iterations grows with
/// the pool, and 1024 GPUs replayed 2050 iterations for minutes. Pools of up to 64 GPUs get
/// whole cycles; a larger one's steady state is the mean of the last kMaxDefaultCycle
/// iterations' (whole periods of the passes in flight).
inline constexpr int kMaxDefaultCycle = 64;

/// Iterations simulate() replays when SimOptions::iterations is 0 for a plan of `stages` stages
/// on `gpus` GPUs: max(4, 2 x cycle + 2), cycle = gpus / gcd(stages, gpus) iterations repeat
/// the deal, at most kMaxDefaultCycle of them.
int default_iterations(int stages, int gpus);

/// Stage costs of `plan` from layer costs (the same formulas as estimate_stage).
std::vector<StageCost> stage_costs(const std::vector<LayerCost>& costs, const IterationPlan& plan,
                                   const PartitionOptions& opt);

/// Runs the simulation. Throws std::invalid_argument for a malformed plan, costs.size()
/// != plan.stages.size(), negative costs, or options out of range (naming the option).
SimResult simulate(const IterationPlan& plan, const std::vector<StageCost>& costs, const SimOptions& opt);

/// Predicted steady-state seconds per iteration of a run with `gpus` workers and
/// `micro_batches` micro-batches (the other options, e.g. bandwidths, staleness and
/// iterations, from `base`): simulate(...).iteration_seconds.
/// The hook for comparing a real (e.g. CPU-backend) run with the prediction.
double predict_iteration_seconds(const IterationPlan& plan, const std::vector<StageCost>& costs, int gpus,
                                 int64_t micro_batches, SimOptions base = {});

/// Closed-form fill/drain bubble of one isolated iteration with equal stages:
/// N(N-1) / (M*S + N(N-1)) (round-robin dispatch). Exact for S a multiple of N and M >= N.
double uniform_bubble_ratio(int gpus, int64_t micro_batches, int stages);

/// Chrome trace JSON (chrome://tracing, Perfetto) of a recorded timeline: tracks
/// "gpu<g>.<stream>" (compute, act_up, act_down, param_up, grad_down), laid out by
/// trace/chrome_trace.hpp (one process per GPU).
nlohmann::json sim_trace_json(const SimResult& r, const IterationPlan& plan);
/// Writes sim_trace_json to `path`. Throws std::runtime_error("<path>: ...").
void write_sim_trace(const std::string& path, const SimResult& r, const IterationPlan& plan);

}  // namespace rp
