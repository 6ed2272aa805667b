// The end of `roundpipe train`: after the "done:" line it names what the run left that exists (the
// model in final/, its optimizer state and the --resume that goes on from it, the TensorBoard logs) and the
// `roundpipe generate` command that tries the model, which runs as printed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

/// The line of `out` that starts with `start` ("" when none does).
std::string line_starting(const std::string& out, const std::string& start) {
  const size_t at = out.rfind("\n" + start);
  if (at == std::string::npos) return "";
  return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

TEST(CliSummary, NamesTheModelItsStateTheLogsAndTheCommandThatTriesIt) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  write(d / "data.jsonl", "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n");
  // a prompt with a quote: the command quotes it for the shell
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", ", \"sample_prompt\": \"Say 'hi'\""));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const std::string run = (d / "run").string();
  EXPECT_EQ(line_starting(r.out, "model in "), "model in " + run + "/final, its optimizer state in " + run +
                                                   "/state/final (go on with --resume " + run +
                                                   "/final), TensorBoard logs in " + run + "/tensorboard")
      << r.out;
  const std::string try_it = line_starting(r.out, "try it: ");
  // the program as typed from the working folder: build/roundpipe below it, else its absolute path
  const size_t generate = try_it.find(" generate ");
  ASSERT_NE(generate, std::string::npos) << r.out;
  const std::string program = try_it.substr(8, generate - 8);
  std::error_code ec;
  EXPECT_TRUE(fs::equivalent(program, fs::path(RP_BUILD_DIR) / "roundpipe", ec)) << program;
  EXPECT_EQ(try_it.substr(generate), " generate " + run + "/final --chat 'Say '\\''hi'\\'''") << r.out;
  EXPECT_EQ(r.out.substr(r.out.size() - try_it.size() - 1), try_it + "\n") << "not the last line: " << r.out;
  // the command runs as printed
  const std::string cmd = try_it.substr(8) + " --max-tokens 4 > " + (d / "gen.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << ": " << slurp(d / "gen.txt");

  // without TensorBoard logs and a sample prompt: neither is named, the prompt is a placeholder
  write(d / "quiet.json", spec_for(model, d / "data.jsonl", d / "quiet", ", \"tensorboard\": false"));
  r = roundpipe("train " + (d / "quiet.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const std::string quiet = (d / "quiet").string();
  EXPECT_EQ(line_starting(r.out, "model in "), "model in " + quiet + "/final, its optimizer state in " +
                                                   quiet + "/state/final (go on with --resume " + quiet +
                                                   "/final)")
      << r.out;
  EXPECT_NE(line_starting(r.out, "try it: ").find(" generate " + quiet + "/final --chat \"...\""),
            std::string::npos)
      << r.out;
  // a folder the shell would split: the --resume it names is quoted to paste as it is
  write(d / "spaced.json", spec_for(model, d / "data.jsonl", d / "my run", ", \"tensorboard\": false"));
  r = roundpipe("train " + (d / "spaced.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const std::string spaced = (d / "my run").string();
  EXPECT_NE(line_starting(r.out, "model in ").find("(go on with --resume '" + spaced + "/final')"),
            std::string::npos)
      << r.out;
  fs::remove_all(d);
}

// Run from the folder that holds the binary (build/ itself), the command is ./roundpipe: a bare
// "roundpipe" would be looked up in $PATH, where it is not, and not run as printed.
TEST(CliSummary, TheCommandThatTriesItRunsFromTheBinarysOwnFolder) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  write(d / "data.jsonl", "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run", ", \"tensorboard\": false"));
  const CliRun r = roundpipe_in(RP_BUILD_DIR, "train " + (d / "spec.json").string(), d, "PATH=/usr/bin:/bin");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const std::string try_it = line_starting(r.out, "try it: ");
  EXPECT_EQ(try_it, "try it: ./roundpipe generate " + (d / "run").string() + "/final --chat \"...\"")
      << r.out;
  // the command runs as printed, there, with a $PATH that does not hold build/
  const std::string cmd = "cd " + std::string(RP_BUILD_DIR) + " && PATH=/usr/bin:/bin " + try_it.substr(8) +
                          " --max-tokens 4 > " + (d / "gen.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << ": " << slurp(d / "gen.txt");
  fs::remove_all(d);
}

}  // namespace
