// The plan `roundpipe plan` prints is the plan a Session with the same model, shape and
// device numbers starts from: both come from plan_run (scheduler/run_plan.hpp), the command
// with plan_inputs, the Session with its own inputs. (bench_throughput passes plan_run the
// Session's inputs in bench/throughput.cpp.)
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "actors/session_testing.hpp"
#include "cli/plan.hpp"
#include "model/config.hpp"
#include "roundpipe/session.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

// run_plan's report, and the line after "plan      ...": the plan's summary.
std::string printed_plan(const rp::PlanCommandOptions& o) {
  std::FILE* f = std::tmpfile();
  rp::run_plan(o, f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  const size_t at = out.find("\nplan      ");
  if (at == std::string::npos) return "no plan line in: " + out;
  const size_t line = out.find('\n', at + 1) + 1;
  const size_t end = out.find('\n', line);
  std::string s = out.substr(line, end - line);
  s.erase(0, s.find_first_not_of(' '));
  return s;
}

TEST(CliPlanAgreement, PlanCommandAndSessionStartFromTheSamePlan) {
  const auto d = tmpdir();
  rp::ModelConfig c;
  c.architecture = "qwen3";
  c.qk_norm = true;
  c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 192, c.num_hidden_layers = 6;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16, c.tie_word_embeddings = true;
  write(d / "config.json", rp::config_to_json(c).dump());
  const rp::ModelLayout layout = rp::make_layout(c);
  struct Case {
    int gpus;
    int64_t micro, seq;
    bool save_attention;
  };
  for (const Case k : {Case{2, 4, 128, true}, Case{3, 6, 256, false}, Case{1, 2, 64, true}}) {
    SCOPED_TRACE(k.gpus);
    rp::PlanCommandOptions o;
    o.model = (d / "config.json").string();
    o.gpus = k.gpus, o.micro_batches = k.micro, o.seq_len = k.seq, o.save_attention = k.save_attention;
    o.peak_tflops = 40, o.hbm_gbps = 100, o.pcie_gbps = 2;  // transfers matter at this size
    o.host_gib = 1024;
    const std::string printed = printed_plan(o);
    // the command's plan is plan_run's with the inputs the command passes
    EXPECT_EQ(printed, rp::plan_run(rp::plan_inputs(layout, o, k.seq, 0)).plan.summary());
    // a Session on the CPU backend with the same shape and device numbers, its cap far above
    // the model (the command's has none)
    rp::TestSessionOptions so;
    so.backend = "cpu";
    so.workers = k.gpus;
    so.micro_batches = int(k.micro);
    so.micro = {1, k.seq};
    so.save_attention = k.save_attention;
    so.profiling.log = [](const std::string&) {};
    so.device_model = rp::plan_inputs(layout, o, k.seq, 0).device;
    std::vector<std::vector<float>> w;
    for (const auto& g : layout.groups) w.emplace_back(size_t(g.numel), 0.01f);
    rp::TestSession s(layout, std::move(w), so);
    EXPECT_EQ(s.plan().summary(), printed);
  }
}

}  // namespace
