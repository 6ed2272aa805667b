// `roundpipe train` ending before its first step takes back the folders it made for output_dir
// (only those, only while empty): after an error, and after a stop signal (SIGINT, SIGTERM,
// SIGHUP, SIGUSR1) while it loads. A second signal during the final save takes back the
// half-written checkpoint folders. A stop signal during `convert` or `export-gguf` takes back
// their half-written output.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

// output_dir through "..": the folder the path passes through is made too and must go with the
// rest (it stayed: the folders taken back were those of the normalised path)
TEST(CliOutputCleanup, AFailedRunTakesBackAFolderMadeOnTheWayThroughDotDot) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"fine\"}\n{\"text\": \n");  // its second line is no JSON
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "new1/../new2"));
  fs::create_directories(d / "old");
  const CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_FALSE(fs::exists(d / "new1")) << r.err;
  EXPECT_FALSE(fs::exists(d / "new2")) << r.err;
  // an empty folder of the user's reached through ".." stays
  const CliRun o =
      roundpipe("train " + (d / "spec.json").string() + " --output-dir " + (d / "new3/../old").string(), d);
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_FALSE(fs::exists(d / "new3")) << o.err;
  EXPECT_TRUE(fs::is_directory(d / "old"));
  fs::remove_all(d);
}

/// Runs `roundpipe train` on a spec whose `model`'s config.json is a FIFO whose writer never writes
/// (so loading waits), its output folder d/mine/runs/exp; once the folder is made, sends `sig` (with SIGHUP
/// ignored from the start when `ignore_hup`, as nohup does). Returns whether the folder was made,
/// whether the run still ran after `sig` (20 s later, or 300 ms for an ignored SIGHUP; then it is
/// stopped with SIGINT), its wait status and its output.
struct LoadingStop {
  bool made = false, survived = false;
  int status = 0;
  std::string err;
};
LoadingStop stop_while_loading(const fs::path& d, const fs::path& model, int sig, bool ignore_hup) {
  const fs::path out = d / "mine" / "runs" / "exp";
  write(d / "spec.json", spec_for(model, d / "data.jsonl", out));
  const std::string bin = std::string(RP_BUILD_DIR) + "/roundpipe";
  const std::string spec = (d / "spec.json").string(), log = (d / "err.txt").string();
  LoadingStop r;
  const pid_t pid = ::fork();
  if (pid < 0) return r;
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (ignore_hup) ::signal(SIGHUP, SIG_IGN);
    ::execl(bin.c_str(), bin.c_str(), "train", spec.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // the run makes its output folders before it loads the model
  for (int i = 0; i < 400 && !fs::exists(out); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  r.made = fs::is_directory(out);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // now waiting on the FIFO
  ::kill(pid, sig);
  // a run the signal stops may take a while on a loaded machine; one that ignores it has 300 ms
  // to show it keeps running
  const auto wait = std::chrono::milliseconds(sig == SIGHUP && ignore_hup ? 300 : 20000);
  const auto until = std::chrono::steady_clock::now() + wait;
  while ((r.survived = ::waitpid(pid, &r.status, WNOHANG) == 0) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (r.survived) {
    ::kill(pid, SIGINT);
    ::waitpid(pid, &r.status, 0);
  }
  r.err = slurp(d / "err.txt");
  return r;
}

// SIGINT while the model loads, and SIGHUP (the terminal or SSH session closing) alike: the run
// exits 130 and takes back the output folders it made; a folder of the user's above them stays.
// A run started with SIGHUP ignored (nohup) keeps ignoring it.
TEST(CliOutputCleanup, AStopSignalWhileLoadingTakesBackTheFoldersTheRunMade) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  fs::remove(model / "config.json");
  ASSERT_EQ(::mkfifo((model / "config.json").c_str(), 0600), 0);
  // the writer: a pipe that no program writes to is refused at once instead of waited on
  const int writer = ::open((model / "config.json").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(writer, 0);
  fs::create_directories(d / "mine");
  for (const auto& [sig, ignore_hup] : {std::pair{SIGINT, false}, {SIGHUP, false}, {SIGHUP, true}}) {
    SCOPED_TRACE(::testing::Message() << "signal " << sig << (ignore_hup ? " (SIGHUP ignored)" : ""));
    const LoadingStop r = stop_while_loading(d, model, sig, ignore_hup);
    EXPECT_TRUE(r.made) << r.err;
    EXPECT_EQ(r.survived, ignore_hup) << r.err;
    ASSERT_TRUE(WIFEXITED(r.status)) << r.err;
    EXPECT_EQ(WEXITSTATUS(r.status), 130) << r.err;
    EXPECT_NE(r.err.find("stop signal before the first step"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d / "mine" / "runs")) << "the folders the run made go, parents included";
    EXPECT_TRUE(fs::is_directory(d / "mine")) << "the user's folder stays";
  }
  ::close(writer);
  fs::remove_all(d);
}

// Ctrl-C twice while final/ is written (the default job's 270 MB take over a second to save)
// exits at once and leaves neither final.tmp-<pid>/ nor state/final.tmp-<pid>/ (nor their
// owner markers) behind: they used to stay until a later run into the folder. Nor the state/
// folder that save made, left empty.
TEST(CliOutputCleanup, ASecondSignalDuringTheFinalSaveTakesBackItsFolders) {
  if (const std::string why = default_assets_missing(); !why.empty()) GTEST_SKIP() << why;
  const fs::path root = RP_SOURCE_DIR;
  auto d = tmpdir();
  const fs::path run = d / "run";
  const std::string cmd =
      "cd " + root.string() + " && (timeout --foreground -s KILL 300 " + std::string(RP_BUILD_DIR) +
      "/roundpipe train examples/specs/default.json --steps 1 --set save_dtype=f32 --output-dir " +
      run.string() + " > " + (d / "out.txt").string() + " 2> " + (d / "err.txt").string() +
      // the first signal once the weights' temporary exists, the second (a second later at the
      // least) the moment the state's does: the state (the optimizer's 2 GB) is then being written
      " < /dev/null & pid=$!; for i in $(seq 4000); do ls -d " + run.string() +
      "/final.tmp-* > /dev/null 2>&1 && break; sleep 0.02; done; kill -INT $pid; sleep 1.02; "
      "for i in $(seq 20000); do ls -d " +
      run.string() +
      "/state/final.tmp-* > /dev/null 2>&1 && break; kill -0 $pid 2> /dev/null || break; "
      "sleep 0.005; done; kill -INT $pid; wait $pid; echo $? > " +
      (d / "rc.txt").string() + ")";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string err = slurp(d / "err.txt");
  if (err.find("interrupted twice") == std::string::npos)
    GTEST_SKIP() << "the final save ended before the second signal\n" << err;
  EXPECT_EQ(slurp(d / "rc.txt"), "130\n") << err;
  for (const fs::path& dir : {run, run / "state"})
    if (fs::is_directory(dir)) {
      for (const auto& e : fs::directory_iterator(dir))
        EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path() << "\n" << err;
    }
  // the run's first save made state/: it goes when nothing finished went into it
  EXPECT_TRUE(!fs::exists(run / "state") || !fs::is_empty(run / "state")) << "an empty state/ was left\n"
                                                                          << err;
  fs::remove_all(d);
}

// Runs `roundpipe <args>` in the background, sends `sig` as soon as `ready` (a shell glob)
// names something, and waits: the exit status as the shell reports it ("130\n" for exit 130), its
// stderr, and whether the signal went before the command had ended.
struct Interrupted {
  std::string rc, err;
  bool sent = false;
};
Interrupted interrupt_when(const fs::path& d, const std::string& args, const std::string& ready, int sig) {
  const fs::path root = RP_SOURCE_DIR;
  const std::string cmd =
      "cd " + root.string() + " && (timeout --foreground -s KILL 300 " + std::string(RP_BUILD_DIR) +
      "/roundpipe " + args + " > " + (d / "out.txt").string() + " 2> " + (d / "err.txt").string() +
      " < /dev/null & pid=$!; for i in $(seq 4000); do ls -d " + ready +
      " > /dev/null 2>&1 && break; sleep 0.01; done; kill -" + std::to_string(sig) + " $pid && touch " +
      (d / "sent").string() + "; wait $pid; echo $? > " + (d / "rc.txt").string() + ")";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  Interrupted r{slurp(d / "rc.txt"), slurp(d / "err.txt"), fs::exists(d / "sent")};
  for (const char* f : {"out.txt", "err.txt", "rc.txt", "sent"}) fs::remove(d / f);
  return r;
}

// A stop signal while convert or export-gguf writes ends it with 130 and one line, and takes back
// the half-written output (out.tmp-<pid>/ and its owner marker, out.gguf.tmp-<pid>): the default
// action used to leave them until the next writer into the same place. The user's files stay.
TEST(CliOutputCleanup, AStopSignalDuringConvertOrExportTakesBackTheUnfinishedOutput) {
  if (const std::string why = default_assets_missing(); !why.empty()) GTEST_SKIP() << why;
  const fs::path root = RP_SOURCE_DIR;
  auto d = tmpdir();
  write(d / "mine.txt", "the user's");
  const std::string gguf = (root / "assets/SmolLM2-135M-Instruct.Q4_1.gguf").string();
  const auto only_mine = [&](const std::string& err) {
    for (const auto& e : fs::directory_iterator(d))
      EXPECT_TRUE(e.path().filename() == "mine.txt" || e.path().filename() == "hf")
          << e.path() << " was left behind\n"
          << err;
    EXPECT_EQ(slurp(d / "mine.txt"), "the user's");
  };
  int ran = 0;
  for (const int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    const Interrupted c = interrupt_when(d, "convert " + gguf + " " + (d / "out").string() + " --dtype f32",
                                         (d / "out.tmp-*").string() + "/model*.safetensors", sig);
    if (!c.sent || c.rc != "130\n") continue;  // convert ended before the signal
    ++ran;
    EXPECT_NE(c.err.find("roundpipe: interrupted: the unfinished output was removed"), std::string::npos)
        << c.err;
    EXPECT_FALSE(fs::exists(d / "out")) << c.err;
    only_mine(c.err);
  }
  const CliRun hf = roundpipe("convert " + gguf + " " + (d / "hf").string() + " --dtype f32", d);
  ASSERT_EQ(hf.code, 0) << hf.err;
  const Interrupted e =
      interrupt_when(d, "export-gguf " + (d / "hf").string() + " " + (d / "x.gguf").string(),
                     (d / "x.gguf.tmp-*").string(), SIGINT);
  if (e.sent && e.rc == "130\n") {
    ++ran;
    // a signal that came once the file was in place says so, and the file stays
    const bool whole =
        e.err.find("roundpipe: interrupted: the output had already been written in full and is kept") !=
        std::string::npos;
    EXPECT_TRUE(whole ||
                e.err.find("roundpipe: interrupted: the unfinished output was removed") != std::string::npos)
        << e.err;
    EXPECT_EQ(fs::exists(d / "x.gguf"), whole) << e.err;
    fs::remove(d / "x.gguf");
    only_mine(e.err);
  }
  // before anything is written: nothing changed, and it says so
  const Interrupted early = interrupt_when(d, "convert " + gguf + " " + (d / "hf").string() + " --dtype bf16",
                                           (d / "hf").string(), SIGTERM);
  if (early.sent && early.rc == "130\n") {
    EXPECT_NE(early.err.find("roundpipe: interrupted: "), std::string::npos) << early.err;
    only_mine(early.err);
  }
  if (ran == 0) GTEST_SKIP() << "every command ended before its signal";
  fs::remove_all(d);
}

}  // namespace
