// `roundpipe plan` on mixture-of-experts (Qwen3-MoE) config.json and GGUF files: both
// spellings of the expert count are accepted, the report carries the active and total
// parameter counts, LoRA on a frozen 4-bit base plans, and a bad key is one line naming it;
// bucketed expert GEMMs are the default, and --expert-gemm bucketed given needs experts.
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <string>

#include "scheduler/cost_model.hpp"  // kBucketedCallSeconds
#include "tests/cli/cli_util.hpp"

#include <fmt/format.h>

namespace fs = std::filesystem;

namespace {

using namespace rp::clitest;

// A Qwen3-30B-A3B-like shape with 8 layers; `experts_key` spells the expert count.
std::string moe_config(const std::string& experts_key, const std::string& top_k = "8") {
  return R"({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
             "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             ")" +
         experts_key + R"(": 128, "num_experts_per_tok": )" + top_k + R"(, "moe_intermediate_size": 768,
             "decoder_sparse_step": 1, "mlp_only_layers": [3], "norm_topk_prob": true, "rope_theta": 1000000,
             "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "max_position_embeddings": 40960})";
}

TEST(CliPlanMoe, PlansAMoeConfigWithEitherExpertKey) {
  auto d = tmpdir();
  for (const char* key : {"num_experts", "num_local_experts"}) {
    SCOPED_TRACE(key);
    write(d / "config.json", moe_config(key));
    CliRun r =
        roundpipe("plan --model " + (d / "config.json").string() + " --gpus 4 --seq 4096 --micro 8", d);
    ASSERT_EQ(r.code, 0) << r.err;
    // 7 sparse layers (layer 3 is dense by mlp_only_layers)
    for (const char* needle : {"128 experts top-8", "in 7 sparse layers", "B active per token", "forward",
                               "tail", "backward", "tokens/s", "bubble"})
      EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  }
  // LoRA on an nf4 base: adapters trainable, the base (all experts) stored in 4 bits
  CliRun r = roundpipe("plan --model " + (d / "config.json").string() +
                           " --gpus 4 --seq 4096 --micro 8 --memory-cap 8GiB --frozen nf4 --lora-r 16",
                       d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("lora      r=16 on all-linear (no expert adapters)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble"), std::string::npos) << r.out;
  // "experts" adds per-expert adapters: more trainable parameters, a slower iteration
  auto trainable = [](const std::string& out) {
    const size_t at = out.find(" trainable parameters");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(out.rfind(' ', at - 1) + 1, at));
  };
  CliRun e = roundpipe("plan --model " + (d / "config.json").string() +
                           " --gpus 4 --seq 4096 --micro 8 --memory-cap 8GiB --frozen nf4 --lora-r 16 "
                           "--lora-targets all-linear,experts",
                       d);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("lora      r=16 on all-linear,experts, "), std::string::npos) << e.out;
  EXPECT_GT(trainable(e.out), 10 * trainable(r.out)) << e.out;
  r = roundpipe("plan --model " + (d / "config.json").string() + " --lora-r 4 --lora-targets q_proj,wrong",
                d);
  EXPECT_EQ(r.code, 2) << r.err;  // a usage error, naming the target and what the flag takes
  EXPECT_NE(r.err.find("unknown module 'wrong'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("experts.down_proj"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // a rank whose parameter counts would wrap around int64_t is refused before any is formed
  r = roundpipe("plan --model " + (d / "config.json").string() + " --lora-r 9223372036854775807", d);
  EXPECT_EQ(r.code, 2) << r.err;  // a usage error
  EXPECT_EQ(r.err,
            "roundpipe: error: --lora-r: expected 0 (none) or an integer in 1..65536, got "
            "9223372036854775807 (see roundpipe --help)\n");
  fs::remove_all(d);
}

// The number before `unit` on the line that starts with `head` (-1 when absent).
double number_before(const std::string& out, const std::string& head, const std::string& unit) {
  const size_t line = out.find("\n" + head);
  if (line == std::string::npos) return -1;
  const size_t at = out.find(unit, line + 1);
  if (at == std::string::npos || at > out.find('\n', line + 1)) return -1;
  const size_t from = out.rfind(' ', at - 2) + 1;
  std::string digits;
  for (size_t i = from; i < at; ++i)
    if (out[i] != ',') digits += out[i];
  return std::stod(digits);
}

// Bucketed expert GEMMs (the default): faster kernels, one host-timed call per bucket, padded
// scratch. At this small shape the host time outweighs the kernels' gain.
TEST(CliPlanMoe, BucketedExpertGemmsPlanHostTimeAndPaddedScratch) {
  auto d = tmpdir();
  write(d / "config.json", moe_config("num_experts"));
  const std::string base = "plan --model " + (d / "config.json").string() + " --gpus 1 --seq 4096 --micro 8";
  CliRun g = roundpipe(base + " --expert-gemm grouped", d),
         b = roundpipe(base + " --expert-gemm bucketed", d);
  ASSERT_EQ(g.code, 0) << g.err;
  ASSERT_EQ(b.code, 0) << b.err;
  CliRun dflt = roundpipe(base, d);  // no flag: the bucketed plan
  ASSERT_EQ(dflt.code, 0) << dflt.err;
  EXPECT_NE(dflt.out.find("(bucketed GEMMs at 0.6 of peak)"), std::string::npos) << dflt.out;
  auto untimed = [](std::string out) {  // the planner's own time ("found in 0.31 ms ...") varies
    const size_t at = out.find(", found in ");
    return at == std::string::npos ? out : out.erase(at, out.find('\n', at) - at);
  };
  EXPECT_EQ(untimed(dflt.out), untimed(b.out));
  EXPECT_NE(g.out.find("(grouped GEMMs at 0.33 of peak)"), std::string::npos) << g.out;
  EXPECT_NE(b.out.find("(bucketed GEMMs at 0.6 of peak)"), std::string::npos) << b.out;
  const double gt = number_before(g.out, "iteration", " tokens/s"),
               bt = number_before(b.out, "iteration", " tokens/s");
  ASSERT_GT(gt, 0) << g.out;
  EXPECT_NE(b.out.find(fmt::format("bucketed: {:g} us of host time per batched call",
                                   rp::kBucketedCallSeconds * 1e6)),
            std::string::npos)
      << b.out;
  EXPECT_EQ(g.out.find("us of host time per batched call"), std::string::npos) << g.out;
  EXPECT_LT(bt, gt) << "host time per bucket: a slower iteration at this shape\n" << b.out;
  // under a 6 GiB cap both pick the same stages: the padded scratch shows in the peak
  CliRun gc = roundpipe(base + " --memory-cap 6GiB --expert-gemm grouped", d),
         bc = roundpipe(base + " --memory-cap 6GiB --expert-gemm bucketed", d);
  ASSERT_EQ(gc.code, 0) << gc.err;
  ASSERT_EQ(bc.code, 0) << bc.err;
  auto stages = [](const std::string& out) {
    const size_t at = out.find("\nplan ");
    const size_t line = out.find('\n', at + 1);
    return at == std::string::npos ? std::string()
                                   : out.substr(line + 1, out.find('\n', line + 1) - line - 1);
  };
  ASSERT_FALSE(stages(gc.out).empty()) << gc.out;
  ASSERT_EQ(stages(gc.out), stages(bc.out)) << gc.out << bc.out;
  const double gm = number_before(gc.out, "peak", " GiB per GPU"),
               bm = number_before(bc.out, "peak", " GiB per GPU");
  ASSERT_GT(gm, 0) << gc.out;
  EXPECT_GT(bm, gm) << "padded rows: more expert scratch\n" << bc.out;
  // a given efficiency wins over the expert_gemm default
  CliRun e = roundpipe(base + " --expert-gemm bucketed --grouped-gemm-efficiency 0.5", d);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("(bucketed GEMMs at 0.5 of peak)"), std::string::npos) << e.out;
  for (const char* eff : {"1e-300", "-0.5", "1.5"}) {  // a rate no GEMM runs at: refused, not absurd times
    CliRun r = roundpipe(base + " --grouped-gemm-efficiency " + eff, d);
    EXPECT_EQ(r.code, 2) << eff << ": " << r.out;
    EXPECT_NE(r.err.find("--grouped-gemm-efficiency: expected a fraction in [0.001, 1]"), std::string::npos)
        << r.err;
  }
  CliRun bad = roundpipe(base + " --expert-gemm fast", d);
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--expert-gemm"), std::string::npos) << bad.err;
  fs::remove_all(d);
}

// The flag's help gives the plan's figure in the plan's words (its line, docs/plan.md), not a
// sentence that lost its verb.
TEST(CliPlanMoe, ExpertGemmHelpSaysTheHostTimePerBatchedCall) {
  CliRun r = roundpipe("plan --help", tmpdir());
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.out.find("--expert-gemm TEXT");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string help = r.out.substr(at, r.out.find("\n  -", at) - at);  // to the next option
  EXPECT_NE(help.find(fmt::format("{:.0f} us of host time per batched call, one call per bucket",
                                  rp::kBucketedCallSeconds * 1e6)),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("1.34x grouped end to end on an H100 SXM at GPT-OSS-20B"), std::string::npos) << help;
}

TEST(CliPlanMoe, ExampleConfigsPlan) {
  auto d = tmpdir();
  for (const char* name : {"qwen3-30b-a3b", "qwen3-235b-a22b"}) {
    SCOPED_TRACE(name);
    const std::string cfg = std::string(RP_SOURCE_DIR) + "/examples/configs/" + name + ".json";
    CliRun r = roundpipe("plan --model " + cfg +
                             " --gpus 8 --seq 4096 --micro 8 --memory-cap 24GiB --frozen nf4 "
                             "--lora-r 32",
                         d);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("B active per token"), std::string::npos) << r.out;
  }
  fs::remove_all(d);
}

TEST(CliPlanMoe, PlansAMoeGguf) {
  auto d = tmpdir();
  const std::string gguf = std::string(RP_FIXTURES_DIR) + "/gguf_moe/tiny_qwen3_moe.q8_0.gguf";
  for (const char* extra : {"", " --frozen q8_0 --lora-r 4"}) {
    SCOPED_TRACE(extra);
    CliRun r = roundpipe("plan --model " + gguf + " --gpus 2 --seq 64 --micro 4" + extra, d);
    ASSERT_EQ(r.code, 0) << r.err;
    for (const char* needle : {"experts top-", "sparse layers", "B active per token", "bubble"})
      EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  }
  fs::remove_all(d);
}

TEST(CliPlanMoe, BadExpertsPerTokenIsOneLineNamingTheKey) {
  auto d = tmpdir();
  for (const char* top_k : {"129", "0", "2.5"}) {
    SCOPED_TRACE(top_k);
    write(d / "config.json", moe_config("num_local_experts", top_k));
    CliRun r = roundpipe("plan --model " + (d / "config.json").string(), d);
    expect_one_line_error(r, "num_experts_per_tok");
    EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
  }
  fs::remove_all(d);
}

// --expert-gemm bucketed lays out the rows of the experts' GEMMs and --grouped-gemm-efficiency
// sets their rate: on a model without experts (or without a sparse layer) they would change
// nothing, so given they are refused instead of ignored; bucketed as the default plans every model.
TEST(CliPlanMoe, BucketedExpertGemmNeedsExperts) {
  auto d = tmpdir();
  const std::string dense = std::string(RP_SOURCE_DIR) + "/examples/configs/llama-3.1-8b.json";
  CliRun r = roundpipe("plan --model " + dense + " --expert-gemm bucketed", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "roundpipe: error: --expert-gemm bucketed needs a mixture-of-experts model; " + dense +
                       " has no experts (see roundpipe --help)\n");
  std::string all_dense = moe_config("num_experts");  // every layer in mlp_only_layers
  all_dense.replace(all_dense.find("[3]"), 3, "[0, 1, 2, 3, 4, 5, 6, 7]");
  write(d / "config.json", all_dense);
  r = roundpipe("plan --model " + (d / "config.json").string() + " --expert-gemm bucketed", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--expert-gemm bucketed needs a mixture-of-experts model; " +
                       (d / "config.json").string() + " has no sparse layer"),
            std::string::npos)
      << r.err;
  // --grouped-gemm-efficiency, the experts' GEMM rate, likewise (it was ignored); 0 is its default
  r = roundpipe("plan --model " + dense + " --grouped-gemm-efficiency 0.5", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "roundpipe: error: --grouped-gemm-efficiency 0.5 needs a mixture-of-experts model; " +
                       dense + " has no experts (see roundpipe --help)\n");
  EXPECT_EQ(roundpipe("plan --model " + dense + " --grouped-gemm-efficiency 0", d).code, 0);
  // grouped given changes nothing either: the layout without padding is a dense model's anyway
  EXPECT_EQ(roundpipe("plan --model " + dense + " --expert-gemm grouped", d).code, 0);
  // bucketed, the default, refuses no model it was not asked for on
  for (const std::string& model : {dense, (d / "config.json").string()}) {
    r = roundpipe("plan --model " + model, d);
    EXPECT_EQ(r.code, 0) << model << ": " << r.err;
    EXPECT_EQ(r.err.find("--expert-gemm"), std::string::npos) << r.err;
  }
  fs::remove_all(d);
}

}  // namespace
