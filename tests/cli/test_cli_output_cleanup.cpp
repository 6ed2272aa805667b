// `roundpipe train` ending before its first step takes back the folders it made for output_dir
// (only those, only while empty): after an error, and after a stop signal while it loads.
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

// SIGINT while the model loads (its config.json a FIFO nobody writes, so loading waits): the run
// exits 130 and takes back the output folders it made; a folder of the user's above them stays.
TEST(CliOutputCleanup, AStopSignalWhileLoadingTakesBackTheFoldersTheRunMade) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  fs::remove(model / "config.json");
  ASSERT_EQ(::mkfifo((model / "config.json").c_str(), 0600), 0);
  fs::create_directories(d / "mine");
  const fs::path out = d / "mine" / "runs" / "exp";
  write(d / "spec.json", spec_for(model, d / "data.jsonl", out));
  const std::string bin = std::string(RP_BUILD_DIR) + "/roundpipe";
  const std::string spec = (d / "spec.json").string(), log = (d / "err.txt").string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(bin.c_str(), bin.c_str(), "train", spec.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // the run makes its output folders before it loads the model
  for (int i = 0; i < 400 && !fs::exists(out); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool made = fs::is_directory(out);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // now waiting on the FIFO
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string err = slurp(d / "err.txt");
  EXPECT_TRUE(made) << err;
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 130) << err;
  EXPECT_NE(err.find("stop signal before the first step"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(d / "mine" / "runs")) << "the folders the run made go, parents included";
  EXPECT_TRUE(fs::is_directory(d / "mine")) << "the user's folder stays";
  fs::remove_all(d);
}

}  // namespace
