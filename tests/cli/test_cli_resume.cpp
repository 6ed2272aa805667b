// `roundpipe train --resume`: a run resumed from checkpoint-k reproduces the uninterrupted run
// bit for bit (losses, saved weights, optimizer state), with the async optimizer and 2 virtual
// GPUs; checkpoints carry the optimizer and trainer state; broken or unsuitable checkpoints give
// one line naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "tests/as_unprivileged.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// metrics.csv rows: step -> the loss column as written (6 decimals).
std::map<int, std::string> losses(const fs::path& csv) {
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);
  std::map<int, std::string> out;
  while (std::getline(f, line)) {
    const auto a = line.find(','), b = line.find(',', a + 1);
    out[std::stoi(line.substr(0, a))] = line.substr(a + 1, b - a - 1);
  }
  return out;
}

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light.\"}\n";

// 5 steps with a cosine schedule after one warmup step, clipping and a checkpoint every 2 steps.
std::string resume_spec(const fs::path& model, const fs::path& data, const fs::path& out,
                        const std::string& dtype) {
  return spec_for(
      model, data, out,
      ", \"steps\": 5, \"save_every\": 2, \"save_dtype\": \"" + dtype +
          "\", \"seed\": 3, \"optimizer\": {\"lr\": 0.01, \"max_grad_norm\": 1.0, \"weight_decay\": 0.1},"
          " \"lr_schedule\": {\"kind\": \"cosine\", \"warmup_steps\": 1}");
}

// The state folder of checkpoint folder `ck`: <out>/state/<name>.
fs::path state_of(const fs::path& ck) { return ck.parent_path() / "state" / ck.filename(); }

void expect_same_checkpoint(const fs::path& a, const fs::path& b) {
  for (const fs::path& f : {a / "model.safetensors", b / "model.safetensors",
                            state_of(a) / "optimizer_state.bin", state_of(b) / "optimizer_state.bin"})
    ASSERT_TRUE(fs::exists(f)) << f;
  EXPECT_TRUE(bytes_of(a / "model.safetensors") == bytes_of(b / "model.safetensors")) << a << " vs " << b;
  EXPECT_TRUE(bytes_of(state_of(a) / "optimizer_state.bin") == bytes_of(state_of(b) / "optimizer_state.bin"))
      << "optimizer state differs: " << a << " vs " << b;
  auto ta = nlohmann::json::parse(bytes_of(state_of(a) / "roundpipe_state.json"));
  auto tb = nlohmann::json::parse(bytes_of(state_of(b) / "roundpipe_state.json"));
  EXPECT_EQ(ta["step"], tb["step"]);
  EXPECT_EQ(ta["data_position"], tb["data_position"]);
}

TEST(CliResume, ResumedRunIsBitIdenticalToTheUninterruptedOne) {
  for (std::string dtype :
       {"f32", "bf16"}) {  // f32: the master is model.safetensors; bf16: in optimizer_state.bin
    auto d = tmpdir();
    auto model = tiny_model(d);
    write(d / "data.jsonl", kData);
    write(d / "spec.json", resume_spec(model, d / "data.jsonl", d / "a", dtype));
    CliRun a = roundpipe("train " + (d / "spec.json").string(), d);
    ASSERT_EQ(a.code, 0) << a.err << a.out;
    for (const char* f : {"model.safetensors", "config.json"})
      EXPECT_TRUE(fs::exists(d / "a/checkpoint-2" / f)) << f;
    for (const char* f : {"optimizer_state.bin", "roundpipe_state.json"})
      EXPECT_TRUE(fs::exists(d / "a/state/checkpoint-2" / f)) << f;
    auto ts = nlohmann::json::parse(bytes_of(d / "a/state/checkpoint-2/roundpipe_state.json"));
    EXPECT_EQ(ts["step"], 2);
    EXPECT_EQ(ts["data_position"], 4);  // 2 steps of 2 sequences
    const auto la = losses(d / "a/metrics.csv");
    ASSERT_EQ(la.size(), 5u);
    EXPECT_NE(la.at(3), la.at(5)) << "the run must train";

    // resume from checkpoint-2 into another folder
    CliRun b = roundpipe("train " + (d / "spec.json").string() + " --resume " +
                             (d / "a/checkpoint-2").string() + " --output-dir " + (d / "b").string(),
                         d);
    ASSERT_EQ(b.code, 0) << b.err << b.out;
    EXPECT_NE(b.out.find("step     5/5"), std::string::npos) << b.out;
    EXPECT_EQ(b.out.find("step     2/5"), std::string::npos) << b.out;
    const auto lb = losses(d / "b/metrics.csv");
    ASSERT_EQ(lb.size(), 3u);
    for (int t = 3; t <= 5; ++t) EXPECT_EQ(lb.at(t), la.at(t)) << dtype << " step " << t;
    expect_same_checkpoint(d / "a/final", d / "b/final");
    expect_same_checkpoint(d / "a/checkpoint-4", d / "b/checkpoint-4");

    // resume in place from checkpoint-4 with the spec key: metrics.csv keeps steps 1-4
    auto spec = nlohmann::json::parse(bytes_of(d / "spec.json"));
    spec["resume_from"] = (d / "a/checkpoint-4").string();
    write(d / "spec2.json", spec.dump());
    const std::string final_before = bytes_of(d / "a/final/model.safetensors");
    CliRun c = roundpipe("train " + (d / "spec2.json").string(), d);
    ASSERT_EQ(c.code, 0) << c.err << c.out;
    EXPECT_EQ(losses(d / "a/metrics.csv"), la);
    EXPECT_TRUE(bytes_of(d / "a/final/model.safetensors") == final_before) << dtype;
    fs::remove_all(d);
  }
}

// SIGTERM (what batch schedulers send) stops the run like Ctrl-C, and so does SIGHUP (a closing
// terminal or SSH session): the steps done are saved as checkpoint-<n>, exit code 130, and the
// run continues from that checkpoint.
TEST(CliResume, SigtermSavesTheStepsDoneAndTheRunContinuesFromThem) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  for (const std::string sig : {"TERM", "HUP"}) {
    SCOPED_TRACE("SIG" + sig);
    const fs::path a = d / ("a-" + sig), b = d / ("b-" + sig);
    write(d / "spec.json", spec_for(model, d / "data.jsonl", a, ", \"steps\": 1000000, \"seed\": 3"));
    const std::string cmd = "cd " + d.string() + " && (" + std::string(RP_BUILD_DIR) +
                            "/roundpipe train spec.json" +
                            " > out.txt 2> err.txt < /dev/null & pid=$!; sleep 3; kill -" + sig +
                            " $pid; wait $pid;" + " echo $? > rc.txt)";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    EXPECT_EQ(slurp(d / "rc.txt"), "130\n") << slurp(d / "err.txt");
    const std::string err = slurp(d / "err.txt");
    const auto at = err.find("saved ");
    ASSERT_NE(at, std::string::npos) << err;
    const auto ck_at = err.find("checkpoint-", at);
    ASSERT_NE(ck_at, std::string::npos) << err;
    const int n = std::stoi(err.substr(ck_at + 11));
    ASSERT_GE(n, 1) << err;
    const fs::path ck = a / ("checkpoint-" + std::to_string(n));
    EXPECT_TRUE(fs::exists(ck / "model.safetensors"));
    for (const char* f : {"optimizer_state.bin", "roundpipe_state.json"})
      EXPECT_TRUE(fs::exists(state_of(ck) / f)) << (state_of(ck) / f);
    EXPECT_EQ(nlohmann::json::parse(bytes_of(state_of(ck) / "roundpipe_state.json"))["step"], n);
    CliRun r = roundpipe("train " + (d / "spec.json").string() + " --resume " + ck.string() + " --steps " +
                             std::to_string(n + 2) + " --output-dir " + b.string(),
                         d);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_EQ(losses(b / "metrics.csv").size(), 2u);
  }
  fs::remove_all(d);
}

// One keypress can reach the run twice (a terminal signals the foreground process group, and a
// wrapper in it such as timeout passes its own copy on): two signals within a second stop once,
// saving the steps done; a second signal a second or more later still exits at once.
TEST(CliResume, TwoSignalsWithinASecondStopOnceAndSave) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "a", ", \"steps\": 1000000, \"seed\": 3"));
  const std::string run = "cd " + d.string() + " && (" + std::string(RP_BUILD_DIR) +
                          "/roundpipe train spec.json > out.txt 2> err.txt < /dev/null & pid=$!; sleep 3; ";
  ASSERT_EQ(std::system((run + "kill -INT $pid; kill -TERM $pid; wait $pid; echo $? > rc.txt)").c_str()), 0);
  std::string err = slurp(d / "err.txt");
  EXPECT_EQ(slurp(d / "rc.txt"), "130\n") << err;
  EXPECT_EQ(err.find("interrupted twice"), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint-"), std::string::npos) << err;
  // stderr is a file, not a terminal that echoed "^C": no blank line before the signal's line
  EXPECT_NE(err.find("roundpipe: interrupted: finishing"), std::string::npos) << err;
  EXPECT_EQ(err.find("\n\nroundpipe: interrupted"), std::string::npos) << err;
  EXPECT_NE(err.front(), '\n') << err;
  // a run whose stop waits (a step stuck on a 1 KB/s emulated link, stop_timeout_s 60): a second
  // signal 1.5 s after the first ends it at once
  write(d / "slow.json", spec_for(model, d / "data.jsonl", d / "b",
                                  ", \"steps\": 100, \"backend\": \"cpu\", \"pcie_gbps\": 1e-6, "
                                  "\"stop_timeout_s\": 60"));
  const SignalledRun r =
      train_with_signals(d, "slow.json", "sleep 3; kill -INT $pid; sleep 1.5; kill -INT $pid");
  err = slurp(d / "err.txt");
  EXPECT_EQ(r.rc, "130\n") << err;
  EXPECT_NE(err.find("interrupted twice, exiting now"), std::string::npos) << err;
  EXPECT_EQ(err.find("\n\nroundpipe: interrupted"), std::string::npos) << err;
  EXPECT_LT(r.seconds, 20.0) << err;
  fs::remove_all(d);
}

// A stop signal while the run evaluates before training (stuck on a 1 KB/s emulated link) has
// no step in flight to finish nor anything to save, and says so; the sample before fine-tuning
// is skipped, not run to its end after the stop.
TEST(CliResume, AStopBeforeTheFirstStepPromisesNoCheckpointAndSkipsTheSample) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json",
        spec_for(model, d / "data.jsonl", d / "a",
                 ", \"steps\": 100, \"pcie_gbps\": 1e-6, \"stop_timeout_s\": 1, "
                 "\"watchdog_s\": 1, \"eval_fraction\": 0.5, \"sample_prompt\": \"Say hi\""));
  // the signal once the watchdog reports the evaluation stuck: the run is past its startup
  const std::string cmd = "cd " + d.string() + " && (timeout --foreground -s KILL 60 " +
                          std::string(RP_BUILD_DIR) +
                          "/roundpipe train spec.json > out.txt 2> err.txt < /dev/null & pid=$!; for i in "
                          "$(seq 200); do grep -q 'watchdog:' out.txt err.txt && break; sleep 0.1; done;" +
                          " kill -INT $pid; wait $pid; echo $? > rc.txt)";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string out = slurp(d / "out.txt"), err = slurp(d / "err.txt");
  EXPECT_EQ(slurp(d / "rc.txt"), "130\n") << out << err;
  ASSERT_EQ(out.find("eval before training:"), std::string::npos) << "the signal came too late\n" << out;
  EXPECT_NE(err.find("roundpipe: interrupted before the first step: stopping without training or saving"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("finishing the steps in flight"), std::string::npos) << err;
  EXPECT_NE(err.find("interrupted after 0 steps; no checkpoint was written"), std::string::npos) << err;
  EXPECT_EQ(out.find("sample before fine-tuning:"), std::string::npos) << out;
  EXPECT_NE(out.find("the sample before fine-tuning is skipped"), std::string::npos) << out;
  fs::remove_all(d);
}

// A run stuck on a 1 KB/s emulated link (pcie_gbps 1e-6: a weight copy takes minutes) says
// what it waits for (the watchdog), and one SIGTERM ends it within stop_timeout_s plus the
// teardown: exit code 130, no checkpoint of the unfinished steps, and a closing line that says so.
TEST(CliResume, OneSigtermEndsARunStuckOnASlowLink) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "a",
                                  ", \"steps\": 100, \"backend\": \"cpu\", \"pcie_gbps\": 1e-6, "
                                  "\"watchdog_s\": 1, \"stop_timeout_s\": 1"));
  const SignalledRun r = train_with_signals(d, "spec.json", "sleep 3; kill -TERM $pid");
  const std::string& all = r.all;
  EXPECT_EQ(r.rc, "130\n") << all;
  EXPECT_LT(r.seconds, 15.0) << "3 s before the signal, 1 s stop timeout: the stop took too long\n" << all;
  EXPECT_NE(all.find("watchdog: no progress for"), std::string::npos) << all;
  EXPECT_NE(all.find("copies outstanding"), std::string::npos) << all;
  EXPECT_NE(all.find("did not finish within 1 s and were not saved"), std::string::npos) << all;
  // steps counted from 1 as in the progress lines: the first step is the one stuck
  EXPECT_NE(all.find("stop: step 1/100 did not finish within 1 s"), std::string::npos) << all;
  EXPECT_NE(all.find("no checkpoint was written"), std::string::npos) << all;
  // the stop line shows the start of the runtime's status; all of it is kept in a file
  const size_t at = all.find("stop: step 1/100");
  ASSERT_NE(at, std::string::npos);
  const std::string line = all.substr(at, all.find('\n', at) - at);
  EXPECT_LT(line.size(), 600u) << line;
  EXPECT_NE(line.find("all of it in "), std::string::npos) << line;
  EXPECT_NE(slurp(d / "a" / "stop_status.txt").find("copies outstanding"), std::string::npos);
  for (const auto& e : fs::directory_iterator(d / "a"))
    EXPECT_EQ(e.path().filename().string().rfind("checkpoint-", 0), std::string::npos) << e.path();
  fs::remove_all(d);
}

TEST(CliResume, UnsuitableCheckpointsGiveOneLineNamingTheFile) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", resume_spec(model, d / "data.jsonl", d / "a", "f32"));
  ASSERT_EQ(roundpipe("train " + (d / "spec.json").string() + " --steps 3", d).code, 0);
  const fs::path ck = d / "a/checkpoint-2";
  auto resume = [&](const fs::path& from, const std::string& extra = "") {
    return roundpipe("train " + (d / "spec.json").string() + " --resume " + from.string() + " --output-dir " +
                         (d / "r").string() + extra,
                     d);
  };
  // a model folder, not a checkpoint of a run: it may be trained as "model"
  expect_one_line_error(resume(model), model.string() +
                                           ": cannot resume: a model folder without the trainer state of a "
                                           "checkpoint (" +
                                           (d / "state/tiny/roundpipe_state.json").string() + " is missing");
  expect_one_line_error(resume(d / "nowhere"),
                        (d / "nowhere").string() +
                            ": cannot resume: not a checkpoint folder (it does not exist); "
                            "expected a checkpoint folder of a roundpipe train run");
  // nothing left to do
  {
    const CliRun r = resume(ck, " --steps 2");
    expect_one_line_error(r, "nothing is left to do");
    EXPECT_EQ(r.out, "") << "printed before the refusal";
  }
  // damaged optimizer state: truncated, missing
  fs::copy(ck, d / "t", fs::copy_options::recursive);
  const fs::path st = d / "state/t";
  fs::create_directories(st.parent_path());
  fs::copy(state_of(ck), st, fs::copy_options::recursive);
  const auto full = fs::file_size(st / "optimizer_state.bin");
  {  // one byte added: refused before the model loads, nothing on stdout
    std::ofstream(st / "optimizer_state.bin", std::ios::binary | std::ios::app) << 'x';
    const CliRun r = resume(d / "t");
    expect_one_line_error(r, "optimizer_state.bin: corrupted optimizer state: 1 trailing bytes");
    EXPECT_EQ(r.out, "") << "printed before the refusal";
  }
  for (auto size : {full / 2, full - 3}) {  // inside a group's state, inside the end marker
    fs::copy_file(state_of(ck) / "optimizer_state.bin", st / "optimizer_state.bin",
                  fs::copy_options::overwrite_existing);
    fs::resize_file(st / "optimizer_state.bin", size);
    const CliRun r = resume(d / "t");
    expect_one_line_error(r, "optimizer_state.bin: truncated");
    EXPECT_EQ(r.out, "") << "printed before the refusal (size " << size << " of " << full << ")";
  }
  fs::remove(st / "optimizer_state.bin");
  expect_one_line_error(resume(d / "t"), "optimizer_state.bin: missing");
  // not a regular file: a FIFO used to block the resume forever, a folder read as "not a state"
  ASSERT_EQ(::mkfifo((st / "optimizer_state.bin").c_str(), 0600), 0);
  expect_one_line_error(resume(d / "t"),
                        "optimizer_state.bin: not a regular file (a device, FIFO or socket)");
  fs::remove(st / "optimizer_state.bin");
  fs::create_directory(st / "optimizer_state.bin");
  expect_one_line_error(resume(d / "t"), "optimizer_state.bin: a folder, not a file");
  fs::remove(st / "optimizer_state.bin");
  fs::rename(st / "roundpipe_state.json", st / "state.keep");
  ASSERT_EQ(::mkfifo((st / "roundpipe_state.json").c_str(), 0600), 0);
  expect_one_line_error(resume(d / "t"),
                        "roundpipe_state.json: not a regular file (a device, FIFO or socket)");
  fs::remove(st / "roundpipe_state.json");
  fs::rename(st / "state.keep", st / "roundpipe_state.json");
  // damaged trainer state
  fs::copy(state_of(ck) / "optimizer_state.bin", st / "optimizer_state.bin");
  auto ts = nlohmann::json::parse(bytes_of(state_of(ck) / "roundpipe_state.json"));
  ts["data_position"] = "four";
  write(st / "roundpipe_state.json", ts.dump());
  expect_one_line_error(resume(d / "t"), "key 'data_position'");
  write(st / "roundpipe_state.json", "{\"format\": ");
  {
    const CliRun r = resume(d / "t");
    // the file, line and column as every JSON reader names a syntax error, not the library's text
    expect_one_line_error(r, "roundpipe_state.json:1:12: invalid JSON: ");
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << "printed before the refusal";
  }
  // a trainer state that disagrees with the optimizer state
  ts["data_position"] = 4;
  ts["step"] = 1;
  write(st / "roundpipe_state.json", ts.dump());
  expect_one_line_error(resume(d / "t"), "roundpipe_state.json says step 1");
  // a state that belongs to other weights (a save killed between the weights and the state)
  ts["step"] = 2;
  write(st / "roundpipe_state.json", ts.dump());
  fs::copy(d / "a/final/model.safetensors", d / "t/model.safetensors", fs::copy_options::overwrite_existing);
  expect_one_line_error(resume(d / "t"), "belongs to other weights");
  // the spec's optimizer settings differ from the saved ones
  auto spec = nlohmann::json::parse(bytes_of(d / "spec.json"));
  spec["optimizer"]["betas"] = {0.8, 0.999};
  write(d / "spec3.json", spec.dump());
  expect_one_line_error(roundpipe("train " + (d / "spec3.json").string() + " --resume " + ck.string() +
                                      " --output-dir " + (d / "r").string(),
                                  d),
                        "same optimizer settings");
  // none of these left output behind
  EXPECT_FALSE(fs::exists(d / "r/final"));
  // a --model that is not there is not needed by a full fine-tuning resume, and said so (a typo
  // was silently ignored)
  {
    const CliRun r =
        roundpipe("train " + (d / "spec.json").string() + " --resume " + ck.string() + " --output-dir " +
                      (d / "m").string() + " --steps 3 --model " + (d / "nowhere").string(),
                  d);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE((r.out + r.err)
                  .find("--model " + (d / "nowhere").string() +
                        ": the model does not exist; not needed: the resumed run takes its weights"),
              std::string::npos)
        << r.out << r.err;
  }
  fs::remove_all(d);
}

/// tiny_model(dir)'s model with a third layer, in dir/tiny-3: one group more.
fs::path three_layer_model(const fs::path& dir) {
  const fs::path tiny = tiny_model(dir);
  rp::ModelConfig c = rp::load_config_file((tiny / "config.json").string());
  c.num_hidden_layers = 3;
  const rp::ModelLayout m = rp::make_layout(c);
  std::vector<std::vector<float>> w;
  std::vector<const float*> ptrs;
  for (const auto& g : m.groups) w.emplace_back(size_t(g.numel), 0.02f);
  for (const auto& g : w) ptrs.push_back(g.data());
  const fs::path out = dir / "tiny-3";
  rp::save_hf_checkpoint(out.string(), m, ptrs, nlohmann::json::parse(bytes_of(tiny / "tokenizer.json")), "",
                         rp::DType::f32);
  return out;
}

// --resume of a folder that is no checkpoint (the user's own, /tmp, /) names the folder as
// given and what a checkpoint folder is, not the path of a trainer state beside it
// ("/state/tmp/..."); "/" once hung looking for that path. Nothing is written.
TEST(CliResume, AFolderThatIsNoCheckpointIsNamedAsGiven) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  fs::create_directories(d / "notes");
  write(d / "notes/todo.txt", "mine");
  const std::string expected =
      ": cannot resume: not a checkpoint folder; expected a checkpoint folder of a roundpipe train run, "
      "<out>/checkpoint-<k>/ or <out>/final/ (its weights), with its trainer state in <out>/state/<name>/";
  for (const std::string& folder : {(d / "notes").string(), (d / "notes").string() + "/", std::string("/")}) {
    // a hang would block the test: ended by timeout, it fails on the exit code
    const CliRun r = roundpipe_in(d, "train spec.json --resume " + folder, d, "timeout -s KILL 60");
    const std::string given =
        folder.size() > 1 && folder.back() == '/' ? folder.substr(0, folder.size() - 1) : folder;
    expect_one_line_error(r, "roundpipe: error: " + given + expected);
    EXPECT_EQ(r.err.find("roundpipe_state.json"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << folder;
  }
  EXPECT_EQ(slurp(d / "notes/todo.txt"), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(d / "notes"), fs::directory_iterator()), 1);
  EXPECT_FALSE(fs::exists(d / "run"));
  fs::remove_all(d);
}

// A checkpoint whose optimizer_state.bin is another model's (the groups of a mixture-of-experts
// model: other sizes; of a model with a layer more: another count) is refused before the model
// loads: one line naming the file, nothing on stdout.
TEST(CliResume, AnotherModelsOptimizerStateIsRefusedBeforeTheModelLoads) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  write(d / "spec.json", resume_spec(tiny_model(d), d / "data.jsonl", d / "a", "f32"));
  ASSERT_EQ(roundpipe("train " + (d / "spec.json").string() + " --steps 3", d).code, 0);
  const fs::path state = d / "a/state/checkpoint-2/optimizer_state.bin";
  const std::string own = bytes_of(state);
  const std::pair<fs::path, std::string> others[] = {
      {tiny_model(d, true), "group 1 is 'layer.0' with"},
      {three_layer_model(d), "the state has 5 parameter groups, the model has 4 trainable ones"}};
  for (const auto& [other, says] : others) {
    SCOPED_TRACE(other.string());
    const fs::path out = d / ("other-" + other.filename().string());
    write(d / "other.json", resume_spec(other, d / "data.jsonl", out, "f32"));
    const CliRun o = roundpipe("train " + (d / "other.json").string() + " --steps 3", d);
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    fs::copy_file(out / "state/checkpoint-2/optimizer_state.bin", state,
                  fs::copy_options::overwrite_existing);
    const CliRun r = roundpipe("train " + (d / "spec.json").string() + " --resume " +
                                   (d / "a/checkpoint-2").string() + " --output-dir " + (d / "r").string(),
                               d);
    expect_one_line_error(r, "optimizer_state.bin: ");
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("saved for another model"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << "printed before the refusal";
  }
  write(state, own);  // its own state again: the resume runs
  const CliRun ok = roundpipe("train " + (d / "spec.json").string() + " --resume " +
                                  (d / "a/checkpoint-2").string() + " --output-dir " + (d / "r").string(),
                              d);
  EXPECT_EQ(ok.code, 0) << ok.err << ok.out;
  fs::remove_all(d);
}

// A checkpoint whose weights folder cannot be listed (no read permission), or whose weights
// cannot be read, is refused with one line naming the folder or file and the reason, not the
// library's "filesystem error: directory iterator cannot open directory". Root reads any
// folder: the resumes run as an unprivileged user.
TEST(CliResume, AnUnreadableCheckpointIsNamedWithTheReason) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  write(d / "spec.json", resume_spec(tiny_model(d), d / "data.jsonl", d / "a", "f32"));
  ASSERT_EQ(roundpipe("train " + (d / "spec.json").string() + " --steps 3", d).code, 0);
  const fs::path u = d / "u", ck = d / "a/checkpoint-2";  // u: where the unprivileged run writes
  fs::create_directories(u);
  fs::permissions(u, fs::perms::all);
  const fs::perms exec_only = fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec;
  const std::tuple<fs::path, fs::perms, std::string> cases[] = {
      {ck, fs::perms::none, ck.string() + ": cannot open the folder (Permission denied)"},
      {ck, exec_only, ck.string() + ": cannot open the folder (Permission denied)"},
      {ck / "model.safetensors", fs::perms::none,
       (ck / "model.safetensors").string() + ": cannot open (Permission denied)"}};
  for (const auto& [path, mode, says] : cases) {
    const fs::perms before = fs::status(path).permissions();
    fs::permissions(path, mode);
    const std::string r = rp::testing::as_unprivileged([&] {
      const CliRun run = roundpipe("train " + (d / "spec.json").string() + " --resume " + ck.string() +
                                       " --output-dir " + (u / "r").string(),
                                   u);
      return fmt::format("{}|{}|{}", run.code, run.err, run.out);
    });
    fs::permissions(path, before);
    if (r == rp::testing::kNoDrop)
      GTEST_SKIP() << "root could not become an unprivileged user to run the resume";
    EXPECT_EQ(r, "1|roundpipe: error: " + says + "\n|") << "mode " << int(mode) << " on " << path;
  }
  fs::remove_all(d);
}

// A final/ the user made read-only: the resume that replaces it cannot remove the previous
// version it moved aside to final.old-<pid>. It left that folder and its marker behind without a
// word, and later runs called it a folder "no roundpipe run marked as its own". Now the resume
// says so in one warning line naming the folder, the reason and what to do, and keeps the folder
// with its marker (nothing finished is lost); a later run names it as a run's leftover it cannot
// remove, and removes both once the folder is writable again. Root removes anything: the runs
// are an unprivileged user's.
TEST(CliResume, APreviousFinalThatCannotBeRemovedIsNamedWithTheReason) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const fs::path model = tiny_model(d), u = d / "u";  // u: where the unprivileged runs write
  fs::create_directories(u);
  fs::permissions(u, fs::perms::all);
  const std::string bad = rp::testing::as_unprivileged([&] {
    std::string wrong;
    const auto check = [&](bool ok, const std::string& what, const CliRun& r) {
      if (!ok) wrong += what + ": " + r.out + r.err + "\n";
    };
    const fs::path out = u / "a", final_dir = out / "final";
    write(u / "spec.json", resume_spec(model, d / "data.jsonl", out, "f32"));
    const std::string train = "train " + (u / "spec.json").string() + " --resume " + final_dir.string();
    const CliRun first = roundpipe("train " + (u / "spec.json").string() + " --steps 2", u);
    if (first.code != 0) return "the first run failed: " + first.err;
    fs::permissions(final_dir, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                    fs::perm_options::remove);
    const CliRun resumed = roundpipe(train + " --steps 3", u);
    check(resumed.code == 0, "the resume failed", resumed);
    std::vector<fs::path> aside;
    for (const auto& e : fs::directory_iterator(out))
      if (e.is_directory() && e.path().filename().string().rfind("final.old-", 0) == 0)
        aside.push_back(e.path());
    if (aside.size() != 1) return wrong + "expected one final.old-<pid> folder: " + resumed.out + resumed.err;
    const std::string old = aside[0].string(), marker = old + ".roundpipe-owner";
    check(resumed.out.find(old + ": the previous version of " + final_dir.string() +
                           ", which the new one replaced, cannot be removed (Permission denied); it is kept "
                           "with its marker " +
                           marker + ": make it writable and remove both") != std::string::npos,
          "the resume did not name the folder it could not remove", resumed);
    check(fs::exists(marker), "the marker went", resumed);
    check(fs::exists(aside[0] / "model.safetensors") && fs::exists(final_dir / "model.safetensors"),
          "a finished checkpoint was lost", resumed);
    // a later run: a run's leftover it cannot remove, named as such
    const CliRun later = roundpipe(train + " --steps 4", u);
    check(later.code == 0, "the later run failed", later);
    check((later.out + later.err)
                  .find(old + ": left by a roundpipe run that ended (its marker " + marker +
                        " says so), but cannot remove it (Permission denied); make it "
                        "writable and remove both") != std::string::npos,
          "the later run did not say why it kept the folder", later);
    check((later.out + later.err).find("left alone") == std::string::npos, "called no run's", later);
    // writable again: the next run removes both
    fs::permissions(aside[0], fs::perms::owner_write, fs::perm_options::add);
    const CliRun last = roundpipe(train + " --steps 5", u);
    check(last.code == 0, "the last run failed", last);
    check(!fs::exists(aside[0]) && !fs::exists(marker), "the writable leftover stayed", last);
    check(last.out.find("removed " + old + " left by an interrupted run") != std::string::npos,
          "the last run did not say what it removed", last);
    return wrong;
  });
  if (bad == rp::testing::kNoDrop)
    GTEST_SKIP() << "root could not become an unprivileged user to run the resume";
  EXPECT_EQ(bad, "");
  fs::remove_all(d);
}

// final/ (and every checkpoint-<k>/) is a plain Hugging Face folder; the trainer's own state
// is in state/<name>/ under names no Hugging Face file uses, and --resume finds it there (or
// inside the folder, as earlier releases wrote it).
TEST(CliResume, CheckpointsArePlainHuggingFaceFoldersWithTheStateBeside) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", resume_spec(model, d / "data.jsonl", d / "a", "bf16"));
  ASSERT_EQ(roundpipe("train " + (d / "spec.json").string() + " --steps 3", d).code, 0);
  auto names = [](const fs::path& dir) {
    std::set<std::string> n;
    for (const auto& e : fs::directory_iterator(dir)) n.insert(e.path().filename().string());
    return n;
  };
  // README.md: the model card (trainer/model_card.hpp), which Hugging Face folders carry too,
  // and roundpipe_manifest.json, the files the run wrote there (a re-save keeps any other)
  const std::set<std::string> hf = {
      "README.md",      "config.json",           "generation_config.json", "model.safetensors",
      "tokenizer.json", "tokenizer_config.json", "roundpipe_manifest.json"};
  EXPECT_EQ(names(d / "a/final"), hf);
  EXPECT_EQ(names(d / "a/checkpoint-2"), hf);
  EXPECT_EQ(names(d / "a/state/final"), (std::set<std::string>{"optimizer_state.bin", "roundpipe_state.json",
                                                               "roundpipe_manifest.json"}));
  EXPECT_EQ(names(d / "a/state"), (std::set<std::string>{"checkpoint-2", "final"}));
  // an earlier release's layout: the state inside the checkpoint folder
  fs::copy(d / "a/checkpoint-2", d / "old", fs::copy_options::recursive);
  fs::copy(d / "a/state/checkpoint-2/optimizer_state.bin", d / "old/optimizer.bin");
  fs::copy(d / "a/state/checkpoint-2/roundpipe_state.json", d / "old/trainer_state.json");
  CliRun r = roundpipe("train " + (d / "spec.json").string() + " --resume " + (d / "old").string() +
                           " --steps 3 --output-dir " + (d / "b").string(),
                       d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(bytes_of(d / "a/final/model.safetensors") == bytes_of(d / "b/final/model.safetensors"));
  fs::remove_all(d);
}

TEST(CliResume, LossScalingKeysAreChecked) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", kData);
  struct Case {
    std::string extra, needle;
  } cases[] = {
      {", \"compute_dtype\": \"f8\"", "key 'compute_dtype'"},
      {", \"loss_scaling\": true", "needs \"compute_dtype\": \"f16\""},
      {", \"compute_dtype\": \"f16\", \"loss_scaling\": {\"init_scale\": -1}", "init_scale"},
      {", \"compute_dtype\": \"f16\", \"loss_scaling\": {\"growth\": 2}",
       "unknown key 'loss_scaling.growth'"},
      {", \"compute_dtype\": \"f16\", \"loss_scaling\": 3", "key 'loss_scaling'"},
      // the CPU backend computes in f32: f16 (and so loss scaling) is refused, naming why
      {", \"compute_dtype\": \"f16\"", "f16"},
  };
  for (auto& c : cases) {
    write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", c.extra));
    expect_one_line_error(roundpipe("train " + (d / "spec.json").string(), d), c.needle);
  }
  fs::remove_all(d);
}

}  // namespace
