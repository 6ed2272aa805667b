// The planner's memory model and the worker agree: for every kind of stage the bytes a worker
// allocates for a stage task (weights as prepare() uploads them, then allocate_work: gradient
// accumulators, slots, temporaries, scratch) equal the partitioner's work_bytes; and a run
// whose memory cap is just above the largest predicted working set completes with a measured
// peak within 5% of the prediction.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/pass_buffers.hpp"
#include "actors/stage_task.hpp"
#include "kernels/device.hpp"
#include "roundpipe/session.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kChunk = 5;  // decoders' MLP chunk (tokens): exercises the chunked scratch

std::vector<LayerCost> cpu_costs(const ModelLayout& m, MicroBatchShape s, bool saved_attention = false) {
  DeviceModel dm;
  dm.saved_attention = saved_attention;
  dm.elem_bytes = 4;  // the CPU backend computes in fp32
  dm.scratch_elem_bytes = 4;
  dm.mlp_chunk_tokens = kChunk;
  return layer_costs(estimate_layers(model_shape_from_config(m.config), s.n_seq, s.seq_len, dm));
}

TEST(StageMemory, WorkerAllocatesThePlannersWorkingSet) {
  for (bool saved : {false, true})
    for (bool tied : {true, false})
      for (int64_t M : {1, 2, 3}) {
        const ModelLayout m = make_layout(tiny_config(true, tied, 4));  // layers: 0 embedding, 1-4, 5 tail
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
        const IterationPlan plan = make_default_plan(m.num_layers(), 1);
        auto pb = std::make_shared<PassBuffers>(m, plan, M, shape, DType::f32);
        const auto costs = cpu_costs(m, shape, saved);
        PartitionOptions po;
        po.micro_batches = M;
        po.alloc_granule = int64_t(dev->allocation_granule());
        const std::vector<Stage> stages = {{StageKind::forward, 0, 0},  {StageKind::forward, 0, 2},
                                           {StageKind::forward, 1, 3},  {StageKind::tail, 5, 5},
                                           {StageKind::tail, 4, 5},     {StageKind::tail, 2, 5},
                                           {StageKind::backward, 0, 0}, {StageKind::backward, 0, 2},
                                           {StageKind::backward, 1, 1}, {StageKind::backward, 1, 3}};
        for (const Stage& st : stages) {
          SCOPED_TRACE(fmt::format("{} stage {}-{}, tied {}, M {}, saved attention {}",
                                   stage_kind_name(st.kind), st.first, st.last, tied, M, saved));
          const size_t before = dev->used_bytes();
          {
            Task t;
            t.rs.stage = st;
            t.rs.buffers = pb;
            t.layers = st.layers();
            t.M = M;
            t.groups = m.groups_uploaded(t.layers, st.kind == StageKind::backward);
            if (st.kind != StageKind::forward) t.grad_groups = m.groups_of(t.layers);
            for (int g : t.groups)
              t.dparam.emplace(g, DeviceBuffer(*dev, size_t(m.groups[size_t(g)].numel) * 4));
            allocate_work(ctx, t);
            const int64_t got = int64_t(dev->used_bytes() - before);
            const StageEstimate e = estimate_stage(costs, st, po);
            // a tied tail's two groups are charged one by one, the model charges their sum
            EXPECT_NEAR(double(got), double(e.work_bytes), 512.0);
            dev->stream(StreamKind::compute).synchronize();  // the accumulators' zero fill
          }
          EXPECT_EQ(dev->used_bytes(), before);
        }
      }
}

// Frozen groups: the worker holds a frozen group's compute-dtype copy and the staging buffer
// its storage form is uploaded into, and no gradient accumulator; the planner's working set
// (apply_frozen_groups) is the same.
TEST(StageMemory, FrozenGroupsWorkingSetMatchesTheWorker) {
  for (bool tied : {true, false}) {
    ModelLayout m = make_layout(tiny_config(true, tied, 4));
    freeze_group(m, 0, WeightFormat::bf16);
    freeze_group(m, 2, WeightFormat::q8_0);
    freeze_group(m, 5, WeightFormat::q8_0);
    freeze_group(m, 3, WeightFormat::f32);  // the f32 device's compute copy itself: no staging
    const MicroBatchShape shape{2, 6};
    std::vector<std::unique_ptr<Layer>> layers;
    LayerOptions lo;
    lo.mlp_chunk_tokens = kChunk;
    for (int l = 0; l < m.num_layers(); ++l) layers.push_back(make_layer(m, l, lo));
    DeviceOptions dopt;
    dopt.capacity_bytes = size_t(1) << 30;
    auto dev = make_cpu_device(0, dopt);
    WorkerContext ctx;
    ctx.device = dev.get();
    ctx.layout = &m;
    ctx.layers = &layers;
    const IterationPlan plan = make_default_plan(m.num_layers(), 1);
    auto pb = std::make_shared<PassBuffers>(m, plan, 2, shape, DType::f32);
    auto costs = cpu_costs(m, shape);
    const auto plain = costs;
    apply_frozen_groups(costs, m, DType::f32, 4);
    EXPECT_EQ(costs[1], plain[1]);  // a trainable decoder keeps the analytic numbers
    EXPECT_EQ(costs[2].grad_bytes, 0);
    EXPECT_EQ(costs[2].staging_bytes, m.groups[2].storage_bytes);
    EXPECT_EQ(costs[3].grad_bytes, 0);
    EXPECT_EQ(costs[3].staging_bytes, 0);
    EXPECT_EQ(costs[3].frozen_weight_bytes, 0);
    EXPECT_EQ(costs[3].weight_bytes, m.groups[3].numel * 4);
    PartitionOptions po;
    po.micro_batches = 2;
    po.alloc_granule = int64_t(dev->allocation_granule());
    for (const Stage& st :
         {Stage{StageKind::forward, 0, 2}, Stage{StageKind::tail, 4, 5}, Stage{StageKind::tail, 2, 5},
          Stage{StageKind::backward, 0, 2}, Stage{StageKind::backward, 2, 2}}) {
      SCOPED_TRACE(fmt::format("{} stage {}-{}, tied {}", stage_kind_name(st.kind), st.first, st.last, tied));
      const size_t before = dev->used_bytes();
      int64_t uploaded = 0;
      {
        Task t;  // as Worker::prepare builds it
        t.rs.stage = st;
        t.rs.buffers = pb;
        t.layers = st.layers();
        t.M = 2;
        t.groups = m.groups_uploaded(t.layers, st.kind == StageKind::backward);
        if (st.kind != StageKind::forward)
          for (int g : m.groups_of(t.layers))
            if (!m.groups[size_t(g)].frozen) t.grad_groups.push_back(g);
        for (int g : t.groups) {
          const ParamGroup& grp = m.groups[size_t(g)];
          t.dparam.emplace(g, DeviceBuffer(*dev, size_t(grp.numel) * 4));
          if (const int64_t st = grp.storage_bytes - grp.direct_bytes(DType::f32); grp.frozen && st > 0)
            t.dstage.emplace(g, DeviceBuffer(*dev, size_t(st)));
          uploaded += grp.frozen ? grp.storage_bytes : grp.numel * 4;
        }
        allocate_work(ctx, t);
        const int64_t got = int64_t(dev->used_bytes() - before);
        const StageEstimate e = estimate_stage(costs, st, po);
        EXPECT_NEAR(double(got), double(e.work_bytes), 1024.0);
        EXPECT_NEAR(double(e.weight_upload_bytes), double(uploaded), 1024.0);  // trainable weights as charged
        dev->stream(StreamKind::compute).synchronize();
      }
      EXPECT_EQ(dev->used_bytes(), before);
    }
  }
}

// Explicit plans at a cap just above their largest predicted working set: the run completes
// (a stage that did not fit would fail the run, or wait for memory forever) and the measured
// peak lies within 5% of the prediction.
TEST(StageMemory, PlansRunUnderACapJustAboveTheirPredictedPeak) {
  for (bool frozen : {false, true}) {
    ModelLayout m = make_layout(tiny_config(true, true, 4));
    if (frozen) {  // the tied embedding in bf16, a decoder in q8_0, one in f32 (uploaded as it is)
      freeze_group(m, 0, WeightFormat::bf16);
      freeze_group(m, 2, WeightFormat::q8_0);
      freeze_group(m, 3, WeightFormat::f32);
    }
    const MicroBatchShape shape{2, 6};
    const std::vector<IterationPlan> plans = {
        plan_from_json(
            nlohmann::json::parse(R"({"forward": [[0, 2]], "tail": [3, 5], "backward": [[2, 1], [0, 0]]})"),
            m.num_layers(), 2, "p"),
        plan_from_json(
            nlohmann::json::parse(R"({"forward": [[0, 0], [1, 1]], "tail": [2, 5], "backward": [[1, 0]]})"),
            m.num_layers(), 2, "p"),
        make_default_plan(m.num_layers(), 2)};
    for (bool saved : {false, true})
      for (const auto& plan : plans) {
        SCOPED_TRACE(plan.summary() + (saved ? ", saved attention" : "") + (frozen ? ", frozen groups" : ""));
        auto costs = cpu_costs(m, shape, saved);
        apply_frozen_groups(costs, m, DType::f32, 4);
        PartitionOptions po;
        po.micro_batches = 3;
        int64_t predicted = 0;
        for (auto& e : check_plan(costs, plan, po, "plan")) predicted = std::max(predicted, e.work_bytes);
        SessionOptions o;
        o.backend = "cpu";
        o.workers = 2;
        o.micro_batches = 3;
        o.micro = shape;
        o.plan = plan;
        o.mlp_chunk_tokens = kChunk;
        o.save_attention = saved;
        o.device.capacity_bytes = size_t(double(predicted) * 1.01) + 4096;
        o.adam = adam_opts();
        Session s(m, random_weights(m, 5), o);
        std::vector<int32_t> ids(size_t(3 * shape.tokens())), tg(ids.size());
        for (size_t i = 0; i < ids.size(); ++i)
          ids[i] = int32_t(i * 7 % 67), tg[i] = int32_t((i * 7 + 3) % 67);
        for (int step = 0; step < 3; ++step) {
          s.forward_backward(ids, tg);
          s.step(1e-3);
        }
        EXPECT_NO_THROW(s.wait(2));
        const double peak = double(s.peak_device_bytes());
        EXPECT_LE(peak, double(o.device.capacity_bytes));
        EXPECT_GE(peak, 0.95 * double(predicted)) << "measured " << peak << " predicted " << predicted;
      }
  }
}

}  // namespace
}  // namespace rp::test
