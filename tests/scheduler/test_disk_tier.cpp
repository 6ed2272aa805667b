// The disk tier of a plan (scheduler/disk_tier.hpp): which frozen bytes stream and how often,
// against sizes worked out by hand from a model's shapes; the attention drop and the spill at
// the edges of the budget; the budget too small for the ring; the simulator's shared disk
// (the step follows the disk when it is slow and the compute when it is fast, a faster disk
// is never slower); the partitioner charging a stage its disk reads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "model/config.hpp"
#include "model/lora.hpp"
#include "scheduler/disk_tier.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/simulator.hpp"
#include "tests/scheduler/stage_plans.hpp"

namespace rp {
namespace {

// LLaMA-3.1-8B: H 4096, FFN 14336, 32 layers, 32 q / 8 kv heads x 128, vocab 128256, untied.
constexpr double H = 4096, F = 14336, KV = 8 * 128, V = 128256;
// bf16 storage of one frozen group: its 2-D matrices in bf16, its 1-D norms in f32 after a
// bf16 prefix of the group's whole element count (freeze_group).
constexpr double kDecoder = 2 * (2 * H * H + 2 * H * KV + 3 * H * F + 2 * H) + 4 * (2 * H);
constexpr double kEmbedding = 2 * V * H;
constexpr double kTail = 2 * (V * H + H) + 4 * H;
// One read buffer: the largest frozen group (the tail's), rounded up to 4 KiB.
const double kBuffer = std::ceil(kTail / 4096) * 4096;

ModelLayout llama_lora() {
  LoraConfig lc;
  lc.r = 16;
  lc.alpha = 16;
  set_lora_targets(lc, {"all-linear"});
  lc.base_format = WeightFormat::bf16;
  return make_layout(load_config_file(std::string(RP_SOURCE_DIR) + "/examples/configs/llama-3.1-8b.json"),
                     lc);
}

// F[0-16] T[17-33] B[16-9] B[8-0] over the 34 compute layers.
IterationPlan llama_plan() {
  IterationPlan p;
  p.num_layers = 34;
  p.stages = {{StageKind::forward, 0, 16},
              {StageKind::tail, 17, 33},
              {StageKind::backward, 9, 16},
              {StageKind::backward, 0, 8}};
  validate_plan(p, "test plan");
  return p;
}

HostRun llama_run() {
  HostRun r;
  r.lora_r = 16;
  r.seq_len = 4096;
  r.micro_batches = 8;
  r.workers = 4;
  return r;
}

TEST(DiskTier, StageReadsAreTheFrozenGroupsEachStageUploads) {
  const std::vector<int64_t> reads = stage_frozen_reads(llama_lora(), llama_plan());
  ASSERT_EQ(reads.size(), 4u);
  EXPECT_EQ(double(reads[0]), kEmbedding + 16 * kDecoder);  // the embedding and decoders 0..15
  EXPECT_EQ(double(reads[1]), 16 * kDecoder + kTail);       // decoders 16..31 and the tail
  EXPECT_EQ(double(reads[2]), 8 * kDecoder);                // decoders 8..15, read again
  EXPECT_EQ(double(reads[3]), 8 * kDecoder);  // decoders 0..7; the embedding's backward reads none
}

TEST(DiskTier, ASmallBudgetStreamsEveryFrozenGroupOncePerStage) {
  const ModelLayout m = llama_lora();
  const HostRun run = llama_run();
  const HostMemoryNeed need = host_memory_need(m, run);
  DiskTier t;
  t.read_bandwidth = 3e9;
  t.write_bandwidth = 1.5e9;
  t.ring_buffers = 1;
  t.automatic_attention = false;  // the attention kept while it fits (save_attention asked for)
  const double trainable = need.master + need.moments + need.weights + need.gradients;
  const double ring = kBuffer;                                           // one buffer of the largest group
  t.host_budget = trainable + ring + need.activations + need.attention;  // no room for any frozen group
  const DiskPlan d = plan_disk_tier(m, run, t, llama_plan());
  ASSERT_TRUE(d.fits);
  EXPECT_DOUBLE_EQ(d.ring_bytes, ring);
  EXPECT_EQ(d.resident_bytes, 0);
  EXPECT_FALSE(d.attention_dropped);
  EXPECT_EQ(d.spill_bytes, 0);
  const double stream = kEmbedding + 48 * kDecoder + kTail;
  EXPECT_DOUBLE_EQ(d.read_bytes, stream);
  EXPECT_DOUBLE_EQ(d.seconds, stream / 3e9);
  // everything fits: nothing streams, no ring
  t.host_budget = need.total();
  const DiskPlan all = plan_disk_tier(m, run, t, llama_plan());
  EXPECT_EQ(all.read_bytes, 0);
  EXPECT_EQ(all.ring_bytes, 0);
  EXPECT_DOUBLE_EQ(all.resident_bytes, need.frozen);
  // room for exactly one decoder's group: it stays and is read neither forward nor backward
  t.host_budget = trainable + ring + need.activations + need.attention + kDecoder;
  const DiskPlan one = plan_disk_tier(m, run, t, llama_plan());
  EXPECT_DOUBLE_EQ(one.resident_bytes, kDecoder);
  EXPECT_DOUBLE_EQ(one.read_bytes, stream - 2 * kDecoder);
}

TEST(DiskTier, TheLargestFrozenGroupIsOneReadBufferAndNamed) {
  std::string name = "untouched";
  EXPECT_DOUBLE_EQ(largest_frozen_group(llama_lora(), &name), kBuffer);
  EXPECT_EQ(name, "head") << "the tail's group (the head and the final norm) is the largest";
  ModelLayout none = llama_lora();
  for (ParamGroup& g : none.groups) g.frozen = false;
  name = "untouched";
  EXPECT_EQ(largest_frozen_group(none, &name), 0);
  EXPECT_EQ(name, "untouched");
}

TEST(DiskTier, TokensToHideFollowTheModelsShapes) {
  // the 8B's frozen stream of the plan above, 8 GPUs, 0.2 ms of compute per token on all stages
  const double stream = kEmbedding + 48 * kDecoder + kTail, c = 2e-4;
  const double n = tokens_to_hide(stream, 0, c, 8, 7e9, 7e9);
  // 23.04e9 B / 7e9 B/s = 3.29 s of disk; a token is 0.2 ms / 8 GPUs = 25 us of step: 131,667 tokens
  EXPECT_EQ(n, std::ceil(stream / 7e9 / (c / 8)));
  EXPECT_EQ(n, 131667);
  // a spill of 1 KB per token costs 1/7e9 + 1/3.5e9 s per token of the 25 us
  const double spill = tokens_to_hide(stream, 1000, c, 8, 7e9, 3.5e9);
  EXPECT_EQ(spill, std::ceil(stream / 7e9 / (c / 8 - 1000 / 7e9 - 1000 / 3.5e9)));
  EXPECT_TRUE(std::isinf(tokens_to_hide(stream, 1e6, c, 8, 7e9, 7e9)));  // 0.43 ms of disk per token
  EXPECT_EQ(tokens_to_hide(0, 0, c, 8, 7e9, 7e9), 0);
}

TEST(DiskTier, SavedAttentionIsDroppedFirstThenActivationsSpillAtTheBudgetsEdges) {
  const ModelLayout m = llama_lora();
  const HostRun run = llama_run();
  const HostMemoryNeed need = host_memory_need(m, run);
  ASSERT_GT(need.attention, 0);
  DiskTier t;
  t.read_bandwidth = 7e9;
  t.ring_buffers = 1;
  t.automatic_attention = false;  // the attention kept while it fits (save_attention asked for)
  const double fixed = need.master + need.moments + need.weights + need.gradients + kBuffer;  // and the ring
  t.host_budget = fixed + need.activations + need.attention;                                  // exactly both
  DiskPlan d = plan_disk_tier(m, run, t, llama_plan());
  EXPECT_TRUE(d.saved_attention);
  EXPECT_FALSE(d.attention_dropped);
  EXPECT_EQ(d.spill_bytes, 0);
  t.host_budget -= 1;  // a byte short: the attention goes, the activations stay
  d = plan_disk_tier(m, run, t, llama_plan());
  EXPECT_TRUE(d.attention_dropped);
  EXPECT_FALSE(d.saved_attention);
  EXPECT_EQ(d.spill_bytes, 0);
  EXPECT_DOUBLE_EQ(d.activation_bytes, need.activations);
  t.host_budget = fixed + need.activations;  // exactly the activations
  d = plan_disk_tier(m, run, t, llama_plan());
  EXPECT_TRUE(d.attention_dropped);
  EXPECT_EQ(d.spill_bytes, 0);
  // 2 KiB short: whole layers' saved inputs spill, one layer's 2 slots x 8 micro-batches x
  // 4096 x 4096 x 2 bytes = 512 MiB; its staging, 4 workers x (4 write + 4 read) records of one
  // micro-batch and slot (32 MiB) = 1 GiB, takes two layers' more room: 3 spill, written and read
  // back once per iteration (one pass slot's share, 256 MiB each)
  t.host_budget = fixed + need.activations - 2048;
  d = plan_disk_tier(m, run, t, llama_plan());
  const double MiB = 1 << 20;
  EXPECT_EQ(d.spilled_layers, 3);
  EXPECT_DOUBLE_EQ(d.staging_bytes, 4 * 8 * 32 * MiB);
  EXPECT_DOUBLE_EQ(d.spill_bytes, 3 * 256 * MiB);
  const double stream = kEmbedding + 48 * kDecoder + kTail;
  EXPECT_DOUBLE_EQ(d.read_bytes, stream + d.spill_bytes);
  EXPECT_DOUBLE_EQ(d.write_bytes, d.spill_bytes);
  EXPECT_DOUBLE_EQ(d.seconds, (stream + d.spill_bytes) / 7e9 + d.spill_bytes / 7e9);
}

TEST(DiskTier, ABudgetBelowTheTrainableStateAndTheRingDoesNotFit) {
  const ModelLayout m = llama_lora();
  const HostRun run = llama_run();
  const HostMemoryNeed need = host_memory_need(m, run);
  DiskTier t;
  t.read_bandwidth = 7e9;
  const double minimum = need.master + need.moments + need.weights + need.gradients + 2 * kBuffer;
  t.host_budget = minimum;
  DiskPlan d = plan_disk_tier(m, run, t, llama_plan());
  EXPECT_DOUBLE_EQ(d.minimum_budget, minimum);
  // no room for any activation: the spill cannot take them all (layer 0's input and the two sets
  // of boundary gradients stay, 2 x 512 MiB), and spilling the other 33 layers takes staging
  // buffers, 4 workers x (4 write + 33 read) records of 32 MiB: as the runtime, refused
  const double MiB = 1 << 20;
  EXPECT_FALSE(d.fits);
  EXPECT_NEAR(d.least_budget, minimum + 2 * 512 * MiB + 4 * 37 * 32 * MiB, 16);
  t.host_budget = d.least_budget;
  d = plan_disk_tier(m, run, t, llama_plan());
  EXPECT_TRUE(d.fits);
  EXPECT_EQ(d.spilled_layers, 33);
  EXPECT_DOUBLE_EQ(d.spill_bytes, 33 * 256 * MiB);
  t.host_budget = minimum - 1;
  EXPECT_FALSE(plan_disk_tier(m, run, t, llama_plan()).fits);
}

SimOptions disk_options(int gpus, double bw) {
  SimOptions o;
  o.gpus = gpus;
  o.micro_batches = 4;
  o.iterations = 16;  // past the transient of a queue on the disk
  o.disk_read_bandwidth = o.disk_write_bandwidth = bw;
  return o;
}

TEST(DiskTierSimulator, ASlowDiskBoundsTheStepAndAFastOneHides) {
  const IterationPlan p = plan_with_stages(4);
  std::vector<StageCost> c(4, StageCost{1e-3, 0, 0, 0, 0});  // 4 ms a stage
  for (auto& x : c) x.disk_read_bytes = 50'000'000;
  const double none = simulate(p, c, disk_options(2, 0)).iteration_seconds;
  EXPECT_NEAR(none, 8e-3, 1e-9);  // two stages of 4 ms on each of 2 GPUs
  // 1 GB/s: 50 ms a read, four reads on the host's one disk (not two per GPU in parallel)
  EXPECT_NEAR(simulate(p, c, disk_options(2, 1e9)).iteration_seconds, 0.2, 1e-6);
  EXPECT_NEAR(simulate(p, c, disk_options(1, 1e9)).iteration_seconds, 0.2, 1e-6);
  // 100 GB/s: 0.5 ms a read, prefetched under the 4 ms of compute: the step without the disk
  EXPECT_NEAR(simulate(p, c, disk_options(2, 100e9)).iteration_seconds, none, 1e-9);
  // a forward stage's spill is written after each micro-batch and read back by a backward
  // stage before it: 4 x 25 MB each way more on the disk
  c[0].spill_write_bytes = 25'000'000;
  c[3].spill_read_bytes = 25'000'000;
  EXPECT_NEAR(simulate(p, c, disk_options(2, 1e9)).iteration_seconds, 0.4, 1e-6);
  SimOptions slow_write = disk_options(2, 1e9);
  slow_write.disk_write_bandwidth = 0.5e9;
  EXPECT_NEAR(simulate(p, c, slow_write).iteration_seconds, 0.5, 1e-6);
  // fast: the spill streams under the compute too
  EXPECT_NEAR(simulate(p, c, disk_options(2, 100e9)).iteration_seconds, none, 1e-9);
}

TEST(DiskTierSimulator, AFasterDiskIsNeverPredictedSlower) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const int S = 3 + int(u(rng) * 6), G = 1 + int(u(rng) * 4);
    const IterationPlan p = plan_with_stages(S);
    std::vector<StageCost> c(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) {
      const StageKind k = p.stages[size_t(s)].kind;
      c[size_t(s)] = {1e-3 * (0.2 + u(rng)), int64_t(1e6 * u(rng)), int64_t(1e6 * u(rng)),
                      int64_t(1e8 * u(rng)), k == StageKind::forward ? 0 : int64_t(1e8 * u(rng))};
      c[size_t(s)].disk_read_bytes = int64_t(1e8 * u(rng));
      if (k == StageKind::forward && u(rng) < 0.5) c[size_t(s)].spill_write_bytes = int64_t(1e7 * u(rng));
      if (k == StageKind::backward && u(rng) < 0.5) c[size_t(s)].spill_read_bytes = int64_t(1e7 * u(rng));
    }
    SimOptions o = disk_options(G, 0);
    o.micro_batches = 1 + int64_t(u(rng) * 8);
    o.bandwidth = StreamBandwidths::uniform(20e9);
    o.disk_ring = 1 + int(u(rng) * 3);
    double last = INFINITY;
    for (double bw : {0.5e9, 1e9, 2e9, 3e9, 7e9, 14e9, 50e9}) {
      o.disk_read_bandwidth = o.disk_write_bandwidth = bw;
      const double t = simulate(p, c, o).iteration_seconds;
      EXPECT_LE(t, last * (1 + 1e-9)) << "trial " << trial << " at " << bw / 1e9 << " GB/s";
      last = t;
    }
  }
}

TEST(DiskTierPartition, AStageIsChargedItsDiskReadsAtItsShareOfTheDisk) {
  std::vector<LayerCost> costs(4);
  for (auto& l : costs) l.fwd = l.bwd = l.tail = 1e-3, l.disk_bytes = 40'000'000;
  PartitionOptions o;
  o.micro_batches = 2;  // 2 ms of compute a layer
  o.disk_bandwidth = 1e10;
  StageEstimate e = estimate_stage(costs, {StageKind::forward, 0, 1}, o);
  EXPECT_EQ(e.disk_read_bytes, 80'000'000);
  EXPECT_DOUBLE_EQ(e.disk_seconds, 8e-3);
  EXPECT_DOUBLE_EQ(e.seconds, 8e-3);  // over its 4 ms of compute
  EXPECT_TRUE(e.transfer_bound());
  // the embedding's backward reads no weight
  e = estimate_stage(costs, {StageKind::backward, 0, 1}, o);
  EXPECT_EQ(e.disk_read_bytes, 40'000'000);
  o.disk_bandwidth = 0;  // no tier
  e = estimate_stage(costs, {StageKind::forward, 0, 1}, o);
  EXPECT_EQ(e.disk_seconds, 0);
  EXPECT_DOUBLE_EQ(e.seconds, 4e-3);
  // the partition splits disk-bound layers apart as it would PCIe-bound ones
  o.disk_bandwidth = 1e10;
  o.gpus = 4;
  const PartitionResult r = partition(costs, o);
  for (const StageEstimate& s : r.stages) EXPECT_LE(s.disk_read_bytes, 80'000'000) << s.stage.first;
}

}  // namespace
}  // namespace rp
