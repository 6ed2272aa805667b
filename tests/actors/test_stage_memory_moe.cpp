// The planner's memory model and the worker agree for mixture-of-experts (Qwen3-MoE) models,
// as tests/actors/test_stage_memory.cpp checks for dense ones: per stage kind, the bytes a
// worker allocates for a stage task equal the partitioner's work_bytes (sparse decoders: all
// experts' weights, the sparse block's scratch), with full fine-tuning and with LoRA on an
// nf4 base, with and without the padded expert layout; and a run whose cap is just above the
// largest predicted working set completes (the LoRA one with the padded layout).
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
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

constexpr int64_t kChunk = 5;  // decoders' MLP chunk (tokens): exercises the chunked sparse block

// 4 decoders: 0, 2, 3 sparse (4 experts, top-2), 1 dense (mlp_only_layers)
ModelLayout moe_layout(bool tied, bool lora) {
  const ModelConfig c = tiny_moe_config(4, tied);
  if (!lora) return make_layout(c);
  LoraConfig lc;
  lc.r = 4;
  lc.dropout = 0.1;
  lc.target_modules = {"all-linear"};
  lc.base_format = WeightFormat::nf4;
  return make_layout(c, lc);
}

// The planner's costs of m as the CPU backend runs it (fp32), frozen groups applied.
std::vector<LayerCost> planned_costs(const ModelLayout& m, MicroBatchShape s, bool saved_attention,
                                     bool padded = false) {
  DeviceModel dm;
  dm.saved_attention = saved_attention;
  dm.expert_padded = padded;
  dm.elem_bytes = 4;
  dm.scratch_elem_bytes = 4;
  dm.mlp_chunk_tokens = kChunk;
  lora_device_model(dm, m);
  auto costs = layer_costs(estimate_layers(model_shape_from_config(m.config), s.n_seq, s.seq_len, dm));
  apply_frozen_groups(costs, m, DType::f32, 4);
  return costs;
}

TEST(StageMemoryMoe, WorkerAllocatesThePlannersWorkingSet) {
  for (bool lora : {false, true})
    for (bool saved : {false, true})
      for (bool tied : {true, false}) {
        const bool padded = saved != tied;  // the padded expert layout's buffers in half the cases
        const ModelLayout m = moe_layout(tied, lora);
        const MicroBatchShape shape{2, 6};
        std::vector<std::unique_ptr<Layer>> layers;
        LayerOptions lo;
        lo.mlp_chunk_tokens = kChunk;
        lo.save_attention = saved;
        lo.expert_padded = padded;
        for (int l = 0; l < m.num_layers(); ++l) layers.push_back(make_layer(m, l, lo));
        DeviceOptions dopt;
        dopt.capacity_bytes = size_t(1) << 30;
        auto dev = make_cpu_device(0, dopt);
        WorkerContext ctx;
        ctx.device = dev.get();
        ctx.layout = &m;
        ctx.layers = &layers;
        ctx.saved_attention = saved;
        const int64_t M = 2;
        const IterationPlan plan = make_default_plan(m.num_layers(), 1);
        auto pb = std::make_shared<PassBuffers>(m, plan, M, shape, DType::f32);
        const auto costs = planned_costs(m, shape, saved, padded);
        PartitionOptions po;
        po.micro_batches = M;
        po.alloc_granule = int64_t(dev->allocation_granule());
        for (const Stage& st : {Stage{StageKind::forward, 0, 2}, Stage{StageKind::forward, 1, 1},
                                Stage{StageKind::forward, 3, 4}, Stage{StageKind::tail, 5, 5},
                                Stage{StageKind::tail, 2, 5}, Stage{StageKind::backward, 0, 2},
                                Stage{StageKind::backward, 2, 2}, Stage{StageKind::backward, 1, 4}}) {
          SCOPED_TRACE(fmt::format("{} stage {}-{}, LoRA {}, tied {}, saved attention {}, padded {}",
                                   stage_kind_name(st.kind), st.first, st.last, lora, tied, saved, padded));
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
              // as the worker stages them: what is not the f32 compute copy itself
              if (const int64_t st = grp.storage_bytes - grp.direct_bytes(DType::f32); grp.frozen && st > 0)
                t.dstage.emplace(g, DeviceBuffer(*dev, size_t(st)));
            }
            allocate_work(ctx, t);
            const int64_t got = int64_t(dev->used_bytes() - before);
            const StageEstimate e = estimate_stage(costs, st, po);
            // a tied tail's two groups are charged one by one, the model charges their sum
            EXPECT_NEAR(double(got), double(e.work_bytes), 512.0);
            dev->stream(StreamKind::compute).synchronize();
          }
          EXPECT_EQ(dev->used_bytes(), before);
        }
      }
}

TEST(StageMemoryMoe, PlansRunUnderACapJustAboveTheirPredictedPeak) {
  for (bool lora : {false, true}) {
    const bool padded = lora;  // "expert_gemm": "bucketed" with the LoRA run
    const ModelLayout m = moe_layout(true, lora);
    const MicroBatchShape shape{2, 6};
    const IterationPlan plan =
        plan_from_json(nlohmann::json::parse(
                           R"({"forward": [[0, 1], [2, 2]], "tail": [3, 5], "backward": [[2, 2], [1, 0]]})"),
                       m.num_layers(), 2, "p");
    SCOPED_TRACE(plan.summary() + (lora ? ", LoRA on nf4" : ""));
    const auto costs = planned_costs(m, shape, true, padded);
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
    o.save_attention = true;
    o.device.capacity_bytes = size_t(double(predicted) * 1.01) + 4096;
    o.device.expert_gemm_bucketed = padded;
    o.adam = adam_opts();
    Session s(m, random_weights(m, 5), o);
    std::vector<int32_t> ids(size_t(3 * shape.tokens())), tg(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 % 67), tg[i] = int32_t((i * 7 + 3) % 67);
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

}  // namespace
}  // namespace rp::test
