// The device memory a worker holds across a stage switch (scheduler/stage_peak.hpp): a retired
// task gives back its inputs and keeps exactly what the planner counts as retained (its
// outputs in flight and its gradient accumulators), and a run with a LoRA model on one
// virtual GPU, one micro-batch per iteration and a slow link (so the outputs are still
// downloading when the next stage starts) peaks between the largest working set and the
// predicted switch peak.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/pass_buffers.hpp"
#include "actors/stage_task.hpp"
#include "kernels/device.hpp"
#include "model/lora.hpp"
#include "roundpipe/session.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/stage_peak.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kChunk = 5;

ModelLayout lora_layout(bool tied) {
  LoraConfig lc;
  lc.r = 4;
  lc.target_modules = {"all-linear"};
  lc.base_format = WeightFormat::bf16;
  return make_layout(tiny_config(false, tied, 4), lc);
}

std::vector<LayerCost> planned_costs(const ModelLayout& m, MicroBatchShape s, bool saved_attention) {
  DeviceModel dm;
  dm.saved_attention = saved_attention;
  dm.elem_bytes = 4;  // the CPU backend computes in fp32
  dm.scratch_elem_bytes = 4;
  dm.mlp_chunk_tokens = kChunk;
  lora_device_model(dm, m);
  auto costs = layer_costs(estimate_layers(model_shape_from_config(m.config), s.n_seq, s.seq_len, dm));
  apply_frozen_groups(costs, m, DType::f32, 4);
  return costs;
}

TEST(StagePeak, RetiredTaskKeepsWhatThePlannerCountsAsRetained) {
  for (bool saved : {false, true})
    for (bool tied : {true, false})
      for (int64_t M : {1, 2, 3}) {
        const ModelLayout m = lora_layout(tied);
        const MicroBatchShape shape{2, 6};
        std::vector<std::unique_ptr<Layer>> layers;
        LayerOptions lo;
        lo.mlp_chunk_tokens = kChunk;
        lo.save_attention = saved;
        for (int l = 0; l < m.num_layers(); ++l) layers.push_back(make_layer(m, l, lo));
        DeviceOptions dopt;
        dopt.capacity_bytes = size_t(1) << 30;
        auto dev = make_cpu_device(0, dopt);
        WorkerContext ctx;
        ctx.device = dev.get();
        ctx.layout = &m;
        ctx.layers = &layers;
        ctx.saved_attention = saved;
        auto pb =
            std::make_shared<PassBuffers>(m, make_default_plan(m.num_layers(), 1), M, shape, DType::f32);
        const auto costs = planned_costs(m, shape, saved);
        PartitionOptions po;
        po.micro_batches = M;
        po.alloc_granule = int64_t(dev->allocation_granule());
        for (const Stage& st : {Stage{StageKind::forward, 0, 2}, Stage{StageKind::forward, 1, 3},
                                Stage{StageKind::tail, 5, 5}, Stage{StageKind::tail, 3, 5},
                                Stage{StageKind::backward, 0, 2}, Stage{StageKind::backward, 2, 3}}) {
          SCOPED_TRACE(fmt::format("{} stage {}-{}, tied {}, M {}, saved attention {}",
                                   stage_kind_name(st.kind), st.first, st.last, tied, M, saved));
          const size_t before = dev->used_bytes();
          {
            Task t;  // as Worker::prepare builds it
            t.rs.stage = st;
            t.rs.buffers = pb;
            t.layers = st.layers();
            t.M = M;
            t.groups = m.groups_uploaded(t.layers, st.kind == StageKind::backward);
            if (st.kind != StageKind::forward)
              for (int g : m.groups_of(t.layers))
                if (!m.groups[size_t(g)].frozen) t.grad_groups.push_back(g);
            for (int g : t.groups) {
              const ParamGroup& grp = m.groups[size_t(g)];
              t.dparam.emplace(g, DeviceBuffer(*dev, size_t(grp.numel) * 4));
              // the frozen bf16 base's storage form, staged beside the f32 compute copy
              if (const int64_t sb = grp.storage_bytes - grp.direct_bytes(DType::f32); grp.frozen && sb > 0)
                t.dstage.emplace(g, DeviceBuffer(*dev, size_t(sb)));
            }
            allocate_work(ctx, t);
            dev->stream(StreamKind::compute).synchronize();  // the accumulators' zero fill
            const StageEstimate e = estimate_stage(costs, st, po);
            EXPECT_NEAR(double(dev->used_bytes() - before), double(e.work_bytes), 512.0);
            // retirement as Worker::maybe_finish does it, the last micro-batch's slot still downloading
            t.dparam.clear();
            t.dstage.clear();
            t.scratch.reset();
            for (auto& b : t.tmp) b.reset();
            const int last = int((M - 1) % 2);
            t.slot[1 - last] = Slot{};
            release_retired_inputs(t, last);
            EXPECT_NEAR(double(dev->used_bytes() - before), double(e.retained_bytes), 512.0);
            EXPECT_LT(e.retained_bytes, e.work_bytes);
          }
          EXPECT_EQ(dev->used_bytes(), before);
        }
      }
}

// One virtual GPU, M = 1, a slow link: every stage starts while the one before it still
// downloads its outputs, and prefetches the next one's weights meanwhile.
TEST(StagePeak, RunPeaksWithinThePredictedSwitchPeak) {
  for (bool saved : {false, true}) {
    const ModelLayout m = lora_layout(true);
    const MicroBatchShape shape{1, 32};
    const IterationPlan plan = plan_from_json(
        nlohmann::json::parse(
            R"({"forward": [[0, 1], [2, 3]], "tail": [4, 5], "backward": [[3, 3], [2, 1], [0, 0]]})"),
        m.num_layers(), 1, "p");
    SCOPED_TRACE(plan.summary() + (saved ? ", saved attention" : ""));
    const auto costs = planned_costs(m, shape, saved);
    PartitionOptions po;
    po.micro_batches = 1;
    po.alloc_granule = 256;
    const std::vector<StageEstimate> est = check_plan(costs, plan, po, "plan");
    const PeakEstimate peak = predict_peak(est, po);
    SessionOptions o;
    o.backend = "cpu";
    o.workers = 1;
    o.micro_batches = 1;
    o.micro = shape;
    o.plan = plan;
    o.mlp_chunk_tokens = kChunk;
    o.save_attention = saved;
    o.device.capacity_bytes = size_t(1) << 30;
    o.device.pcie_bytes_per_s = 20e6;  // an activation of 4 KiB takes 0.2 ms
    o.adam = adam_opts();
    Session s(m, random_weights(m, 5), o);
    std::vector<int32_t> ids(size_t(shape.tokens())), tg(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 % 67), tg[i] = int32_t((i * 7 + 3) % 67);
    for (int step = 0; step < 3; ++step) {
      s.forward_backward(ids, tg);
      s.step(1e-3);
    }
    EXPECT_NO_THROW(s.wait(2));
    const double measured = double(s.peak_device_bytes());
    EXPECT_GT(peak.bytes, peak.max_work);
    EXPECT_GE(measured, double(peak.max_work));
    EXPECT_LE(measured, double(peak.bytes) + 4096) << "measured " << measured << " predicted " << peak.bytes;
  }
}

}  // namespace
}  // namespace rp::test
