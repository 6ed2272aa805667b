// Runs that cannot go on stop with one line and keep what was good: a non-finite loss stops
// the run (or is skipped and counted, "nonfinite": "skip"), too many skipped steps in a row
// stop it, a checkpoint is never written from non-finite weights, and the loss scale's floor
// ends a run that keeps overflowing (StepWatch, fed by hand: the CPU backend has no f16).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "roundpipe/errors.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/disk_space.hpp"
#include "trainer/step_watch.hpp"

namespace {

using namespace rp::clitest;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n";

/// The tiny model of cli_util.hpp with `value` written into one weight of tensor `tensor`.
fs::path poisoned_model(const fs::path& d, const std::string& tensor, float value) {
  rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  lm.tensors.at(tensor).data[3] = value;
  const rp::ModelLayout layout = rp::make_layout(lm.config);
  std::vector<std::vector<float>> w;
  rp::fill_groups(lm, layout, w);
  std::vector<const float*> ptrs;
  for (auto& g : w) ptrs.push_back(g.data());
  const fs::path out = d / "poisoned";
  rp::save_hf_checkpoint(out.string(), layout, ptrs, lm.tokenizer_json, lm.chat_template, rp::DType::f32);
  return out;
}

rp::TrainSpec spec(const fs::path& d, const fs::path& model, int64_t steps, const std::string& extra = "") {
  write(d / "data.jsonl", kData);
  rp::TrainSpec s = rp::spec_from_json(
      nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / "run", extra)), "test spec");
  s.steps = steps;
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rp::TrainingDiverged& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

int64_t metric_rows(const fs::path& csv) {
  const std::string s = slurp(csv);
  return std::count(s.begin(), s.end(), '\n') - 1;
}

TEST(NonFinite, NaNWeightsStopTheRunAtTheFirstStepWithoutACheckpoint) {
  auto d = tmpdir();
  const fs::path m = poisoned_model(d, "model.layers.0.self_attn.q_proj.weight", NAN);
  const std::string e = error_of([&] { rp::Trainer(spec(d, m, 6)).run(); });
  EXPECT_NE(e.find("step 1: the loss is nan"), std::string::npos) << e;
  EXPECT_NE(e.find("no checkpoint was written"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "run/final"));
  EXPECT_EQ(metric_rows(d / "run/metrics.csv"), 1);  // the failing step is recorded
}

TEST(NonFinite, AHugeLearningRateStopsTheRunAndKeepsTheLastGoodCheckpoint) {
  auto d = tmpdir();
  rp::TrainSpec s = spec(d, tiny_model(d), 12, ", \"save_every\": 1, \"async\": false");
  s.adam.lr = s.lr_schedule.lr = 1e39;  // beyond fp32: the first real update makes the weights inf
  s.lr_schedule.warmup_steps = 1;       // step 1 runs at lr 0: checkpoint-1 is good
  s.lr_schedule.kind = "linear";
  s.lr_schedule.total_steps = 12;
  const std::string e = error_of([&] { rp::Trainer(s).run(); });
  EXPECT_NE(e.find("checkpoint-1 is kept"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "run/final"));
  EXPECT_FALSE(fs::exists(d / "run/checkpoint-2"));
  // the kept checkpoint holds finite weights
  rp::LoadedModel kept = rp::load_model((d / "run/checkpoint-1").string());
  for (const auto& [name, t] : kept.tensors)
    for (float x : t.data) ASSERT_TRUE(std::isfinite(x)) << name;
}

TEST(NonFinite, SkipModeSkipsAndCountsAndStopsAfterTooManyInARow) {
  auto d = tmpdir();
  const fs::path m = poisoned_model(d, "model.layers.1.mlp.up_proj.weight", NAN);
  rp::TrainSpec s = spec(d, m, 10, ", \"nonfinite\": \"skip\", \"max_skipped_steps\": 3");
  std::vector<rp::StepReport> seen;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { seen.push_back(r); };
  const std::string e = error_of([&] { rp::Trainer(s).run(cb); });
  EXPECT_NE(e.find("step 3: 3 steps in a row were skipped"), std::string::npos) << e;
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& r : seen) EXPECT_TRUE(r.skipped);
  const std::string csv = slurp(d / "run/metrics.csv");
  // skipped column set (then the blank eval and mixture-of-experts columns, then the epoch)
  const size_t row2 = csv.find("\n2,");
  ASSERT_NE(row2, std::string::npos) << csv;
  EXPECT_NE(csv.substr(row2, csv.find('\n', row2 + 1) - row2).find(",1,,,,,,"), std::string::npos) << csv;
  EXPECT_FALSE(fs::exists(d / "run/final"));
}

TEST(NonFinite, SpecKeysAreChecked) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  auto parse = [&](const std::string& extra) { return spec_result(d, extra); };
  EXPECT_EQ(parse(", \"nonfinite\": \"ignore\""),
            "s.json: key 'nonfinite': expected \"stop\" or \"skip\", got \"ignore\"");
  EXPECT_EQ(parse(", \"max_skipped_steps\": 0"),
            "s.json: key 'max_skipped_steps': expected an integer >= 1, got 0");
  EXPECT_NE(parse(", \"compute_dtype\": \"f16\", \"loss_scaling\": {\"min_scale\": 0}").find("min_scale"),
            std::string::npos);
  EXPECT_EQ(parse(", \"nonfinite\": \"skip\", \"max_skipped_steps\": 5"), "ok");
}

// fp16 GEMM accumulation (docs/gpu.md): only with f16 storage, and only "f32" or "f16".
TEST(GemmAccumulate, SpecKeyIsChecked) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  auto parse = [&](const std::string& extra) {
    return spec_result(d, extra, [](const rp::TrainSpec& s) { return "ok " + s.gemm_accumulate; });
  };
  EXPECT_EQ(parse(""), "ok f32");
  EXPECT_EQ(parse(", \"compute_dtype\": \"f16\", \"gemm_accumulate\": \"f16\""), "ok f16");
  EXPECT_EQ(
      parse(", \"gemm_accumulate\": \"f16\""),
      "s.json: key 'gemm_accumulate': \"f16\" needs \"compute_dtype\": \"f16\" (bf16 tensor cores accumulate "
      "in fp32 only)");
  EXPECT_EQ(parse(", \"compute_dtype\": \"f16\", \"gemm_accumulate\": \"fp16\""),
            "s.json: key 'gemm_accumulate': expected \"f32\" or \"f16\", got \"fp16\"");
}

// The experts' GEMMs (docs/gpu.md, "Mixture-of-experts ops"): "bucketed" by default, "grouped"
// a choice, anything else one line naming the key.
TEST(ExpertGemm, SpecKeyIsChecked) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  auto parse = [&](const std::string& extra) {
    return spec_result(
        d, extra, [](const rp::TrainSpec& s) { return "ok " + s.expert_gemm; }, /*validate=*/true);
  };
  EXPECT_EQ(parse(""), "ok bucketed");
  EXPECT_EQ(parse(", \"expert_gemm\": \"grouped\""), "ok grouped");
  EXPECT_EQ(parse(", \"expert_gemm\": \"bucketed\""), "ok bucketed");
  EXPECT_EQ(parse(", \"expert_gemm\": \"batched\""),
            "s.json: key 'expert_gemm': expected \"grouped\" or \"bucketed\", got \"batched\"");
}

rp::StepReport step(int64_t k, double loss, bool skipped, float scale = 1.f, int64_t targets = 10) {
  rp::StepReport r;
  r.step = k;
  r.loss = loss;
  r.skipped = skipped;
  r.loss_scale = scale;
  r.target_tokens = targets;
  r.grad_norm = skipped ? std::numeric_limits<double>::quiet_NaN() : 1.0;
  return r;
}

TEST(StepWatch, LossScalingStopsAtTheFloorAndCountsSkipsInARow) {
  rp::TrainSpec s;
  s.loss_scaling = rp::LossScalerOptions{};
  s.loss_scaling->min_scale = 4.f;
  s.max_skipped_steps = 100;
  rp::StepWatch w(s);
  // overflows back off 16 -> 8 -> 4; the scale used by a skipped step is reported
  EXPECT_EQ(w.check(step(1, 2.0, true, 16.f), "").size(), 1u);
  EXPECT_NE(w.check(step(2, 2.0, true, 8.f), "")[0].find("scale -> 4"), std::string::npos);
  const std::string e = error_of([&] { w.check(step(3, 2.0, true, 4.f), "out/checkpoint-2"); });
  EXPECT_NE(e.find("step 3: the gradients overflow even at the loss scale's floor 4"), std::string::npos)
      << e;
  EXPECT_NE(e.find("out/checkpoint-2 is kept"), std::string::npos) << e;
  EXPECT_EQ(w.skipped_total(), 3);

  // 200 consecutive overflows of a tiny backoff: stopped after max_skipped_steps
  s.loss_scaling->min_scale = 1e-30f;
  s.max_skipped_steps = 5;
  rp::StepWatch v(s);
  for (int k = 1; k <= 4; ++k) v.check(step(k, 2.0, true, 1e6f), "");
  v.check(step(5, 2.0, false, 1e6f), "");  // a clean step resets the count
  EXPECT_EQ(v.skipped_in_a_row(), 0);
  for (int k = 6; k <= 9; ++k) v.check(step(k, 2.0, true, 1e6f), "");
  const std::string e2 = error_of([&] { v.check(step(10, 2.0, true, 1e6f), ""); });
  EXPECT_NE(e2.find("step 10: 5 steps in a row were skipped (overflowing gradients"), std::string::npos)
      << e2;
}

TEST(StepWatch, StopModeStopsOnAGuardedSkipAndOnANonFiniteAppliedStep) {
  rp::TrainSpec s;
  rp::StepWatch w(s);
  EXPECT_TRUE(w.check(step(1, 2.0, false), "").empty());
  // clipping skipped a step with NaN gradients: the spec asked to stop
  EXPECT_NE(error_of([&] { w.check(step(2, 2.0, true), ""); }).find("step 2: the gradient norm is nan"),
            std::string::npos);
  rp::StepWatch v(s);
  EXPECT_NE(error_of([&] { v.check(step(1, INFINITY, false), ""); }).find("step 1: the loss is inf"),
            std::string::npos);
  // a step without target tokens is skipped by the runtime: a warning, not an error
  rp::StepWatch u(s);
  auto warn = u.check(step(1, 0.0, true, 1.f, 0), "");
  ASSERT_EQ(warn.size(), 1u);
  EXPECT_NE(warn[0].find("no target tokens"), std::string::npos);
}

TEST(StepWatch, FindsNonFiniteGroups) {
  std::vector<std::vector<float>> g = {{1.f, 2.f}, {3.f}, {4.f, 5.f}};
  EXPECT_EQ(rp::first_nonfinite_group(g), -1);
  g[2][1] = -INFINITY;
  EXPECT_EQ(rp::first_nonfinite_group(g), 2);
  g[1][0] = NAN;
  EXPECT_EQ(rp::first_nonfinite_group(g), 1);
}

TEST(SpecLimits, ProductsOfCountsAndHugeNumbersNameTheirKey) {
  auto d = tmpdir();
  auto parse = [&](const std::string& extra) { return spec_result(d, extra); };
  // the product overflowed to 0 and divided by it (SIGFPE)
  EXPECT_EQ(parse(", \"micro_batches\": 4611686018427387904, \"accumulation\": 4"),
            "s.json: key 'sequences_per_step': 2 is not divisible by micro_batches x accumulation = "
            "4611686018427387904 x 4");
  EXPECT_NE(parse(", \"seq_len\": 4611686018427387904").find("key 'seq_len'"), std::string::npos);
  EXPECT_NE(parse(", \"steps\": 4611686018427387904").find("key 'steps'"), std::string::npos);
  EXPECT_EQ(
      parse(", \"device_memory_gib\": 1e300"),
      "s.json: key 'device_memory_gib': expected a number > 0 and <= 1048576 (GiB per device), got 1e+300");
}

TEST(SpecLimits, ASpecBuiltInCodeIsCheckedLikeASpecFile) {
  auto d = tmpdir();
  rp::TrainSpec s = spec(d, tiny_model(d), 2);
  s.workers = -3;  // used to be planned as one worker
  try {
    rp::Trainer(s).run();
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "test spec: key 'workers': expected an integer in 1..1024, got -3");
  }
  EXPECT_FALSE(fs::exists(d / "run"));
  s.workers = 2;
  s.micro_batches = int64_t(1) << 62;
  s.accumulation = 8;
  EXPECT_THROW(rp::Trainer(s).run(), std::invalid_argument);
}

TEST(SpecLimits, ASeqLenWhoseSequencesDoNotFitIsRefusedBeforePacking) {
  auto d = tmpdir();
  rp::TrainSpec s = spec(d, tiny_model(d), 2);
  s.seq_len = int64_t(1) << 38;  // one sequence's tokens and one layer's activation of it: > 20 TiB
  s.sequences_per_step = 2;
  try {
    rp::Trainer(s).run();
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(
        std::string(e.what()).find("test spec: key 'seq_len': one sequence of 274877906944 tokens needs "),
        std::string::npos)
        << e.what();
  }
}

}  // namespace

namespace {

// A metrics.csv that is a symbolic link (here to /dev/full, where every write fails with
// ENOSPC) is refused before the model loads, naming it: the run writes a file of its own
// there and would replace the user's link. (This link was how the test made metrics writes
// fail mid-run; a real full disk during a run is left to the break-it passes, which ran it.)
TEST(DiskFull, ALinkedMetricsFileIsRefusedBeforeTheRunStarts) {
  auto d = tmpdir();
  rp::TrainSpec s = spec(d, tiny_model(d), 4);
  fs::create_directories(d / "run");
  fs::create_symlink("/dev/full", d / "run/metrics.csv");
  // an earlier run's folder
  write(d / "run/roundpipe_run.json", R"({"written_by": "roundpipe train"})");
  try {
    rp::Trainer(s).run();
    FAIL() << "accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.csv is a symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_symlink(d / "run/metrics.csv"));
  EXPECT_FALSE(fs::exists(d / "run/final"));
}

// A metrics.csv that is a named pipe (a user's, or a tracker's) is refused before the run
// starts, naming it: a resumed run read its rows from the pipe and waited for a writer forever,
// a fresh one blocked opening it for writing.
TEST(DiskFull, AMetricsFileThatIsANamedPipeIsRefusedBeforeTheRunStarts) {
  auto d = tmpdir();
  rp::TrainSpec s = spec(d, tiny_model(d), 4);
  fs::create_directories(d / "run");
  ASSERT_EQ(mkfifo((d / "run/metrics.csv").c_str(), 0600), 0);
  write(d / "run/roundpipe_run.json", R"({"written_by": "roundpipe train"})");
  try {
    rp::Trainer(s).run();
    FAIL() << "accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(
        std::string(e.what()).find("metrics.csv is a named pipe, where the run writes a file of its own"),
        std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(d / "run/metrics.csv"));
  EXPECT_FALSE(fs::exists(d / "run/final"));
}

// A save that fails mid-run (here a file of the user's where the next checkpoint goes; a full
// disk or a read-only folder fails the same write) says which finished checkpoint --resume can
// still start from, or that there is none.
TEST(DiskFull, AFailedSaveNamesTheCheckpointToResumeFrom) {
  auto d = tmpdir();
  rp::TrainSpec s = spec(d, tiny_model(d), 4);
  s.save_every = 1;
  const fs::path out = d / "run";
  rp::TrainerCallbacks cb;
  cb.on_checkpoint = [&](const rp::CheckpointReport& r) {
    if (fs::path(r.dir).filename() == "checkpoint-2") write(out / "checkpoint-3", "in the way");
  };
  const auto failure = [](rp::TrainSpec spec, const rp::TrainerCallbacks& callbacks) -> std::string {
    try {
      rp::Trainer(std::move(spec)).run(callbacks);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(failure(s, cb), (out / "checkpoint-3").string() + ": exists and is not a directory; --resume " +
                                (out / "checkpoint-2").string() +
                                " continues from the last finished checkpoint");
  EXPECT_TRUE(rp::resumable_checkpoint((out / "checkpoint-2").string()));
  // the first save failing: none to resume from
  fs::remove_all(out);
  rp::TrainerCallbacks first;
  first.on_ready = [&] { write(out / "checkpoint-1", "in the way"); };
  EXPECT_EQ(failure(s, first), (out / "checkpoint-1").string() +
                                   ": exists and is not a directory; no checkpoint was finished before it "
                                   "(nothing to --resume from)");
  fs::remove_all(d);
}

// A full disk mostly fails the per-step metrics write before a checkpoint's: that error names
// the checkpoint --resume can start from too. The test caps the size of the files this process
// writes (RLIMIT_FSIZE, SIGXFSZ ignored: a write past it fails with EFBIG, as ENOSPC would) at
// metrics.csv's size once checkpoint-2 is written, so step 3's metrics row is the write that fails.
TEST(DiskFull, AFailedMetricsWriteNamesTheCheckpointToResumeFrom) {
  auto d = tmpdir();
  rp::TrainSpec s = spec(d, tiny_model(d), 5);
  s.save_every = 2;
  const fs::path out = d / "run";
  struct rlimit was {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &was), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rp::TrainerCallbacks cb;
  cb.on_checkpoint = [&](const rp::CheckpointReport& r) {
    if (fs::path(r.dir).filename() != "checkpoint-2") return;
    struct rlimit cap = was;
    cap.rlim_cur = rlim_t(fs::file_size(out / "metrics.csv"));
    setrlimit(RLIMIT_FSIZE, &cap);
  };
  std::string what = "no error";
  try {
    rp::Trainer(s).run(cb);
  } catch (const std::exception& e) {
    what = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &was);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(what.find("metrics.csv: cannot write the row of step 3: File too large"), std::string::npos)
      << what;
  EXPECT_NE(what.find("; --resume " + (out / "checkpoint-2").string() +
                      " continues from the last finished checkpoint"),
            std::string::npos)
      << what;
  EXPECT_TRUE(rp::resumable_checkpoint((out / "checkpoint-2").string()));
  fs::remove_all(d);
}

TEST(DiskFull, FreeSpaceIsCheckedAgainstTheCheckpointSize) {
  auto d = tmpdir();
  EXPECT_NO_THROW(rp::require_disk_space(d.string(), 1 << 20, "a checkpoint"));
  try {
    rp::require_disk_space((d / "not/yet").string(), uint64_t(1) << 62, "a checkpoint");
    FAIL() << "accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("not/yet: a checkpoint needs about 4194304 TiB, the file system has"),
        std::string::npos)
        << e.what();
  }
  // the estimate bounds a real checkpoint from above (within a factor of two plus the slack)
  rp::TrainSpec s = spec(d, tiny_model(d), 2);
  const rp::TrainResult r = rp::Trainer(s).run();
  uint64_t real = 0;  // the Hugging Face folder and the state folder beside it (state/<name>/)
  const fs::path ck = r.checkpoint;
  for (const fs::path& dir : {ck, ck.parent_path() / "state" / ck.filename()})
    for (const auto& f : fs::directory_iterator(dir)) real += f.file_size();
  const rp::LoadedModel lm = rp::load_model(r.checkpoint);
  const uint64_t est = rp::checkpoint_bytes(rp::make_layout(lm.config), s);
  EXPECT_GE(est, real);
  EXPECT_LE(est - (uint64_t(64) << 20), 2 * real);
}

// A tokenizer whose ids run past the model's vocab_size is refused when the data is loaded,
// naming the data file, the id and the vocab_size, instead of failing inside the first step.
TEST(SpecLimits, TokenIdsPastTheVocabSizeAreRefusedWhenTheDataLoads) {
  auto d = tmpdir();
  rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  write(d / "data.jsonl", kData);
  rp::TokenStreamOptions o;
  o.seq_len = 16;
  EXPECT_GT(rp::TokenStream(lm, (d / "data.jsonl").string(), o).stats().sequences, 0);  // fits as it is
  lm.config.vocab_size = 100;  // the byte tokens of letters are ids 98..123
  try {
    rp::TokenStream s(lm, (d / "data.jsonl").string(), o);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("data.jsonl: token id "), std::string::npos) << m;
    EXPECT_NE(m.find("vocab_size 100"), std::string::npos) << m;
  }
  fs::remove_all(d);
}

}  // namespace
