// The `roundpipe` command as a user meets it: bad input gives one clear line and leaves
// no output behind; the default job trains a real model with a falling loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "scheduler/profile.hpp"
#include "tests/as_unprivileged.hpp"
#include "tests/cli/cli_util.hpp"
#include "trace/trace_check.hpp"

namespace fs = std::filesystem;

namespace {

using namespace rp::clitest;

TEST(Cli, TrainsTinyModelAndWritesLoadableCheckpoint) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl",
        "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n"
        "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("step     2/2 | loss"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d / "run/metrics.csv"));
  auto lm = rp::load_model((d / "run/final").string());
  EXPECT_EQ(lm.config.num_hidden_layers, 2);
  // training moved the weights away from the constant 0.02 they started at
  double moved = 0;
  for (auto& [name, t] : lm.tensors)
    for (float v : t.data) moved += std::abs(v - 0.02f);
  EXPECT_GT(moved, 1e-3);
  fs::remove_all(d);
}

// The run directory holds the measured per-layer profile, and `roundpipe plan --profile`
// partitions with it.
// A Qwen3-MoE run's progress line carries the expert utilisation and the load-balancing loss,
// which metrics.csv holds for the same step.
TEST(Cli, MoeProgressLineShowsTheExperts) {
  auto d = tmpdir();
  auto model = tiny_model(d, true);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const size_t at = r.out.find("step     2/2 | loss");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(line.find("x even, aux "), std::string::npos) << line;
  std::ifstream f(d / "run/metrics.csv");
  std::string row;
  std::getline(f, row);
  std::getline(f, row);
  std::getline(f, row);  // step 2
  std::vector<std::string> cols;
  std::stringstream ss(row);
  for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
  ASSERT_GE(cols.size(), 12u) << row;
  EXPECT_NE(line.find(fmt::format("aux {:.3f}", std::stod(cols[11]))), std::string::npos)
      << line << " / " << row;
  fs::remove_all(d);
}

// --dump-batch replaces an earlier dump (debugging reruns) but never another file at its name.
TEST(Cli, DumpBatchReplacesOnlyAnEarlierDump) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const std::string run = "train " + (d / "spec.json").string() + " --dump-batch " + (d / "b.json").string();
  ASSERT_EQ(roundpipe(run, d).code, 0);
  const CliRun again = roundpipe(run, d);  // the earlier dump goes
  EXPECT_EQ(again.code, 0) << again.err;
  write(d / "b.json", "{\"ids\": [1, 2], \"mine\": true}\n");
  const CliRun user = roundpipe(run, d);
  EXPECT_EQ(user.code, 2) << user.err;
  EXPECT_NE(user.err.find("is not an earlier --dump-batch output"), std::string::npos) << user.err;
  EXPECT_EQ(slurp(d / "b.json"), "{\"ids\": [1, 2], \"mine\": true}\n");
  fs::remove_all(d);
}

TEST(Cli, DumpBatchWritesTheFirstBatchOrSaysWhyNot) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun ok =
      roundpipe("train " + (d / "spec.json").string() + " --dump-batch " + (d / "batch.json").string(), d);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("the first batch of step 1 (2 sequences of 16 tokens,"), std::string::npos) << ok.out;
  // one sequence is singular ("1 sequences" before)
  const CliRun one = roundpipe("train " + (d / "spec.json").string() +
                                   " --set sequences_per_step=1 --set "
                                   "micro_batches=1 --dump-batch " +
                                   (d / "one.json").string(),
                               d);
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("the first batch of step 1 (1 sequence of 16 tokens,"), std::string::npos)
      << one.out;
  const auto b = nlohmann::json::parse(slurp(d / "batch.json"));
  EXPECT_EQ(b["ids"].size(), size_t(b["n_seq"].get<int>() * b["seq_len"].get<int>()));
  // a folder that does not exist: one line naming the option and the path, exit 1 (it used
  // to write nothing and say nothing)
  const std::string bad = (d / "no/such/dir/batch.json").string();
  CliRun r = roundpipe("train " + (d / "spec.json").string() + " --dump-batch " + bad + " --output-dir " +
                           (d / "run2").string(),
                       d);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--dump-batch " + bad + ": cannot write"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d / "run2")) << "checked before any output is written";
  fs::remove_all(d);
}

TEST(Cli, TrainWritesAProfileThatPlanReads) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string() + " --steps 3", d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE((r.out + r.err).find("automatic plan"), std::string::npos) << r.out << r.err;
  const fs::path prof = d / "run/profile.json";
  ASSERT_TRUE(fs::exists(prof)) << r.out << r.err;
  rp::Profile p = rp::Profile::load(prof.string());
  ASSERT_EQ(p.num_layers(), 4);  // embedding, 2 decoders, tail
  EXPECT_EQ(p.n_seq(), 1);
  EXPECT_EQ(p.seq_len(), 16);
  // 3 steps x 2 micro-batches: every layer was timed in every micro-batch (the plan may
  // have changed once, so a decoder's micro-batches split between kinds)
  for (int l = 0; l < 4; ++l) {
    const auto& lp = p.layer(l);
    const int64_t fb = std::max(lp.fwd.seen(), lp.bwd.seen()), tail = lp.tail.seen();
    EXPECT_EQ(fb + tail, 6) << "layer " << l;
    EXPECT_GT(lp.weight_bytes, 0) << "layer " << l;
    EXPECT_GT(lp.grad_bytes, 0) << "layer " << l;
  }
  EXPECT_EQ(p.layer(3).tail.seen(), 6);
  r = roundpipe("plan --model " + (d / "run/final").string() + " --gpus 2 --seq 16 --micro 2 --profile " +
                    prof.string(),
                d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("costs     profile " + prof.string()), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// The transfer keys reach the runtime: the trace records the settings the run used.
TEST(Cli, TransferSettingsFromTheSpecReachTheTrace) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json",
        spec_for(model, d / "data.jsonl", d / "run",
                 ", \"trace\": true, \"transfer_priorities\": false, \"transfer_chunk_bytes\": 65536"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  std::ifstream f(d / "run/trace.json");
  auto j = nlohmann::json::parse(f);
  EXPECT_TRUE(rp::check_trace_nesting(j).ok()) << rp::check_trace_nesting(j).summary();
  EXPECT_EQ(j["otherData"]["transfer_priorities"], "off");
  EXPECT_EQ(j["otherData"]["transfer_chunk_bytes"], "65536");
  fs::remove_all(d);
}

TEST(Cli, BadSpecsGiveOneLineNamingTheKey) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"hello world\"}\n");
  struct Case {
    std::string extra, needle;
  } cases[] = {
      {", \"wokers\": 2", "unknown key 'wokers'"},
      {", \"steps\": \"ten\"", "key 'steps': expected an integer"},
      {", \"micro_batches\": 0", "key 'micro_batches'"},
      {", \"sequences_per_step\": 3", "not divisible"},
      {", \"backend\": \"tpu\"", "key 'backend'"},
      {", \"transfer_chunk_bytes\": -1", "key 'transfer_chunk_bytes'"},
      {", \"transfer_chunk_bytes\": 1",
       "key 'transfer_chunk_bytes': expected 0 (no chunking) or at least 65536"},
      {", \"transfer_chunk_bytes\": 9223372036854775808", "got 9223372036854775808"},
      {", \"seed\": -1", "key 'seed': expected an integer >= 0, got -1"},
      {", \"backend\": \"cpu\", \"compute_dtype\": \"f16\"",
       "key 'compute_dtype': \"f16\" needs the cuda backend"},
      {", \"transfer_priorities\": \"yes\"", "key 'transfer_priorities': expected true or false"},
      {", \"optimizer\": {\"lr\": 1e-3, \"beta\": 0.9}", "unknown key 'optimizer.beta'"},
      {", \"lr_schedule\": {\"kind\": \"exp\"}", "exp"},
      {", \"plan\": {\"forward\": [[0,1]], \"tail\": [3,3], \"backward\": [[1,0]]}", "tail stage"},
      // {} once ran the uniform default plan as if it had been given
      {", \"plan\": {}",
       "spec.json: key 'plan': expected an object with \"forward\", \"tail\" and \"backward\""},
      {", \"plan\": [1]", "spec.json: key 'plan': expected an object"},
      // what needs no model is refused before it loads: mixed forms, counts out of range, bad pairs
      {", \"plan\": {\"forward_layers\": 2, \"forward\": [[0, 1]], \"tail\": [3, 3], \"backward\": []}",
       "spec.json: key 'plan': key 'forward_layers' does not go with explicit forward/tail/backward stages"},
      {", \"plan\": {\"backward_layers\": -1}",
       "spec.json: key 'plan': key 'backward_layers': expected an "
       "integer >= 1, got -1"},
      {", \"plan\": {\"tail_decoders\": -2}",
       "spec.json: key 'plan': key 'tail_decoders': expected an integer >= 0"},
      {", \"plan\": {\"forward\": [[0]], \"tail\": [3, 3], \"backward\": [[2, 0]]}",
       "spec.json: key 'plan'.forward: expected a pair of layer indices [a, b], got [0]"},
      {", \"watchdog_s\": -1", "key 'watchdog_s': expected a number of seconds >= 0 (0 = off), got -1"},
      {", \"stop_timeout_s\": \"soon\"", "key 'stop_timeout_s'"},
      {", \"pin_budget_gib\": -2",
       "key 'pin_budget_gib': expected a number >= 0 and <= 1048576 (GiB), got -2"},
      // values the learning-rate schedule inherits are named by the key the spec wrote
      {", \"steps\": -5", "spec.json: key 'steps': expected an integer >= 1, got -5"},
      {", \"optimizer\": {\"lr\": -0.001}",
       "spec.json: key 'optimizer.lr': expected a finite number >= 0, got -0.001"},
      {", \"lr_schedule\": {\"kind\": \"exp\"}",
       "spec.json: key 'lr_schedule.kind': unknown schedule 'exp' (valid: constant, linear, cosine)"},
      // a warmup longer than the run names the warmup (the likelier slip) and both counts
      {", \"lr_schedule\": {\"kind\": \"cosine\", \"warmup_steps\": 5}",
       "spec.json: key 'lr_schedule.warmup_steps': expected at most steps (2), got 5"},
      {", \"lr_schedule\": {\"kind\": \"linear\", \"warmup_steps\": 5, \"total_steps\": 3}",
       "spec.json: key 'lr_schedule.warmup_steps': expected at most total_steps (3), got 5"},
      {", \"lr_schedule\": {\"lr\": \"fast\"}",
       "spec.json: key 'lr_schedule.lr': expected a finite number >= 0"},
      // the default constant schedule ramps up too: it trained at a fraction of lr throughout
      {", \"lr_schedule\": {\"warmup_steps\": 5}",
       "spec.json: key 'lr_schedule.warmup_steps': expected at most steps (2), got 5"},
  };
  for (auto& c : cases) {
    write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", c.extra));
    CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
    expect_one_line_error(r, c.needle);
    EXPECT_FALSE(fs::exists(d / "run")) << c.extra;
    if (c.needle.rfind("spec.json: key 'plan'", 0) == 0) {  // refused before the model loads
      EXPECT_EQ(r.out, "") << c.extra << ": printed before the refusal";
    }
  }
  // --steps is checked with the schedule: it was applied after, so a warmup that fits the new
  // steps was refused against the file's and one that does not fit them trained at lr 0
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run",
                                  ", \"lr_schedule\": {\"kind\": \"linear\", \"warmup_steps\": 3}"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string() + " --steps 1", d),
                        "key 'lr_schedule.warmup_steps': expected at most steps (1), got 3");
  EXPECT_FALSE(fs::exists(d / "run"));
  const CliRun longer = roundpipe(
      "train " + (d / "spec.json").string() + " --steps 5 --dump-batch " + (d / "b.json").string(), d);
  EXPECT_EQ(longer.code, 0) << longer.err;
  EXPECT_TRUE(fs::exists(d / "b.json")) << longer.err;
  fs::remove(d / "b.json");
  fs::remove_all(d / "run");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string() + " --resume ''", d),
                        "--resume: expected a checkpoint folder");
  EXPECT_FALSE(fs::exists(d / "run"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string() + " --output-dir ''", d),
                        "--output-dir: expected a folder, got \"\"");
  EXPECT_FALSE(fs::exists(d / "run"));
  EXPECT_FALSE(fs::exists(d / "runs")) << "the spec's default output folder";
  // the data files are checked before the model is loaded, naming the key and the OS reason
  write(d / "spec.json", spec_for(model, d / "nowhere.jsonl", d / "run"));
  expect_one_line_error(
      roundpipe("train " + (d / "spec.json").string(), d),
      "spec.json: key 'data': " + (d / "nowhere.jsonl").string() + ": No such file or directory");
  EXPECT_FALSE(fs::exists(d / "run"));
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run",
                                  ", \"eval_data\": \"" + (d / "no-eval.jsonl").string() + "\""));
  expect_one_line_error(
      roundpipe("train " + (d / "spec.json").string(), d),
      "spec.json: key 'eval_data': " + (d / "no-eval.jsonl").string() + ": No such file or directory");
  EXPECT_FALSE(fs::exists(d / "run"));
  write(d / "broken.json", "{\"model\": \"x\",\n \"data\": }");
  expect_one_line_error(roundpipe("train " + (d / "broken.json").string(), d), "broken.json:2:");
  fs::remove_all(d);
}

// A run killed while swapping a checkpoint into place left "<name>.old-<pid>" (the previous
// checkpoint, marked as ours) and maybe no "<name>": the next run puts it back; beside a
// complete "<name>" it is removed. Nothing finished is lost: a fresh run into that folder is
// refused unless told to start over there (which then removes them), and, as neither has its
// trainer state, no --resume is advised.
TEST(Cli, LeftoversOfAKilledCheckpointSwapAreRestoredOrRemoved) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  fs::create_directories(d / "run/checkpoint-7.old-999999999");
  write(d / "run/checkpoint-7.old-999999999/marker", "kept");
  mark(d / "run/checkpoint-7.old-999999999", "old", "checkpoint-7", "999999999");
  fs::create_directories(d / "run/checkpoint-5");
  fs::create_directories(d / "run/checkpoint-5.old-999999999");
  mark(d / "run/checkpoint-5.old-999999999", "old", "checkpoint-5", "999999999");
  // an earlier run's folder
  write(d / "run/roundpipe_run.json", R"({"written_by": "roundpipe train"})");
  // the folder holds an earlier run's checkpoints: a fresh run there is refused (after the
  // leftovers were put back), and --overwrite-output-dir lets it start over
  const CliRun refused = roundpipe("train " + (d / "spec.json").string() + " --steps 1", d);
  EXPECT_EQ(refused.code, 1) << refused.err;
  EXPECT_NE(refused.err.find("roundpipe: error: "), std::string::npos) << refused.err;
  EXPECT_NE(
      refused.err.find("holds an earlier run's checkpoints (checkpoint-5, checkpoint-7); none of them can be "
                       "resumed"),
      std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("--resume"), std::string::npos) << refused.err;
  EXPECT_TRUE(fs::exists(d / "run/checkpoint-7/marker"));
  CliRun r = roundpipe("train " + (d / "spec.json").string() + " --steps 1 --overwrite-output-dir", d);
  ASSERT_EQ(r.code, 0) << r.err;
  // starting over removes the earlier run's checkpoints but keeps every file in them that no
  // manifest proves roundpipe's (these folders have none, as an earlier release wrote them):
  // the empty checkpoint-5 goes, checkpoint-7's file stays and the log names it
  EXPECT_TRUE(fs::exists(d / "run/checkpoint-7/marker")) << r.err;
  EXPECT_FALSE(fs::exists(d / "run/checkpoint-7.old-999999999"));
  EXPECT_FALSE(fs::exists(d / "run/checkpoint-5"));
  EXPECT_FALSE(fs::exists(d / "run/checkpoint-5.old-999999999"));
  EXPECT_NE(r.out.find("overwrite: removed the earlier run's checkpoint-5, checkpoint-7"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("checkpoint-7/marker: not written by roundpipe"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// Names that only look like leftovers (a user's build.tmp-4242/, backup.old-2023/) are never
// removed or renamed, only named in one warning line; and "output_dir": ".." (a folder that
// holds the working directory) is refused before anything is looked at.
TEST(Cli, LookAlikeLeftoversAreLeftAloneAndTheParentFolderIsNoOutput) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  fs::create_directories(d / "work/run");
  fs::create_directories(d / "work/build.tmp-999999999/obj");
  write(d / "work/build.tmp-999999999/obj/a.o", "mine");
  fs::create_directories(d / "work/backup.old-999999998");
  write(d / "work/backup.old-999999998/notes.txt", "mine");
  write(d / "work/run/spec.json", spec_for(model, d / "data.jsonl", ".."));
  expect_one_line_error(roundpipe_in(d / "work/run", "train spec.json --steps 1", d),
                        "spec.json: key 'output_dir': '..' contains the working directory");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "work"));
  const CliRun r = roundpipe("train " + (d / "spec.json").string() + " --steps 1", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(d / "work/build.tmp-999999999/obj/a.o"), "mine");
  EXPECT_EQ(slurp(d / "work/backup.old-999999998/notes.txt"), "mine");
  EXPECT_FALSE(fs::exists(d / "work/backup"));
  const std::string log = r.out + r.err;  // spdlog's lines go to stdout
  EXPECT_NE(log.find("left alone " + (d / "work/backup.old-999999998").string() + ", " +
                     (d / "work/build.tmp-999999999").string()),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("left alone"), log.rfind("left alone")) << "one warning line: " << log;
  fs::remove_all(d);
}

TEST(Cli, BadModelAndDataFilesAreNamed) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"hello\"}\n{\"prompt\": 3, \"completion\": \"x\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "data.jsonl:2:");
  write(d / "data.jsonl", "{\"text\": \"hello\"}\n");
  // missing model: named with the spec's key, before anything is loaded
  write(d / "spec.json", spec_for(d / "nope.gguf", d / "data.jsonl", d / "run"));
  expect_one_line_error(
      roundpipe("train " + (d / "spec.json").string(), d),
      "spec.json: key 'model': " + (d / "nope.gguf").string() + ": No such file or directory");
  // truncated safetensors
  auto st = model / "model.safetensors";
  auto size = fs::file_size(st);
  fs::resize_file(st, size / 2);
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "model.safetensors");
  // unsupported config
  fs::remove_all(model);
  model = tiny_model(d);
  auto cfg = nlohmann::json::parse(slurp(model / "config.json"));
  cfg["model_type"] = "gpt_neox";
  write(model / "config.json", cfg.dump());
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "config.json");
  EXPECT_FALSE(fs::exists(d / "run"));
  fs::remove_all(d);
}

TEST(Cli, DefaultJobLossFallsOver20Steps) {
  if (const std::string why = default_assets_missing(); !why.empty()) GTEST_SKIP() << why;
  const fs::path root = RP_SOURCE_DIR;
  auto d = tmpdir();
  CliRun r{0, "", ""};
  {
    auto cwd = fs::current_path();
    fs::current_path(root);
    r = roundpipe("train examples/specs/default.json --output-dir " + (d / "run").string(), d);
    fs::current_path(cwd);
  }
  ASSERT_EQ(r.code, 0) << r.err;
  // metrics.csv: step,loss,... ; compare the mean of the first and last 5 steps
  std::ifstream f(d / "run/metrics.csv");
  std::string line;
  std::getline(f, line);
  std::vector<double> loss;
  std::vector<double> eval;  // the eval_loss column (every 5 steps)
  while (std::getline(f, line)) {
    loss.push_back(std::stod(line.substr(line.find(',') + 1)));
    std::vector<std::string> cols;
    for (size_t a = 0, b; a <= line.size(); a = b + 1) {
      b = line.find(',', a);
      if (b == std::string::npos) b = line.size();
      cols.push_back(line.substr(a, b - a));
    }
    if (!cols.at(9).empty()) eval.push_back(std::stod(cols.at(9)));  // eval_loss, blank without an evaluation
  }
  ASSERT_EQ(loss.size(), 20u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += loss[i] / 5, last += loss[15 + i] / 5;
  EXPECT_LT(last, first - 0.2) << "first-5 mean " << first << ", last-5 mean " << last;
  // the held-out passages: evaluated at steps 5, 10, 15, 20, and the loss on them falls too
  ASSERT_EQ(eval.size(), 4u);
  EXPECT_LT(eval.back(), eval.front() - 0.1)
      << "eval loss at step 5: " << eval.front() << ", at 20: " << eval.back();
  EXPECT_NE(r.out.find("eval loss"), std::string::npos);
  EXPECT_NE((r.out + r.err).find("eval before training"), std::string::npos) << r.out;
  auto lm = rp::load_model((d / "run/final").string());
  EXPECT_EQ(lm.config.num_hidden_layers, 30);
  fs::remove_all(d);
}

}  // namespace

namespace {

// Fitting without waiting at stage switches is not monotonic in the length: the partitioner
// sizes stages by working set, so at 32,768 tokens Qwen3-30B-A3B gets stages whose switches pass
// 24 GiB while at 65,536 it gets two-decoder stages whose switches fit (measured on an H200 under
// a 24 GiB cap: peak 11.99 GiB, bench/results/long_sequences.md). --max-seq's no-wait figure must
// not stop at the first length that waits.
TEST(Cli, MaxSeqWithoutWaitingIsNotABisection) {
  auto d = tmpdir();
  const fs::path cfg = fs::path(RP_SOURCE_DIR) / "examples/configs/qwen3-30b-a3b.json";
  CliRun run = roundpipe("plan --model " + cfg.string() +
                             " --gpus 1 --micro 1 --memory-cap 24GiB --max-seq --lora-r 32 "
                             "--lora-targets q_proj,k_proj,v_proj,o_proj",
                         d);
  ASSERT_EQ(run.code, 0) << run.err;
  // "longest   N tokens per sequence fit ... (1 micro-batch of 1 sequence); M without waiting ..."
  const auto at = run.out.find("); ", run.out.find("longest"));
  ASSERT_NE(at, std::string::npos) << run.out;
  const int64_t no_wait = std::stoll(run.out.substr(at + 3));
  EXPECT_GE(no_wait, 65536) << run.out;
  CliRun fit = roundpipe("plan --model " + cfg.string() +
                             " --gpus 1 --micro 1 --memory-cap 24GiB --lora-r 32 "
                             "--lora-targets q_proj,k_proj,v_proj,o_proj --seq " +
                             std::to_string(no_wait),
                         d);
  EXPECT_EQ(fit.code, 0) << fit.err;
  EXPECT_EQ(fit.out.find("makes the worker wait"), std::string::npos) << fit.out;
  fs::remove_all(d);
}

TEST(Cli, PlanPartitionsAConfigWithoutWeights) {
  auto d = tmpdir();
  write(d / "config.json",
        R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
            "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "max_position_embeddings": 40960})");
  CliRun r = roundpipe("plan --model " + (d / "config.json").string() +
                           " --gpus 8 --seq 8192 --micro 16 --trace " + (d / "sim.json").string(),
                       d);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* needle : {"28", "forward", "tail", "backward", "tokens/s", "bubble"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  auto trace = nlohmann::json::parse(slurp(d / "sim.json"));
  EXPECT_GT(trace["traceEvents"].size(), 16u);
  EXPECT_TRUE(rp::check_trace_nesting(trace).ok()) << rp::check_trace_nesting(trace).summary();
  // A pool past what one process drives is a usage error at once (it used to be simulated for minutes).
  r = roundpipe("plan --model " + (d / "config.json").string() + " --gpus 100000", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--gpus: expected an integer in 1..1024, got 100000"), std::string::npos) << r.err;
  // so are more simulated iterations than a plan needs (a million ran for minutes past 8 GiB)
  r = roundpipe("plan --model " + (d / "config.json").string() + " --iterations 20000", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--iterations: expected 0 (enough for whole deal cycles) to 10000, got 20000"),
            std::string::npos)
      << r.err;
  // --trace naming the model it plans is refused before anything is written (it replaced the config)
  const std::string config_text = slurp(d / "config.json");
  r = roundpipe("plan --model " + (d / "config.json").string() + " --trace " + (d / "config.json").string(),
                d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--trace: '" + (d / "config.json").string() + "' is or lies inside the input"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(d / "config.json"), config_text);
  // rates, latencies and host sizes are bounded: an infinite one printed "inf TFLOP/s", or "0
  // tokens/s", and 1e300 a 300-digit number of ms or "inf TiB"
  for (const char* flag : {"--pcie-gbps", "--peak-tflops", "--hbm-gbps", "--fp8-tflops", "--net-gbps",
                           "--net-latency-us", "--host-gib"})
    for (const char* value : {"inf", "1e300", "1e20"}) {
      r = roundpipe("plan --model " + (d / "config.json").string() + " --nodes 2 " + flag + " " + value, d);
      EXPECT_EQ(r.code, 2) << flag << " " << value << ": " << r.err;
      EXPECT_EQ(r.err.find("roundpipe: error: " + std::string(flag) + ": expected "), 0u) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
  // A memory cap no single layer fits in is refused, naming the layer.
  r = roundpipe("plan --model " + (d / "config.json").string() + " --gpus 8 --memory-cap 10MiB", d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("layer"), std::string::npos) << r.err;
  // --frozen: weights in a 4-bit storage form and no gradients leave room for longer sequences
  auto longest = [&](const std::string& extra) {
    CliRun run = roundpipe(
        "plan --model " + (d / "config.json").string() + " --gpus 8 --memory-cap 6GiB --max-seq" + extra, d);
    EXPECT_EQ(run.code, 0) << run.err;
    const auto at = run.out.find("longest");
    return at == std::string::npos ? int64_t(-1) : int64_t(std::stoll(run.out.substr(at + 7)));
  };
  const int64_t trainable = longest(""), frozen = longest(" --frozen q4_0");
  EXPECT_GT(trainable, 0);
  EXPECT_GT(frozen, trainable);
  // --max-seq also names the longest whose peak across stage switches fits (no stage waits for
  // the one before it to drain): no longer than the longest that fits at all; the plan prints its peak
  {
    CliRun run = roundpipe(
        "plan --model " + (d / "config.json").string() + " --gpus 8 --memory-cap 6GiB --max-seq", d);
    const auto at = run.out.find("); ", run.out.find("longest "));  // "(16 micro-batches of 1 sequence); N"
    ASSERT_NE(at, std::string::npos) << run.out;
    const int64_t no_wait = std::stoll(run.out.substr(at + 3));
    EXPECT_GT(no_wait, 0);
    EXPECT_LE(no_wait, trainable);
    EXPECT_NE(run.out.find("\npeak      "), std::string::npos) << run.out;
    // and a run of that length is planned with switches that fit: no stage waits
    CliRun fit = roundpipe("plan --model " + (d / "config.json").string() +
                               " --gpus 8 --memory-cap 6GiB --seq " + std::to_string(no_wait),
                           d);
    EXPECT_EQ(fit.code, 0) << fit.err;
    EXPECT_NE(fit.out.find("\npeak      "), std::string::npos) << fit.out;
    EXPECT_EQ(fit.out.find("makes the worker wait"), std::string::npos) << fit.out;
  }
  // a length past the model's context is said to be so (memory allows it, the model was not
  // trained for it); within it, nothing is said
  for (const int64_t max_pos : {int64_t(1024), int64_t(1) << 30}) {
    nlohmann::json cfg = nlohmann::json::parse(slurp(d / "config.json"));
    cfg["max_position_embeddings"] = max_pos;
    write(d / "ctx.json", cfg.dump());
    CliRun run =
        roundpipe("plan --model " + (d / "ctx.json").string() + " --gpus 8 --memory-cap 6GiB --max-seq", d);
    EXPECT_EQ(run.code, 0) << run.err;
    const bool noted = run.out.find("past the model's max_position_embeddings 1024") != std::string::npos;
    EXPECT_EQ(noted, max_pos == 1024) << run.out;
  }
  // mxfp4 is the experts' form: a model without experts is planned (and run) as a bf16 base
  EXPECT_EQ(longest(" --frozen mxfp4"), longest(" --frozen bf16"));
  r = roundpipe("plan --model " + (d / "config.json").string() + " --frozen mxfp4", d);
  EXPECT_NE(r.out.find("bf16 (mxfp4 applies to experts; this model has none)"), std::string::npos) << r.out;
  r = roundpipe("plan --model " + (d / "config.json").string() + " --frozen q9", d);
  EXPECT_EQ(r.code, 2) << r.err;  // a usage error
  EXPECT_NE(r.err.find("--frozen: expected f32, bf16"), std::string::npos) << r.err;
  r = roundpipe("plan --model " + (d / "missing.json").string(), d);
  expect_one_line_error(r, "missing.json");
  fs::remove_all(d);
}

}  // namespace

namespace {

TEST(Cli, UsageErrorsAreOneLine) {
  auto d = tmpdir();
  const char* const usage_errors[] = {"",
                                      "frobnicate",
                                      "train",
                                      "train x.json --steps 0",
                                      "train x.json --workers two",
                                      "train x.json --backend tpu",
                                      "train x.json --train",
                                      "convert a b --dtype q4",
                                      "train x.json --replica-timeout -1",
                                      "plan --model x.json --gpus -8",
                                      "plan --model x.json --nodes 0",
                                      "plan --model x.json --net-gbps -100",
                                      "plan --model x.json --net-gbps 100",
                                      "plan --model x.json --accumulation 4",
                                      "plan --model x.json --frozen q5_0",
                                      "plan --model x.json --memory-cap 24XB",
                                      "plan --model x.json --max-seq",
                                      "generate x.gguf",
                                      "generate x.gguf --prompt a --chat b",
                                      "generate x.gguf --prompt ''",
                                      "trace"};
  for (const char* args : usage_errors) {
    CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: "), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    // every usage error ends the same way, whether CLI11 or the command found it
    const std::string help = " (see roundpipe --help)\n";
    EXPECT_TRUE(r.err.size() > help.size() &&
                r.err.compare(r.err.size() - help.size(), help.size(), help) == 0)
        << args << ": " << r.err;
  }
  CliRun g = roundpipe("generate x.gguf", d);
  EXPECT_EQ(g.err,
            "roundpipe: error: give one of --prompt TEXT, --chat TEXT or --messages FILE, not empty (see "
            "roundpipe --help)\n");
  // a readable bound, not a range of 300 digits
  CliRun r = roundpipe("train x.json --replica-timeout -1", d);
  EXPECT_NE(r.err.find("expected a finite number of seconds > 0, got -1"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 200u) << r.err;
  r = roundpipe("plan --model x.json --net-gbps 100", d);
  EXPECT_NE(r.err.find("--net-gbps 100: predicts the gradient sum over nodes; give --nodes N"),
            std::string::npos)
      << r.err;
  fs::remove_all(d);
}

// A device_memory_gib too small for a stage fails naming the key (or the --set) that set the
// cap, with sizes in the unit that shows them: it said "0.0 MiB of 0.0 MiB capacity" and left
// the reader to guess which setting that was.
TEST(Cli, AMemoryCapTooSmallForAStageNamesTheKeyThatSetIt) {
  auto d = tmpdir();
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json",
        spec_for(tiny_model(d), d / "data.jsonl", d / "run", ", \"device_memory_gib\": 1e-6"));
  CliRun r = roundpipe("train " + (d / "spec.json").string() + " --steps 1", d);
  expect_one_line_error(r, "capacity (1073 bytes) in use; " + (d / "spec.json").string() +
                               ": key 'device_memory_gib' sets that capacity: raise it\n");
  EXPECT_NE(r.err.find("of its 1.05 KiB capacity"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("0.0 MiB"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d / "run")) << r.err;
  r = roundpipe("train " + (d / "spec.json").string() + " --steps 1 --set device_memory_gib=0.00001", d);
  expect_one_line_error(r,
                        "of its 10.5 KiB capacity (10737 bytes) in use; --set device_memory_gib=0.00001: key "
                        "'device_memory_gib' sets that capacity: raise it\n");
  EXPECT_FALSE(fs::exists(d / "run")) << r.err;
  fs::remove_all(d);
}

TEST(Cli, OutputDirAndSeqLenProblemsAreNamedBeforeTraining) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "chat.jsonl", "{\"prompt\": \"a very long prompt that does not fit\", \"completion\": \" x\"}\n");
  write(d / "data.jsonl", "{\"text\": \"hello world, hello world\"}\n");
  write(d / "afile", "x");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "afile"));
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "key 'output_dir'");
  write(d / "spec.json", spec_for(model, d / "chat.jsonl", d / "run"));
  auto spec = nlohmann::json::parse(slurp(d / "spec.json"));
  spec["seq_len"] = 4;
  write(d / "spec.json", spec.dump());
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), "key 'seq_len'");
  fs::remove_all(d);
}

// An unknown spec key that nearly is a known one (at most 2 edits), or a Hugging Face name of one,
// says which key was meant, in the one line naming the file (or the --set) and the key; a key
// near none gets no guess. A suggested key that a --set also sets does not make the file's
// typo that setting's fault.
TEST(Cli, AnUnknownKeyNearAKnownOneSaysWhichWasMeant) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"hello world, hello world\"}\n");
  const std::string spec = (d / "spec.json").string();
  struct Case {
    std::string extra, line;
  } cases[] = {
      {", \"wokers\": 2", ": unknown key 'wokers'; did you mean 'workers'? (known keys: "},
      {", \"sequences_per_setp\": 2",
       ": unknown key 'sequences_per_setp'; did you mean 'sequences_per_step'? (known keys: "},
      {", \"learnig_rate\": 1e-4",
       ": unknown key 'learnig_rate'; did you mean 'optimizer.lr' (Hugging Face's learning_rate)? (known "
       "keys: "},
      {", \"num_train_epochs\": 3",
       ": unknown key 'num_train_epochs'; did you mean 'epochs' (Hugging Face's num_train_epochs)? (known "
       "keys: "},
      {", \"optimizer\": {\"lrr\": 1e-3}",
       ": unknown key 'optimizer.lrr'; did you mean 'optimizer.lr'? (known keys: "},
      {", \"lr_schedule\": {\"warmup_step\": 1}",
       ": key 'lr_schedule.warmup_step': unknown key; did you mean 'lr_schedule.warmup_steps'? (valid: "},
      {", \"plan\": {\"forwad_layers\": 1}",
       ": key 'plan': unknown key 'forwad_layers'; did you mean 'forward_layers'? ("},
  };
  for (const auto& c : cases) {
    write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", c.extra));
    const CliRun r = roundpipe("train " + spec, d);
    expect_one_line_error(r, spec + c.line);
  }
  // nothing near: no guess
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", ", \"colour\": 2"));
  CliRun r = roundpipe("train " + spec, d);
  expect_one_line_error(r, spec + ": unknown key 'colour' (known keys: ");
  EXPECT_EQ(r.err.find("did you mean"), std::string::npos) << r.err;
  // from the command line: the --set is named
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  expect_one_line_error(roundpipe("train " + spec + " --set workrs=2", d),
                        "roundpipe: error: --set workrs=2: unknown key 'workrs'; did you mean 'workers'?");
  // the file's typo stays the file's, though a --set sets the key it suggests
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", ", \"wokers\": 2"));
  expect_one_line_error(roundpipe("train " + spec + " --set workers=1", d),
                        "roundpipe: error: " + spec + ": unknown key 'wokers'; did you mean 'workers'?");
  EXPECT_FALSE(fs::exists(d / "run"));
  fs::remove_all(d);
}

// An output folder given with --output-dir that cannot be one is named by the flag the user
// typed, not by the spec's key (the spec file never said it); one given with --set names that
// setting and the key, one in the file the file and the key. Nothing is made or changed.
TEST(Cli, AnOutputDirFromTheCommandLineIsNamedByItsFlag) {
  const TinyRun t = tiny_run();
  const fs::path& d = t.d;
  const fs::path& model = t.model;
  write(d / "afile", "x");
  const std::string train = "train " + (d / "spec.json").string();
  const std::string afile = (d / "afile").string();
  {  // a file, not a folder
    const CliRun r = roundpipe(train + " --output-dir " + afile, d);
    expect_one_line_error(r, "--output-dir: expected a directory, but '" + afile + "' is a file");
    EXPECT_EQ(r.err.find("spec.json"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("key 'output_dir'"), std::string::npos) << r.err;
  }
  {  // under a file: the folder cannot be made
    const CliRun r = roundpipe(train + " --output-dir " + afile + "/run", d);
    expect_one_line_error(r, "--output-dir: cannot create '" + afile + "/run': ");
    EXPECT_EQ(r.err.find("spec.json"), std::string::npos) << r.err;
  }
  // a folder of the user's own
  expect_one_line_error(roundpipe(train + " --output-dir /", d),
                        "roundpipe: error: --output-dir: '/' is the root folder");
  // --set names the setting and the key, the file itself the file and the key
  expect_one_line_error(roundpipe(train + " --set output_dir=" + afile, d),
                        "--set output_dir=" + afile + ": key 'output_dir': expected a directory");
  write(d / "file.json", spec_for(model, d / "data.jsonl", d / "afile"));
  expect_one_line_error(roundpipe("train " + (d / "file.json").string(), d),
                        (d / "file.json").string() + ": key 'output_dir': expected a directory");
  // --output-dir wins over a --set of the key, and the error names the flag
  expect_one_line_error(
      roundpipe(train + " --set output_dir=" + (d / "x").string() + " --output-dir " + afile, d),
      "roundpipe: error: --output-dir: expected a directory");
  EXPECT_EQ(slurp(d / "afile"), "x");
  EXPECT_FALSE(fs::exists(d / "run"));
  EXPECT_FALSE(fs::exists(d / "x"));
  fs::remove_all(d);
}

// An output folder the run cannot write into (read-only, another user's) is refused before the
// model and data load, in one line naming what gave it and why, with nothing on stdout; the
// user's file in it stays. Root writes anywhere: the run is an unprivileged user's.
TEST(Cli, AnOutputFolderThatCannotBeWrittenIsRefusedBeforeLoading) {
  const TinyRun t = tiny_run();
  const fs::path& d = t.d;
  const fs::path u = d / "u", ro = d / "ro";  // u: where the unprivileged run writes its output
  fs::create_directories(u);
  fs::permissions(u, fs::perms::all);
  fs::create_directories(ro);
  write(ro / "notes.txt", "mine");
  fs::permissions(ro, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                          fs::perms::others_read | fs::perms::others_exec);
  const std::string r = rp::testing::as_unprivileged([&] {
    const CliRun run = roundpipe("train " + (d / "spec.json").string() + " --output-dir " + ro.string(), u);
    return fmt::format("{}|{}|{}", run.code, run.err, run.out);
  });
  if (r == rp::testing::kNoDrop) GTEST_SKIP() << "root could not become an unprivileged user to run it";
  EXPECT_EQ(r, "1|roundpipe: error: --output-dir: cannot write into '" + ro.string() +
                   "' (Permission denied); the run writes its checkpoints and metrics there: make it "
                   "writable or choose another output_dir\n|");
  EXPECT_EQ(slurp(ro / "notes.txt"), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(ro), fs::directory_iterator()), 1);
  fs::remove_all(d);
}

TEST(Cli, LeftoversOfKilledRunsAreRemoved) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  fs::create_directories(d / "run/final.tmp-999999999");
  write(d / "run/final.tmp-999999999/model.safetensors.tmp-999999999", "partial");
  mark(d / "run/final.tmp-999999999", "tmp", "final", "999999999");  // a roundpipe writer's
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(d / "run/final.tmp-999999999"));
  EXPECT_FALSE(fs::exists(d / "run/final.tmp-999999999.roundpipe-owner"));
  EXPECT_TRUE(fs::exists(d / "run/final/model.safetensors"));
  fs::remove_all(d);
}

}  // namespace
