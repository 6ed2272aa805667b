// `roundpipe plan --disk-gbps`: the disk tier's section (cli/plan_disk.hpp). A slow disk bounds
// the predicted step and a fast one hides under the compute; a faster disk never predicts
// fewer tokens/s; the tokens that hide the disk follow LLaMA-3.1-8B's shapes; the attention
// drop and the spill appear as the budget shrinks; a budget below the trainable state and the
// read ring is one line naming the option; without the options the plan is unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const std::string kLlama = std::string(RP_SOURCE_DIR) + "/examples/configs/llama-3.1-8b.json";
// LLaMA-3.1-8B with LoRA r=16 on 8 H200s, 8 micro-batches of 4096 tokens
const std::string kRun = "plan --model " + kLlama + " --gpus 8 --seq 4096 --micro 8 --lora-r 16 --gpu h200";

// The number after `key` in `out` (e.g. "with the disk, " -> its tokens/s), or NaN.
double number_after(const std::string& out, const std::string& key) {
  const auto at = out.find(key);
  if (at == std::string::npos) return NAN;
  return std::stod(out.substr(at + key.size()));
}

// The plan's output less the line that times the search ("found in 0.08 ms").
std::string untimed(const std::string& out) {
  return std::regex_replace(out, std::regex("found in [0-9.]+ ms"), "found in");
}

TEST(CliPlanDisk, WithoutTheOptionsThePlanIsUnchanged) {
  auto d = tmpdir();
  const CliRun plain = roundpipe(kRun, d);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("\ndisk "), std::string::npos);
  EXPECT_EQ(plain.out.find("disk-bound"), std::string::npos);
  const CliRun zero = roundpipe(kRun + " --disk-gbps 0", d);
  ASSERT_EQ(zero.code, 0) << zero.err;
  EXPECT_EQ(untimed(zero.out), untimed(plain.out));
  const CliRun with = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 40", d);
  ASSERT_EQ(with.code, 0) << with.err;
  EXPECT_NE(with.out.find("\ndisk "), std::string::npos) << with.out;
  EXPECT_NE(with.out.find("training places by this rule with the spec key frozen_tier.host_budget_gib"),
            std::string::npos)
      << with.out;
  fs::remove_all(d);
}

// The host section counts the base in RAM; with the tier it must not tell the user the run
// would run out of memory, which the tier exists to prevent. LLaMA-3.1-8B in bf16 needs more
// than a 16 GiB host: without the tier the section warns, with it it names the budget instead.
TEST(CliPlanDisk, TheHostSectionDoesNotWarnAboutMemoryTheTierKeepsOnDisk) {
  auto d = tmpdir();
  const std::string run =
      "plan --model " + kLlama + " --gpus 1 --seq 4096 --micro 8 --lora-r 16 --gpu h200 --host-gib 16";
  const CliRun plain = roundpipe(run, d);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(plain.out.find("would run out of memory"), std::string::npos) << plain.out;
  const CliRun tier = roundpipe(run + " --disk-gbps 7 --host-budget-gib 12", d);
  ASSERT_EQ(tier.code, 0) << tier.err;
  EXPECT_EQ(tier.out.find("would run out of memory"), std::string::npos) << tier.out;
  const auto host = tier.out.find("\nhost      in RAM the run would need ");
  ASSERT_NE(host, std::string::npos) << tier.out;
  const std::string line = tier.out.substr(host + 1, tier.out.find('\n', host + 1) - host - 1);
  EXPECT_NE(line.find("within its host budget of 12.0 GiB"), std::string::npos) << line;
  fs::remove_all(d);
}

// A pool of GPUs also gets the figure for a 7 GB/s drive per GPU: the same as --disk-gbps set
// to G x 7, and never more tokens than one drive needs. One GPU gets no such figure.
TEST(CliPlanDisk, APoolGetsTheTokensToHideWithADrivePerGpu) {
  auto d = tmpdir();
  // "hidden from A tokens per iteration at this disk, from B ... at a 7 GB/s NVMe[, from C ... at
  // one per GPU (R GB/s)]"
  const std::regex line(
      "hidden from ([0-9]+) tokens per iteration at this disk, from ([0-9]+) tokens per iteration at a 7 "
      "GB/s NVMe(, from ([0-9]+) tokens per iteration at one per GPU \\(([0-9]+) GB/s\\))?;");
  std::smatch pool_m, striped_m, single_m;
  const CliRun pool = roundpipe(kRun + " --disk-gbps 3 --host-budget-gib 31.5", d);
  ASSERT_EQ(pool.code, 0) << pool.err;
  ASSERT_TRUE(std::regex_search(pool.out, pool_m, line) && pool_m[3].matched) << pool.out;
  EXPECT_EQ(pool_m[5].str(), "56");
  const double nvme = std::stod(pool_m[2].str()), each = std::stod(pool_m[4].str());
  EXPECT_LT(each, nvme);  // eight drives hide the disk from fewer tokens than one
  const CliRun striped = roundpipe(kRun + " --disk-gbps 56 --host-budget-gib 31.5", d);
  ASSERT_EQ(striped.code, 0) << striped.err;
  ASSERT_TRUE(std::regex_search(striped.out, striped_m, line)) << striped.out;
  EXPECT_NEAR(std::stod(striped_m[1].str()), each, 1.0) << striped.out;  // the same as 56 GB/s given
  const CliRun single = roundpipe("plan --model " + kLlama +
                                      " --gpus 1 --seq 4096 --micro 8 --lora-r 16 --gpu h200 --disk-gbps 3 "
                                      "--host-budget-gib 20",
                                  d);
  ASSERT_EQ(single.code, 0) << single.err;
  ASSERT_TRUE(std::regex_search(single.out, single_m, line)) << single.out;
  EXPECT_FALSE(single_m[3].matched) << single.out;
  fs::remove_all(d);
}

TEST(CliPlanDisk, ASlowDiskBoundsTheStepAndAFastOneHidesUnderTheCompute) {
  auto d = tmpdir();
  CliRun r = roundpipe(kRun + " --disk-gbps 1 --host-budget-gib 31.5", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("the disk bounds the step"), std::string::npos) << r.out;
  const double disk_ms = number_after(r.out, "bound     disk ");
  const double step_ms = number_after(r.out, "          iteration ");
  EXPECT_GT(disk_ms, 5 * number_after(r.out, "against compute "));
  EXPECT_NEAR(step_ms, disk_ms, 0.01 * disk_ms);  // the step follows the disk
  EXPECT_NEAR(number_after(r.out, "with the disk, "), 8 * 4096 / (step_ms / 1e3), 1.0);
  // the plan's own iteration line is the disk-bound one too
  EXPECT_NEAR(number_after(r.out, "\niteration "), step_ms, 0.01);
  r = roundpipe(kRun + " --disk-gbps 200 --host-budget-gib 31.5", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("compute bounds the step"), std::string::npos) << r.out;
  const double with = number_after(r.out, "          iteration ");
  const double without = number_after(r.out, "tokens/s (");
  EXPECT_NEAR(with, without, 0.01 * without);  // hidden: the step without the disk
  EXPECT_LT(number_after(r.out, "bound     disk "), number_after(r.out, "against compute "));
  fs::remove_all(d);
}

TEST(CliPlanDisk, AFasterDiskIsNeverPredictedSlower) {
  auto d = tmpdir();
  for (const char* budget : {"30", "48"}) {
    double last = 0;
    for (const char* gbps : {"0.5", "1", "2", "3.5", "7", "14", "25", "28", "30", "40", "56", "200"}) {
      const CliRun r = roundpipe(kRun + " --disk-gbps " + gbps + " --host-budget-gib " + budget, d);
      ASSERT_EQ(r.code, 0) << r.err;
      const double tps = number_after(r.out, "with the disk, ");
      EXPECT_GE(tps, last * (1 - 1e-9)) << gbps << " GB/s, budget " << budget << " GiB";
      last = std::max(last, tps);
    }
  }
  fs::remove_all(d);
}

// A larger host budget keeps more of the base resident: never a slower predicted step. (The
// partition re-made with the disk charged can need a larger read ring than the plain one;
// the simulator picks between them.) Without saved attention: with it, training's rule keeps
// the attention once everything fits, which can be a little slower than recomputing it.
TEST(CliPlanDisk, ALargerBudgetIsNeverPredictedSlower) {
  auto d = tmpdir();
  double last = 0;
  for (const char* budget : {"20", "24", "28", "30", "36", "40", "56"}) {
    const CliRun r = roundpipe(kRun + " --no-save-attention --disk-gbps 7 --host-budget-gib " + budget, d);
    ASSERT_EQ(r.code, 0) << r.err;
    const double tps = number_after(r.out, "with the disk, ");
    EXPECT_GE(tps, last * (1 - 1e-9)) << budget << " GiB";
    last = std::max(last, tps);
  }
  fs::remove_all(d);
}

TEST(CliPlanDisk, TokensToHideTheDiskFollowTheModelsShapes) {
  auto d = tmpdir();
  // without saved attention, 21.2 GiB hold what is set aside, the LoRA state, the ring and the activations
  // but no decoder of the base: every frozen group streams, nothing spills
  const CliRun r = roundpipe(kRun + " --no-save-attention --disk-gbps 3 --host-budget-gib 21.2", d);
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_NE(r.out.find("of which 0 B resident"), std::string::npos) << r.out;
  ASSERT_EQ(r.out.find("activations spilled"), std::string::npos) << r.out;
  // H 4096, FFN 14336, 8 kv heads x 128, vocab 128256: a decoder's bf16 matrices and its two
  // f32 norms after a bf16 prefix of the group; the embedding; the final norm and LM head
  const double H = 4096, F = 14336, KV = 1024, V = 128256;
  const double decoder = 2 * (2 * H * H + 2 * H * KV + 3 * H * F + 2 * H) + 4 * 2 * H;
  const double embedding = 2 * V * H, tail = 2 * (V * H + H) + 4 * H;
  // forward stages and the tail read every group once; the backward stages read the decoders
  // before the tail stage again (decoders 0..a-2 for a tail from layer a), not the embedding
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(" T\\[([0-9]+)-33\\]"))) << r.out;
  const double a = std::stod(m[1]);
  const double stream = embedding + tail + (32 + a - 1) * decoder;
  // 32768 tokens an iteration on 8 GPUs, compute per GPU as printed
  const double per_token = number_after(r.out, "against compute ") / 1e3 / 32768;
  const double at7 = std::ceil(stream / 7e9 / per_token);
  const double at3 = std::ceil(stream / 3e9 / per_token);
  const double got3 = number_after(r.out, "hidden from ");
  const double got7 = number_after(r.out, "at this disk, from ");
  EXPECT_NEAR(got3, at3, 1e-4 * at3) << r.out;  // the compute is printed to 0.01 ms
  EXPECT_NEAR(got7, at7, 1e-4 * at7) << r.out;
  fs::remove_all(d);
}

TEST(CliPlanDisk, TheAttentionGoesFirstThenActivationsSpillAsTheBudgetShrinks) {
  auto d = tmpdir();
  // 17.5 GiB of activations and 16.2 GiB of saved attention over two pass slots, 0.7 GiB of
  // LoRA state, a read ring of 2 GiB and 0.8 GiB set aside for the process.
  // 60 GiB holds everything: nothing streams or spills, the attention is kept
  CliRun r = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 60", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("saved attention dropped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of which 15.0 GiB resident"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("activations spilled"), std::string::npos) << r.out;
  // 50 GiB holds it all with the attention but part of the base: as training's automatic
  // save_attention, the attention goes so that the whole base stays
  r = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 50", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("saved attention dropped though it fits: that keeps more of the base resident"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("of which 15.0 GiB resident"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("activations spilled"), std::string::npos) << r.out;
  r = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 31.5", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("saved attention dropped to fit the budget"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("activations spilled"), std::string::npos) << r.out;
  r = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 15", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("saved attention dropped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("activations spilled"), std::string::npos) << r.out;
  // 13.5 GiB: the trainable state and the ring fit, but not the saved inputs no layer can spill
  // with the spill's staging buffers; training refuses it, and so does the plan, naming the least
  r = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 13.5", d);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--host-budget-gib: the disk tier needs at least 13.7 GiB"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("saved activations that cannot spill and the spill's staging"), std::string::npos)
      << r.err;
  fs::remove_all(d);
}

TEST(CliPlanDisk, ABudgetTooSmallForTheRingIsOneLineNamingTheOption) {
  auto d = tmpdir();
  CliRun r = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 2", d);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--host-budget-gib: the disk tier needs at least "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("trainable state "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2.00 GiB given"), std::string::npos) << r.err;
  // the least it names does not depend on the budget given, even one below the process's share
  const std::string least =
      r.err.substr(r.err.find("at least "), r.err.find(" of host memory") - r.err.find("at least "));
  for (const char* small : {"0.5", "1"}) {
    const CliRun s = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib " + small, d);
    EXPECT_EQ(s.code, 2);
    EXPECT_NE(s.err.find(least + " of host memory"), std::string::npos) << least << " | " << s.err;
  }
  // the default budget is 90% of --host-gib: the line blames the flag given (--host-budget-gib,
  // which was not, before) and says so
  r = roundpipe(kRun + " --disk-gbps 7 --host-gib 2", d);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.find("roundpipe: error: --host-gib: the disk tier needs at least "), 0u) << r.err;
  EXPECT_NE(r.err.find("1.80 GiB given (90% of --host-gib 2) (see roundpipe --help)\n"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("--host-budget-gib"), std::string::npos) << r.err;
  // a --host-gib of a few bytes is out of its range, not "1 B given"
  r = roundpipe(kRun + " --disk-gbps 7 --host-gib 1e-9", d);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.find("roundpipe: error: --host-gib: expected 0 (this machine's) or 0.001 to 1048576 GiB"),
            0u)
      << r.err;
  // the tier's options without the tier change nothing: a usage error
  r = roundpipe(kRun + " --host-budget-gib 40", d);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--host-budget-gib"), std::string::npos) << r.err;
  r = roundpipe(kRun + " --disk-gbps -1", d);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--disk-gbps"), std::string::npos) << r.err;
  fs::remove_all(d);
}

// Rates past what the output can print (1 MB/s to 1 PB/s), budgets past 1 PiB, --disk-ring
// without a tier or below the runtime's two buffers and a budget above --host-gib: one line
// naming the option, exit 2.
TEST(CliPlanDisk, OutOfRangeAndOrphanOptionsAreOneLineNamingTheOption) {
  auto d = tmpdir();
  for (const std::string& bad :
       {std::string(" --disk-gbps 1e-300"), std::string(" --disk-gbps 4.9e-324"),
        std::string(" --disk-gbps 1e300"), std::string(" --disk-gbps 7 --disk-write-gbps 1e-9"),
        std::string(" --disk-gbps 7 --host-budget-gib 1e300"), std::string(" --disk-ring 5"),
        // the ring's default given without the tier (it was accepted) and --disk-gbps 0 (off)
        std::string(" --disk-ring 2"), std::string(" --disk-gbps 0 --disk-ring 2"),
        // a host past 1 PiB printed "host budget inf TiB"
        std::string(" --disk-gbps 7 --host-gib 1e300"), std::string(" --disk-gbps 7 --host-gib 1e20"),
        std::string(" --disk-gbps 7 --host-gib 30 --host-budget-gib 48"),
        std::string(" --disk-gbps 7 --disk-ring 1")}) {
    const CliRun r = roundpipe(kRun + bad, d);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
    const std::string flag = bad.substr(bad.rfind(" --") + 1, bad.rfind(' ') - bad.rfind(" --") - 1);
    EXPECT_NE(r.err.find(flag), std::string::npos) << bad << ": " << r.err;
  }
  // --disk-gbps given as 0 turns the tier off: the line says so, not to give --disk-gbps
  for (const std::string& off : {std::string(" --disk-ring 2"), std::string(" --disk-ring 3"),
                                 std::string(" --host-budget-gib 8"), std::string(" --disk-write-gbps 3")}) {
    const CliRun r = roundpipe(kRun + " --disk-gbps 0" + off, d);
    EXPECT_NE(r.err.find("which --disk-gbps 0 turns off"), std::string::npos) << off << ": " << r.err;
    EXPECT_EQ(r.err.find("give --disk-gbps"), std::string::npos) << off << ": " << r.err;
  }
  // 0 is no "off" for the write rate: it writes at the read rate
  const CliRun w = roundpipe(kRun + " --disk-gbps 7 --disk-write-gbps 1e-9", d);
  EXPECT_NE(w.err.find("--disk-write-gbps: expected 0 (the read rate) or a rate"), std::string::npos)
      << w.err;
  fs::remove_all(d);
}

// --max-seq plans the disk for the length it found, as a run given that length with --seq (a
// budget that holds what cannot spill of 8 sequences of that length, and the spill's staging).
TEST(CliPlanDisk, MaxSeqPlansTheDiskForTheLengthItFound) {
  auto d = tmpdir();
  const std::string run = "plan --model " + kLlama + " --gpus 8 --micro 8 --lora-r 16 --gpu rtx4090";
  const CliRun found = roundpipe(run + " --max-seq --disk-gbps 7 --host-budget-gib 480", d);
  ASSERT_EQ(found.code, 0) << found.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(found.out, m, std::regex("of [0-9]+ x ([0-9,]+) tokens"))) << found.out;
  std::string len = m[1];
  len.erase(std::remove(len.begin(), len.end(), ','), len.end());
  const CliRun given = roundpipe(run + " --seq " + len + " --disk-gbps 7 --host-budget-gib 480", d);
  ASSERT_EQ(given.code, 0) << given.err;
  const std::string key = "per iteration: ";
  ASSERT_NE(found.out.find(key), std::string::npos) << found.out;
  const auto line = [&](const std::string& out) {
    const auto at = out.find(key);
    return out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_EQ(line(found.out), line(given.out));
  fs::remove_all(d);
}

// A budget of 1 PiB (the most) without --host-gib plans: the budget is what the plan is told
// the host holds, not this machine's memory.
TEST(CliPlanDisk, TheLargestBudgetPlansWithoutHostGib) {
  auto d = tmpdir();
  const CliRun r = roundpipe(kRun + " --disk-gbps 7 --host-budget-gib 1048576", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("host budget 1024 TiB (--host-budget-gib;"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("inf"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// Full fine-tuning streams no frozen weights: a budget too small names no read ring ("read ring
// 2 x 0 B" before).
TEST(CliPlanDisk, FullFineTuningsBudgetErrorNamesNoRing) {
  auto d = tmpdir();
  const CliRun r = roundpipe(
      "plan --model " + kLlama + " --gpus 8 --seq 4096 --micro 8 --gpu h200 --disk-gbps 7 --host-gib 2", d);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.err.find("roundpipe: error: --host-gib: the disk tier needs at least "), 0u) << r.err;
  EXPECT_NE(r.err.find("trainable state "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("read ring"), std::string::npos) << r.err;
  fs::remove_all(d);
}

// Full fine-tuning has no frozen weights: the ring line says so rather than "everything fits".
TEST(CliPlanDisk, FullFineTuningSaysThereIsNothingToStream) {
  auto d = tmpdir();
  const CliRun r = roundpipe("plan --model " + kLlama +
                                 " --gpus 8 --seq 4096 --micro 8 --gpu h200 --disk-gbps 7 "
                                 "--host-budget-gib 150",
                             d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("none (no frozen weights to stream)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("everything fits"), std::string::npos) << r.out;
  fs::remove_all(d);
}

}  // namespace
