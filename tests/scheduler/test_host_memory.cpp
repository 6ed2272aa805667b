// The host memory of a run (scheduler/host_memory.hpp) and the changes advised when a machine
// has less: every advised change is recomputed here from its own run and must lower the need,
// below the budget whenever it says it fits.
#include <gtest/gtest.h>

#include <string>

#include "model/config.hpp"
#include "scheduler/host_memory.hpp"

namespace rp {
namespace {

ModelConfig config(const char* name) {
  return load_config_file(std::string(RP_SOURCE_DIR) + "/examples/configs/" + name);
}

constexpr double kGiB = double(int64_t(1) << 30);

TEST(HostMemory, FullFineTuningHoldsEighteenBytesPerParameterAndTheActivations) {
  const ModelConfig c = config("qwen3-1.7b.json");
  HostRun run;
  run.seq_len = 4096, run.micro_batches = 8, run.workers = 4, run.pass_slots = 2, run.saved_attention = false;
  const HostMemoryNeed n = host_memory_need(c, run);
  const double p = double(c.num_parameters());
  EXPECT_EQ(n.trainable_params, c.num_parameters());
  EXPECT_EQ(n.frozen_params, 0);
  EXPECT_DOUBLE_EQ(n.master + n.moments + n.weights + n.gradients, 18 * p);  // 4 + 8 + 2 + 4
  // two pass slots x 8 micro-batches x (28 + 2 layers + 1: the saved inputs of layers 1..29 and two
  // sets of boundary gradients) x 4096 x 2048 bf16
  EXPECT_DOUBLE_EQ(n.activations, 2.0 * 8 * 31 * 4096 * 2048 * 2);
  EXPECT_EQ(n.attention, 0);
  // one worker: its passes share one slot
  HostRun one = run;
  one.workers = 1;
  EXPECT_DOUBLE_EQ(host_memory_need(c, one).activations, n.activations / 2);
  // saved attention: per layer and token, 16 heads x (128 x 2 + 4) bytes
  HostRun attn = run;
  attn.saved_attention = true;
  EXPECT_DOUBLE_EQ(host_memory_need(c, attn).attention, 2.0 * 8 * 28 * 4096 * 16 * (128 * 2 + 4));
  run.seq_len = 0;
  EXPECT_THROW(host_memory_need(c, run), std::invalid_argument);
}

TEST(HostMemory, LoraAndAFourBitBaseShrinkTheWeights) {
  const ModelConfig c = config("llama-3.1-8b.json");
  HostRun full;
  full.saved_attention = false;
  HostRun lora = full;
  lora.lora_r = 16;
  HostRun nf4 = lora;
  nf4.frozen = WeightFormat::nf4;
  const HostMemoryNeed f = host_memory_need(c, full), l = host_memory_need(c, lora),
                       q = host_memory_need(c, nf4);
  EXPECT_EQ(l.frozen_params, c.num_parameters());  // the whole base, the adapters on top
  EXPECT_LT(l.trainable_params, c.num_parameters() / 50);
  EXPECT_NEAR(l.frozen, 2.0 * double(c.num_parameters()), 0.01 * double(c.num_parameters()));  // bf16 base
  EXPECT_LT(q.frozen, 0.3 * l.frozen);  // 0.5625 B/value
  EXPECT_LT(q.total(), l.total());
  EXPECT_LT(l.total(), f.total());
  EXPECT_EQ(l.activations, f.activations);
}

// Each change is recomputed from its own run: its need must be that run's, below the original,
// and under 90% of the budget exactly when it says it fits.
void expect_honest_advice(const ModelConfig& c, const HostRun& run, double budget) {
  const double before = host_memory_need(c, run).total();
  const auto changes = host_memory_alternatives(c, run, budget);
  ASSERT_FALSE(changes.empty());
  for (const HostMemoryChange& ch : changes) {
    SCOPED_TRACE(ch.what);
    EXPECT_NE(ch.run, run);
    const double need = host_memory_need(c, ch.run).total();
    EXPECT_DOUBLE_EQ(ch.need, need);
    EXPECT_LT(need, before);
    EXPECT_EQ(ch.fits, need <= kHostHeadroom * budget);
  }
}

TEST(HostMemory, AdvisedChangesLowerTheNeedBelowTheBudgetWhenTheySaySo) {
  const ModelConfig c = config("qwen3-1.7b.json");
  HostRun run;  // full fine-tuning of 8 x 16 x 8192 tokens: about 100 GiB
  run.workers = 8;
  const double need = host_memory_need(c, run).total();
  ASSERT_GT(need, 64 * kGiB);
  EXPECT_TRUE(host_memory_alternatives(c, run, need / kHostHeadroom * 1.001).empty());  // fits already
  expect_honest_advice(c, run, 64 * kGiB);
  const auto changes = host_memory_alternatives(c, run, 64 * kGiB);
  ASSERT_EQ(changes.size(), 5u);  // LoRA, nf4 LoRA, fewer sequences, shorter sequences, no saved attention
  EXPECT_NE(changes[0].what.find("LoRA r=16"), std::string::npos);
  EXPECT_EQ(changes[1].run.frozen, WeightFormat::nf4);
  // fewer sequences: the largest count that fits and keeps the batch of 16 (a divisor of it, the
  // rest made up by accumulation), so the next such count would not fit
  const HostMemoryChange& fewer = changes[2];
  ASSERT_TRUE(fewer.fits);
  const int64_t per_pass = fewer.run.micro_batches * fewer.run.sequences_per_micro;
  EXPECT_EQ(per_pass * fewer.run.accumulation, 16);
  int64_t next = per_pass + 1;
  while (16 % next != 0) ++next;
  ASSERT_LT(next, 16);
  HostRun more = fewer.run;
  more.micro_batches = next;
  more.accumulation = 16 / next;
  EXPECT_GT(host_memory_need(c, more).total(), kHostHeadroom * 64 * kGiB);
  // shorter: halved until it fits, so twice as long would not
  const HostMemoryChange& shorter = changes[3];
  ASSERT_TRUE(shorter.fits);
  HostRun longer = shorter.run;
  longer.seq_len *= 2;
  EXPECT_GT(host_memory_need(c, longer).total(), kHostHeadroom * 64 * kGiB);
  // a budget nothing alone meets gets the combination as a last entry
  expect_honest_advice(c, run, 8 * kGiB);
  const auto tight = host_memory_alternatives(c, run, 8 * kGiB);
  EXPECT_EQ(tight.back().what, "all of the above together");
}

TEST(HostMemory, LoraRunsAreAdvisedAFourBitBaseAndNotLoraAgain) {
  const ModelConfig c = config("qwen3-235b-a22b.json");
  HostRun run;
  run.lora_r = 32;
  run.seq_len = 4096, run.micro_batches = 8;
  expect_honest_advice(c, run, 64 * kGiB);
  const auto changes = host_memory_alternatives(c, run, 64 * kGiB);
  for (const HostMemoryChange& ch : changes) {
    EXPECT_EQ(ch.what.find("instead of full fine-tuning"), std::string::npos) << ch.what;
    EXPECT_EQ(ch.run.lora_r, 32) << ch.what;
  }
  // a 235B base is over 64 GiB even in 4 bits: nothing fits
  for (const HostMemoryChange& ch : changes) EXPECT_FALSE(ch.fits) << ch.what;
  EXPECT_NE(host_memory_text(host_memory_need(c, run)).find("frozen base"), std::string::npos);
}

}  // namespace
}  // namespace rp
