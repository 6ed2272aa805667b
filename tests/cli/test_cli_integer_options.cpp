// The integer options of `roundpipe`: a value that is no integer, or one out of range, gives
// one short line naming the option and what it expects (CLI11's NonNegativeNumber used to print
// a range up to 1.8e308 in 309 digits, and its Range checks "abc not in range").
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tests/cli/cli_util.hpp"

namespace {
using namespace rp::clitest;

TEST(CliIntegerOptions, NoIntegerOrOutOfRangeIsOneShortLineNamingTheOption) {
  auto d = tmpdir();
  write(d / "t.json", "{}");
  const std::string t = (d / "t.json").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate m --context abc",
       "--context: expected an integer >= 0 (0: the model's max positions), got abc"},
      {"generate m --context -1", "--context: expected an integer >= 0"},
      {"generate m --context 2.5", "--context: expected an integer >= 0"},
      {"generate m --top-k abc", "--top-k: expected an integer >= 0 (0: all), got abc"},
      {"generate m --max-tokens abc", "--max-tokens: expected an integer from 1 to 1048576, got abc"},
      {"generate m --max-tokens 0", "--max-tokens: expected an integer from 1 to 1048576, got 0"},
      {"generate m --seed abc", "--seed: expected an integer >= 0, got abc"},
      {"train x.json --steps abc", "--steps: expected an integer from 1 to 1099511627776, got abc"},
      {"train x.json --workers two", "--workers: expected an integer from 1 to 1024, got two"},
      {"trace " + t + " --skip-passes abc", "--skip-passes: expected an integer >= 0, got abc"},
      {"plan --model m --mlp-chunk -5", "--mlp-chunk: expected an integer >= 0 (0: 8192), got -5"},
  };
  for (const auto& [args, want] : cases) {
    CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: "), 0u) << args << ": " << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_LT(r.err.size(), 200u) << args << ": " << r.err;
  }
  fs::remove_all(d);
}

// The real and text options of `generate`: a NaN (which CLI::Range let through, so --temperature nan
// sampled from NaN probabilities) or a value out of range is one line naming the option.
TEST(CliIntegerOptions, NaNOrOutOfRangeRealIsOneShortLineNamingTheOption) {
  auto d = tmpdir();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate m --temperature nan", "--temperature: expected a number from 0 to 100, got nan"},
      {"generate m --temperature -1", "--temperature: expected a number from 0 to 100, got -1"},
      {"generate m --temperature 1x", "--temperature: expected a number from 0 to 100, got 1x"},
      {"generate m --top-p nan", "--top-p: expected a number from 1e-06 to 1, got nan"},
      {"generate m --top-p 2", "--top-p: expected a number from 1e-06 to 1, got 2"},
      // text flags: a stray byte met the tokenizer ("byte 0xff has no token in the vocab", exit 1)
      {R"x(generate m --prompt "$(printf 'ab\377')")x",
       "--prompt: not UTF-8: byte 0xff at offset 2; expected UTF-8 text"},
      {R"x(generate m --chat hi --system "$(printf '\303')")x", "--system: not UTF-8: byte 0xc3 at offset 0"},
  };
  for (const auto& [args, want] : cases) {
    CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  fs::remove_all(d);
}

}  // namespace
