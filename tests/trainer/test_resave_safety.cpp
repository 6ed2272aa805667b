// A save replaces only what its manifest proves roundpipe wrote: files of the user's in any
// saved folder (final/, state/final/, checkpoint-<n>/, final-merged/) survive a re-save, an
// --overwrite-output-dir start and a merge; a file the manifest does not prove ours never
// enters the next manifest; and a save that would have to replace one is refused before the
// first step, never after the last.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/atomic_file.hpp"
#include "base/output_folder.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/trainer.hpp"
#include "tests/cli/cli_util.hpp"
#include "trainer/checkpoint_bundle.hpp"

namespace {

using namespace rp::clitest;

rp::TrainSpec spec_into(const fs::path& d, const fs::path& out, int64_t steps,
                        const std::string& extra = "") {
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  rp::TrainSpec s = rp::spec_from_json(
      nlohmann::json::parse(spec_for(tiny_model(d), d / "data.jsonl", out, extra)), "test spec");
  s.steps = steps;
  s.save_dtype = "f32";
  return s;
}

bool listed(const fs::path& dir, const std::string& name) {
  const auto m = rp::manifest_files(dir);
  return m && m->count(name) > 0;
}

/// run(spec) must throw a FolderConflict naming `file` before any step (no metrics row added).
void expect_refused_before_training(const rp::TrainSpec& spec, const fs::path& file) {
  const fs::path metrics = fs::path(spec.output_dir) / "metrics.csv";
  const std::string before = fs::exists(metrics) ? slurp(metrics) : "";
  try {
    rp::Trainer(spec).run();
    ADD_FAILURE() << "the run replaced " << file;
  } catch (const rp::FolderConflict& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find(file.string() + ": "), 0u) << m;
    EXPECT_NE(m.find("nothing was trained"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_EQ(fs::exists(metrics) ? slurp(metrics) : "", before) << "steps were trained";
}

// --overwrite-output-dir keeps the user's files in final/, state/final/ and checkpoint-<n>/
// (and says so); the new run's saves of those folders then keep them too.
TEST(OutputSafety, OverwriteThenReSaveKeepsTheUsersFilesInEverySavedFolder) {
  auto d = tmpdir();
  const fs::path out = d / "out";
  rp::TrainSpec spec = spec_into(d, out, 2);
  spec.save_every = 1;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 2);
  for (const char* f :
       {"final/user.txt", "state/final/user.txt", "checkpoint-1/user.txt", "state/checkpoint-1/user.txt"})
    write(out / f, std::string("mine: ") + f);
  rp::TrainSpec again = spec_into(d, out, 2);
  again.save_every = 1;
  again.overwrite_output_dir = true;
  ASSERT_EQ(rp::Trainer(again).run().steps_done, 2);
  for (const char* f :
       {"final/user.txt", "state/final/user.txt", "checkpoint-1/user.txt", "state/checkpoint-1/user.txt"})
    EXPECT_EQ(slurp(out / f), std::string("mine: ") + f) << f;
  EXPECT_TRUE(rp::resumable_checkpoint((out / "final").string()));
  EXPECT_FALSE(listed(out / "final", "user.txt"));
  fs::remove_all(d);
}

// A README.md of the user's kept in final/ by a resumed save is never listed as the run's, so a
// later --overwrite-output-dir keeps it; an edited card is the user's too, not a reason to refuse.
TEST(OutputSafety, AKeptReadmeNeverEntersTheManifest) {
  auto d = tmpdir();
  const fs::path out = d / "out", fin = out / "final";
  rp::TrainSpec spec = spec_into(d, out, 1);
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  ASSERT_TRUE(listed(fin, "README.md")) << "the run's own card is its file";
  const std::string edited = slurp(fin / "README.md");
  write(fin / "README.md", edited.substr(0, 20) + "my notes" + edited.substr(20));  // the user edits the card
  const std::string mine = slurp(fin / "README.md");
  spec.resume_from = fin.string();
  spec.steps = 2;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 2);
  EXPECT_EQ(slurp(fin / "README.md"), mine);
  EXPECT_FALSE(listed(fin, "README.md"));
  rp::TrainSpec over = spec_into(d, out, 1);
  over.overwrite_output_dir = true;
  ASSERT_EQ(rp::Trainer(over).run().steps_done, 1);
  EXPECT_EQ(slurp(fin / "README.md"), mine);
  fs::remove_all(d);
}

// A named pipe or socket of the user's in a folder the run saves (final/README.md, one inside a
// sub-folder of state/final/), which the save could not keep beside its files, is refused before
// the first step naming it: it failed only at the final save, after the whole training.
TEST(OutputSafety, ASpecialFileTheSaveCannotKeepIsRefusedBeforeTraining) {
  auto d = tmpdir();
  const fs::path out = d / "out", fin = out / "final";
  ASSERT_EQ(rp::Trainer(spec_into(d, out, 1)).run().steps_done, 1);
  for (const fs::path& special : {fin / "README.md", out / "state/final/notes/pipe"}) {
    SCOPED_TRACE(special);
    fs::remove(fin / "README.md");
    fs::create_directories(special.parent_path());
    ASSERT_EQ(::mkfifo(special.c_str(), 0600), 0);
    rp::TrainSpec over = spec_into(d, out, 1);
    over.overwrite_output_dir = true;
    expect_refused_before_training(over, special);
    EXPECT_EQ(fs::symlink_status(special).type(), fs::file_type::fifo) << "the pipe went";
    fs::remove(special);
  }
  write(fin / "README.md", "mine");
  rp::TrainSpec over = spec_into(d, out, 1);
  over.overwrite_output_dir = true;
  ASSERT_EQ(rp::Trainer(over).run().steps_done, 1) << "a plain file of the user's is kept, not refused";
  EXPECT_EQ(slurp(fin / "README.md"), "mine");
  fs::remove_all(d);
}

// A file of the run's that the user edited (same size: only the manifest's XXH3 shows it) in
// state/final/ or final/ is refused before the first step with one line naming it.
TEST(OutputSafety, AnEditedFileTheSaveWouldReplaceIsRefusedBeforeTraining) {
  auto d = tmpdir();
  const fs::path out = d / "out", fin = out / "final";
  rp::TrainSpec spec = spec_into(d, out, 1);
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  spec.resume_from = fin.string();
  spec.steps = 3;
  const fs::path state = out / "state/final/roundpipe_state.json";
  std::string s = slurp(state);
  const std::string original = s;
  ASSERT_NE(s.find("\"step\": 1"), std::string::npos) << s;
  s.replace(s.find("\"step\": 1"), 9, "\"step\":  1");  // one byte more
  s.pop_back();                                         // one byte less: the same size
  ASSERT_EQ(s.size(), original.size());
  write(state, s);
  expect_refused_before_training(spec, state);
  EXPECT_EQ(slurp(state), s);
  write(state, original);
  const fs::path cfg = fin / "config.json";
  std::string c = slurp(cfg);
  c[c.rfind('}') - 1] = ' ';  // same size, other content
  write(cfg, c);
  expect_refused_before_training(spec, cfg);
  EXPECT_EQ(slurp(cfg), c);
  EXPECT_TRUE(rp::resumable_checkpoint(fin.string()));
  fs::remove_all(d);
}

// A file of the user's that appears in final/ while the run trains (after the check before the
// first step) makes the end save keep the last step as checkpoint-<steps> instead, and say so.
TEST(OutputSafety, AConflictDuringTheRunKeepsTheLastStepInACheckpoint) {
  auto d = tmpdir();
  const fs::path out = d / "out", fin = out / "final";
  rp::TrainSpec spec = spec_into(d, out, 1);
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  spec.resume_from = fin.string();
  spec.steps = 3;
  rp::TrainerCallbacks cb;
  cb.on_step = [&](const rp::StepReport& r) {
    if (r.step == 2) write(fin / "tokenizer_config.json", "{\"mine\": true}");
  };
  try {
    rp::Trainer(spec).run(cb);
    ADD_FAILURE() << "replaced the user's tokenizer_config.json";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find((fin / "tokenizer_config.json").string() + ": changed since roundpipe wrote it"), 0u)
        << m;
    EXPECT_NE(m.find("the last step 3 is saved in " + (out / "checkpoint-3").string() + " instead"),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(slurp(fin / "tokenizer_config.json"), "{\"mine\": true}");
  EXPECT_TRUE(rp::resumable_checkpoint((out / "checkpoint-3").string()));
  EXPECT_TRUE(rp::resumable_checkpoint(fin.string())) << "final/ stays the step-1 checkpoint it was";
  fs::remove_all(d);
}

// A folder no manifest proves roundpipe's (an earlier release's checkpoint): a save that would
// write a name it holds is refused before training; one holding only the user's files is kept.
TEST(OutputSafety, AFolderWithoutAManifestIsTheUsers) {
  auto d = tmpdir();
  const fs::path out = d / "out", fin = out / "final";
  rp::TrainSpec spec = spec_into(d, out, 1);
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  fs::remove(fin / rp::kManifestFile);
  rp::TrainSpec resume = spec;
  resume.resume_from = fin.string();
  resume.steps = 2;
  expect_refused_before_training(resume, fin / "config.json");
  rp::TrainSpec over = spec_into(d, out, 1);
  over.overwrite_output_dir = true;
  expect_refused_before_training(over, fin / "config.json");
  EXPECT_TRUE(fs::exists(fin / "model.safetensors")) << "removed what nothing proved roundpipe's";
  for (const auto& name : rp::entries_of(fin)) fs::remove(fin / name);
  write(fin / "user.txt", "mine");
  ASSERT_EQ(rp::Trainer(over).run().steps_done, 1);
  EXPECT_EQ(slurp(fin / "user.txt"), "mine");
  EXPECT_FALSE(listed(fin, "user.txt"));
  fs::remove_all(d);
}

// A LoRA run's final-merged/ has a manifest like every saved folder: a resumed save keeps the
// user's file there, and save_total_limit's rotation never removes a checkpoint holding one.
TEST(OutputSafety, FinalMergedCarriesAManifestAndKeepsTheUsersFiles) {
  auto d = tmpdir();
  const fs::path out = d / "out", merged = out / "final-merged";
  rp::TrainSpec spec = spec_into(d, out, 1, ", \"lora\": {\"r\": 2}, \"merge_adapters\": true");
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  ASSERT_TRUE(rp::manifest_files(merged).has_value());
  EXPECT_TRUE(listed(merged, "model.safetensors"));
  write(merged / "user.txt", "mine");
  spec.resume_from = (out / "final").string();
  spec.steps = 2;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 2);
  EXPECT_EQ(slurp(merged / "user.txt"), "mine");
  EXPECT_FALSE(listed(merged, "user.txt"));
  // roundpipe merge writes into the run's final-merged/ (its manifest proves it ours), but not
  // while it holds a file of the user's
  try {
    rp::merge_peft_folder((out / "final").string(), merged.string(), "", rp::DType::f32);
    ADD_FAILURE() << "merged over the user's file";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds a file roundpipe did not write there (user.txt)"),
              std::string::npos)
        << e.what();
  }
  fs::remove(merged / "user.txt");
  rp::merge_peft_folder((out / "final").string(), merged.string(), "", rp::DType::f32);
  EXPECT_TRUE(listed(merged, "model.safetensors"));
  fs::remove_all(d);
}

TEST(OutputSafety, RotationNeverRemovesACheckpointHoldingTheUsersFile) {
  auto d = tmpdir();
  const fs::path out = d / "out";
  rp::TrainSpec spec = spec_into(d, out, 2);
  spec.save_every = 1;
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 2);
  write(out / "checkpoint-1/user.txt", "mine");
  rp::TrainSpec again = spec_into(d, out, 4);
  again.save_every = 1;
  again.save_total_limit = 1;
  again.resume_from = (out / "checkpoint-1").string();
  ASSERT_EQ(rp::Trainer(again).run().steps_done, 4);
  EXPECT_EQ(slurp(out / "checkpoint-1/user.txt"), "mine");
  EXPECT_FALSE(fs::exists(out / "checkpoint-2")) << "rotation removed nothing";
  fs::remove_all(d);
}

// roundpipe_run.json must be a run record roundpipe wrote: a folder or garbage of that name is
// refused with one line naming it, and nothing in the folder is replaced.
TEST(OutputSafety, AGarbageRunRecordIsRefused) {
  auto d = tmpdir();
  const fs::path out = d / "out";
  rp::TrainSpec spec = spec_into(d, out, 1);
  ASSERT_EQ(rp::Trainer(spec).run().steps_done, 1);
  const std::string metrics = slurp(out / "metrics.csv");
  for (int kind = 0; kind < 2; ++kind) {
    fs::remove_all(out / "roundpipe_run.json");
    if (kind == 0) write(out / "roundpipe_run.json", "not json");
    else fs::create_directories(out / "roundpipe_run.json");
    rp::TrainSpec over = spec_into(d, out, 1);
    over.overwrite_output_dir = true;
    try {
      rp::Trainer(over).run();
      ADD_FAILURE() << "ran with a garbage run record";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find((out / "roundpipe_run.json").string() + " is not a run record"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(slurp(out / "metrics.csv"), metrics);
  }
  fs::remove_all(d);
}

// A symbolic link named like a run output (a folder the run saves, metrics.csv) is never
// replaced, removed or written through: refused before anything is loaded.
TEST(OutputSafety, ASymlinkedSaveTargetIsRefused) {
  auto d = tmpdir();
  const fs::path out = d / "out";
  fs::create_directories(out);
  fs::create_directories(d / "elsewhere");
  write(d / "elsewhere/keep.txt", "mine");
  fs::create_directory_symlink(d / "elsewhere", out / "final");
  write(out / "roundpipe_run.json", "{\"written_by\": \"roundpipe train\"}");
  write(d / "mine.csv", "mine");
  fs::create_symlink(d / "mine.csv", out / "metrics.csv");
  rp::TrainSpec spec = spec_into(d, out, 1);
  spec.overwrite_output_dir = true;
  for (const char* name : {"final", "metrics.csv"}) {
    try {
      rp::Trainer(spec).run();
      ADD_FAILURE() << "ran into a symlinked " << name;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find((out / name).string() + " is a symbolic link"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(fs::is_symlink(out / name));
    fs::rename(out / name, d / (std::string(name) + ".link"));  // the next one
  }
  EXPECT_EQ(slurp(d / "elsewhere/keep.txt"), "mine");
  EXPECT_EQ(slurp(d / "mine.csv"), "mine");
  // a symlinked state/ is found by the save targets' check
  fs::create_directory_symlink(d / "elsewhere", out / "state");
  try {
    rp::Trainer(spec).run();
    ADD_FAILURE() << "ran into a symlinked state/";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find((out / "state").string() + " is a symbolic link"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(rp::entries_of(d / "elsewhere"), std::vector<std::string>{"keep.txt"});
  fs::remove_all(d);
}

}  // namespace
