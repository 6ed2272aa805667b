// The profiler's worker half (per-layer timings for the automatic planner): times every layer call of one
// micro-batch's compute launch and reports device memory per layer.
//
// A LayerTimer lives for one compute launch. Inside the launch, run() issues the stage's
// layer calls and puts a timing mark (Stream::mark_time: a steady-clock reading on the CPU
// backend, a CUDA event on the GPU) on the compute stream before the first call, after every
// call and, in backward calls of decoders, between the recompute and the backward proper
// (LayerArgs::after_recompute). Nothing waits for a timer: the marks are read in the then()
// callback that follows the launch, once the device has passed them, and the samples go to
// the scheduler as a LayerTimings message.
//
// Profile kinds (scheduler/profile.hpp) by stage kind:
//   forward stage  : each layer's forward                            -> forward
//   backward stage : recompute of a decoder's forward                -> recompute
//                    the rest of its backward (embedding: all of it) -> backward
//   tail stage     : everything a layer does in the stage (a decoder's forward, recompute and
//                    backward; the tail layer's fused forward + loss + backward) -> tail
// Times are seconds for one micro-batch, as Profile::record expects.
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "actors/messages.hpp"
#include "kernels/device.hpp"
#include "model/layer.hpp"

namespace rp {

/// Layer calls of one compute launch in issue order: (layer index, arguments).
using LayerCalls = std::vector<std::pair<int, LayerArgs>>;
/// Optional, inside the launch: called with i after the i-th backward call was issued (the
/// worker drains gradients that are final at that point: GradsFinal).
using AfterBackward = std::function<void(size_t)>;

class LayerTimer {
 public:
  /// Times calls issued on `stream` (the compute stream) for a stage of kind `kind`.
  LayerTimer(Stream& stream, StageKind kind) : stream_(stream), kind_(kind) {}

  /// Inside the compute launch: issues layers[l]->forward(a) for every (l, a) of `fwd`,
  /// then layers[l]->backward(a) for every (l, a) of `bwd`, marking the stream around each
  /// call. Exceptions of the calls propagate (the stream reports them to then()).
  void run(const std::vector<std::unique_ptr<Layer>>& layers, const LayerCalls& fwd, const LayerCalls& bwd,
           const AfterBackward& after_backward = {});

  /// After completion (in a then() callback issued after the launch): one sample per layer
  /// and profile kind, in issue order; a tail-stage layer's phases are summed. Empty when
  /// run() never started. Throws DeviceError when a mark was not reached yet.
  std::vector<LayerSample> samples() const;

 private:
  enum class Phase : uint8_t { forward, recompute, backward };
  struct Mark {
    int layer;
    Phase phase;
    std::unique_ptr<TimingMark> t;
  };
  void mark(int layer, Phase phase) { marks_.push_back({layer, phase, stream_.mark_time()}); }

  Stream& stream_;
  StageKind kind_;
  std::unique_ptr<TimingMark> start_;
  std::vector<Mark> marks_;
};

/// Issues the calls like LayerTimer::run, without timing (profiling off).
void run_layer_calls(const std::vector<std::unique_ptr<Layer>>& layers, const LayerCalls& fwd,
                     const LayerCalls& bwd, const AfterBackward& after_backward = {});

/// In a then() callback after the launch: fills lt.samples from `timer` and sends `lt` to
/// `to` (the profile's owner); sends nothing when there is neither a sample nor memory.
void send_layer_timings(const SchedulerActor& to, LayerTimings lt, const LayerTimer& timer);

/// layer_memory of every layer of `stage`.
std::vector<LayerMemory> stage_memory(const ModelLayout& m, const std::vector<std::unique_ptr<Layer>>& layers,
                                      const Stage& stage, const MicroBatchShape& s, DType compute,
                                      DType grad);

/// Device memory a stage of kind `kind` holds for layer `l` (bytes): its parameter groups
/// in `compute` dtype, their gradient accumulators in `grad` dtype (-1 for forward stages,
/// which hold none) and the scratch of one call (Layer::scratch_bytes for shape `s`).
LayerMemory layer_memory(const ModelLayout& m, const Layer& layer, int l, StageKind kind,
                         const MicroBatchShape& s, DType compute, DType grad);

}  // namespace rp
