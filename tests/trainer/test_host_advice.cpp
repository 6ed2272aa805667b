// `roundpipe train`'s host-memory warning (warn_host_memory): a run over 90% of this machine's
// memory is told its need and what to change, with the numbers of scheduler/host_memory.hpp
// (the model `roundpipe plan` prints); a run that fits is told nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "base/host_resources.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "roundpipe/spec.hpp"
#include "scheduler/host_memory.hpp"
#include "trainer/run_setup.hpp"

namespace rp {
namespace {

// A sequence, or a pass, whose token buffers and one layer's activations alone exceed the
// memory available is refused naming its key; the same shape with more accumulation (a smaller
// pass) is not, nor anything when the memory is unknown.
TEST(HostAdvice, ABatchShapeOverTheAvailableMemoryIsRefusedNamingItsKey) {
  ModelConfig c;
  c.hidden_size = 576;
  TrainSpec spec;
  spec.source = "s.json";
  spec.backend = "cpu";
  spec.seq_len = 128;
  spec.sequences_per_step = 4;
  spec.micro_batches = 2;
  spec.accumulation = 1;
  const size_t gib = size_t(1) << 30;
  EXPECT_NO_THROW(check_batch_fits_host(spec, c, 24 * gib));
  auto refusal = [&](size_t available) -> std::string {
    try {
      check_batch_fits_host(spec, c, available);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  spec.seq_len = 100000000;  // 230 GB for one layer's activations of one sequence
  EXPECT_EQ(refusal(24 * gib).rfind("s.json: key 'seq_len': one sequence of 100000000 tokens needs ", 0), 0u)
      << refusal(24 * gib);
  spec.seq_len = 128;
  spec.sequences_per_step = 1000000000;  // 1.5 TB of token batch per pass
  EXPECT_EQ(refusal(24 * gib).rfind("s.json: key 'sequences_per_step': a pass of 1000000000 sequences", 0),
            0u)
      << refusal(24 * gib);
  spec.accumulation = 500000000;  // two sequences per pass
  EXPECT_EQ(refusal(24 * gib), "");
  spec.accumulation = 1;
  EXPECT_EQ(refusal(0), "");  // the memory is unknown
}

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

/// The spec `base` with the members `fragment` (JSON object members, as an advice line gives
/// them) pasted in place of the keys they set, read by the spec file reader (load_spec).
TrainSpec pasted(nlohmann::json base, const std::string& fragment) {
  const nlohmann::json members = nlohmann::json::parse("{" + fragment + "}");
  for (const auto& [k, v] : members.items()) base.erase(k);
  std::string text = base.dump();
  text.pop_back();  // the closing brace
  const std::string path =
      (std::filesystem::temp_directory_path() / ("rp_host_advice_" + std::to_string(::getpid()) + ".json"))
          .string();
  std::ofstream(path) << text << (fragment.empty() ? "" : ", ") << fragment << "}";
  try {
    const TrainSpec s = load_spec(path);
    std::filesystem::remove(path);
    validate_spec(s);
    return s;
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
}

/// The HostRun a spec trains (as warn_host_memory reads it), with `like`'s machine fields.
HostRun run_of(const TrainSpec& s, const HostRun& like) {
  HostRun r = like;
  r.lora_r = s.lora ? s.lora->r : 0;
  r.lora_targets = {"all-linear"};
  r.frozen.reset();
  if (s.lora) {
    r.lora_targets = s.lora->target_modules;
    for (const auto& t : s.lora->target_parameters) r.lora_targets.push_back(t);
    if (!s.lora_base_format_from_model) r.frozen = s.lora->base_format;
  }
  r.seq_len = s.seq_len;
  r.micro_batches = s.micro_batches;
  r.sequences_per_micro = s.sequences_per_step / s.accumulation / s.micro_batches;
  r.accumulation = s.accumulation;
  r.saved_attention = s.save_attention.value_or(false);
  return r;
}

/// `r` with its LoRA targets as set_lora_targets reads them ("experts" and
/// "mlp.experts.gate_up_proj, mlp.experts.down_proj" alike).
HostRun normalized(HostRun r) {
  LoraConfig l;
  set_lora_targets(l, r.lora_targets);
  r.lora_targets = l.target_modules;
  r.lora_targets.insert(r.lora_targets.end(), l.target_parameters.begin(), l.target_parameters.end());
  return r;
}

// Every change the host-memory advice names ends in the spec keys that make it: pasted into a
// spec of the advised-on run, the spec file reader accepts them and the spec trains exactly
// the changed run (its LoRA rank, targets and base, batch shape, sequence length, attention).
TEST(HostAdvice, EachAdvisedSpecFragmentReadsAsTheChangedRun) {
  const std::string configs = std::string(RP_SOURCE_DIR) + "/examples/configs/";
  struct Case {
    std::string config;
    HostRun run;
  };
  HostRun full;
  full.seq_len = 8192, full.micro_batches = 16, full.sequences_per_micro = 2, full.saved_attention = true;
  HostRun lora = full;
  lora.lora_r = 8, lora.lora_targets = {"q_proj", "v_proj"}, lora.accumulation = 4, lora.replicas = 2;
  HostRun experts = full;
  experts.lora_r = 4, experts.lora_targets = {"all-linear", "experts"}, experts.frozen = WeightFormat::bf16;
  int fragments = 0;
  for (const Case& c :
       {Case{"qwen3-1.7b.json", full}, Case{"qwen3-1.7b.json", lora}, Case{"qwen3-30b-a3b.json", experts}}) {
    const ModelConfig config = load_config_file(configs + c.config);
    nlohmann::json base = {
        {"model", "m"},
        {"data", "d.jsonl"},
        {"output_dir", "out"},
        {"seq_len", c.run.seq_len},
        {"micro_batches", c.run.micro_batches},
        {"accumulation", c.run.accumulation},
        {"sequences_per_step", c.run.micro_batches * c.run.sequences_per_micro * c.run.accumulation},
        {"save_attention", c.run.saved_attention}};
    if (c.run.lora_r > 0) {
      LoraConfig l;
      set_lora_targets(l, c.run.lora_targets);
      base["lora"] = {{"r", c.run.lora_r}, {"target_modules", l.target_modules}};
      if (!l.target_parameters.empty()) base["lora"]["target_parameters"] = l.target_parameters;
      if (c.run.frozen) base["lora"]["base_format"] = weight_format_name(*c.run.frozen);
    }
    ASSERT_EQ(normalized(run_of(pasted(base, ""), c.run)), normalized(c.run)) << c.config;
    const auto changes = host_memory_alternatives(config, c.run, 4.0 * (int64_t(1) << 30));
    ASSERT_GE(changes.size(), 4u) << c.config;
    for (const HostMemoryChange& ch : changes) {
      if (ch.how.empty()) continue;  // the combination of the others
      const size_t at = ch.how.find("; spec: ");
      ASSERT_NE(at, std::string::npos) << ch.how;
      const std::string fragment = ch.how.substr(at + 8);
      try {
        EXPECT_EQ(normalized(run_of(pasted(base, fragment), c.run)), normalized(ch.run))
            << c.config << ": " << ch.what << ": " << fragment;
      } catch (const std::exception& e) {
        ADD_FAILURE() << c.config << ": " << ch.what << ": " << fragment << ": " << e.what();
      }
      ++fragments;
    }
  }
  EXPECT_GE(fragments, 12);
}

}  // namespace
}  // namespace rp
