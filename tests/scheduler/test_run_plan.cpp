// The run plan (scheduler/run_plan.hpp) the Session, `roundpipe plan` and bench_throughput
// share: its plan is the partition of the analytic costs (or the explicit / uniform plan), its
// host need is the one `roundpipe plan` prints (host_memory_need), and its checks refuse what
// the Session refused.
#include <gtest/gtest.h>

#include <string>

#include "kernels/device.hpp"
#include "model/config.hpp"
#include "scheduler/gpu_presets.hpp"
#include "scheduler/host_memory.hpp"
#include "scheduler/replan.hpp"
#include "scheduler/run_plan.hpp"

namespace rp {
namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.architecture = "qwen3";
  c.qk_norm = true;
  c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 192, c.num_hidden_layers = 6;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
  c.tie_word_embeddings = true;
  return c;
}

RunPlanInputs inputs(const ModelLayout& m) {
  RunPlanInputs in;
  in.layout = &m;
  in.micro = {2, 256};
  in.micro_batches = 4;
  in.workers = 2;
  in.device = backend_device_model("cuda", 0, DType::bf16);
  in.alloc_granule = int64_t(kCudaPoolGranule);
  in.save_attention = true;
  return in;
}

// What the three callers each computed before they shared plan_run: the analytic costs of
// the layout, frozen groups applied, partitioned automatically.
PartitionResult partition_as_before(const ModelLayout& m, const RunPlanInputs& in, bool saved_attention) {
  DeviceModel d = in.device;
  d.saved_attention = saved_attention;
  lora_device_model(d, m);
  auto costs =
      layer_costs(estimate_layers(model_shape_from_config(m.config), in.micro.n_seq, in.micro.seq_len, d));
  apply_frozen_groups(costs, m, in.compute, d.grad_elem_bytes);
  PartitionOptions po;
  po.gpus = in.workers;
  po.micro_batches = in.micro_batches;
  po.memory_cap = in.device_capacity;
  po.pcie_bandwidth = d.pcie_bandwidth;
  po.alloc_granule = in.alloc_granule;
  return automatic_partition(costs, po);
}

TEST(RunPlan, AutomaticPlanIsThePartitionOfTheAnalyticCosts) {
  const ModelLayout full = make_layout(tiny());
  LoraConfig lora;
  lora.r = 4;
  lora.target_modules = {"all-linear"};
  const ModelLayout adapted = make_layout(tiny(), lora);
  for (const ModelLayout* m : {&full, &adapted}) {
    for (bool saved : {true, false}) {
      RunPlanInputs in = inputs(*m);
      in.save_attention = saved;
      const RunPlan r = plan_run(in);
      const PartitionResult before = partition_as_before(*m, in, saved);
      EXPECT_EQ(r.plan.summary(), before.plan.summary());
      ASSERT_TRUE(r.automatic);
      EXPECT_DOUBLE_EQ(r.automatic->objective, before.objective);
      EXPECT_EQ(r.saved_attention, saved);
      EXPECT_EQ(r.device.saved_attention, saved);
      EXPECT_TRUE(r.log_line.empty());
      EXPECT_EQ(r.costs, r.analytic);
      EXPECT_EQ(int(r.analytic.size()), m->num_layers());
    }
  }
}

TEST(RunPlan, ExplicitPlanIsKeptAndChecked) {
  const ModelLayout m = make_layout(tiny());
  RunPlanInputs in = inputs(m);
  in.plan = make_default_plan(m.num_layers(), 2);
  const RunPlan r = plan_run(in);
  EXPECT_EQ(r.plan.summary(), in.plan->summary());
  EXPECT_FALSE(r.automatic);
  in.plan = make_default_plan(m.num_layers() + 1, 2);
  try {
    plan_run(in);
    FAIL() << "a plan of the wrong depth was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the model has 8"), std::string::npos) << e.what();
  }
  in.layout = nullptr;
  EXPECT_THROW(plan_run(in), std::invalid_argument);
}

TEST(RunPlan, NoPlanUnderTheCapFallsBackToTheUniformPlanOrThrows) {
  const ModelLayout m = make_layout(tiny());
  RunPlanInputs in = inputs(m);
  in.device_capacity = 1 << 20;  // below one weight granule: nothing fits
  EXPECT_THROW(plan_run(in), std::runtime_error);
  in.uniform_fallback = true;
  const RunPlan r = plan_run(in);
  EXPECT_EQ(r.plan.summary(), make_default_plan(m.num_layers(), 2).summary());
  EXPECT_FALSE(r.automatic);
  EXPECT_NE(r.log_line.find("starting from the uniform plan " + r.plan.summary()), std::string::npos)
      << r.log_line;
}

// The host need is what `roundpipe plan` prints for the same run (host_memory_need) less the
// fp32 masters the caller hands over, plus the weight prediction's last update.
TEST(RunPlan, HostNeedIsThePlanCommandsHostMemoryNeed) {
  const ModelLayout full = make_layout(tiny());
  LoraConfig lora;
  lora.r = 8;
  const ModelLayout adapted = make_layout(tiny(), lora);
  for (const ModelLayout* m : {&full, &adapted})
    for (int workers : {1, 3})
      for (bool saved : {false, true}) {
        RunPlanInputs in = inputs(*m);
        in.workers = workers;
        in.save_attention = saved;
        in.host = HostBudget{2, false, 0, false};
        const RunPlan r = plan_run(in);
        HostRun run;
        run.seq_len = 256, run.sequences_per_micro = 2, run.micro_batches = 4, run.workers = workers;
        run.pass_slots = 2, run.saved_attention = saved, run.elem_bytes = 2;
        const HostMemoryNeed n = host_memory_need(*m, run);
        EXPECT_DOUBLE_EQ(n.master, 4.0 * double(n.trainable_params));
        EXPECT_DOUBLE_EQ(double(r.host_bytes), n.total() - n.master) << workers << " " << saved;
        in.host->weight_prediction = true;
        EXPECT_DOUBLE_EQ(double(plan_run(in).host_bytes), n.total());  // + 4 per trainable parameter
      }
}

TEST(RunPlan, SavedAttentionIsOnWhenItFitsAndTheNeedIsChecked) {
  const ModelLayout m = make_layout(tiny());
  RunPlanInputs in = inputs(m);
  in.save_attention.reset();
  in.host = HostBudget{2, false, 0, false};
  EXPECT_TRUE(plan_run(in).saved_attention);  // nothing known about the host: on
  in.save_attention = false;
  const size_t without = plan_run(in).host_bytes;
  in.save_attention = true;
  const size_t with = plan_run(in).host_bytes;
  ASSERT_GT(with, without);
  in.save_attention.reset();
  in.host->available_bytes = size_t(double(with) / 0.9) + 16;
  EXPECT_TRUE(plan_run(in).saved_attention);
  in.host->available_bytes = with;  // fits, but not within 90%: recomputed instead
  const RunPlan r = plan_run(in);
  EXPECT_FALSE(r.saved_attention);
  EXPECT_EQ(r.host_bytes, without);
  in.host->available_bytes = without - 1;
  try {
    plan_run(in);
    FAIL() << "a host need over the budget was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("host memory: the session needs about"), std::string::npos)
        << e.what();
  }
}

// The CPU backend's virtual GPUs are host memory too: each worker's largest stage.
TEST(RunPlan, CpuBackendCountsItsVirtualGpus) {
  const ModelLayout m = make_layout(tiny());
  RunPlanInputs in = inputs(m);
  in.compute = DType::f32;
  in.device = backend_device_model("cpu", 0, DType::f32);
  in.alloc_granule = 256;
  in.device_capacity = int64_t(1) << 30;
  in.host = HostBudget{2, false, 0, true};
  const RunPlan r = plan_run(in);
  int64_t largest = 0;
  for (const Stage& st : r.plan.stages)
    largest = std::max(largest, estimate_stage(r.analytic, st, r.partition).memory_bytes);
  ASSERT_GT(largest, 0);
  EXPECT_EQ(r.device_arena_bytes, size_t(largest) * 2);
  in.host->available_bytes = r.host_bytes + r.device_arena_bytes - 1;
  try {
    plan_run(in);
    FAIL() << "virtual GPUs over the host budget were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("virtual GPUs running plan"), std::string::npos) << e.what();
  }
}

TEST(RunPlan, BackendDeviceModels) {
  const DeviceModel cuda = backend_device_model("cuda", 5e9, DType::f16);
  EXPECT_DOUBLE_EQ(cuda.peak_flops, DeviceModel{}.peak_flops);
  EXPECT_DOUBLE_EQ(cuda.pcie_bandwidth, DeviceModel{}.pcie_bandwidth);  // the CPU link's throttle only
  EXPECT_EQ(cuda.elem_bytes, 2);
  const DeviceModel cpu = backend_device_model("cpu", 5e9, DType::f32);
  EXPECT_DOUBLE_EQ(cpu.pcie_bandwidth, 5e9);
  EXPECT_EQ(cpu.elem_bytes, 4);
  EXPECT_EQ(cpu.scratch_elem_bytes, 4);
  EXPECT_LT(cpu.peak_flops, cuda.peak_flops);
  // FP8 linears: planned at the measured FP8 rate (their caches and scratch in stage memory);
  // weight gradients only with fp8
  EXPECT_EQ(cuda.fp8_flops, 0);
  const DeviceModel f8 = backend_device_model("cuda", 0, DType::bf16, true);
  EXPECT_DOUBLE_EQ(f8.fp8_flops, kFp8SpeedupH200 * f8.peak_flops);
  EXPECT_FALSE(f8.fp8_weight_gradients);
  EXPECT_TRUE(backend_device_model("cuda", 0, DType::bf16, true, true).fp8_weight_gradients);
  EXPECT_FALSE(backend_device_model("cuda", 0, DType::bf16, false, true).fp8_weight_gradients);
}

}  // namespace
}  // namespace rp
