// `roundpipe train` settings from the command line (--set, --lr, --seq-len, --data, ...),
// --dump-batch on its own, --version, and what a run says about itself: the optimizer mode
// first, truncated examples per data file, the gradient norm in every progress line; -q before or
// after the command.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"

#include "base/error_text.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

// -q keeps warnings and errors and drops the information lines, whether it comes before the
// command or after it (it is parsed by the top-level app either way).
TEST(CliSettings, QuietDropsInformationLinesBeforeOrAfterTheCommand) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const std::string dump = "train " + (d / "spec.json").string() + " --dump-batch " + (d / "b.json").string();
  const CliRun loud = roundpipe(dump, d);
  ASSERT_EQ(loud.code, 0) << loud.err;
  ASSERT_NE(loud.out.find("loading model"), std::string::npos) << loud.out;  // spdlog writes to stdout
  for (const std::string& args : {"-q " + dump, dump + " -q", dump + " --quiet"}) {
    const CliRun q = roundpipe(args, d);
    ASSERT_EQ(q.code, 0) << args << ": " << q.err;
    EXPECT_EQ(q.out.find("loading model"), std::string::npos) << args << ": " << q.out;
    EXPECT_NE(q.out.find("the first batch of step 1"), std::string::npos) << args << ": " << q.out;
  }
  // an error is still one line
  const CliRun bad = roundpipe("-q train " + (d / "missing.json").string(), d);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("roundpipe: error: "), std::string::npos) << bad.err;
  // and says why the spec file cannot be opened
  EXPECT_EQ(bad.err, "roundpipe: error: " + (d / "missing.json").string() + ": cannot open the spec file (" +
                         std::strerror(ENOENT) + ")\n");
  fs::remove_all(d);
}

// What -q keeps, as --help and the README say: a run's progress lines, its closing summary,
// warnings and errors; only the information log lines ("[12:00:00] loading model ...") go.
TEST(CliSettings, QuietKeepsProgressLinesAndTheSummaryAndHelpSaysSo) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const CliRun q = roundpipe("-q train " + (d / "spec.json").string(), d);
  ASSERT_EQ(q.code, 0) << q.err << q.out;
  EXPECT_EQ(q.out.find("loading model"), std::string::npos) << q.out;
  EXPECT_EQ(q.out.find("saved checkpoint"), std::string::npos) << q.out;
  EXPECT_EQ(q.out.find("step     1/2 | loss "), 0u) << q.out;
  EXPECT_NE(q.out.find("\nstep     2/2 | loss "), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("\ndone: 2 steps in "), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("\ntry it: "), std::string::npos) << q.out;
  const CliRun help = roundpipe("--help", d);
  EXPECT_NE(
      help.out.find("drop the information log lines; keep the progress lines, what the command prints as "
                    "its result (train's closing summary), warnings and errors"),
      std::string::npos)
      << help.out;
  fs::remove_all(d);
}

// A frozen_tier.path given with --set that the cache cannot use is refused when the cache
// opens, after the model loaded: the line names the --set, as a bad value of it does before,
// not the spec file, which has no frozen_tier at all; the user's file stays as it was.
TEST(CliSettings, ACachePathFromSetIsNamedByTheSetWhenTheCacheRefusesIt) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "notes.txt", "the user's notes, not a cache");
  write(d / "spec.json",
        spec_for(model, d / "data.jsonl", d / "run",
                 ", \"lora\": {\"r\": 4, \"alpha\": 8, \"target_modules\": \"all-linear\"}"));
  // a long setting is quoted shortened, as other errors quote values
  const std::string value = "frozen_tier.path=" + (d / "notes.txt").string();
  const std::string set = "--set " + value;
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string() + " " + set, d),
                        "--set " + rp::excerpt(value) + ": key 'frozen_tier.path': " +
                            (d / "notes.txt").string() + ": exists and is not a roundpipe tier cache");
  EXPECT_EQ(
      roundpipe("train " + (d / "spec.json").string() + " " + set, d).err.find("expected a writable file"),
      std::string::npos)
      << "the file is there and writable: the line says to move it away, nothing else";
  // the whole object from --set names it too
  const std::string object = "frozen_tier={\"path\":\"" + (d / "notes.txt").string() + "\"}";
  expect_one_line_error(roundpipe("train " + (d / "spec.json").string() + " --set '" + object + "'", d),
                        "--set " + rp::excerpt(object) + ": key 'frozen_tier.path': ");
  EXPECT_EQ(slurp(d / "notes.txt"), "the user's notes, not a cache");
  // a path longer than the file system takes: one line, the --set and the path quoted shortened
  const std::string longer = (d / std::string(3000, 'x')).string();
  const CliRun r = roundpipe("train " + (d / "spec.json").string() + " --set frozen_tier.path=" + longer, d);
  expect_one_line_error(r,
                        "--set " + rp::excerpt("frozen_tier.path=" + longer) + ": key 'frozen_tier.path': ");
  EXPECT_NE(r.err.find("': cannot reach (" + std::string(std::strerror(ENAMETOOLONG)) + ")"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find(std::string(1000, 'x')), std::string::npos)
      << "quoted whole: " << r.err.size() << " bytes";
  fs::remove_all(d);
}

TEST(CliSettings, SetAndShorthandsReachTheSpecAndErrorsNameThem) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "other.jsonl", "{\"text\": \"And God said, Let there be light: and there was light.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const std::string spec = (d / "spec.json").string();
  // shorthands first, then --set in order: seq_len ends at 10
  CliRun r = roundpipe("train " + spec + " --seq-len 12 --set seq_len=14 --set seq_len=10 --dump-batch " +
                           (d / "a.json").string(),
                       d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_EQ(nlohmann::json::parse(slurp(d / "a.json"))["seq_len"], 10);
  EXPECT_NE(r.out.find("nothing was trained"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "run")) << "--dump-batch alone writes nothing else";
  r = roundpipe("train " + spec + " --seq-len 12 --dump-batch " + (d / "b.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(d / "b.json"))["seq_len"], 12);
  r = roundpipe("train " + spec + " --data " + (d / "other.jsonl").string() + " --dump-batch " +
                    (d / "c.json").string(),
                d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(nlohmann::json::parse(slurp(d / "c.json"))["ids"],
            nlohmann::json::parse(slurp(d / "b.json"))["ids"]);
  // a path that is not there is named by the flag that gave it, not the spec file
  const std::string nowhere = (d / "nowhere").string();
  expect_one_line_error(
      roundpipe("train " + spec + " --model " + nowhere, d),
      "roundpipe: error: --model " + nowhere + ": key 'model': " + nowhere + ": " + std::strerror(ENOENT));
  expect_one_line_error(
      roundpipe("train " + spec + " --data " + nowhere, d),
      "roundpipe: error: --data " + nowhere + ": key 'data': " + nowhere + ": " + std::strerror(ENOENT));
  expect_one_line_error(roundpipe("train " + spec + " --eval-data " + nowhere, d),
                        "roundpipe: error: --eval-data " + nowhere + ": key 'eval_data': " + nowhere + ": " +
                            std::strerror(ENOENT));
  // so are the keys checked once the data is read, and an output file the run would replace
  const std::string notes = (d / "notes.txt").string();
  write(notes, "the user's notes\n");
  expect_one_line_error(roundpipe("train " + spec + " --set metrics_jsonl=" + notes, d),
                        "roundpipe: error: --set " + rp::excerpt("metrics_jsonl=" + notes) +
                            ": key 'metrics_jsonl': '" + notes + "' holds a file whose line 1");
  EXPECT_EQ(slurp(notes), "the user's notes\n");
  write(d / "chat.jsonl", "{\"prompt\": \"a very long prompt that does not fit\", \"completion\": \" x\"}\n");
  expect_one_line_error(
      roundpipe("train " + spec + " --data " + (d / "chat.jsonl").string() + " --seq-len 4", d),
      "roundpipe: error: --seq-len 4: key 'seq_len': 4 tokens leave no training target");
  // text too short for one window is the data's fault, not seq_len's ("in any of the 0 examples
  // ... (their prompts are longer); raise seq_len")
  write(d / "empty_text.jsonl", "{\"text\": \"\"}\n");
  expect_one_line_error(roundpipe("train " + spec + " --data " + (d / "empty_text.jsonl").string(), d),
                        "roundpipe: error: " + (d / "empty_text.jsonl").string() +
                            ": its text makes 1 token, too few for one training sequence");
  write(d / "one.jsonl", "{\"prompt\": \"hi\", \"completion\": \" x\"}\n");
  expect_one_line_error(
      roundpipe("train " + spec + " --data " + (d / "one.jsonl").string() + " --set eval_fraction=0.5", d),
      "roundpipe: error: --set eval_fraction=0.5: key 'eval_fraction': 0.5 of the 1 sequence of ");
  EXPECT_FALSE(fs::exists(d / "run"));
  expect_one_line_error(roundpipe("train " + spec + " --set lora.r=0", d),
                        "--set lora.r=0: key 'lora.r': expected an integer in 1..65536, got 0");
  expect_one_line_error(roundpipe("train " + spec + " --lr fast", d),
                        "--lr fast: key 'optimizer.lr': expected a number, got \"fast\"");
  expect_one_line_error(roundpipe("train " + spec + " --set wokers=2", d),
                        "--set wokers=2: unknown key 'wokers'");
  {  // a plan of the wrong shape is refused before the model loads, naming the setting
    const CliRun r = roundpipe("train " + spec + " --set 'plan={}'", d);
    expect_one_line_error(r, "--set plan={}: key 'plan': expected an object with \"forward\"");
    EXPECT_EQ(r.out, "") << "printed before the refusal";
  }
  // no KEY=VALUE at all: a usage error, exit 2 (it used to exit 1 like a bad value)
  for (const char* bad : {" --set steps", " --set =4"}) {
    const CliRun r = roundpipe("train " + spec + bad, d);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(std::string(bad).substr(1) + ": expected KEY=VALUE"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // a key with an empty part, at its end or at its start: one wording for both, the key as
  // given, exit 2 like a --set without a key
  for (const std::string key : {"steps.", ".steps"}) {
    const CliRun r = roundpipe("train " + spec + " --set " + key + "=3", d);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.err, "roundpipe: error: --set " + key + "=3: key '" + key +
                         "' has an empty part (a dot at its start or end, or two in a row); expected a key "
                         "like seq_len or lora.r (see roundpipe --help)\n");
  }
  // a usage error: exit 2 like the other command-line usage errors (it used to exit 1)
  const CliRun alone = roundpipe("train " + spec + " --train", d);
  EXPECT_EQ(alone.code, 2) << alone.err;
  EXPECT_EQ(alone.err, "roundpipe: error: --train requires --dump-batch (see roundpipe --help)\n");
  EXPECT_FALSE(fs::exists(d / "run"));
  fs::remove_all(d);
}

// With --train the run goes on after the dump, and its first batch is the one dumped alone.
TEST(CliSettings, DumpBatchWithTrainTrainsOnTheSameBatch) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl",
        "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n"
        "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", ", \"seed\": 5"));
  const std::string spec = (d / "spec.json").string();
  ASSERT_EQ(roundpipe("train " + spec + " --dump-batch " + (d / "alone.json").string(), d).code, 0);
  CliRun r = roundpipe("train " + spec + " --dump-batch " + (d / "trained.json").string() + " --train", d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_TRUE(fs::exists(d / "run/final"));
  EXPECT_EQ(slurp(d / "alone.json"), slurp(d / "trained.json"));
  // a resumed run has no step 1: refused, not a fresh run's batch (alone) or no file (with --train)
  for (const char* train : {"", " --train"}) {
    const fs::path dump = d / "resumed.json";
    const CliRun resumed = roundpipe("train " + spec + " --steps 3 --resume " + (d / "run/final").string() +
                                         " --dump-batch " + dump.string() + train,
                                     d);
    EXPECT_EQ(resumed.code, 2) << train << resumed.err;
    EXPECT_NE(resumed.err.find("--dump-batch: only for a fresh run"), std::string::npos) << resumed.err;
    EXPECT_FALSE(fs::exists(dump)) << train;
  }
  fs::remove_all(d);
}

// --dump-batch never writes over the run's inputs (the data, the spec), and an error that
// quotes a huge command-line value is still one bounded line.
TEST(CliSettings, DumpBatchNeverReplacesAnInputAndErrorsStayShort) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const std::string spec = (d / "spec.json").string(), data = slurp(d / "data.jsonl"),
                    spec_text = slurp(spec);
  expect_one_line_error(
      roundpipe("train " + spec + " --dump-batch " + (d / "data.jsonl").string(), d),
      "--dump-batch: '" + (d / "data.jsonl").string() + "' is or lies inside the run's input");
  expect_one_line_error(roundpipe("train " + spec + " --dump-batch " + spec, d),
                        "is or lies inside the run's input");
  EXPECT_EQ(slurp(d / "data.jsonl"), data);
  EXPECT_EQ(slurp(spec), spec_text);
  // a folder there: a usage error that says so ("cannot write the file" did not), nothing is left
  fs::create_directories(d / "dump");
  const CliRun folder = roundpipe("train " + spec + " --dump-batch " + (d / "dump").string(), d);
  EXPECT_EQ(folder.code, 2) << folder.err;
  EXPECT_NE(folder.err.find("--dump-batch " + (d / "dump").string() + ": is a folder"), std::string::npos)
      << folder.err;
  EXPECT_TRUE(fs::is_empty(d / "dump"));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().find("dump.tmp-"), std::string::npos) << e.path();
  // a folder that holds the inputs is a folder too, not a file "inside the run's input"
  const CliRun holder = roundpipe("train " + spec + " --dump-batch " + d.string(), d);
  EXPECT_EQ(holder.code, 2) << holder.err;
  EXPECT_NE(holder.err.find("--dump-batch " + d.string() + ": is a folder"), std::string::npos) << holder.err;
  expect_one_line_error(roundpipe("train " + spec + " --set metrics_jsonl=" + d.string(), d),
                        "key 'metrics_jsonl': '" + d.string() + "' is a folder");
  // an empty name (an unset shell variable) is refused, not taken as no --dump-batch: the run
  // trained and wrote its whole output folder
  const CliRun empty = roundpipe("train " + spec + " --dump-batch ''", d);
  EXPECT_EQ(empty.code, 2) << empty.err;
  EXPECT_NE(empty.err.find("--dump-batch: expected a file name, got \"\""), std::string::npos) << empty.err;
  EXPECT_FALSE(fs::exists(d / "run"));
  const CliRun r = roundpipe("train " + spec + " --set steps=" + std::string(20000, 'x'), d);
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.err.size(), 1200u) << r.err.size();
  EXPECT_NE(r.err.find("key 'steps'"), std::string::npos) << r.err.substr(0, 300);
  fs::remove_all(d);
}

TEST(CliSettings, VersionSaysHowTheBinaryWasBuilt) {
  auto d = tmpdir();
  CliRun r = roundpipe("--version", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("roundpipe ", 0), 0u) << r.out;
  for (const char* field : {"\ncommit: ", "\nbuild type: ", "\nCUDA architectures: ", "\ncuDNN attention: "})
    EXPECT_NE(r.out.find(field), std::string::npos) << field << " in " << r.out;
  const size_t at = r.out.find("commit: ") + 8;
  std::string commit = r.out.substr(at, r.out.find('\n', at) - at);
  // a build with uncommitted edits says so after the hash
  if (commit.size() > 6 && commit.compare(commit.size() - 6, 6, "-dirty") == 0)
    commit.resize(commit.size() - 6);
  EXPECT_TRUE(commit == "unknown" ||
              (commit.size() == 12 && commit.find_first_not_of("0123456789abcdef") == std::string::npos))
      << commit;
  fs::remove_all(d);
}

// The commit --version names is the one the binary was built from: in a git checkout, its HEAD
// once built (the build refreshes it; a configure long ago does not pin it), with "-dirty" when
// tracked files had uncommitted edits.
TEST(CliSettings, VersionNamesTheCommitOfTheBuild) {
  auto d = tmpdir();
  const std::string git = "git -C '" + std::string(RP_SOURCE_DIR) + "' ";
  const bool in_git =
      std::system(
          (git + "rev-parse --show-toplevel > " + (d / "top.txt").string() + " 2>/dev/null").c_str()) == 0;
  std::string top = slurp(d / "top.txt");
  top = top.substr(0, top.find('\n'));
  std::error_code ec;
  if (!in_git || !fs::equivalent(top, RP_SOURCE_DIR, ec))  // a tarball, maybe inside another repository
    GTEST_SKIP() << RP_SOURCE_DIR << " is not a git checkout (or git is missing): the commit is \"unknown\"";
  ASSERT_EQ(std::system((git + "rev-parse --short=12 HEAD > " + (d / "head.txt").string()).c_str()), 0);
  const std::string head = slurp(d / "head.txt").substr(0, 12);
  // tracked files edited since that commit: the build says so ("<head>-dirty")
  ASSERT_EQ(std::system(
                (git + "status --porcelain --untracked-files=no > " + (d / "changes.txt").string()).c_str()),
            0);
  const std::string commit = head + (slurp(d / "changes.txt").empty() ? "" : "-dirty");
  const CliRun r = roundpipe("--version", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\ncommit: " + commit + "\n"), std::string::npos)
      << "the checkout is at " << commit << "; rebuild if it moved or changed since the last build\n"
      << r.out;
  fs::remove_all(d);
}

// A run's output: the optimizer mode first, one line per data file with truncated examples,
// the gradient norm on every progress line although nothing clips.
TEST(CliSettings, ARunSaysItsOptimizerTruncationsAndGradNorm) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  const std::string long_text(80, 'a');
  write(d / "data.jsonl",
        "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n"
        "{\"prompt\": \"Say\", \"completion\": \"" +
            long_text +
            "\"}\n"
            "{\"prompt\": \"Go\", \"completion\": \" on\"}\n");
  write(d / "eval.jsonl", "{\"prompt\": \"Say\", \"completion\": \"" + long_text + "\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r =
      roundpipe("train " + (d / "spec.json").string() + " --eval-data " + (d / "eval.jsonl").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const std::string all = r.out + r.err;
  const size_t opt = all.find(
      "optimizer: AdamW (lr 0.0001, weight decay 0, clipping off), staleness 1 (async, the "
      "default; \"async\": false for a synchronous step)");
  EXPECT_NE(opt, std::string::npos) << all;
  EXPECT_LT(opt, all.find("loading model")) << "before the model loads";
  EXPECT_NE(all.find((d / "data.jsonl").string() + ": 1 of 3 examples truncated to 16 tokens"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find((d / "eval.jsonl").string() + ": 1 of 1 example truncated to 16 tokens"),
            std::string::npos)
      << all;
  // a count of one is singular in every line ("1 sequences" was printed before)
  EXPECT_NE(all.find("eval: 1 sequence of " + (d / "eval.jsonl").string()), std::string::npos) << all;
  for (const char* wrong : {"1 sequences", "1 examples", "1 stages", "1 micro-batches", "1 passes", "(s)"})
    EXPECT_EQ(all.find(wrong), std::string::npos) << wrong << " in " << all;
  for (const char* step : {"step     1/2 |", "step     2/2 |"}) {
    const size_t at = r.out.find(step);
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    const size_t g = line.find("| grad norm ");
    ASSERT_NE(g, std::string::npos) << line;
    EXPECT_GT(std::stod(line.substr(g + 12)), 0) << line;
  }
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "sync", ", \"async\": false"));
  r = roundpipe("train " + (d / "spec.json").string() + " --steps 1", d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE((r.out + r.err).find("synchronous (staleness 0"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// "epochs" through --set (generic): the steps come from the training sequences, every
// progress line shows the epoch (sequences consumed / training sequences), "done" counts the
// derived steps; with the file's "steps" as well it is one line naming the setting, and
// --steps replaces the epochs.
TEST(CliSettings, EpochsFromTheCommandLineDeriveTheStepsAndShowTheEpoch) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl",
        "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was "
        "without form, and void.\"}\n");
  // the spec without "steps": spec_for writes "steps": 2, which this replaces by nothing
  nlohmann::json j = nlohmann::json::parse(spec_for(model, d / "data.jsonl", d / "run"));
  j.erase("steps");
  write(d / "spec.json", j.dump());
  const rp::LoadedModel m = rp::load_model(model.string());
  rp::TokenStreamOptions o;
  o.seq_len = 16;
  o.chat_template = rp::TokenStream::chat_template_for(m, "auto");
  const int64_t n = rp::TokenStream(m, (d / "data.jsonl").string(), o).stats().sequences;  // 2 per step
  ASSERT_GE(n, 3);
  const int64_t steps = (3 * n + 3) / 4;  // ceil(1.5 n / 2)
  CliRun r = roundpipe("train " + (d / "spec.json").string() + " --set epochs=1.5", d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  for (int64_t s = 1; s <= steps; ++s) {
    const std::string head = fmt::format("step {:>5}/{} | loss ", s, steps);
    const size_t at = r.out.find(head);
    ASSERT_NE(at, std::string::npos) << head << "\n" << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find(fmt::format(" | epoch {:.2f} | ", double(2 * s) / double(n))), std::string::npos)
        << line;
  }
  EXPECT_NE(r.out.find(fmt::format("done: {} steps", steps)), std::string::npos) << r.out;
  write(d / "spec2.json", spec_for(model, d / "data.jsonl", d / "run2"));
  expect_one_line_error(roundpipe("train " + (d / "spec2.json").string() + " --set epochs=2", d),
                        "--set epochs=2: keys 'steps' and 'epochs': give one or the other");
  r = roundpipe("train " + (d / "spec.json").string() + " --set epochs=9 --steps 1 --output-dir " +
                    (d / "run3").string(),
                d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("step     1/1 | loss"), std::string::npos) << r.out;
  fs::remove_all(d);
}

}  // namespace
