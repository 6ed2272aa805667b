#include "actors/layer_timer.hpp"

#include <algorithm>

namespace rp {

void LayerTimer::run(const std::vector<std::unique_ptr<Layer>>& layers, const LayerCalls& fwd,
                     const LayerCalls& bwd, const AfterBackward& after_backward) {
  start_ = stream_.mark_time();
  for (const auto& [l, a] : fwd) {
    layers[size_t(l)]->forward(a);
    mark(l, Phase::forward);
  }
  for (size_t i = 0; i < bwd.size(); ++i) {
    const auto& [l, a] = bwd[i];
    LayerArgs b = a;
    b.after_recompute = [this, l = l] { mark(l, Phase::recompute); };
    layers[size_t(l)]->backward(b);
    mark(l, Phase::backward);
    if (after_backward) after_backward(i);
  }
}

std::vector<LayerSample> LayerTimer::samples() const {
  std::vector<LayerSample> out;
  if (!start_) return out;
  const TimingMark* prev = start_.get();
  for (const Mark& m : marks_) {
    const double s = std::max(0.0, m.t->seconds_since(*prev));
    prev = m.t.get();
    ProfileKind k = ProfileKind::tail;
    if (kind_ == StageKind::forward) k = ProfileKind::forward;
    else if (kind_ == StageKind::backward)
      k = m.phase == Phase::recompute ? ProfileKind::recompute : ProfileKind::backward;
    // a tail-stage layer's forward, recompute and backward form one sample; so do the
    // pieces of one backward call (a decoder's recompute is its own sample)
    auto same = [&](const LayerSample& x) { return x.layer == m.layer && x.kind == k; };
    auto it = std::find_if(out.begin(), out.end(), same);
    if (it != out.end() && k == ProfileKind::tail) {
      it->seconds += s;
    } else {
      out.push_back({m.layer, k, s});
    }
  }
  return out;
}

void run_layer_calls(const std::vector<std::unique_ptr<Layer>>& layers, const LayerCalls& fwd,
                     const LayerCalls& bwd, const AfterBackward& after_backward) {
  for (const auto& [l, a] : fwd) layers[size_t(l)]->forward(a);
  for (size_t i = 0; i < bwd.size(); ++i) {
    layers[size_t(bwd[i].first)]->backward(bwd[i].second);
    if (after_backward) after_backward(i);
  }
}

void send_layer_timings(const SchedulerActor& to, LayerTimings lt, const LayerTimer& timer) {
  try {
    lt.samples = timer.samples();
  } catch (const DeviceError&) {
    lt.samples.clear();  // cannot happen after completion; a profile simply misses the sample
  }
  if (lt.samples.empty() && lt.memory.empty()) return;
  caf::anon_send(to, std::move(lt));
}

std::vector<LayerMemory> stage_memory(const ModelLayout& m, const std::vector<std::unique_ptr<Layer>>& layers,
                                      const Stage& stage, const MicroBatchShape& s, DType compute,
                                      DType grad) {
  std::vector<LayerMemory> out;
  for (int l = stage.first; l <= stage.last; ++l)
    out.push_back(layer_memory(m, *layers[size_t(l)], l, stage.kind, s, compute, grad));
  return out;
}

LayerMemory layer_memory(const ModelLayout& m, const Layer& layer, int l, StageKind kind,
                         const MicroBatchShape& s, DType compute, DType grad) {
  LayerMemory mem;
  mem.layer = l;
  int64_t numel = 0, trainable = 0;  // frozen groups have no gradient accumulator
  for (int g : m.groups_of(l)) {
    numel += m.groups[size_t(g)].numel;
    if (!m.groups[size_t(g)].frozen) trainable += m.groups[size_t(g)].numel;
  }
  mem.weight_bytes = numel * int64_t(dtype_size(compute));
  if (kind != StageKind::forward) mem.grad_bytes = trainable * int64_t(dtype_size(grad));
  mem.scratch_bytes = int64_t(layer.scratch_bytes(s, compute, kind != StageKind::forward));
  return mem;
}

}  // namespace rp
