// What a training run may write over: never "/", $HOME, the working directory or its parents,
// never its own inputs, never run outputs no roundpipe run recorded; and a checkpoint is its
// weights and its trainer state together, written state first, so a save cut in between
// leaves nothing that looks resumable, and no advice names a checkpoint that cannot resume.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/atomic_file.hpp"
#include "base/output_folder.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "tests/in_folder.hpp"
#include "trainer/checkpoint_bundle.hpp"

namespace {

using namespace rp::clitest;

rp::TrainSpec spec_into(const fs::path& d, const fs::path& out, int64_t steps) {
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  rp::TrainSpec s =
      rp::spec_from_json(nlohmann::json::parse(spec_for(tiny_model(d), d / "data.jsonl", out)), "test spec");
  s.steps = steps;
  s.save_dtype = "f32";
  return s;
}

/// run(spec) must throw std::invalid_argument containing `what`.
void expect_refused(const rp::TrainSpec& spec, const std::string& what) {
  try {
    rp::Trainer(spec).run();
    ADD_FAILURE() << "ran into " << spec.output_dir;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

using rp::testing::InFolder;

TEST(OutputSafety, TheRootHomeAndWorkingDirectoryAreNoOutputFolder) {
  auto d = tmpdir();
  fs::create_directories(d / "home/a/work");
  rp::TrainSpec spec = spec_into(d / "home/a/work", d / "unused", 1);
  InFolder in(d / "home/a/work", d / "home");
  const auto before = std::distance(fs::recursive_directory_iterator(d), {});
  const std::pair<std::string, std::string> cases[] = {{"/", "is the root folder"},
                                                       {(d / "home").string(), "is the home folder ($HOME)"},
                                                       {".", "is the working directory"},
                                                       {"..", "contains the working directory"},
                                                       {d.string(), "contains the working directory"}};
  for (const auto& [out, why] : cases) {
    spec.output_dir = out;
    expect_refused(spec, "key 'output_dir': '" + out + "' " + why);
  }
  // a frozen tier's cache inside such a folder: the folder is the fault, named first
  spec.frozen_tier = rp::TrainSpec::FrozenTier{};
  spec.frozen_tier->path = (d / "home/a/work/c/b.tier").string();
  for (const auto& [out, why] : cases) {
    spec.output_dir = out;
    expect_refused(spec, "key 'output_dir': '" + out + "' " + why);
  }
  EXPECT_EQ(std::distance(fs::recursive_directory_iterator(d), {}), before) << "something was written";
  fs::remove_all(d);
}

// model runs/x/final with output_dir runs/x would replace the model at the end of the run;
// --overwrite-output-dir changes nothing to that. Data, eval data and the resumed checkpoint
// likewise (a checkpoint directly in output_dir is the run being continued, and allowed).
TEST(OutputSafety, AnOutputFolderHoldingOrInsideAnInputIsRefused) {
  auto d = tmpdir();
  rp::TrainSpec spec = spec_into(d, d / "runs/x", 1);
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  const std::string weights = slurp(d / "runs/x/final/model.safetensors");
  rp::TrainSpec again = spec_into(d, d / "runs/x", 1);
  again.model = (d / "runs/x/final").string();
  again.overwrite_output_dir = true;
  expect_refused(again, "key 'output_dir': '" + (d / "runs/x").string() +
                            "' is, holds or lies inside the input '" + (d / "runs/x/final").string() +
                            "' (key 'model')");
  EXPECT_EQ(slurp(d / "runs/x/final/model.safetensors"), weights);
  rp::TrainSpec inside = spec_into(d, d / "runs/x/final/sub", 1);
  inside.model = (d / "runs/x/final").string();
  expect_refused(inside, "(key 'model')");
  EXPECT_FALSE(fs::exists(d / "runs/x/final/sub"));
  rp::TrainSpec data = spec_into(d, d, 1);
  data.output_dir = (d / "runs").string();
  data.data = (d / "runs/x/data.jsonl").string();
  fs::copy_file(d / "data.jsonl", data.data);
  expect_refused(data, "(key 'data')");
  data.data = (d / "data.jsonl").string();
  data.eval_data = (d / "runs/x/data.jsonl").string();
  expect_refused(data, "(key 'eval_data')");
  rp::TrainSpec resume = spec_into(d, d / "runs/x/final/more", 2);
  resume.resume_from = (d / "runs/x/final").string();
  expect_refused(resume, "the checkpoint '" + resume.resume_from + "' the run resumes from");
  resume.output_dir = (d / "runs").string();  // holds the checkpoint, but is not the run's folder
  expect_refused(resume, "the run resumes from");
  resume.output_dir = (d / "runs/x").string();  // continuing the run in its own folder
  EXPECT_EQ(rp::Trainer(resume).run().steps_done, 2);
  fs::remove_all(d);
}

// The run writes and replaces its own files in output_dir (metrics.csv, profile.json, final/):
// a frozen tier's cache there would be overwritten or carried off with a checkpoint. Refused
// before anything is loaded or written, however the path is spelled (a "..", a link to the
// folder, even one that only resolves once the run makes output_dir), and where only the
// cache's own folder (its lock, temporary and spill files) lies inside.
TEST(OutputSafety, AFrozenTierCacheInsideOutputDirIsRefused) {
  auto d = tmpdir();
  rp::TrainSpec spec = spec_into(d, d / "runs/x", 1);
  const std::string out = (d / "runs/x").string();
  const auto refuse = [&](const fs::path& cache, const std::string& how,
                          const std::string& where = "test spec") {
    spec.frozen_tier = rp::TrainSpec::FrozenTier{};
    spec.frozen_tier->path = cache.string();
    expect_refused(spec, where + ": key 'frozen_tier.path': '" + cache.string() + "' " + how +
                             " the run's output_dir '" + out + "'");
  };
  refuse(d / "runs/x/metrics.csv", "lies inside");
  fs::create_directories(d / "elsewhere");
  refuse(d / "elsewhere/../runs/x/final/base.tier", "lies inside");
  fs::create_directory_symlink(d / "runs/x", d / "link");  // dangling until the run makes runs/x
  refuse(d / "link/base.tier", "lies inside");
  EXPECT_FALSE(fs::exists(d / "runs")) << "the refused run left the folder it made";
  fs::create_directories(d / "runs/x");
  write(d / "cache.tier", "a cache\n");
  fs::create_symlink(d / "cache.tier", d / "runs/x/t.tier");
  refuse(d / "runs/x/t.tier", "keeps its lock and spill files inside");
  fs::remove(d / "runs/x/t.tier");
  spec.frozen_tier->path = (d / "m.jsonl").string();
  spec.metrics_jsonl = (d / "elsewhere/../m.jsonl").string();
  expect_refused(spec, "key 'frozen_tier.path': '" + spec.frozen_tier->path + "' is, or keeps beside it");
  spec.metrics_jsonl.reset();
  // a path a --set wrote names the setting
  spec.settings = {{"frozen_tier", "{}", false, "--set frozen_tier={...}"}};
  refuse(d / "runs/x/profile.json", "lies inside", "--set frozen_tier={...}");
  EXPECT_TRUE(fs::is_empty(d / "runs/x"));
  EXPECT_EQ(slurp(d / "cache.tier"), "a cache\n");
  EXPECT_FALSE(fs::exists(d / "m.jsonl"));
  fs::remove_all(d);
}

// The reverse: an output_dir inside the cache path (the cache is a file, so a folder there is
// none) is refused in one line naming both, before any folder is made; and metrics_jsonl may
// be neither the cache nor a file the tier keeps beside it (its builders' lock, its temporary
// and that temporary's owner marker), however spelled.
TEST(OutputSafety, AnOutputDirInsideTheTierCacheAndMetricsOnItsFilesAreRefused) {
  auto d = tmpdir();
  const fs::path cache = d / "q/t.tier";
  rp::TrainSpec spec = spec_into(d, cache / "out", 1);
  spec.frozen_tier = rp::TrainSpec::FrozenTier{};
  spec.frozen_tier->path = cache.string();
  expect_refused(spec, "test spec: key 'output_dir': '" + (cache / "out").string() +
                           "' lies inside frozen_tier.path '" + cache.string() + "'");
  EXPECT_FALSE(fs::exists(d / "q")) << "the refused run made folders";
  spec.output_dir = (d / "runs/x").string();
  fs::create_directories(d / "elsewhere");
  for (const std::string suffix : {".lock", ".tmp-4242", ".tmp-4242.roundpipe-owner", ""}) {
    spec.metrics_jsonl = (d / "elsewhere/../q").string() + "/t.tier" + suffix;
    expect_refused(spec, "key 'frozen_tier.path': '" + cache.string() + "' is, or keeps beside it");
  }
  fs::create_directories(d / "q");
  spec.metrics_jsonl = cache.string() + ".jsonl";  // a name that only starts like the cache's is fine
  EXPECT_EQ(rp::Trainer(spec).run().steps_done, 1);
  fs::remove_all(d);
}

// Files named like run outputs that no roundpipe run recorded (a user's metrics.csv, an HF
// trainer's checkpoint-500/) are not replaced, with or without --overwrite-output-dir; other
// files in the folder are the user's and stay untouched by a run.
// An output_dir that is, or lies under, a symbolic link to a missing target is refused in one
// line that names it and the link (not the file system's bare "File exists"), and the run
// creates and removes nothing: the link stays, its target is not made.
TEST(OutputSafety, AnOutputDirThatIsADanglingLinkIsNamed) {
  auto d = tmpdir();
  fs::create_symlink(d / "gone", d / "out");
  const auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(d)) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  rp::TrainSpec spec = spec_into(d, d / "out", 1);
  const std::vector<std::string> before = entries();
  const std::string link = "is a symbolic link to '" + (d / "gone").string() + "', which does not exist";
  expect_refused(spec, "test spec: key 'output_dir': '" + (d / "out").string() + "' " + link);
  spec.output_dir = (d / "out" / "run").string();
  expect_refused(spec, "test spec: key 'output_dir': '" + spec.output_dir + "' lies under '" +
                           (d / "out").string() + "', which " + link);
  EXPECT_EQ(entries(), before);
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d / "out")));
  EXPECT_FALSE(fs::exists(d / "gone"));
  fs::remove_all(d);
}

TEST(OutputSafety, RunOutputsNoRunRecordedAreNeverReplaced) {
  auto d = tmpdir();
  rp::TrainSpec spec = spec_into(d, d / "out", 1);
  fs::create_directories(d / "out/checkpoint-500");
  write(d / "out/metrics.csv", "mine\n");
  write(d / "out/notes.txt", "mine\n");
  expect_refused(spec, "holds checkpoint-500, metrics.csv that no roundpipe run recorded as its own");
  spec.overwrite_output_dir = true;
  expect_refused(spec, "holds checkpoint-500, metrics.csv that no roundpipe run recorded as its own");
  EXPECT_EQ(slurp(d / "out/metrics.csv"), "mine\n");
  fs::remove(d / "out/metrics.csv");
  fs::remove(d / "out/checkpoint-500");
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  EXPECT_EQ(slurp(d / "out/notes.txt"), "mine\n");
  EXPECT_TRUE(fs::exists(d / "out/roundpipe_run.json"));
  fs::remove_all(d);
}

// A file the run writes outside its output folder (metrics_jsonl) never replaces an input,
// and a user's metrics.jsonl in the output folder is a run output no run recorded.
TEST(OutputSafety, MetricsJsonlNeverReplacesAnInputOrTheUsersFile) {
  auto d = tmpdir();
  rp::TrainSpec spec = spec_into(d, d / "out", 1);
  const std::string data = slurp(d / "data.jsonl");
  spec.metrics_jsonl = (d / "data.jsonl").string();
  expect_refused(spec, "key 'metrics_jsonl'");
  EXPECT_EQ(slurp(d / "data.jsonl"), data);
  spec.metrics_jsonl = std::string();  // output_dir/metrics.jsonl
  fs::create_directories(d / "out");
  write(d / "out/metrics.jsonl", "mine\n");
  expect_refused(spec, "holds metrics.jsonl that no roundpipe run recorded as its own");
  EXPECT_EQ(slurp(d / "out/metrics.jsonl"), "mine\n");
  fs::remove(d / "out/metrics.jsonl");
  // a path outside the folder: a user's file there stays, whatever its one line; an earlier
  // run's metrics (even with a killed run's torn last line) are written over
  for (const char* text : {"mine\n", "{\"note\": 1}\n", "{\"step\": 1}\nnotes\nmore\n"}) {
    write(d / "notes.jsonl", text);
    spec.metrics_jsonl = (d / "notes.jsonl").string();
    expect_refused(spec, "is not a run's metrics line; a run replaces only an earlier run's metrics there");
    EXPECT_EQ(slurp(d / "notes.jsonl"), text);
  }
  write(d / "m.jsonl", "{\"step\": 0, \"eval_loss\": 3.1}\n{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"lo");
  spec.metrics_jsonl = (d / "m.jsonl").string();
  EXPECT_EQ(rp::Trainer(spec).run().steps_done, 1);
  EXPECT_EQ(slurp(d / "m.jsonl").find("\"lo\n"), std::string::npos);
  EXPECT_NE(slurp(d / "m.jsonl").find("\"step\":1"), std::string::npos);
  fs::remove_all(d);
}

// Half pairs: weights without their state (or with another checkpoint's state), and a state
// without its weights, are no checkpoint: the fresh-run refusal advises only a checkpoint
// that resumes, a resume from a half pair fails with one line, and without any whole pair no
// --resume is advised at all.
TEST(OutputSafety, AHalfCheckpointIsNeverAdvisedOrResumed) {
  auto d = tmpdir();
  const fs::path out = d / "out";
  rp::TrainSpec spec = spec_into(d, out, 3);
  spec.save_every = 1;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 3);
  ASSERT_TRUE(rp::resumable_checkpoint((out / "final").string()));
  fs::remove_all(out / "state/final");                               // weights without state
  fs::remove_all(out / "checkpoint-2");                              // state without weights
  fs::remove_all(out / "state/checkpoint-1");                        // weights with the state
  fs::copy(out / "state/checkpoint-2", out / "state/checkpoint-1");  // of other weights
  EXPECT_FALSE(rp::resumable_checkpoint((out / "final").string()));
  EXPECT_FALSE(rp::resumable_checkpoint((out / "checkpoint-1").string()));
  EXPECT_FALSE(rp::resumable_checkpoint((out / "checkpoint-2").string()));
  // no whole pair is left: a fresh run advises no --resume
  rp::TrainSpec fresh = spec_into(d, out, 1);
  try {
    rp::Trainer(fresh).run();
    ADD_FAILURE() << "a fresh run replaced the earlier run's checkpoints";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("(checkpoint-1, final); none of them can be resumed"), std::string::npos) << m;
    EXPECT_EQ(m.find("--resume"), std::string::npos) << m;
  }
  rp::TrainSpec from_folder = spec_into(d, out, 5);
  from_folder.resume_from = out.string();
  expect_refused(from_folder, "none of its checkpoints (checkpoint-1, final) can be resumed");
  // a whole pair again: the advice names it, and it resumes
  rp::TrainSpec redo = spec_into(d, d / "redo", 2);
  redo.save_every = 1;
  ASSERT_EQ(rp::Trainer(redo).run().steps_done, 2);
  fs::rename(d / "redo/checkpoint-1", out / "checkpoint-3");
  fs::rename(d / "redo/state/checkpoint-1", out / "state/checkpoint-3");
  try {
    rp::Trainer(fresh).run();
    ADD_FAILURE() << "a fresh run replaced the earlier run's checkpoints";
  } catch (const std::invalid_argument& e) {
    // checkpoint-3 is at step 1, the fresh spec's whole length: a finished run, resumed with more steps
    EXPECT_NE(std::string(e.what()).find("that run is finished (checkpoint-3 is at step 1 of the spec's 1): "
                                         "train it further with --resume " +
                                         out.string() + "/checkpoint-3 --steps"),
              std::string::npos)
        << e.what();
  }
  rp::TrainSpec half = spec_into(d, out, 5);
  half.resume_from = (out / "final").string();
  EXPECT_THROW(rp::Trainer(half).run(), std::runtime_error);
  half.resume_from = (out / "checkpoint-3").string();
  EXPECT_EQ(rp::Trainer(half).run().steps_done, 5);
  fs::remove_all(d);
}

// The trainer state is in place before the weights: a failure injected between the two
// (right after state/<name> was put in place) leaves the state without weights, which
// nothing treats as a checkpoint, and the earlier checkpoints stay resumable.
TEST(OutputSafety, ACheckpointSavesItsStateFirstAndItsWeightsLast) {
  auto d = tmpdir();
  const fs::path out = d / "out";
  rp::TrainSpec spec = spec_into(d, out, 2);
  spec.save_every = 1;
  std::vector<std::string> replaced;
  rp::set_atomic_write_hook([&](const std::string& event, const std::string& dir) {
    if (event != "folder-replaced") return;
    replaced.push_back(fs::relative(dir, out).string());
    if (replaced.back() == "state/final") throw std::runtime_error("injected: killed between the two writes");
  });
  EXPECT_THROW(rp::Trainer(spec).run(), std::runtime_error);
  rp::set_atomic_write_hook({});
  EXPECT_EQ(replaced, (std::vector<std::string>{"state/checkpoint-1", "checkpoint-1", "state/final"}));
  EXPECT_TRUE(fs::exists(out / "state/final"));
  EXPECT_FALSE(fs::exists(out / "final"));
  EXPECT_EQ(rp::checkpoints_in(out.string()), (std::vector<std::string>{"checkpoint-1"}));
  rp::TrainSpec fresh = spec_into(d, out, 2);
  expect_refused(fresh, "continue it with --resume " + out.string() + "/checkpoint-1");
  rp::TrainSpec resume = spec_into(d, out, 2);
  resume.resume_from = (out / "checkpoint-1").string();
  EXPECT_EQ(rp::Trainer(resume).run().steps_done, 2);
  EXPECT_TRUE(rp::resumable_checkpoint((out / "final").string()));
  fs::remove_all(d);
}

}  // namespace

namespace {
/// Makes `leftover` look like what a killed roundpipe writer (pid 999999, long gone) left.
void mark_dead_leftover(const fs::path& leftover, const char* kind, const std::string& target) {
  write(
      fs::path(rp::owner_marker_path(leftover.string())),
      std::string("roundpipe leftover v1\npid=999999\nstart=1\nkind=") + kind + "\ntarget=" + target + "\n");
}
}  // namespace

// A save of final/ killed between its two renames (the new state in place, the new weights
// complete in final.tmp-<pid>, the old state aside in state/final.old-<pid>): the next start
// completes the pair. With the new weights incomplete it puts the old state back instead.
// Either way final/ resumes, and the leftovers' cleanup afterwards keeps it so.
TEST(OutputSafety, ASaveKilledBetweenStateAndWeightsIsMadeWhole) {
  for (const bool complete : {true, false}) {
    auto d = tmpdir();
    rp::TrainSpec spec = spec_into(d, d / "out", 2);
    ASSERT_EQ(rp::Trainer(spec).run().steps_done, 2);
    const fs::path out = d / "out", fin = out / "final", st = out / "state/final";
    fs::copy(fin, d / "w2", fs::copy_options::recursive);
    fs::copy(st, d / "s2", fs::copy_options::recursive);
    const std::string w2 = rp::weights_checksum(fin.string());
    spec.resume_from = fin.string();
    spec.steps = 3;
    ASSERT_EQ(rp::Trainer(spec).run().steps_done, 3);
    const std::string w3 = rp::weights_checksum(fin.string());
    ASSERT_NE(w2, w3);
    // what the kill left
    fs::rename(fin, out / "final.tmp-999999");
    fs::copy(d / "w2", fin, fs::copy_options::recursive);
    fs::copy(d / "s2", out / "state/final.old-999999", fs::copy_options::recursive);
    mark_dead_leftover(out / "final.tmp-999999", "tmp", "final");
    mark_dead_leftover(out / "state/final.old-999999", "old", "final");
    if (!complete) fs::resize_file(out / "final.tmp-999999/model.safetensors", 100);
    EXPECT_FALSE(rp::resumable_checkpoint(fin.string()));
    const auto mended = rp::mend_interrupted_saves(out.string());
    ASSERT_EQ(mended.size(), 1u);
    EXPECT_NE(mended[0].find(complete ? "completed the interrupted save" : "put back the trainer state"),
              std::string::npos)
        << mended[0];
    rp::clean_stale_temporaries(out.string());
    rp::clean_stale_temporaries((out / "state").string());
    EXPECT_TRUE(rp::resumable_checkpoint(fin.string()));
    EXPECT_EQ(rp::weights_checksum(fin.string()), complete ? w3 : w2);
    EXPECT_FALSE(fs::exists(out / "final.tmp-999999"));
    EXPECT_FALSE(fs::exists(out / "state/final.old-999999"));
    fs::remove_all(d);
  }
}

namespace {

// A resumed run re-saves final/ (and its state): the files the user put there (not in the
// roundpipe_manifest.json the save wrote) stay, a user's *.safetensors among them does not
// count as the checkpoint's weights, and a file of the run's the user changed fails the save
// with one line before anything is replaced, leaving the checkpoint resumable.
TEST(OutputSafety, AReSaveKeepsTheUsersFilesInACheckpoint) {
  auto d = tmpdir();
  const fs::path out = d / "out", fin = out / "final";
  rp::TrainSpec spec = spec_into(d, out, 1);
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  write(fin / "notes.txt", "mine");
  fs::create_directories(fin / "mine");
  write(fin / "mine/a.txt", "mine too");
  write(fin / "extra.safetensors", "not weights");
  write(out / "state/final/notes.txt", "state notes");
  spec.resume_from = fin.string();
  spec.steps = 2;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 2);
  EXPECT_EQ(slurp(fin / "notes.txt"), "mine");
  EXPECT_EQ(slurp(fin / "mine/a.txt"), "mine too");
  EXPECT_EQ(slurp(fin / "extra.safetensors"), "not weights");
  EXPECT_EQ(slurp(out / "state/final/notes.txt"), "state notes");
  EXPECT_TRUE(rp::resumable_checkpoint(fin.string()));
  // the user's own generation_config.json in place of the run's: refused, kept, and final/
  // still resumes
  const std::string edited = slurp(fin / "generation_config.json") + "\n\n";
  write(fin / "generation_config.json", edited);
  const std::string state = slurp(out / "state/final/roundpipe_state.json");
  spec.steps = 3;
  try {
    rp::Trainer(spec).run();
    ADD_FAILURE() << "replaced the user's generation_config.json";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find((fin / "generation_config.json").string() +
                                         ": changed since roundpipe wrote it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(slurp(fin / "generation_config.json"), edited);
  EXPECT_TRUE(rp::resumable_checkpoint(fin.string()));
  EXPECT_EQ(slurp(out / "state/final/roundpipe_state.json"), state)
      << "the state was replaced without its weights";
  EXPECT_EQ(slurp(fin / "notes.txt"), "mine");
  fs::remove_all(d);
}

// --overwrite-output-dir starts over: the earlier run's checkpoint-<n>/, final/ and their
// states go (no later --resume or reader sees a mix of two runs), the user's files stay,
// inside those folders too.
TEST(OutputSafety, OverwriteRemovesTheEarlierRunsCheckpointsAndKeepsTheUsers) {
  auto d = tmpdir();
  const fs::path out = d / "out";
  rp::TrainSpec spec = spec_into(d, out, 3);
  spec.save_every = 1;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 3);
  ASSERT_EQ(rp::checkpoints_in(out.string()),
            (std::vector<std::string>{"checkpoint-1", "checkpoint-2", "final"}));
  write(out / "checkpoint-1/notes.txt", "mine");
  write(out / "notes.txt", "mine");
  rp::TrainSpec again = spec_into(d, out, 1);
  again.overwrite_output_dir = true;
  ASSERT_EQ(rp::Trainer(again).run().steps_done, 1);
  EXPECT_FALSE(fs::exists(out / "checkpoint-2"));
  EXPECT_FALSE(fs::exists(out / "state/checkpoint-1"));
  EXPECT_FALSE(fs::exists(out / "state/checkpoint-2"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-1/config.json"));
  EXPECT_EQ(slurp(out / "checkpoint-1/notes.txt"), "mine");
  EXPECT_EQ(slurp(out / "notes.txt"), "mine");
  EXPECT_TRUE(rp::resumable_checkpoint((out / "final").string()));
  EXPECT_EQ(rp::newest_resumable_checkpoint(out.string(), rp::checkpoints_in(out.string())), "final");
  const std::string metrics = slurp(out / "metrics.csv");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 2) << metrics;  // header + this run's one step
  fs::remove_all(d);
}

// A run that stops before its first step (bad data, an early error) leaves no folder it made,
// however deep (the parents it made too), and never removes one that was there before.
TEST(OutputSafety, ARunFailingBeforeItsFirstStepRemovesOnlyTheFoldersItMade) {
  auto d = tmpdir();
  auto failing = [&](const fs::path& out) {
    rp::TrainSpec s = spec_into(d, out, 2);
    write(d / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": \n");  // its second line is no JSON
    s.data = (d / "bad.jsonl").string();
    EXPECT_ANY_THROW(rp::Trainer(s).run());
  };
  failing(d / "made");
  EXPECT_FALSE(fs::exists(d / "made")) << "the failed run made the folder and wrote nothing into it";
  failing(d / "runs" / "exp" / "out");
  EXPECT_FALSE(fs::exists(d / "runs")) << "the parents the run made go too";
  fs::create_directories(d / "kept" / "empty");
  failing(d / "kept" / "empty" / "new" / "out");
  EXPECT_TRUE(fs::is_directory(d / "kept" / "empty")) << "a folder that was there before stays";
  EXPECT_FALSE(fs::exists(d / "kept" / "empty" / "new"));
  failing(d / "kept" / "empty");
  EXPECT_TRUE(fs::is_directory(d / "kept" / "empty")) << "an empty output folder that was there before stays";
  // an error once the run's files are written (metrics.csv, its record), before the first step
  rp::TrainSpec late = spec_into(d, d / "late" / "out", 2);
  rp::TrainerCallbacks cb;
  cb.on_ready = [] { throw std::runtime_error("an error before the first step"); };
  EXPECT_THROW(rp::Trainer(late).run(cb), std::runtime_error);
  EXPECT_FALSE(fs::exists(d / "late")) << "its files and the folders it made go";
  // the same for what a callback may throw that is no std::exception
  cb.on_ready = [] { throw 42; };
  EXPECT_THROW(rp::Trainer(late).run(cb), int);
  EXPECT_FALSE(fs::exists(d / "late")) << "its files and the folders it made go";
  fs::remove_all(d);
}

// The CLI's handler of a stop signal before the first step removes the files recorded as
// unfinished and the (then empty) folders the run made, and leaves at once: at the last moment
// it can come (on_ready), a fresh run's record and metrics.csv are among those files, so nothing
// is left (the record used to stay, and with it the folder).
TEST(OutputSafety, AStopSignalBeforeTheFirstStepLeavesNoFolder) {
  GTEST_FLAG_SET(death_test_style, "fast");  // the child runs the statement in this test's folder
  auto d = tmpdir();
  rp::TrainSpec s = spec_into(d, d / "sig" / "out", 2);
  rp::TrainerCallbacks cb;
  cb.on_ready = [] {
    rp::remove_unfinished_temporaries();
    rp::remove_recorded_folders();
    std::_Exit(130);
  };
  EXPECT_EXIT(rp::Trainer(s).run(cb), ::testing::ExitedWithCode(130), "");
  std::string left;
  if (fs::exists(d / "sig"))
    for (const auto& e : fs::recursive_directory_iterator(d / "sig"))
      left += " " + e.path().lexically_relative(d).string();
  EXPECT_FALSE(fs::exists(d / "sig")) << "left:" << left;
  // once the first step began they are no longer the signal's to remove
  rp::TrainSpec kept = spec_into(d, d / "kept", 2);
  ASSERT_EQ(rp::Trainer(kept).run().steps_done, 2);
  rp::remove_unfinished_temporaries();
  EXPECT_TRUE(fs::exists(d / "kept" / "roundpipe_run.json"));
  EXPECT_TRUE(fs::exists(d / "kept" / "metrics.csv"));
  fs::remove_all(d);
}

// The metrics_jsonl file is opened at the first step's line, so a stop signal before that step
// (the CLI's handler, as above) leaves none: an explicit file outside the output folder, where
// the folder's cleanup does not reach, is not created, and an earlier run's file there keeps its
// lines.
TEST(OutputSafety, AStopSignalBeforeTheFirstStepLeavesTheMetricsJsonlAlone) {
  GTEST_FLAG_SET(death_test_style, "fast");
  auto d = tmpdir();
  rp::TrainerCallbacks cb;
  cb.on_ready = [] {
    rp::remove_unfinished_temporaries();
    rp::remove_recorded_folders();
    std::_Exit(130);
  };
  rp::TrainSpec s = spec_into(d, d / "sig", 2);
  s.metrics_jsonl = (d / "metrics.jsonl").string();
  EXPECT_EXIT(rp::Trainer(s).run(cb), ::testing::ExitedWithCode(130), "");
  EXPECT_FALSE(fs::exists(d / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(d / "sig"));
  const std::string earlier = "{\"step\": 1, \"loss\": 2.5}\n";
  write(d / "metrics.jsonl", earlier);
  EXPECT_EXIT(rp::Trainer(s).run(cb), ::testing::ExitedWithCode(130), "");
  EXPECT_EQ(slurp(d / "metrics.jsonl"), earlier);
  fs::remove_all(d);
}

}  // namespace
