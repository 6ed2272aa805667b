// The checkpoints a fine-tuner manages (trainer/checkpoint_rotation.hpp): save_total_limit keeps
// the newest and the best checkpoint, and a resumed run goes on rotating the first run's;
// load_best_model_at_end puts the best one in final/; early stopping ends the run at the
// evaluation its rule names on a real loss trajectory; "epochs" derives the steps; the keys'
// refusals are one line. The expectations are computed here from metrics.csv (the run's own
// evaluations), never taken from what the code under test decided.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/weight_format.hpp"
#include "roundpipe/data.hpp"
#include "roundpipe/model_source.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/checkpoint_rotation.hpp"
#include "trainer/lora_setup.hpp"
#include "trainer/run_setup.hpp"
#include "trainer/trainer_state.hpp"

namespace {

using namespace rp::clitest;

// a few hundred byte tokens: ~20 sequences of 16, a quarter held out for evaluation
const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light. And God saw the light, that it was "
    "good: and God divided the light from the darkness.\"}\n"
    "{\"prompt\": \"Count\", \"completion\": \" one two three four five six seven\"}\n";

rp::TrainSpec series_spec(const fs::path& d, const std::string& out, int64_t steps,
                          const std::string& extra = "") {
  write(d / "data.jsonl", kData);
  if (!fs::exists(d / "tiny")) tiny_model(d);
  rp::TrainSpec s =
      rp::spec_from_json(nlohmann::json::parse(spec_for(
                             d / "tiny", d / "data.jsonl", d / out,
                             ", \"eval_fraction\": 0.25, \"eval_every\": 1, \"tensorboard\": false" + extra)),
                         "test spec");
  s.steps = steps;
  s.seed = 3;
  s.save_dtype = "f32";
  s.adam.lr = s.lr_schedule.lr = 0.05;
  return s;
}

/// metrics.csv's column `name` per row (rows in step order; "" where blank).
std::vector<std::string> column(const fs::path& csv, const std::string& name) {
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);
  auto split = [](const std::string& l) {
    std::vector<std::string> v;
    size_t a = 0;
    for (size_t b; (b = l.find(',', a)) != std::string::npos; a = b + 1) v.push_back(l.substr(a, b - a));
    v.push_back(l.substr(a));
    return v;
  };
  const auto head = split(line);
  const size_t at = size_t(std::find(head.begin(), head.end(), name) - head.begin());
  EXPECT_LT(at, head.size()) << name << " not in " << line;
  std::vector<std::string> out;
  while (std::getline(f, line)) out.push_back(at < head.size() ? split(line).at(at) : "");
  return out;
}

/// eval_loss of each step (1-based index; nullopt where the step has none).
std::vector<std::optional<double>> eval_losses(const fs::path& csv) {
  std::vector<std::optional<double>> out{std::nullopt};  // step 0
  for (const auto& v : column(csv, "eval_loss"))
    out.push_back(v.empty() ? std::nullopt : std::optional(std::stod(v)));
  return out;
}

std::set<std::string> checkpoint_folders(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("checkpoint-", 0) == 0) out.insert(e.path().filename().string());
  return out;
}

/// The survivors of save_total_limit as Hugging Face's rotation defines them, computed from the
/// saves and the evaluations: the newest `limit` of `saves`, the best (lowest eval loss, the
/// earliest on a tie) always among them, the newest always kept.
std::set<std::string> expected_survivors(const std::vector<int64_t>& saves,
                                         const std::vector<std::optional<double>>& ev, size_t limit) {
  int64_t best = -1;
  for (int64_t s : saves)
    if (ev.at(size_t(s)) && (best < 0 || *ev[size_t(s)] < *ev[size_t(best)])) best = s;
  std::vector<int64_t> keep = saves;
  while (keep.size() > limit) {
    auto it =
        std::find_if(keep.begin(), keep.end(), [&](int64_t s) { return s != best && s != keep.back(); });
    if (it == keep.end()) break;
    keep.erase(it);
  }
  std::set<std::string> out;
  for (int64_t s : keep) out.insert("checkpoint-" + std::to_string(s));
  return out;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// ---- the rules alone ----

TEST(RunSeries, RotationRemovesTheOldestButNeverTheBestOrTheNewest) {
  auto ck = [](int64_t n) { return rp::SavedCheckpoint{"checkpoint-" + std::to_string(n), n, "", {}, {}}; };
  const std::vector<rp::SavedCheckpoint> four = {ck(2), ck(4), ck(6), ck(8)};
  EXPECT_TRUE(rp::checkpoints_beyond_limit(four, 0, "").empty());  // 0 keeps all
  EXPECT_EQ(rp::checkpoints_beyond_limit(four, 2, ""),
            (std::vector<std::string>{"checkpoint-2", "checkpoint-4"}));
  EXPECT_EQ(rp::checkpoints_beyond_limit(four, 2, "checkpoint-2"),
            (std::vector<std::string>{"checkpoint-4", "checkpoint-6"}));
  // limit 1 with an older best keeps two: the best and the newest
  EXPECT_EQ(rp::checkpoints_beyond_limit(four, 1, "checkpoint-4"),
            (std::vector<std::string>{"checkpoint-2", "checkpoint-6"}));
  // out of order in the record: by step, not by position
  EXPECT_EQ(rp::checkpoints_beyond_limit({ck(8), ck(2), ck(4)}, 1, ""),
            (std::vector<std::string>{"checkpoint-2", "checkpoint-4"}));
}

TEST(RunSeries, EarlyStoppingCountsEvaluationsWithoutAnImprovementAboveTheThreshold) {
  rp::EarlyStopState st;
  const rp::TrainSpec::EarlyStopping es{2, 0.1};
  EXPECT_FALSE(rp::early_stopping_update(st, 3.0, es, false));   // the first sets the best
  EXPECT_FALSE(rp::early_stopping_update(st, 2.5, es, false));   // 0.5 better
  EXPECT_FALSE(rp::early_stopping_update(st, 2.45, es, false));  // better, but by 0.05 only: 1
  EXPECT_EQ(*st.best, 2.45);                                     // still the best value
  EXPECT_TRUE(rp::early_stopping_update(st, 2.6, es, false));    // worse: 2 = patience
  rp::EarlyStopState up;
  EXPECT_FALSE(rp::early_stopping_update(up, 1.0, {1, 0}, true));
  EXPECT_FALSE(rp::early_stopping_update(up, 1.5, {1, 0}, true));
  EXPECT_TRUE(rp::early_stopping_update(up, 1.5, {1, 0}, true));  // a tie is no improvement
}

TEST(RunSeries, EpochsArithmetic) {
  auto steps = [](double epochs, int64_t sequences, int64_t per_step, std::string kind = "constant",
                  int64_t warmup = 0) {
    rp::TrainSpec s;
    s.epochs = epochs;
    s.sequences_per_step = per_step;
    s.lr_schedule.kind = kind;
    s.lr_schedule.warmup_steps = warmup;
    s.lr_schedule.total_steps = 0;
    const std::string line = rp::resolve_epochs(s, sequences);
    EXPECT_NE(line.find(fmt::format("= {} steps", s.steps)), std::string::npos) << line;
    if (kind != "constant") {
      EXPECT_EQ(s.lr_schedule.total_steps, s.steps);
    }
    return s.steps;
  };
  EXPECT_EQ(steps(2.5, 9, 3), 8);   // 7.5 steps of data: the last one partly a fourth pass
  EXPECT_EQ(steps(1, 9, 3), 3);     // whole passes divide exactly
  EXPECT_EQ(steps(0.1, 30, 3), 1);  // 1.0000000000000002 in floating point is still one step
  EXPECT_EQ(steps(0.01, 5, 4), 1);  // at least one step
  EXPECT_EQ(steps(3, 10, 4, "cosine", 2), 8);
  rp::TrainSpec s;
  s.source = "spec.json";
  s.epochs = 1;
  s.sequences_per_step = 4;
  s.lr_schedule.kind = "linear";
  s.lr_schedule.warmup_steps = 5;
  s.lr_schedule.total_steps = 0;
  try {
    rp::resolve_epochs(s, 8);
    ADD_FAILURE() << "2 steps with 5 warmup steps accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "spec.json: key 'epochs': 1 epochs of 8 training sequences are 2 steps of 4 "
              "sequences, fewer than lr_schedule.warmup_steps 5");
  }
  rp::TrainSpec none;
  EXPECT_EQ(rp::resolve_epochs(none, 8), "");
  EXPECT_EQ(none.steps, 20);
}

// The series a checkpoint records reads back as written, and a record that could name a folder
// outside the output folder is refused with one line (a state file is user input too).
TEST(RunSeries, TheRecordReadsBackAndNamesOnlyCheckpointFolders) {
  auto d = tmpdir();
  rp::TrainSpec spec;
  rp::TrainerState st = rp::trainer_state_of(spec, 6, 24);
  st.series.checkpoints = {
      {"checkpoint-2", 2, "00ff", {{"model.safetensors", 1234}, {"config.json", 56}}, 2.5},
      {"checkpoint-4", 4, "00aa", {{"model.safetensors", 1234}}, std::nullopt}};
  st.series.best = rp::BestCheckpoint{"checkpoint-2", 2, "eval_loss", 2.5};
  st.series.early_stopping = {2.25, 1};
  const std::string file = (d / "state.json").string();
  rp::write_trainer_state(file, st);
  const rp::TrainerState back = rp::read_trainer_state(file);
  ASSERT_EQ(back.series.checkpoints.size(), 2u);
  EXPECT_EQ(back.series.checkpoints[0].files, st.series.checkpoints[0].files);
  EXPECT_EQ(back.series.checkpoints[0].metric, 2.5);
  EXPECT_FALSE(back.series.checkpoints[1].metric);
  EXPECT_EQ(back.series.checkpoints[1].weights_xxh3, "00aa");
  ASSERT_TRUE(back.series.best);
  EXPECT_EQ(back.series.best->name, "checkpoint-2");
  EXPECT_EQ(back.series.early_stopping.best, 2.25);
  EXPECT_EQ(back.series.early_stopping.bad_evals, 1);
  nlohmann::json j = nlohmann::json::parse(bytes_of(file));
  j["run_series"]["checkpoints"][0]["name"] = "../../home";
  write(d / "bad.json", j.dump());
  try {
    rp::read_trainer_state((d / "bad.json").string());
    ADD_FAILURE() << "a record naming ../../home was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'run_series.checkpoints.name'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  fs::remove_all(d);
}

// ---- runs ----

// save_total_limit 2, a checkpoint every step: what is left is the newest and the best by the
// evaluations metrics.csv holds, with their state folders and nothing else of the series.
TEST(RunSeries, RotationKeepsTheNewestAndTheBestCheckpoint) {
  auto d = tmpdir();
  rp::TrainSpec spec = series_spec(d, "run", 8);
  spec.save_every = 1;
  spec.save_total_limit = 2;
  fs::create_directories(d / "run");
  write(d / "run/notes.txt", "mine");  // the user's file stays
  const rp::TrainResult res = rp::Trainer(spec).run();
  const auto ev = eval_losses(d / "run/metrics.csv");
  const std::set<std::string> want = expected_survivors({1, 2, 3, 4, 5, 6, 7}, ev, 2);
  EXPECT_EQ(checkpoint_folders(d / "run"), want);
  std::set<std::string> states;
  for (const auto& e : fs::directory_iterator(d / "run/state")) states.insert(e.path().filename().string());
  std::set<std::string> want_states = want;
  want_states.insert("final");
  EXPECT_EQ(states, want_states);
  EXPECT_EQ(bytes_of(d / "run/notes.txt"), "mine");
  // the best is recorded where a resumed run finds it
  const rp::TrainerState fin = rp::read_trainer_state((d / "run/state/final/roundpipe_state.json").string());
  ASSERT_TRUE(fin.series.best);
  EXPECT_TRUE(want.count(fin.series.best->name) || fin.series.best->name == "final") << fin.series.best->name;
  EXPECT_EQ(res.best_checkpoint, (d / "run" / fin.series.best->name).string());
  fs::remove_all(d);
}

// A file the run did not save inside a checkpoint folder makes it the user's: rotation leaves it
// (and its state) alone and says so.
TEST(RunSeries, RotationLeavesACheckpointHoldingOtherFilesAlone) {
  auto d = tmpdir();
  rp::TrainSpec spec = series_spec(d, "run", 3, ", \"eval_every\": 0");
  spec.save_every = 1;
  spec.save_total_limit = 1;
  rp::TrainerCallbacks cb;
  cb.on_checkpoint = [&](const rp::CheckpointReport& c) {
    if (c.step == 1) write(fs::path(c.dir) / "my_notes.txt", "keep me");
  };
  rp::Trainer(spec).run(cb);
  EXPECT_EQ(checkpoint_folders(d / "run"), (std::set<std::string>{"checkpoint-1", "checkpoint-2"}));
  EXPECT_EQ(bytes_of(d / "run/checkpoint-1/my_notes.txt"), "keep me");
  EXPECT_TRUE(fs::exists(d / "run/state/checkpoint-1/roundpipe_state.json"));
  // a checkpoint whose state was replaced by another save is not removed either
  rp::SavedCheckpoint c = rp::record_checkpoint((d / "run").string(), "checkpoint-2", 2, std::nullopt);
  c.step = 5;
  EXPECT_NE(rp::remove_series_checkpoint((d / "run").string(), c), "");
  EXPECT_TRUE(fs::exists(d / "run/checkpoint-2/model.safetensors"));
  c.step = 2;
  EXPECT_EQ(rp::remove_series_checkpoint((d / "run").string(), c), "");
  EXPECT_FALSE(fs::exists(d / "run/checkpoint-2"));
  EXPECT_FALSE(fs::exists(d / "run/state/checkpoint-2"));
  fs::remove_all(d);
}

// A run stopped after step 3 (its checkpoint-3) and resumed goes on rotating the checkpoints the
// first part wrote:
// at the end the folder holds what the rule gives for all the saves of the series, and the
// resumed run still reproduces the uninterrupted one bit for bit.
TEST(RunSeries, ResumeContinuesTheRotation) {
  auto d = tmpdir();
  auto spec = [&](const std::string& out) {
    rp::TrainSpec s = series_spec(d, out, 10);
    s.save_every = 4;
    s.save_total_limit = 1;
    return s;
  };
  const rp::TrainResult whole = rp::Trainer(spec("whole")).run();
  rp::StopToken stop;
  std::atomic<int64_t> reported{0};
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) {
    reported = r.step;
    while (r.step == 2 && !stop.stop_requested()) std::this_thread::yield();
  };
  std::thread stopper([&] {
    while (reported < 2) std::this_thread::yield();
    stop.request_stop();
  });
  const rp::TrainResult part = rp::Trainer(spec("part")).run(cb, stop);
  stopper.join();
  ASSERT_TRUE(part.stopped);
  ASSERT_EQ(part.steps_done, 3);
  rp::TrainSpec rest = spec("part");
  rest.resume_from = part.checkpoint;
  rp::Trainer(rest).run();
  const auto ev = eval_losses(d / "part/metrics.csv");
  EXPECT_EQ(ev, eval_losses(d / "whole/metrics.csv"));
  // the stop's checkpoint-3 joins the series: the resumed run rotates it away like its own
  EXPECT_EQ(checkpoint_folders(d / "part"), expected_survivors({3, 4, 8}, ev, 1));
  EXPECT_EQ(checkpoint_folders(d / "whole"), expected_survivors({4, 8}, ev, 1));
  EXPECT_TRUE(bytes_of(d / "whole/final/model.safetensors") == bytes_of(d / "part/final/model.safetensors"));
  EXPECT_TRUE(bytes_of(d / "whole/state/final/optimizer_state.bin") ==
              bytes_of(d / "part/state/final/optimizer_state.bin"));
  fs::remove_all(d);
}

// load_best_model_at_end: final/ is the best checkpoint (by the evaluations metrics.csv holds)
// when it beats the last step, byte for byte with its state, and says which step it holds.
TEST(RunSeries, LoadBestModelAtEndPutsTheBestCheckpointInFinal) {
  auto d = tmpdir();
  rp::TrainSpec spec = series_spec(d, "run", 8);
  spec.save_every = 2;
  spec.eval_every = 2;
  spec.load_best_model_at_end = true;
  spec.adam.lr = spec.lr_schedule.lr = 0.3;  // large steps: the evaluation loss does not only fall
  rp::validate_spec(spec);
  const rp::TrainResult res = rp::Trainer(spec).run();
  const auto ev = eval_losses(d / "run/metrics.csv");
  int64_t best = 2;
  for (int64_t s : {4, 6, 8})
    if (*ev[size_t(s)] < *ev[size_t(best)]) best = s;
  const rp::TrainerState fin = rp::read_trainer_state((d / "run/state/final/roundpipe_state.json").string());
  EXPECT_EQ(fin.step, best);
  EXPECT_EQ(res.final_step, best);
  if (best != 8) {
    const std::string name = "checkpoint-" + std::to_string(best);
    EXPECT_TRUE(bytes_of(d / "run/final/model.safetensors") ==
                bytes_of(d / "run" / name / "model.safetensors"));
    EXPECT_TRUE(rp::resumable_checkpoint((d / "run/final").string()));
  }
  fs::remove_all(d);
}

// The best checkpoint is known across a resume: a run stopped at step 6 and resumed (it evaluates
// only step 8 itself) puts the same checkpoint in final/ as the uninterrupted run, byte for byte.
TEST(RunSeries, ResumeKnowsTheBestCheckpoint) {
  auto d = tmpdir();
  auto spec = [&](const std::string& out) {
    rp::TrainSpec s = series_spec(d, out, 8);
    s.save_every = 2;
    s.eval_every = 2;
    s.load_best_model_at_end = true;
    s.adam.lr = s.lr_schedule.lr = 0.3;
    return s;
  };
  const rp::TrainResult whole = rp::Trainer(spec("whole")).run();
  rp::StopToken stop;
  std::atomic<int64_t> reported{0};
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) {
    reported = r.step;
    while (r.step == 6 && !stop.stop_requested()) std::this_thread::yield();
  };
  std::thread stopper([&] {
    while (reported < 6) std::this_thread::yield();
    stop.request_stop();
  });
  const rp::TrainResult part = rp::Trainer(spec("part")).run(cb, stop);
  stopper.join();
  ASSERT_TRUE(part.stopped);
  // the resumed run evaluates only step 8: a best before it comes from the checkpoint's record
  ASSERT_LT(whole.best_step, 8) << "the trajectory must have its best before the last step";
  rp::TrainSpec rest = spec("part");
  rest.resume_from = part.checkpoint.empty() ? part.latest_checkpoint : part.checkpoint;
  ASSERT_FALSE(rest.resume_from.empty());
  const rp::TrainResult done = rp::Trainer(rest).run();
  EXPECT_EQ(done.final_step, whole.final_step);
  EXPECT_EQ(done.best_step, whole.best_step);
  EXPECT_EQ(done.best_metric, whole.best_metric);
  EXPECT_TRUE(bytes_of(d / "whole/final/model.safetensors") == bytes_of(d / "part/final/model.safetensors"));
  EXPECT_EQ(rp::read_trainer_state((d / "part/state/final/roundpipe_state.json").string()).step,
            whole.final_step);
  fs::remove_all(d);
}

/// The step early stopping must end a run at, by Hugging Face's rule applied to the
/// evaluations `ev` of a run that was not stopped (0: none within it).
int64_t hf_early_stop_step(const std::vector<std::optional<double>>& ev, int64_t patience, double threshold) {
  std::optional<double> best;
  int64_t bad = 0;
  for (size_t s = 1; s < ev.size(); ++s) {
    if (!ev[s]) continue;
    const double v = *ev[s];
    if (!best || (v<*best&& * best - v> threshold)) bad = 0;
    else ++bad;
    if (!best || v < *best) best = v;
    if (bad >= patience) return int64_t(s);
  }
  return 0;
}

// The reference run evaluates every step without early stopping; the rule applied to its
// evaluations names the step; the run with early_stopping ends exactly there, with the same
// evaluations up to it, final/ saved at that step.
TEST(RunSeries, EarlyStoppingEndsAtTheEvaluationItsRuleNames) {
  auto d = tmpdir();
  const int64_t steps = 14, patience = 2;
  auto spec_of = [&](const std::string& out) {
    rp::TrainSpec s = series_spec(d, out, steps);
    // large steps: the evaluation loss first rises, then falls by varying amounts
    s.adam.lr = s.lr_schedule.lr = 0.1;
    s.eval_every = 2;
    return s;
  };
  rp::Trainer(spec_of("reference")).run();
  const auto ev = eval_losses(d / "reference/metrics.csv");
  double threshold = -1;
  int64_t want = 0;
  for (double t : {0.0, 0.01, 0.1, 0.25, 0.5})
    if (const int64_t s = hf_early_stop_step(ev, patience, t); s > 3 && s < steps - 1) {
      threshold = t;
      want = s;
      break;
    }
  std::string trajectory;
  for (const auto& v : ev) trajectory += v ? fmt::format(" {:.5f}", *v) : std::string(" -");
  ASSERT_GE(threshold, 0) << "no threshold stops the reference trajectory within the run:" << trajectory;
  rp::TrainSpec spec = spec_of("stopped");
  spec.early_stopping = rp::TrainSpec::EarlyStopping{patience, threshold};
  const rp::TrainResult res = rp::Trainer(spec).run();
  EXPECT_TRUE(res.early_stopped);
  EXPECT_FALSE(res.stopped);
  EXPECT_EQ(res.steps_done, want) << "threshold " << threshold << ", evaluations" << trajectory;
  EXPECT_NE(res.early_stop_reason.find(fmt::format("at step {}", want)), std::string::npos)
      << res.early_stop_reason;
  const auto got = eval_losses(d / "stopped/metrics.csv");
  ASSERT_EQ(got.size(), size_t(want + 1));
  for (int64_t s = 1; s <= want; ++s) EXPECT_EQ(got[size_t(s)], ev[size_t(s)]) << "step " << s;
  EXPECT_EQ(rp::read_trainer_state((d / "stopped/state/final/roundpipe_state.json").string()).step, want);
  fs::remove_all(d);
}

/// The training sequences the trainer packs from the tiny data (eval_fraction 0.25 held out).
int64_t training_sequences(const fs::path& d) {
  const rp::LoadedModel m = rp::load_model((d / "tiny").string());
  rp::TokenStreamOptions o;
  o.seq_len = 16;
  o.seed = 3;
  o.eval_fraction = 0.25;
  o.chat_template = rp::TokenStream::chat_template_for(m, "auto");
  return rp::TokenStream(m, (d / "data.jsonl").string(), o).stats().sequences;
}

// "epochs": steps = ceil(epochs x training sequences / sequences_per_step); the epoch of every
// step is the sequences consumed over the training sequences; a cosine schedule decays over the
// derived steps; metrics.csv gains the epoch as its last column.
TEST(RunSeries, EpochsDeriveTheStepsAndTheEpochOfEveryStep) {
  auto d = tmpdir();
  rp::TrainSpec spec = series_spec(d, "run", 1, ", \"eval_every\": 0");
  spec.epochs = 1.5;
  spec.lr_schedule.kind = "cosine";
  spec.lr_schedule.total_steps = 0;  // follows the derived steps
  std::vector<rp::StepReport> steps;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) { steps.push_back(r); };
  const rp::TrainResult res = rp::Trainer(spec).run(cb);
  const int64_t n = training_sequences(d);
  ASSERT_GT(n, 2);
  const int64_t want = int64_t(std::ceil(1.5 * double(n) / 2.0 - 1e-9));
  EXPECT_EQ(res.steps_done, want);
  EXPECT_EQ(res.total_steps, want);
  ASSERT_EQ(steps.size(), size_t(want));
  const auto epochs = column(d / "run/metrics.csv", "epoch");
  for (const auto& r : steps) {
    EXPECT_DOUBLE_EQ(r.epoch, double(r.step * 2) / double(n)) << r.step;
    EXPECT_EQ(r.total_steps, want);
    EXPECT_EQ(epochs.at(size_t(r.step - 1)), fmt::format("{:.4f}", r.epoch));
  }
  const rp::TrainerState fin = rp::read_trainer_state((d / "run/state/final/roundpipe_state.json").string());
  EXPECT_EQ(fin.lr_schedule["total_steps"], want);
  EXPECT_EQ(fin.data_position, want * 2);
  fs::remove_all(d);
}

// The refusals are one line naming the key, as every other key's.
TEST(RunSeries, BadKeysAreOneLineErrors) {
  auto d = tmpdir();
  write(d / "data.jsonl", kData);
  const std::string base = "{\"model\": \"m\", \"data\": \"x\", \"eval_fraction\": 0.25, \"eval_every\": 2";
  auto error = [&](const std::string& extra) {
    try {
      rp::spec_from_json(nlohmann::json::parse(base + extra + "}"), "spec.json");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error(", \"steps\": 5, \"epochs\": 2"),
            "spec.json: keys 'steps' and 'epochs': give one or the other");
  EXPECT_NE(error(", \"epochs\": 0").find("key 'epochs': expected a number > 0"), std::string::npos);
  EXPECT_NE(error(", \"save_total_limit\": -1").find("key 'save_total_limit': expected an integer >= 0"),
            std::string::npos);
  EXPECT_NE(error(", \"metric_for_best_model\": \"accuracy\"").find("key 'metric_for_best_model'"),
            std::string::npos);
  EXPECT_NE(error(", \"greater_is_better\": true").find("key 'greater_is_better': expected false"),
            std::string::npos);
  EXPECT_NE(
      error(", \"load_best_model_at_end\": true, \"save_every\": 3")
          .find("key 'load_best_model_at_end': needs an evaluation at every save: save_every (3) a multiple "
                "of eval_every (2)"),
      std::string::npos);
  EXPECT_EQ(error(", \"load_best_model_at_end\": true, \"save_every\": 4"), "accepted");
  EXPECT_NE(error(", \"early_stopping\": {\"patience\": 0}").find("key 'early_stopping.patience'"),
            std::string::npos);
  EXPECT_NE(error(", \"early_stopping\": {\"patience\": 2, \"wait\": 1}").find("early_stopping.wait"),
            std::string::npos);
  EXPECT_NE(error(", \"early_stopping\": 3").find("key 'early_stopping'"), std::string::npos);
  // without evaluation data
  const std::string no_eval = "{\"model\": \"m\", \"data\": \"x\", \"save_every\": 2, \"eval_every\": 2";
  auto error2 = [&](const std::string& extra) {
    try {
      rp::spec_from_json(nlohmann::json::parse(no_eval + extra + "}"), "spec.json");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // eval_every alone: nothing to evaluate, which passed without a word
  EXPECT_EQ(error2(""),
            "spec.json: key 'eval_every': 2 needs evaluation data (\"eval_data\" or \"eval_fraction\"); "
            "without it nothing is evaluated: give one, or set eval_every to 0");
  EXPECT_EQ(error2(", \"eval_fraction\": 0.5"), "accepted");
  EXPECT_EQ(error2(", \"load_best_model_at_end\": true"),
            "spec.json: key 'load_best_model_at_end': needs evaluation data (\"eval_data\" or "
            "\"eval_fraction\") to "
            "rank the checkpoints");
  EXPECT_NE(error2(", \"early_stopping\": {}").find("key 'early_stopping': needs evaluation data"),
            std::string::npos);
  // every message is one line
  for (const auto& m : {error(", \"epochs\": -1"), error2(", \"early_stopping\": {}")})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  // a spec built in code gets the same checks
  rp::TrainSpec s = series_spec(d, "run", 4);
  s.eval_fraction = 0;
  s.early_stopping = rp::TrainSpec::EarlyStopping{};
  EXPECT_THROW(rp::validate_spec(s), std::invalid_argument);
  fs::remove_all(d);
}

// base_format follows an f32, f16 or bf16 base when the spec does not set it (it was bf16 for
// every base); a quantized base stays bf16; a base_format the spec sets wins.
TEST(RunSeries, LoraBaseFormatFollowsTheBaseDtype) {
  auto d = tmpdir();
  const fs::path tiny = tiny_model(d);
  const rp::LoadedModel m = rp::load_model(tiny.string());
  const rp::ModelLayout layout = rp::make_layout(m.config);
  std::vector<std::vector<float>> w;
  rp::fill_groups(m, layout, w);
  std::vector<const float*> ptrs;
  for (auto& g : w) ptrs.push_back(g.data());
  for (const auto& [dt, want] :
       {std::pair{rp::DType::f32, "f32"}, {rp::DType::f16, "f16"}, {rp::DType::bf16, "bf16"}}) {
    const fs::path base = d / fmt::format("base-{}", want);
    rp::save_hf_checkpoint(base.string(), layout, ptrs, m.tokenizer_json, m.chat_template, dt);
    std::string why;
    EXPECT_EQ(rp::weight_format_name(rp::base_format_of_model(rp::ModelSource::open(base.string()), why)),
              want);
    EXPECT_NE(why.find(want), std::string::npos) << why;
    // through a run: the state records the form the base was kept in
    write(d / "data.jsonl", kData);
    const std::string out = fmt::format("run-{}", want);
    rp::TrainSpec s =
        rp::spec_from_json(nlohmann::json::parse(spec_for(base, d / "data.jsonl", d / out,
                                                          ", \"lora\": {\"r\": 2}, \"steps\": 1")),
                           "spec.json");
    EXPECT_TRUE(s.lora_base_format_from_model);
    rp::Trainer(s).run();
    EXPECT_EQ(rp::read_trainer_state((d / out / "state/final/roundpipe_state.json").string()).base_format,
              want);
  }
  // set in the spec: kept
  const rp::TrainSpec q =
      rp::spec_from_json(nlohmann::json::parse(spec_for(d / "base-f32", d / "data.jsonl", d / "q",
                                                        ", \"lora\": {\"r\": 2, \"base_format\": \"q8_0\"}")),
                         "spec.json");
  EXPECT_FALSE(q.lora_base_format_from_model);
  // a quantized GGUF base: bf16
  const fs::path gguf = fs::path(RP_SOURCE_DIR) / "assets/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << "no " << gguf << " (scripts/setup.sh downloads it)";
  std::string why;
  EXPECT_EQ(rp::base_format_of_model(rp::ModelSource::open(gguf.string()), why), rp::WeightFormat::bf16);
  EXPECT_NE(why.find("not all f32, f16 or bf16"), std::string::npos) << why;
  fs::remove_all(d);
}

}  // namespace
