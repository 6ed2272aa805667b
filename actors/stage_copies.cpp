#include "actors/stage_copies.hpp"

#include <algorithm>
#include <utility>

#include "kernels/ops.hpp"
#include "trace/tracer.hpp"

namespace rp {

int64_t frozen_direct_bytes(const WorkerContext& ctx, int g) {
  return ctx.layout->groups[size_t(g)].direct_bytes(ctx.device->compute_dtype());
}

int64_t frozen_staged_bytes(const WorkerContext& ctx, int g) {
  const ParamGroup& grp = ctx.layout->groups[size_t(g)];
  return grp.frozen ? grp.storage_bytes - frozen_direct_bytes(ctx, g) : 0;
}

std::unique_ptr<Task> new_task(const WorkerContext& ctx, RunStage rs, uint64_t id, int windows) {
  auto& d = *ctx.device;
  const auto& m = *ctx.layout;
  auto tp = std::make_unique<Task>();
  Task& t = *tp;
  t.id = id;
  t.rs = std::move(rs);
  t.layers = t.rs.stage.layers();
  t.M = t.rs.buffers->micro_batches;
  t.progress = StageProgress(t.M);
  t.wall_start = std::chrono::steady_clock::now();
  t.t_start = ctx.tracer ? ctx.tracer->now() : 0;
  const StageKind kind = t.rs.stage.kind;
  t.groups = m.groups_uploaded(t.layers, kind == StageKind::backward);
  if (kind != StageKind::forward && !t.rs.eval)
    for (int g : m.groups_of(t.layers))
      if (!m.groups[g].frozen) t.grad_groups.push_back(g);  // frozen groups have no gradient
  t.grads_pending = int(t.grad_groups.size());
  const size_t esz = dtype_size(d.compute_dtype());
  for (int g : t.groups) {
    t.dparam.emplace(g, DeviceBuffer(d, size_t(m.groups[g].numel) * esz));
    if (const int64_t st = frozen_staged_bytes(ctx, g); st > 0)
      t.dstage.emplace(g, DeviceBuffer(d, size_t(st)));
  }
  // A frozen group uploads its storage form (ParamGroup::storage_bytes); a trainable one its
  // compute copy.
  std::vector<std::pair<int, size_t>> sizes;
  for (int g : t.groups)
    sizes.emplace_back(
        g, size_t(m.groups[g].frozen ? m.groups[g].storage_bytes : m.groups[g].numel * int64_t(esz)));
  const auto& tc = ctx.transfer;
  // A group streamed from the disk tier holds a read buffer until its chunks land: they all
  // go at once (one window), so a buffer never waits for another stage's progress.
  const FrozenTier* tier = ctx.frozen_tier;
  const bool tiered =
      tier && std::any_of(t.groups.begin(), t.groups.end(), [&](int g) { return tier->tiered(g); });
  t.uploads = std::make_shared<UploadWindows>(sizes, tc.priorities ? tc.chunk_bytes : 0,
                                              tc.priorities && !tiered ? windows : 1);
  t.params_pending = int(t.groups.size());
  return tp;
}

std::vector<HostCopy> weight_copies(const WorkerContext& ctx, Task& t, const UploadWindows::Piece& p) {
  std::vector<HostCopy> out;
  const int g = p.group;
  const auto leased = t.frozen_leases.find(g);  // streamed from the disk tier
  const char* src = leased != t.frozen_leases.end() ? reinterpret_cast<const char*>(leased->second.data())
                                                    : static_cast<const char*>(ctx.store->lowp[g].data());
  const auto st = t.dstage.find(g);
  const size_t direct =
      st == t.dstage.end() ? SIZE_MAX : size_t(frozen_direct_bytes(ctx, g));  // nothing staged: all direct
  const size_t begin = p.chunk.offset, end = p.chunk.offset + p.chunk.bytes;
  if (begin < direct)
    out.push_back({t.dparam.at(g).as<char>() + begin, src + begin, std::min(end, direct) - begin});
  if (end > direct) {
    if (begin < direct) t.extra_copies[g]++;
    const size_t from = std::max(begin, direct);
    out.push_back({st->second.as<char>() + (from - direct), src + from, end - from});
  }
  return out;
}

std::vector<HostCopy> input_copies(const Task& t, int64_t m, const SpillPort& spill) {
  std::vector<HostCopy> out;
  auto& pb = *t.rs.buffers;
  const Slot& s = t.slot[m % 2];
  const StageKind kind = t.rs.stage.kind;
  auto up = [&](void* dst, const void* src, size_t bytes) { out.push_back({dst, src, bytes}); };
  const size_t idb = pb.ids[m].size();
  if (t.rs.stage.first == 0) up(s.ids.get(), pb.ids[m].data(), idb);
  if (s.pos.get()) up(s.pos.get(), pb.positions[m].data(), idb);
  if (s.moe_stats.get())
    up(s.moe_stats_in.get(), &pb.moe_stats[size_t(2 * pb.experts * m)], s.moe_stats.bytes());
  if (kind == StageKind::forward) {
    if (t.rs.stage.first > 0) up(s.in.get(), spill.input(t, t.rs.stage.first, m), pb.act_bytes);
  } else if (kind == StageKind::tail) {
    up(s.xs[0].get(), spill.input(t, t.rs.stage.first, m), pb.act_bytes);
    up(s.targets.get(), pb.targets[m].data(), idb);
  } else {
    up(s.in.get(), pb.boundary(t.rs.chain - 1, m).data(), pb.act_bytes);
    for (size_t i = 0; i < t.layers.size(); ++i) {
      const int l = t.layers[i];
      if (l > 0) up(s.xs[i].get(), spill.input(t, l, m), pb.act_bytes);
      if (s.attn_o[i].get()) {  // the forward's attention output and log-sum-exp
        up(s.attn_o[i].get(), pb.activations->attn_o[l][m].data(), s.attn_o[i].bytes());
        up(s.attn_lse[i].get(), pb.activations->attn_lse[l][m].data(), s.attn_lse[i].bytes());
      }
    }
  }
  return out;
}

std::vector<HostCopy> output_copies(Task& t, int64_t m, SpillPort& spill, int& spilled) {
  std::vector<HostCopy> out;
  auto& pb = *t.rs.buffers;
  Slot& s = t.slot[m % 2];
  const StageKind kind = t.rs.stage.kind;
  auto down = [&](void* dst, const void* src, size_t bytes) { out.push_back({dst, src, bytes}); };
  spilled = 0;
  if (kind == StageKind::forward) {
    for (size_t i = 0; i < t.layers.size(); ++i) {
      // an evaluation pass has no backward: of its layers' outputs only the last, the next
      // stage's input, is read (the others would be written to the spill's file for nothing)
      if (t.rs.eval && i + 1 < t.layers.size()) continue;
      const int l = t.layers[i];
      if (spill.spilled(l + 1)) {
        spill.output(t, m, l + 1, s.xs[i].get());
        ++spilled;
      } else {
        down(pb.x[l + 1][m].data(), s.xs[i].get(), pb.act_bytes);
      }
      if (s.attn_o[i].get()) {  // kept for the backward stage, which then skips the attention
        down(pb.activations->attn_o[l][m].data(), s.attn_o[i].get(), s.attn_o[i].bytes());
        down(pb.activations->attn_lse[l][m].data(), s.attn_lse[i].get(), s.attn_lse[i].bytes());
      }
    }
  } else {
    if (t.rs.stage.first > 0 && !t.rs.eval)
      down(pb.boundary(t.rs.chain, m).data(), s.out.get(), pb.act_bytes);
    if (kind == StageKind::tail) down(&pb.loss[2 * m], s.loss.get(), 2 * sizeof(float));
  }
  // the router statistics so far (forward), of the whole forward pass (tail)
  if (s.moe_stats.get() && kind != StageKind::backward)
    down(&pb.moe_stats[size_t(2 * pb.experts * m)], s.moe_stats.get(), s.moe_stats.bytes());
  return out;
}

void launch_dequantize(const WorkerContext& ctx, Task& t, int g, WorkerActor me) {
  Device& d = *ctx.device;
  const ParamGroup& grp = ctx.layout->groups[g];
  const int64_t direct = frozen_direct_bytes(ctx, g);  // arrived in the weights as it is
  const char* stage = t.dstage.at(g).as<char>();       // holds the storage from `direct` on
  char* dst = t.dparam.at(g).as<char>();
  const size_t esz = dtype_size(d.compute_dtype());
  // an FP8 decoder's fp8-stored linears stay in their storage form where the device runs them
  // from their codes (LayerArgs::fp8_stored_base; decided on the compute stream, as the layer does)
  const std::vector<int64_t> keep = fp8_stored_offsets(ctx, t, g);
  std::vector<DequantPart> parts, stored;
  for (const TensorSpec& ts : grp.tensors)
    if (ts.byte_offset >= direct) {
      const DequantPart p{ts.format, stage + (ts.byte_offset - direct), dst + size_t(ts.offset) * esz,
                          ts.numel(), weight_format_cols(ts.shape)};
      const bool as_is = ts.format == WeightFormat::fp8 && std::count(keep.begin(), keep.end(), ts.offset);
      (as_is ? stored : parts).push_back(p);
    }
  auto& stream = d.stream(StreamKind::compute);
  stream.launch([&d, parts = std::move(parts), stored = std::move(stored)]() mutable {
    dequantize_frozen(d.ops(), parts, stored);
  });
  t.dequant_order.push_back(g);
  stream.then([me, id = t.id](const std::string& err) {
    caf::anon_send(me, ComputeDone{id, kDequantized, err});
  });
}

}  // namespace rp
