// `roundpipe train`'s host-memory warning (warn_host_memory): a run over 90% of this machine's
// memory is told its need and what to change, with the numbers of scheduler/host_memory.hpp
// (the model `roundpipe plan` prints); a run that fits is told nothing.
#include <gtest/gtest.h>

#include <string>

#include "base/host_resources.hpp"
#include "model/config.hpp"
#include "scheduler/host_memory.hpp"
#include "trainer/run_setup.hpp"

namespace rp {
namespace {

TEST(HostAdvice, TrainWarnsWithThePlannersNumbersWhenTheRunIsOverTheMachine) {
  const double total = double(host_total_bytes());
  if (!(total > 0)) GTEST_SKIP() << "this machine's memory is unknown (no /proc/meminfo)";
  ModelConfig c = load_config_file(std::string(RP_SOURCE_DIR) + "/examples/configs/qwen3-1.7b.json");
  c.num_hidden_layers = 2;  // 0.17 B parameters: 3 GiB of optimizer state, under any machine that builds this
  c.vocab_size = 32000;
  const ModelLayout layout = make_layout(c);
  TrainSpec spec;
  spec.backend = "cuda";  // bf16 copies and activations, whatever this machine has
  spec.workers = 8;
  spec.seq_len = 1024;
  spec.micro_batches = 2;
  spec.sequences_per_step = 2;
  spec.accumulation = 1;
  spec.save_attention = false;
  HostRun run;
  run.seq_len = 1024, run.micro_batches = 2, run.workers = 8, run.saved_attention = false;
  const double small = host_memory_need(layout, run).total();
  if (small > kHostHeadroom * total)
    GTEST_SKIP() << "this machine has less than " << byte_text(small / kHostHeadroom);
  EXPECT_EQ(warn_host_memory(spec, layout), "");
  // the same model with as many 64K-token sequences per pass as it takes to be over the machine
  spec.seq_len = run.seq_len = 65536;
  run.micro_batches = 2;
  while (host_memory_need(layout, run).total() <= kHostHeadroom * total) run.micro_batches *= 2;
  spec.micro_batches = run.micro_batches;
  spec.sequences_per_step = run.micro_batches;
  const std::string text = warn_host_memory(spec, layout);
  EXPECT_NE(text.find("this run needs about " + byte_text(host_memory_need(layout, run).total())),
            std::string::npos)
      << text;
  const auto changes = host_memory_alternatives(c, run, total);
  ASSERT_FALSE(changes.empty());
  for (const HostMemoryChange& ch : changes)
    EXPECT_NE(text.find(ch.what + ": needs " + byte_text(ch.need)), std::string::npos) << ch.what << "\n"
                                                                                       << text;
}

}  // namespace
}  // namespace rp
