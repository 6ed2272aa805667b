// convert, merge and export-gguf compare what they will write with the free space of the
// output's file system before writing anything: a disk too small is one line naming the output,
// the bytes needed and the bytes free, and nothing is left on it (the write used to fail at the
// first full block with an error naming the temporary file, already removed). The small disk is a
// tmpfs mounted in a private mount namespace (`unshare -rm`); where this machine allows no such
// namespace the tests skip, saying so.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const std::string kFixtures = RP_FIXTURES_DIR;

struct OnSmallDisk {
  bool mounted = false;
  int code = -1;
  std::string err, left;  ///< the command's stderr; what the small disk held afterwards (ls -A)
};

/// Runs `roundpipe <args>` with a tmpfs of `size` (mount's size=) at d/small, in a mount namespace
/// of its own; `@` in args stands for that folder.
OnSmallDisk on_small_disk(const fs::path& d, const std::string& size, std::string args) {
  const std::string small = (d / "small").string();
  for (size_t at; (at = args.find('@')) != std::string::npos;) args.replace(at, 1, small);
  fs::create_directories(small);
  const std::string script = "mount -t tmpfs -o size=" + size + " tmpfs " + small + " || exit 99; " +
                             std::string(RP_BUILD_DIR) + "/roundpipe " + args + " > /dev/null 2> " +
                             (d / "err.txt").string() + " < /dev/null; echo $? > " + (d / "rc.txt").string() +
                             "; ls -A " + small + " > " + (d / "left.txt").string();
  const int rc =
      std::system(("unshare -rm sh -c '" + script + "' 2> " + (d / "unshare.txt").string()).c_str());
  OnSmallDisk r;
  r.mounted = WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && fs::exists(d / "rc.txt");
  if (!r.mounted) {
    r.err = slurp(d / "unshare.txt");
    return r;
  }
  r.code = std::stoi(slurp(d / "rc.txt"));
  r.err = slurp(d / "err.txt");
  r.left = slurp(d / "left.txt");
  for (const char* f : {"rc.txt", "err.txt", "left.txt", "unshare.txt"}) fs::remove(d / f);
  return r;
}

TEST(CliDiskSpace, ADiskTooSmallIsOneLineBeforeAnythingIsWritten) {
  auto d = tmpdir();
  const std::string gguf = kFixtures + "/gguf_moe/tiny_qwen3_moe.f32.gguf";
  const std::string hf = tiny_model(d).string();  // with its tokenizer, as export-gguf needs
  struct Case {
    std::string args, output, what;
  };
  const Case cases[] = {
      {"convert " + gguf + " @/out --dtype f32", "/out", "the model folder"},
      {"merge " + kFixtures + "/peft/tied_untie/adapter @/out --dtype f32", "/out", "the model folder"},
      {"export-gguf " + hf + " @/m.gguf", "/m.gguf", "the GGUF file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const OnSmallDisk r = on_small_disk(d, "64k", c.args);
    if (!r.mounted) GTEST_SKIP() << "no private mount namespace with a tmpfs here (unshare -rm): " << r.err;
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(
        r.err.rfind(
            "roundpipe: error: " + (d / "small").string() + c.output + ": " + c.what + " needs about ", 0),
        0u)
        << r.err;
    EXPECT_NE(r.err.find("the file system has 64.0 KiB free; free some space or write it to another disk "
                         "(nothing was written)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.left, "") << "left on the small disk:\n" << r.left;
  }
  // where the output fits, the same commands write it
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const OnSmallDisk r = on_small_disk(d, "64m", c.args);
    ASSERT_TRUE(r.mounted) << r.err;
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.left, c.output.substr(1) + "\n") << r.err;
  }
}

}  // namespace
