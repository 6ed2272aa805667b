#include "actors/stage_task.hpp"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>

#include "kernels/ops.hpp"
#include "kernels/weight_format.hpp"
#include "scheduler/stage_memory.hpp"
#include "trace/tracer.hpp"

namespace rp {

void allocate_work(const WorkerContext& ctx, Task& t) {
  auto& d = *ctx.device;
  const auto& m = *ctx.layout;
  const auto& shape = t.rs.buffers->shape;
  const size_t act = t.rs.buffers->act_bytes;
  const StageKind kind = t.rs.stage.kind;
  size_t scratch = 0;
  const bool backward = kind != StageKind::forward && !t.rs.eval;
  for (int l : t.layers)
    scratch = std::max(scratch, (*ctx.layers)[l]->scratch_bytes(shape, d.compute_dtype(), backward));
  const size_t gsz = dtype_size(d.ops().grad_dtype());
  for (int g : t.grad_groups) t.dgrad.emplace(g, DeviceBuffer(d, size_t(m.groups[g].numel) * gsz));
  if (scratch > 0) t.scratch = DeviceBuffer(d, scratch);
  for (int l : t.layers)
    if (const size_t b = (*ctx.layers)[l]->fp8_weight_bytes(backward)) t.dfp8.emplace(l, DeviceBuffer(d, b));
  for (int j = 0; j < 2 && j < t.M; ++j)
    if (!t.progress.holds_slot(j)) allocate_slot(ctx, t, j);
  const int temporaries = stage_temporaries(kind, int(t.layers.size()));
  for (int i = 0; i < temporaries; ++i) t.tmp[i] = DeviceBuffer(d, act);
  // Gradient accumulators start at zero for every stage task.
  for (auto& [g, buf] : t.dgrad) {
    void* p = buf.get();
    size_t n = buf.bytes();
    d.stream(StreamKind::compute).launch([&d, p, n] {
      const DType gt = d.ops().grad_dtype();
      d.ops().fill(gt, p, int64_t(n / dtype_size(gt)), 0.f);
    });
  }
}

void allocate_slot(const WorkerContext& ctx, Task& t, int j) {
  auto& d = *ctx.device;
  const size_t act = t.rs.buffers->act_bytes, T = size_t(t.rs.buffers->shape.tokens());
  const StageKind kind = t.rs.stage.kind;
  Slot s;
  if (t.rs.stage.first == 0) s.ids = DeviceBuffer(d, T * 4);
  if (t.rs.packed && std::any_of(t.layers.begin(), t.layers.end(),
                                 [&](int l) { return ctx.layout->kind(l) == LayerKind::decoder; }))
    s.pos = DeviceBuffer(d, T * 4);
  if (kind == StageKind::tail) {
    s.targets = DeviceBuffer(d, T * 4);
    s.loss = DeviceBuffer(d, 2 * sizeof(float));
  }
  // in: the uploaded input of a forward stage, or dy of a backward stage
  if (kind == StageKind::backward || (kind == StageKind::forward && t.rs.stage.first > 0))
    s.in = DeviceBuffer(d, act);
  if (kind != StageKind::forward && t.rs.stage.first > 0 && !t.rs.eval) s.out = DeviceBuffer(d, act);
  // one activation per layer: outputs (forward), inputs (tail), saved inputs (backward: none
  // for the embedding, which reads the ids)
  for (int l : t.layers)
    s.xs.push_back(kind == StageKind::backward && l == 0 ? DeviceBuffer() : DeviceBuffer(d, act));
  // a saved attention per decoder layer (the tail stage keeps its decoders' on the device)
  const auto& lay = *ctx.layout;
  for (int l : t.layers) {
    const bool dec = ctx.saved_attention && lay.kind(l) == LayerKind::decoder;
    const auto& c = lay.config;
    s.attn_o.push_back(
        dec ? DeviceBuffer(d, T * size_t(c.num_attention_heads * c.head_dim) * dtype_size(d.compute_dtype()))
            : DeviceBuffer());
    s.attn_lse.push_back(dec ? DeviceBuffer(d, T * size_t(c.num_attention_heads) * sizeof(float))
                             : DeviceBuffer());
  }
  if (t.rs.buffers->experts > 0 && std::any_of(t.layers.begin(), t.layers.end(), [&](int l) {
        return lay.kind(l) == LayerKind::decoder && lay.config.is_moe_layer(l - 1);
      })) {
    s.moe_stats_in = DeviceBuffer(d, size_t(2 * t.rs.buffers->experts) * sizeof(float));
    s.moe_stats = DeviceBuffer(d, size_t(2 * t.rs.buffers->experts) * sizeof(float));
  }
  t.slot[j] = std::move(s);
  t.progress.hold_slot(j);
}

void release_retired_inputs(Task& t, int j) {
  Slot& s = t.slot[j];
  const StageKind kind = t.rs.stage.kind;
  for (DeviceBuffer* b : {&s.ids, &s.pos, &s.targets, &s.in, &s.moe_stats_in}) b->reset();
  if (kind == StageKind::forward) return;
  for (auto* v : {&s.xs, &s.attn_o, &s.attn_lse})
    for (DeviceBuffer& b : *v) b.reset();
  if (kind == StageKind::backward) s.moe_stats.reset();
}

LayerArgs layer_args(const WorkerContext& ctx, const Task& t, int layer, int64_t m) {
  const Slot& s = t.slot[m % 2];
  LayerArgs a;
  a.ops = &ctx.device->ops();
  a.shape = t.rs.buffers->shape;
  for (int g : ctx.layout->groups_of(layer)) {
    auto w = t.dparam.find(g);  // absent: weights this stage does not read (groups_uploaded)
    a.params.push_back(w == t.dparam.end() ? nullptr : w->second.get());
    // a frozen group has no accumulator: the layer gets null and computes no weight gradient
    if (t.rs.stage.kind != StageKind::forward && !t.rs.eval)
      a.grads.push_back(ctx.layout->groups[size_t(g)].frozen ? nullptr : t.dgrad.at(g).get());
  }
  a.scratch = t.scratch.get();
  a.scratch_bytes = t.scratch.bytes();
  a.ids = s.ids.as<int32_t>();
  const auto i = size_t(std::find(t.layers.begin(), t.layers.end(), layer) - t.layers.begin());
  if (i < s.attn_o.size()) {
    a.attn_o = s.attn_o[i].get();
    a.attn_lse = s.attn_lse[i].as<float>();
  }
  if (s.pos.get()) {
    a.positions = s.pos.as<int32_t>();
    a.rope_length = t.rs.buffers->rope_length[size_t(m)];
  }
  // FP8 decoders: the weights are quantized once per upload, by micro-batch 0's calls (the
  // first in stream order; a tail stage's backward call adds W^T after its forward call's W)
  if (auto f = t.dfp8.find(layer); f != t.dfp8.end()) {
    a.fp8_weights = f->second.get();
    a.fp8_weights_bytes = f->second.bytes();
    a.fp8_fill_weights = m == 0;
    a.fp8_stored_base = !(*ctx.layers)[layer]->fp8_stored_tensors().empty();
  }
  // LoRA dropout masks: the same in the micro-batch's forward, tail and backward stages
  a.dropout_id = t.rs.dropout_pass < 0 ? -1 : t.rs.dropout_pass * t.M + m;
  // sparse decoders: router statistics, and the load-balancing loss's weight in a backward
  // (the micro-batch's share of the objective: coefficient x its target tokens)
  a.moe_stats = s.moe_stats.as<float>();
  if (s.moe_stats.get() && t.rs.stage.kind != StageKind::forward && !t.rs.eval)
    a.moe_aux_scale = float(double(t.rs.loss_scale) * ctx.layout->config.aux_loss_coef() *
                            double(t.rs.buffers->target_tokens[size_t(m)]));
  return a;
}

std::vector<int64_t> fp8_stored_offsets(const WorkerContext& ctx, const Task& t, int g) {
  for (int l : t.layers)  // only FP8 decoders list any (and get LayerArgs::fp8_stored_base)
    if (ctx.layout->groups_of(l).front() == g) return (*ctx.layers)[l]->fp8_stored_tensors();
  return {};
}

void dequantize_frozen(Ops& ops, std::vector<DequantPart>& parts, const std::vector<DequantPart>& stored) {
  if (!stored.empty() && ops.gemm_fp8_rows_supported()) {
    for (const DequantPart& p : stored)  // row scales then codes: an even byte count (sides of 16)
      ops.copy(DType::bf16, p.dst, p.src, int64_t(weight_format_bytes(p.format, p.n, p.cols) / 2));
  } else {
    parts.insert(parts.end(), stored.begin(), stored.end());
  }
  ops.dequantize_many(parts.data(), int64_t(parts.size()));
}

void build_layer_calls(const WorkerContext& ctx, Task& t, int64_t m, LayerCalls& fwd, LayerCalls& bwd) {
  Slot& s = t.slot[m % 2];
  const StageKind kind = t.rs.stage.kind;
  const int k = int(t.layers.size());
  if (kind == StageKind::forward) {
    // layer i reads the ids (embedding), the uploaded input, or layer i-1's output,
    // and writes xs[i], which is downloaded as the saved input of layer i+1.
    for (int i = 0; i < k; ++i) {
      LayerArgs a = layer_args(ctx, t, t.layers[i], m);
      a.x = i > 0 ? s.xs[i - 1].get() : (t.rs.stage.first == 0 ? nullptr : s.in.get());
      a.y = s.xs[i].get();
      fwd.emplace_back(t.layers[i], a);
    }
  } else if (kind == StageKind::tail) {
    // forward through the decoder layers of the stage, keeping every input in xs
    for (int i = 0; i + 1 < k; ++i) {
      LayerArgs a = layer_args(ctx, t, t.layers[i], m);
      a.x = s.xs[i].get();
      a.y = s.xs[i + 1].get();
      fwd.emplace_back(t.layers[i], a);
    }
    LayerArgs ta = layer_args(ctx, t, t.layers[k - 1], m);
    ta.x = s.xs[k - 1].get();
    ta.targets = s.targets.as<int32_t>();
    ta.loss = s.loss.as<float>();
    if (t.rs.eval) {  // evaluation: the loss only
      fwd.emplace_back(t.layers[k - 1], ta);
      return;
    }
    ta.loss_scale = t.rs.loss_scale;
    ta.dx = k == 1 ? s.out.get() : t.tmp[0].get();
    bwd.emplace_back(t.layers[k - 1], ta);
    const void* dy = ta.dx;
    for (int i = k - 2, n = 1; i >= 0; --i, ++n) {
      LayerArgs a = layer_args(ctx, t, t.layers[i], m);
      a.x = s.xs[i].get();
      a.dy = dy;
      a.dx = i == 0 ? s.out.get() : t.tmp[n % 2].get();
      dy = a.dx;
      bwd.emplace_back(t.layers[i], a);
    }
  } else {
    const void* dy = s.in.get();
    for (int i = 0; i < k; ++i) {
      const int l = t.layers[i];
      LayerArgs a = layer_args(ctx, t, l, m);
      a.x = l > 0 ? s.xs[i].get() : nullptr;
      a.dy = dy;
      if (l > 0) a.dx = i == k - 1 ? s.out.get() : t.tmp[i % 2].get();
      dy = a.dx;
      bwd.emplace_back(l, a);
    }
  }
}

}  // namespace rp

namespace rp {

void add_router_statistics(const ModelLayout& m, const PassBuffers& pb, StageDone& sd) {
  const int64_t E = pb.experts;
  if (E == 0) return;
  const double rows = double(m.config.num_moe_layers()) * double(pb.shape.tokens());
  const double coef = m.config.aux_loss_coef();
  sd.expert_tokens.assign(size_t(E), 0.0);
  for (int64_t mb = 0; mb < pb.micro_batches; ++mb) {
    const float* st = &pb.moe_stats[size_t(2 * E * mb)];
    double aux = 0;  // E * sum_e (c_e / rows) (P_e / rows), model/moe_block.hpp
    for (int64_t e = 0; e < E; ++e) aux += double(st[e]) / rows * (double(st[E + e]) / rows);
    aux *= double(E);
    const double n = pb.target_tokens[size_t(mb)];
    sd.aux_weighted += aux * n;
    sd.loss_sum += coef * aux * n;
    for (int64_t e = 0; e < E; ++e) sd.expert_tokens[size_t(e)] += st[e];
  }
}

std::vector<std::vector<int>> grads_final_after(const ModelLayout& m, const LayerCalls& bwd,
                                                const std::vector<int>& grad_groups) {
  std::vector<std::vector<int>> out(bwd.size());
  for (int g : grad_groups) {
    size_t last = bwd.size();
    for (size_t i = 0; i < bwd.size(); ++i) {
      const auto& gs = m.groups_of(bwd[i].first);
      if (std::find(gs.begin(), gs.end(), g) != gs.end()) last = i;
    }
    if (last + 1 < bwd.size()) out[last].push_back(g);
  }
  return out;
}

namespace {

/// launch_compute's hook for the last micro-batch of a training stage (ctx.early_gradients):
/// after each backward call with final groups, a then() callback on the compute stream sends
/// GradsFinal. With ctx.late_grads_final (testing) the groups go to `late` instead.
AfterBackward early_drain(const WorkerContext& ctx, const Task& t, int64_t m, const LayerCalls& bwd,
                          WorkerActor me, std::vector<int>& late) {
  if (!ctx.early_gradients || m != t.M - 1 || bwd.empty()) return {};
  auto final_after = grads_final_after(*ctx.layout, bwd, t.grad_groups);
  if (ctx.late_grads_final) {
    for (const auto& v : final_after) late.insert(late.end(), v.begin(), v.end());
    return {};
  }
  if (std::all_of(final_after.begin(), final_after.end(), [](const auto& v) { return v.empty(); })) return {};
  Stream* stream = &ctx.device->stream(StreamKind::compute);
  return [stream, me, id = t.id, final_after = std::move(final_after)](size_t i) {
    if (final_after[i].empty()) return;
    stream->then([me, id, groups = final_after[i]](const std::string& err) {
      caf::anon_send(me, GradsFinal{id, groups, err});
    });
  };
}

}  // namespace

void launch_compute(const WorkerContext& ctx, Task& t, int64_t m, WorkerActor me) {
  const auto& layers = *ctx.layers;
  const StageKind kind = t.rs.stage.kind;
  // Build every call's arguments here; the device runs them in stream order.
  LayerCalls fwd, bwd;
  build_layer_calls(ctx, t, m, fwd, bwd);
  auto& stream = ctx.device->stream(StreamKind::compute);
  Tracer* tr = ctx.tracer;
  std::string track = fmt::format("worker{}.compute", ctx.index);
  std::string label = fmt::format("{}{} L{}-{} mb{} (pass {})",
                                  t.rs.eval                    ? "E"
                                  : kind == StageKind::forward ? "F"
                                  : kind == StageKind::tail    ? "T"
                                                               : "B",
                                  t.rs.stage_index, t.rs.stage.first, t.rs.stage.last, m, t.rs.pass);
  auto t0 = std::make_shared<double>(0);
  // evaluation passes are not profiled: their tail runs no backward
  auto timer = ctx.profile && !t.rs.eval ? std::make_shared<LayerTimer>(stream, kind) : nullptr;
  const bool inject =
      ctx.faults.fire_compute(FaultInjection::Site::device_op, ctx.index, t.rs.stage_index, m);
  // the layers add their router statistics to a copy of the uploaded ones (Slot::moe_stats)
  const Slot& s = t.slot[m % 2];
  Ops* ops = &ctx.device->ops();
  const void* stats_in = s.moe_stats_in.get();
  void* stats = s.moe_stats.get();
  const int64_t stats_n = int64_t(s.moe_stats.bytes() / sizeof(float));
  const uint64_t id = t.id;
  std::vector<int> late;  // testing (WorkerContext::late_grads_final): sent after ComputeDone
  AfterBackward drain = early_drain(ctx, t, m, bwd, me, late);
  stream.launch([&layers, fwd = std::move(fwd), bwd = std::move(bwd), tr, t0, timer, inject, m, ops, stats_in,
                 stats, stats_n, drain = std::move(drain)] {
    if (inject) throw std::runtime_error(FaultInjection::what(fmt::format("device op of micro-batch {}", m)));
    if (stats) ops->copy(DType::f32, stats, stats_in, stats_n);
    if (tr) *t0 = tr->now();
    if (timer) timer->run(layers, fwd, bwd, drain);
    else run_layer_calls(layers, fwd, bwd, drain);
  });
  LayerTimings lt{ctx.index, t.rs.pass, m, {}, {}};
  if (timer && m == 0)
    lt.memory = stage_memory(*ctx.layout, layers, t.rs.stage, t.rs.buffers->shape,
                             ctx.device->compute_dtype(), ctx.device->ops().grad_dtype());
  // Runs on the stream's callback thread: whatever happens here, ComputeDone goes out.
  stream.then([me, id, m, tr, t0, track, label, timer, lt = std::move(lt), sched = ctx.scheduler,
               late = std::move(late)](const std::string& err) mutable {
    std::string e = err;
    try {
      if (tr) tr->interval(track, label, *t0, tr->now());
      if (timer && err.empty()) send_layer_timings(sched, std::move(lt), *timer);
    } catch (const std::exception& ex) {
      if (e.empty()) e = ex.what();
    }
    caf::anon_send(me, ComputeDone{id, m, e});
    if (!late.empty()) caf::anon_send(me, GradsFinal{id, late, {}});
  });
}

}  // namespace rp
