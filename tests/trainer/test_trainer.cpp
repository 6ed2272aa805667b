// rp::Trainer through its C++ API (the `roundpipe train` tests in tests/cli drive the same
// code through the command): callbacks in step order with what metrics.csv records, the
// evaluation point sees exactly the weights of its step, a StopToken triggered from another
// thread leaves a checkpoint that continues bit for bit, and bad specs are refused before
// anything is written; a failure injected into a device op, a copy or an optimizer job ends
// run() with an error naming it; a stop while a copy is stuck on a throttled link ends the run
// in bounded time without saving the unfinished steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/session_testing.hpp"
#include "formats/safetensors.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/trainer_state.hpp"

namespace {

using namespace rp::clitest;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light.\"}\n";

rp::TrainSpec tiny_spec(const fs::path& d, const std::string& out, int64_t steps) {
  write(d / "data.jsonl", kData);
  rp::TrainSpec s = rp::spec_from_json(
      nlohmann::json::parse(spec_for(tiny_model(d), d / "data.jsonl", d / out)), "test spec");
  s.steps = steps;
  s.seed = 3;
  s.save_dtype = "f32";
  s.adam.lr = 0.01;
  s.lr_schedule.kind = "cosine";
  s.lr_schedule.lr = 0.01;
  s.lr_schedule.warmup_steps = 1;
  s.lr_schedule.total_steps = steps;
  return s;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

/// metrics.csv: the step and loss columns of every row.
std::vector<std::string> losses(const fs::path& csv) {
  std::ifstream f(csv);
  std::string line;
  std::vector<std::string> out;
  std::getline(f, line);
  while (std::getline(f, line)) out.push_back(line.substr(0, line.find(',', line.find(',') + 1)));
  return out;
}

TEST(Trainer, CallbacksFollowTheStepsAndMatchTheMetrics) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "run", 5);
  spec.accumulation = 2;  // 2 passes of 1 sequence per micro-batch
  spec.sequences_per_step = 4;
  spec.save_every = 2;
  std::vector<std::string> events;
  std::vector<rp::StepReport> steps;
  rp::TrainerCallbacks cb;
  cb.on_ready = [&] { events.push_back("ready"); };
  cb.on_batch = [&](int64_t step, int64_t pass, const rp::TokenBatch& b) {
    events.push_back("batch " + std::to_string(step) + "." + std::to_string(pass));
    EXPECT_EQ(b.n_seq, 2);
    EXPECT_EQ(b.seq_len, 16);
  };
  cb.on_step = [&](const rp::StepReport& r) {
    events.push_back("step " + std::to_string(r.step));
    steps.push_back(r);
  };
  cb.on_checkpoint = [&](const rp::CheckpointReport& c) {
    events.push_back("checkpoint " + fs::path(c.dir).filename().string() + " " + std::to_string(c.step));
  };
  const rp::TrainResult res = rp::Trainer(spec).run(cb);
  EXPECT_FALSE(res.stopped);
  EXPECT_EQ(res.steps_done, 5);
  EXPECT_EQ(res.checkpoint, (d / "run/final").string());
  // step k is reported once its update is applied: one behind the passes, drained before a checkpoint
  const std::vector<std::string> want = {"ready",
                                         "batch 0.0",
                                         "batch 0.1",
                                         "batch 1.0",
                                         "batch 1.1",
                                         "step 1",
                                         "step 2",
                                         "checkpoint checkpoint-2 2",
                                         "batch 2.0",
                                         "batch 2.1",
                                         "batch 3.0",
                                         "batch 3.1",
                                         "step 3",
                                         "step 4",
                                         "checkpoint checkpoint-4 4",
                                         "batch 4.0",
                                         "batch 4.1",
                                         "step 5",
                                         "checkpoint final 5"};
  EXPECT_EQ(events, want);
  // metrics.csv holds what on_step saw
  std::ifstream csv(res.metrics);
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line,
            "step,loss,target_tokens,tokens_per_s,lr,elapsed_s,grad_norm,loss_scale,skipped,eval_loss,eval_"
            "perplexity,aux_loss,expert_load_min,expert_load_max,epoch");
  for (const auto& r : steps) {
    ASSERT_TRUE(std::getline(csv, line));
    EXPECT_EQ(line.substr(0, line.find(',', line.find(',') + 1)), fmt::format("{},{:.6f}", r.step, r.loss));
    EXPECT_EQ(r.lr, spec.lr_schedule.at(r.step - 1));
    EXPECT_EQ(r.total_steps, 5);
    EXPECT_EQ(r.tokens, 4 * 16);
    EXPECT_GT(r.target_tokens, 0);
    EXPECT_LE(r.target_tokens, r.tokens);
  }
  fs::remove_all(d);
}

TEST(Trainer, EvaluationSeesTheWeightsOfItsStep) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "run", 5);
  spec.save_every = 2;
  std::vector<std::pair<int64_t, std::vector<std::vector<float>>>> seen;
  rp::TrainerCallbacks cb;
  cb.eval_every = 2;
  cb.on_eval = [&](const rp::EvalContext& e) { seen.emplace_back(e.step, e.weights); };
  rp::Trainer(spec).run(cb);
  ASSERT_EQ(seen.size(), 2u);  // after steps 2 and 4, not after the last one
  for (const auto& [step, weights] : seen) {
    // checkpoint-<step> holds the fp32 master of the same step (save_dtype f32)
    rp::SafetensorsFile f(
        (d / "run" / ("checkpoint-" + std::to_string(step)) / "model.safetensors").string());
    const rp::ModelLayout layout = rp::make_layout(rp::load_model((d / "tiny").string()).config);
    for (size_t g = 0; g < layout.groups.size(); ++g)
      for (const auto& t : layout.groups[g].tensors) {
        const rp::HostTensor saved = f.read_f32(*f.find(t.name));
        ASSERT_EQ(0, std::memcmp(saved.data.data(), weights[g].data() + t.offset, saved.data.size() * 4))
            << "step " << step << " " << t.name;
      }
  }
  fs::remove_all(d);
}

// A stop requested from another thread (what a signal handler or a UI does) ends the run after
// the steps in flight; the checkpoint it leaves continues to the same result as a run that
// was never stopped.
TEST(Trainer, StopFromAnotherThreadLeavesACheckpointThatContinuesBitForBit) {
  auto d = tmpdir();
  const rp::TrainResult whole = rp::Trainer(tiny_spec(d, "whole", 6)).run();
  rp::StopToken stop;
  std::atomic<int64_t> reported{0};
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) {
    reported = r.step;
    while (r.step == 2 && !stop.stop_requested()) std::this_thread::yield();  // hold until the stop arrives
  };
  std::thread stopper([&] {
    while (reported < 2) std::this_thread::yield();
    EXPECT_TRUE(stop.request_stop());
    EXPECT_FALSE(stop.request_stop());  // a second request is not the first
  });
  const rp::TrainResult part = rp::Trainer(tiny_spec(d, "part", 6)).run(cb, stop);
  stopper.join();
  ASSERT_TRUE(part.stopped);
  ASSERT_EQ(part.steps_done, 3);  // step 3's passes were in flight when step 2 was reported
  ASSERT_EQ(part.checkpoint, (d / "part/checkpoint-3").string());
  EXPECT_EQ(nlohmann::json::parse(bytes_of(d / "part/state/checkpoint-3/roundpipe_state.json"))["step"], 3);

  rp::TrainSpec rest = tiny_spec(d, "part", 6);
  rest.resume_from = part.checkpoint;
  const rp::TrainResult done = rp::Trainer(rest).run();
  EXPECT_EQ(done.first_step, 3);
  EXPECT_EQ(done.steps_done, 6);
  EXPECT_TRUE(bytes_of(d / "whole/final/model.safetensors") == bytes_of(d / "part/final/model.safetensors"));
  EXPECT_TRUE(bytes_of(d / "whole/state/final/optimizer_state.bin") ==
              bytes_of(d / "part/state/final/optimizer_state.bin"));
  EXPECT_EQ(losses(d / "whole/metrics.csv"), losses(d / "part/metrics.csv"));
  fs::remove_all(d);
}

// A stop before the first step leaves nothing behind: no metrics.csv, TensorBoard file or
// profile, and no output folder when the run made it; a folder that was there stays with what
// it held.
TEST(Trainer, StopBeforeTheFirstStepLeavesNoOutput) {
  auto d = tmpdir();
  for (bool existed : {false, true}) {
    rp::TrainSpec spec = tiny_spec(d, existed ? "old" : "new", 4);
    spec.tensorboard = true;
    const fs::path out = spec.output_dir;
    if (existed) {
      fs::create_directories(out);
      write(out / "notes.txt", "kept");
    }
    rp::StopToken stop;
    rp::TrainerCallbacks cb;
    cb.on_ready = [&] { stop.request_stop(); };
    const rp::TrainResult r = rp::Trainer(spec).run(cb, stop);
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.steps_done, 0);
    EXPECT_TRUE(r.checkpoint.empty());
    if (!existed) {
      EXPECT_FALSE(fs::exists(out)) << "the run made the folder and wrote nothing into it";
      continue;
    }
    EXPECT_EQ(bytes_of(out / "notes.txt"), "kept");
    for (const char* name : {"metrics.csv", "tensorboard", "profile.json"})
      EXPECT_FALSE(fs::exists(out / name)) << name;
  }
  fs::remove_all(d);
}

// A fresh run in a folder that an earlier run recorded but left without checkpoints (one killed
// before or during its first save) replaces that run's TensorBoard event files, as it replaces its
// metrics.csv, so TensorBoard does not show two runs' steps as one; the user's files in
// tensorboard/ stay, and a resumed run keeps the earlier events it continues.
TEST(Trainer, AFreshRunReplacesTheEventFilesOfARunWithoutCheckpoints) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "out", 1);
  spec.tensorboard = true;
  const fs::path out = spec.output_dir, tb = out / "tensorboard";
  const auto events = [&] {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(tb))
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
        v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  };
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  // what a run killed during its first save leaves: its record, metrics.csv and event file
  fs::remove_all(out / "final");
  fs::remove_all(out / "state");
  ASSERT_EQ(events().size(), 1u);
  const std::string old = "events.out.tfevents.1.otherhost.1";  // another process's name
  fs::rename(tb / events()[0], tb / old);
  write(tb / "notes.txt", "mine");
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  const std::vector<std::string> now = events();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], old) << "the earlier run's events were left beside this run's";
  EXPECT_EQ(bytes_of(tb / "notes.txt"), "mine");
  // a resume continues the run whose events are there: they stay
  rp::TrainSpec more = spec;
  more.steps = 2;
  more.resume_from = (out / "final").string();
  ASSERT_EQ(rp::Trainer(more).run().steps_done, 2);
  const std::vector<std::string> after = events();
  EXPECT_NE(std::find(after.begin(), after.end(), now[0]), after.end()) << "the resumed run's events went";
  fs::remove_all(d);
}

// A run holds its output folder: a second run into it while the first is under way is refused
// with one line naming the key, writes nothing there, and leaves the first run unharmed; once the
// first ends the folder is free again. A run that fails after making the folder (its model
// cannot be loaded) leaves no folder behind.
TEST(Trainer, ASecondRunIntoAnOutputFolderInUseIsRefused) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "out", 2);
  spec.tensorboard = false;
  const fs::path out = spec.output_dir;
  std::string second_error;
  std::vector<std::string> listing_during;
  rp::TrainerCallbacks cb;
  cb.on_ready = [&] {
    try {
      rp::Trainer(spec).run();
    } catch (const std::invalid_argument& e) {
      second_error = e.what();
    }
    for (const auto& e : fs::directory_iterator(out)) listing_during.push_back(e.path().filename().string());
  };
  const rp::TrainResult r = rp::Trainer(spec).run(cb);
  EXPECT_NE(second_error.find("key 'output_dir'"), std::string::npos) << second_error;
  EXPECT_NE(second_error.find("in use by another roundpipe run"), std::string::npos) << second_error;
  std::sort(listing_during.begin(), listing_during.end());
  EXPECT_EQ(listing_during, (std::vector<std::string>{"metrics.csv", "roundpipe_run.json"}))
      << "only the first run's files";
  EXPECT_EQ(r.steps_done, 2);
  EXPECT_TRUE(fs::exists(out / "final" / "model.safetensors"));
  // released at the end: the same folder takes a run again (it continues from final/)
  rp::TrainSpec again = spec;
  again.steps = 3;
  again.resume_from = r.checkpoint;
  EXPECT_EQ(rp::Trainer(again).run().steps_done, 3);

  rp::TrainSpec broken = tiny_spec(d, "never", 2);
  fs::create_directories(d / "not_a_model");
  broken.model = (d / "not_a_model").string();
  EXPECT_ANY_THROW(rp::Trainer(broken).run());
  EXPECT_FALSE(fs::exists(broken.output_dir)) << "the failed run made the folder and wrote nothing into it";
  fs::remove_all(d);
}

// The std::invalid_argument a run of `spec` is refused with ("" and a failure when it runs).
std::string refusal(const rp::TrainSpec& spec, const char* what_went_wrong) {
  try {
    rp::Trainer(spec).run();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << what_went_wrong;
  return "";
}

// A finished run is never replaced by mistake: a fresh run into its output folder is refused
// with one line naming the checkpoints found and the --resume that continues them (with more
// steps where the run there already reached the spec's), and leaves every file as it was; with
// overwrite_output_dir it starts over there.
TEST(Trainer, AFreshRunIntoAFolderWithCheckpointsIsRefusedUnlessTold) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "out", 2);
  spec.save_every = 1;
  const fs::path out = spec.output_dir;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 2);
  const std::string weights = bytes_of(out / "final" / "model.safetensors");
  const std::string metrics = bytes_of(out / "metrics.csv");
  rp::TrainSpec again = tiny_spec(d, "out", 1);
  {
    const std::string m = refusal(again, "the earlier run's checkpoints were replaced");
    EXPECT_NE(m.find("key 'output_dir'"), std::string::npos) << m;
    EXPECT_NE(m.find("holds an earlier run's checkpoints (checkpoint-1, final)"), std::string::npos) << m;
    // the run there is finished at this length: --resume alone would have nothing to do
    EXPECT_NE(m.find("that run is finished (final is at step 2 of the spec's 1): train it further with "
                     "--resume " +
                     out.string() + "/final --steps <more than 2>"),
              std::string::npos)
        << m;
  }
  {  // a longer spec has steps left: --resume continues it
    const std::string m = refusal(tiny_spec(d, "out", 3), "the earlier run's checkpoints were replaced");
    EXPECT_NE(m.find("continue it with --resume " + out.string() + "/final, start over"), std::string::npos)
        << m;
  }
  EXPECT_EQ(bytes_of(out / "final" / "model.safetensors"), weights);
  EXPECT_EQ(bytes_of(out / "metrics.csv"), metrics);
  // resuming from the run's folder itself names the checkpoint to resume from
  rp::TrainSpec from_folder = tiny_spec(d, "out", 3);
  from_folder.resume_from = out.string();
  {
    const std::string m = refusal(from_folder, "resumed from a run's output folder");
    EXPECT_EQ(m, out.string() + ": a run's output folder, not a checkpoint; resume from " + out.string() +
                     "/final");
  }
  // and from a checkpoint's trainer state (state/final) names the checkpoint itself
  from_folder.resume_from = (out / "state" / "final").string();
  {
    const std::string m = refusal(from_folder, "resumed from a state folder");
    EXPECT_EQ(m, (out / "state" / "final").string() + ": the trainer state of checkpoint " +
                     (out / "final").string() + "; resume from " + (out / "final").string());
  }
  // and from the state folder of the whole run names the run's checkpoint, not one inside it
  from_folder.resume_from = (out / "state").string();
  {
    const std::string m = refusal(from_folder, "resumed from the run's state folder");
    EXPECT_EQ(m, (out / "state").string() + ": the trainer states of the run in " + out.string() +
                     "; resume from " + (out / "final").string());
  }
  // a final checkpoint whose optimizer state is truncated is not the one suggested
  const fs::path opt_file = out / "state" / "final" / "optimizer_state.bin";
  const std::string opt_bytes = bytes_of(opt_file);
  write(opt_file, opt_bytes.substr(0, opt_bytes.size() / 2));
  {
    const std::string m = refusal(from_folder, "resumed from the run's state folder, final damaged");
    EXPECT_EQ(m, (out / "state").string() + ": the trainer states of the run in " + out.string() +
                     "; resume from " + (out / "checkpoint-1").string());
  }
  write(opt_file, opt_bytes);
  // the state of a checkpoint whose weights folder is gone says so
  fs::rename(out / "final", d / "final.keep");
  from_folder.resume_from = (out / "state" / "final").string();
  {
    const std::string m = refusal(from_folder, "resumed from the state of a removed checkpoint");
    EXPECT_EQ(m, (out / "state" / "final").string() + ": the trainer state of checkpoint " +
                     (out / "final").string() + ", which is missing (nothing to resume there)");
  }
  fs::rename(d / "final.keep", out / "final");
  // a run's output folder with no checkpoint left in it (only its record and metrics)
  fs::create_directories(d / "bare");
  fs::copy_file(out / "roundpipe_run.json", d / "bare" / "roundpipe_run.json");
  from_folder.resume_from = (d / "bare").string();
  EXPECT_EQ(refusal(from_folder, "resumed from a run folder without checkpoints"),
            (d / "bare").string() + ": a run's output folder with no checkpoint in it (nothing to resume)");
  from_folder.resume_from = (out / "state" / "final").string();
  // a damaged state file there is named with what is wrong, besides the checkpoint to resume from
  const fs::path state_file = out / "state" / "final" / "roundpipe_state.json";
  const std::string state_text = bytes_of(state_file);
  write(state_file, "{\"step\": ");
  {
    const std::string m = refusal(from_folder, "resumed from a damaged state folder");
    EXPECT_NE(m.find("resume from " + (out / "final").string()), std::string::npos) << m;
    EXPECT_NE(m.find(state_file.string()), std::string::npos) << m;
    EXPECT_NE(m.find("invalid JSON"), std::string::npos) << m;
  }
  write(state_file, state_text);
  // a resume of another run's checkpoint into this folder would replace its final model and
  // metrics as a fresh run would: refused the same way unless told
  rp::TrainSpec other = tiny_spec(d, "other", 1);
  ASSERT_EQ(rp::Trainer(other).run().steps_done, 1);
  rp::TrainSpec foreign = tiny_spec(d, "out", 3);
  foreign.resume_from = (fs::path(other.output_dir) / "final").string();
  {
    const std::string m = refusal(foreign, "resumed another run's checkpoint over this run's");
    EXPECT_NE(m.find("key 'output_dir'"), std::string::npos) << m;
    EXPECT_NE(m.find("holds an earlier run's checkpoints (checkpoint-1, final)"), std::string::npos) << m;
  }
  EXPECT_EQ(bytes_of(out / "final" / "model.safetensors"), weights);
  EXPECT_EQ(bytes_of(out / "metrics.csv"), metrics);
  // and an output folder inside the resumed checkpoint's trainer state is an input overlap
  foreign.resume_from = (out / "final").string();
  foreign.output_dir = (out / "state" / "final" / "nested").string();
  {
    const std::string m = refusal(foreign, "wrote a run inside the checkpoint's trainer state");
    EXPECT_NE(m.find("lies inside the checkpoint"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(out / "state" / "final" / "nested"));
  EXPECT_TRUE(rp::checkpoints_in((out / "state").string()).empty()) << "state/ holds no checkpoints";
  again.overwrite_output_dir = true;
  EXPECT_EQ(rp::Trainer(again).run().steps_done, 1);
  EXPECT_NE(bytes_of(out / "metrics.csv"), metrics);
  fs::remove_all(d);
}

// A failure on any of the runtime's threads ends run() with a RuntimeFailure naming it,
// promptly (the run takes well under a second), never a hang.
TEST(Trainer, AFailureInTheRuntimeEndsTheRunWithAnErrorNamingIt) {
  auto d = tmpdir();
  using Site = rp::FaultInjection::Site;
  struct Case {
    const char* name;
    rp::FaultInjection f;
    std::string needle;
  };
  std::vector<Case> cases(3);
  cases[0].name = "device op";
  cases[0].f.site = Site::device_op;
  cases[0].f.micro_batch = 1;
  cases[0].needle = "injected failure: device op of micro-batch 1";
  cases[1].name = "copy";
  cases[1].f.site = Site::transfer;
  cases[1].f.copy = rp::CopyKind::output;
  cases[1].needle = "injected failure: worker0.act_down: copy of the output of micro-batch 0";
  cases[2].name = "optimizer job";
  cases[2].f.site = Site::optimizer_job;
  cases[2].f.group = 1;
  cases[2].f.step = 1;
  cases[2].needle = "AdamW update of step 1 of group 1 failed: injected failure";
  for (const Case& c : cases) {
    rp::ScopedFaultInjection inject(c.f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      rp::Trainer(tiny_spec(d, std::string("failed-") + c.name, 4)).run();
      ADD_FAILURE() << c.name << ": expected RuntimeFailure";
    } catch (const rp::RuntimeFailure& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << c.name << ": " << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0) << c.name;
    EXPECT_FALSE(fs::exists(d / (std::string("failed-") + c.name) / "final")) << c.name;
  }
  fs::remove_all(d);
}

// A link of 1 KB/s (pcie_gbps 1e-6): nothing completes for minutes. A stop ends the run within
// stop_timeout_s plus the teardown, saves no checkpoint of the unfinished steps (their updates
// could be half applied) and says how many it abandoned.
TEST(Trainer, StopWhileACopyIsStuckEndsInBoundedTimeAndSavesNoHalfStep) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "stuck", 50);
  spec.backend = "cpu";
  spec.pcie_gbps = 1e-6;
  spec.stop_timeout_s = 0.5;
  spec.watchdog_s = 0.3;
  rp::StopToken stop;
  rp::TrainerCallbacks cb;
  std::thread stopper;
  std::chrono::steady_clock::time_point asked;
  cb.on_ready = [&] {
    stopper = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      asked = std::chrono::steady_clock::now();
      stop.request_stop();
    });
  };
  const rp::TrainResult res = rp::Trainer(spec).run(cb, stop);
  const double after_stop = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  stopper.join();
  EXPECT_TRUE(res.stopped);
  EXPECT_EQ(res.steps_done, 0);
  EXPECT_GE(res.steps_abandoned, 1);
  EXPECT_EQ(res.checkpoint, "");
  EXPECT_LT(after_stop, 10.0) << "the stop took " << after_stop << " s (stop_timeout_s 0.5)";
  for (const auto& e : fs::directory_iterator(d / "stuck"))
    EXPECT_EQ(e.path().filename().string().rfind("checkpoint-", 0), std::string::npos) << e.path();
  EXPECT_FALSE(fs::exists(d / "stuck/final"));
  EXPECT_TRUE(fs::exists(d / "stuck/profile.json"));
  fs::remove_all(d);
}

/// Fails the test binary (std::_Exit) when the scope is not left within `limit_s`: a hang
/// must fail the test, not stall the suite.
class HangGuard {
 public:
  HangGuard(double limit_s, std::string what)
      : thread_([this, limit_s, what = std::move(what)] {
          std::unique_lock<std::mutex> lock(m_);
          if (!cv_.wait_for(lock, std::chrono::duration<double>(limit_s), [this] { return done_; })) {
            std::fprintf(stderr, "FAILED: %s did not end within %g s\n", what.c_str(), limit_s);
            std::_Exit(1);
          }
        }) {}
  ~HangGuard() {
    {
      std::lock_guard<std::mutex> lock(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// A stop during the evaluation before training ends as a stop before the first step does, in
// bounded time: with a link of 1 KB/s the evaluation passes never finish, and the stop must not
// wait for them (it used to wait for every evaluation pass, however long they took).
TEST(Trainer, StopDuringTheEvaluationBeforeTrainingEndsInBoundedTime) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "stuck-eval", 50);
  spec.eval_fraction = 0.5;
  spec.pcie_gbps = 1e-6;
  spec.stop_timeout_s = 0.5;
  rp::StopToken stop;
  rp::TrainerCallbacks cb;
  std::thread stopper;
  std::chrono::steady_clock::time_point asked;
  cb.on_ready = [&] {
    stopper = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      asked = std::chrono::steady_clock::now();
      stop.request_stop();
    });
  };
  rp::TrainResult res;
  {
    HangGuard guard(120, "a run stopped during its evaluation before training");
    res = rp::Trainer(spec).run(cb, stop);
  }
  const double after_stop = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  stopper.join();
  EXPECT_TRUE(res.stopped);
  EXPECT_EQ(res.steps_done, 0);
  EXPECT_EQ(res.checkpoint, "");
  EXPECT_LT(after_stop, 10.0) << "the stop took " << after_stop << " s (stop_timeout_s 0.5)";
  EXPECT_FALSE(fs::exists(d / "stuck-eval"))
      << "a run stopped before its first step leaves no folder it made";
  fs::remove_all(d);
}

TEST(Trainer, BadSpecsAreRefusedBeforeAnythingIsWritten) {
  auto d = tmpdir();
  rp::TrainSpec spec = tiny_spec(d, "out", 2);
  write(d / "out", "a file");
  try {
    rp::Trainer(spec).run();
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("test spec: key 'output_dir'"), std::string::npos) << e.what();
  }
  spec.output_dir = (d / "fresh").string();
  spec.resume_from = (d / "nowhere").string();
  EXPECT_THROW(rp::Trainer(spec).run(), std::invalid_argument);
  EXPECT_FALSE(fs::exists(d / "fresh"));
  try {
    rp::Trainer::from_json(nlohmann::json::parse("{\"model\": \"m\", \"data\": \"d\", \"stepz\": 3}"),
                           "inline");
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("inline: unknown key 'stepz'", 0), 0u) << e.what();
  }
  fs::remove_all(d);
}

// eval_fraction must hold out at least one sequence and leave one for training: 0.01 of 20
// examples used to evaluate nothing. The refusal is one line with both counts; a split that
// leaves fewer training sequences than a step takes runs (with a warning).
TEST(Trainer, AnEvalFractionThatHoldsOutNothingIsRefusedWithTheCounts) {
  auto d = tmpdir();
  std::string data;
  for (int i = 0; i < 20; ++i)
    data += fmt::format("{{\"prompt\": \"Say {}\", \"completion\": \" {} there\"}}\n", i, i);
  rp::TrainSpec spec = tiny_spec(d, "out", 2);
  write(d / "twenty.jsonl", data);
  spec.data = (d / "twenty.jsonl").string();
  spec.eval_fraction = 0.01;
  try {
    rp::Trainer(spec).run();
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("test spec: key 'eval_fraction': 0.01 of the 20 sequences", 0), 0u) << m;
    EXPECT_NE(m.find("holds out 0 for evaluation and leaves 20 for training"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(d / "out"));
  spec.eval_fraction = 0.99;  // 19 held out, one training sequence: allowed
  spec.sequences_per_step = 2;
  const rp::TrainResult r = rp::Trainer(spec).run();
  EXPECT_EQ(r.steps_done, 2);
  fs::remove_all(d);
}

// A resume whose model is of another architecture than the checkpoint's is refused with one
// line naming the field (a full fine-tuning resume used to train the checkpoint's model
// whatever spec.model named); roundpipe_state.json records the architecture, and a resume with
// another max_examples (other examples drawn) is named among the differences warned about.
TEST(Trainer, ResumingWithAnotherArchitectureIsRefusedNamingTheField) {
  auto d = tmpdir();
  const rp::TrainResult first = rp::Trainer(tiny_spec(d, "first", 2)).run();
  const rp::TrainerState saved =
      rp::read_trainer_state((d / "first/state/final/roundpipe_state.json").string());
  EXPECT_EQ(saved.model_config.at("hidden_size"), 16);
  EXPECT_EQ(saved.model_config.at("model_type"), "llama");
  rp::TrainSpec spec = tiny_spec(d, "first", 4);
  spec.resume_from = first.checkpoint;
  fs::create_directories(d / "moe");
  spec.model = tiny_model(d / "moe", true).string();
  try {
    rp::Trainer(spec).run();
    ADD_FAILURE() << "a resume on another architecture was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("test spec: key 'model': ", 0), 0u) << m;
    EXPECT_NE(m.find("model_type \"qwen3_moe\" (the checkpoint's \"llama\")"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_EQ(rp::architecture_difference(saved.model_config, saved.model_config), "");
  rp::TrainSpec fewer = tiny_spec(d, "first", 2);
  fewer.max_examples = 1;
  bool named = false;
  for (const auto& s : rp::resume_differences(saved, fewer))
    named |= s.find("max_examples 1 (saved run 0)") == 0;
  EXPECT_TRUE(named);
  EXPECT_TRUE(rp::resume_differences(saved, tiny_spec(d, "first", 2)).empty());
  fs::remove_all(d);
}

// The host-memory refusal advises only keys the spec accepts (it advised `pass_slots`, which
// the spec refuses as an unknown key): every snake_case name in the message, and the keys it
// says to raise or set, parse as spec keys.
TEST(Trainer, TheHostMemoryRefusalAdvisesOnlySpecKeys) {
  rp::ModelConfig c;
  c.vocab_size = 300;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  const rp::ModelLayout layout = rp::make_layout(c);
  std::vector<std::vector<float>> w;
  for (const auto& g : layout.groups) w.emplace_back(g.numel, 0.02f);
  rp::SessionOptions o;
  o.backend = "cpu";
  o.workers = 2;
  o.micro_batches = 1;
  o.micro.n_seq = 1;
  o.micro.seq_len = int64_t(1) << 30;  // terabytes of activations
  o.save_attention = true;
  std::string m;
  try {
    rp::Session session(layout, w, o);
    FAIL() << "no refusal";
  } catch (const std::invalid_argument& e) {
    m = e.what();
  }
  ASSERT_EQ(m.rfind("host memory: ", 0), 0u) << m;
  std::set<std::string> keys;
  for (size_t i = 0; i < m.size();) {
    size_t j = i;
    while (j < m.size() && (std::islower(static_cast<unsigned char>(m[j])) || m[j] == '_')) ++j;
    const std::string word = m.substr(i, j - i);
    if (word.find('_') != std::string::npos) keys.insert(word);
    i = j == i ? i + 1 : j;
  }
  for (const char* named : {"accumulation", "workers"})
    if (m.find(named) != std::string::npos) keys.insert(named);
  EXPECT_GE(keys.size(), 4u) << m;
  for (const auto& key : keys) {
    nlohmann::json spec = {{"model", "m"}, {"data", "d"}, {key, 1}};
    try {
      rp::spec_from_json(spec, "advice");
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find("unknown key"), std::string::npos)
          << key << ": " << e.what() << "\n"
          << m;
    }
  }
}

TEST(TokenStream, ServesTheSameBatchesAfterASeek) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  rp::TokenStreamOptions o;
  o.seq_len = 16;
  o.seed = 5;
  rp::TokenStream a(lm, (d / "data.jsonl").string(), o), b(lm, (d / "data.jsonl").string(), o);
  EXPECT_GT(a.stats().sequences, 2);
  EXPECT_EQ(a.stats().chat_template, "chatml");  // the tiny model carries no template
  a.next(3);
  const rp::TokenBatch want = a.next(2);
  b.seek(3);
  const rp::TokenBatch got = b.next(2);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.targets, want.targets);
  EXPECT_EQ(b.position(), 5);
  // every prompt longer than the sequences: nothing to train on, said by next()
  write(d / "long.jsonl", "{\"prompt\": \"a long prompt of many bytes\", \"completion\": \" x\"}\n");
  o.seq_len = 4;
  rp::TokenStream none(lm, (d / "long.jsonl").string(), o);
  EXPECT_EQ(none.stats().sequences, 0);
  EXPECT_THROW(none.next(1), std::invalid_argument);
  EXPECT_THROW(rp::TokenStream::chat_template_for(lm, "mistral"), std::invalid_argument);
  fs::remove_all(d);
}

}  // namespace

namespace {

// Evaluation through the trainer: a held-out fraction is never trained on, is evaluated
// every eval_every steps and after the last one (rows of metrics.csv and StepReports), and
// in sync mode the evaluation after step k is that of the weights after k steps: a run
// stopped at step 2 evaluates exactly what the longer run evaluated at step 2.
TEST(Trainer, HeldOutEvaluationEveryKStepsAndAfterTheLast) {
  auto d = tmpdir();
  auto spec = [&](const std::string& out, int64_t steps) {
    rp::TrainSpec s = tiny_spec(d, out, steps);
    s.async = false;
    s.eval_fraction = 0.5;
    s.eval_every = 2;
    return s;
  };
  std::vector<rp::StepReport> reports;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { reports.push_back(r); };
  rp::Trainer(spec("long", 5)).run(cb);
  ASSERT_EQ(reports.size(), 5u);
  for (const auto& r : reports) EXPECT_EQ(r.evaluated, r.step == 2 || r.step == 4 || r.step == 5) << r.step;
  EXPECT_GT(reports[1].eval_tokens, 0);
  EXPECT_NEAR(reports[1].eval_perplexity, std::exp(reports[1].eval_loss), 1e-9 * reports[1].eval_perplexity);
  EXPECT_NE(reports[1].eval_loss, reports[3].eval_loss);  // the weights moved
  std::vector<rp::StepReport> shorter;
  cb.on_step = [&](const rp::StepReport& r) { shorter.push_back(r); };
  rp::Trainer(spec("short", 2)).run(cb);
  ASSERT_EQ(shorter.size(), 2u);
  EXPECT_EQ(shorter[1].eval_loss, reports[1].eval_loss);
  // metrics.csv carries the evaluations in their rows, blank elsewhere
  std::ifstream f(d / "long/metrics.csv");
  std::string line;
  std::getline(f, line);
  EXPECT_NE(line.find(",eval_loss,eval_perplexity"), std::string::npos) << line;
  for (int step = 1; std::getline(f, line); ++step) {
    // the eval_loss column (the tenth) is blank in the rows without an evaluation
    size_t at = 0;
    for (int col = 0; col < 9; ++col) at = line.find(',', at) + 1;
    EXPECT_EQ(line[at] == ',', step == 1 || step == 3) << line;
  }
  fs::remove_all(d);
}

TEST(TokenStream, HeldOutSequencesAreNeverServedForTraining) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  rp::TokenStreamOptions o;
  o.seq_len = 16;
  rp::TokenStream all(lm, (d / "data.jsonl").string(), o);
  o.eval_fraction = 0.34;
  rp::TokenStream part(lm, (d / "data.jsonl").string(), o);
  EXPECT_EQ(part.stats().sequences + part.stats().eval_sequences, all.stats().sequences);
  ASSERT_GT(part.stats().eval_sequences, 0);
  const auto ev = part.evaluation_batches(2);
  ASSERT_EQ(int64_t(ev.size()), (part.stats().eval_sequences + 1) / 2);
  std::set<std::vector<int32_t>> held;
  for (const auto& b : ev)
    for (int64_t r = 0; r < b.n_seq; ++r) {
      std::vector<int32_t> row(b.targets.begin() + r * 16, b.targets.begin() + (r + 1) * 16);
      if (std::any_of(row.begin(), row.end(), [](int32_t t) { return t >= 0; })) held.insert(row);
    }
  EXPECT_EQ(int64_t(held.size()), part.stats().eval_sequences);
  for (int i = 0; i < 3 * part.stats().sequences; ++i) {
    const rp::TokenBatch b = part.next(1);
    EXPECT_EQ(held.count(b.targets), 0u) << "a held-out sequence was served for training";
  }
  fs::remove_all(d);
}

}  // namespace

namespace {

// metrics_jsonl: one flushed object per step with what metrics.csv and on_step hold, the
// evaluation before training as step 0; the gradient norm is reported without clipping.
TEST(Trainer, MetricsJsonlMirrorsTheStepsAndTheNormIsAlwaysThere) {
  auto d = tmpdir();
  rp::TrainSpec s = tiny_spec(d, "run", 4);
  s.eval_fraction = 0.5;
  s.eval_every = 2;
  s.metrics_jsonl = "";  // true: output_dir/metrics.jsonl
  ASSERT_EQ(s.max_grad_norm, 0) << "no clipping: the unguarded path";
  std::vector<rp::StepReport> reports;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { reports.push_back(r); };
  rp::Trainer(s).run(cb);
  ASSERT_EQ(reports.size(), 4u);
  std::ifstream f(d / "run/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["step"], 0);
  EXPECT_TRUE(lines[0].contains("eval_loss"));
  for (size_t i = 0; i < reports.size(); ++i) {
    const rp::StepReport& r = reports[i];
    const nlohmann::json& j = lines[i + 1];
    EXPECT_EQ(j["step"], r.step);
    EXPECT_EQ(j["loss"].get<double>(), r.loss);
    EXPECT_EQ(j["grad_norm"].get<double>(), r.grad_norm);
    EXPECT_EQ(j["epoch"].get<double>(), r.epoch);
    EXPECT_GT(r.epoch, 0);
    EXPECT_GT(r.grad_norm, 0) << "computed without clipping, step " << r.step;
    EXPECT_TRUE(std::isfinite(r.grad_norm));
    EXPECT_EQ(j.contains("eval_loss"), r.evaluated) << r.step;
    EXPECT_FALSE(j.contains("aux_loss")) << "a dense model, as metrics.csv leaves it blank";
    EXPECT_GT(r.eta_s + (r.step == 4 ? 1 : 0), 0) << "the ETA of every step but the last";
  }
  // metrics.csv's grad_norm column (the seventh) holds the same norm
  std::ifstream csv(d / "run/metrics.csv");
  std::string row;
  std::getline(csv, row);
  for (const auto& r : reports) {
    ASSERT_TRUE(std::getline(csv, row));
    size_t at = 0;
    for (int col = 0; col < 6; ++col) at = row.find(',', at) + 1;
    EXPECT_NEAR(std::stod(row.substr(at)), r.grad_norm, 1e-5 * r.grad_norm) << row;
  }
  fs::remove_all(d);
}

}  // namespace
