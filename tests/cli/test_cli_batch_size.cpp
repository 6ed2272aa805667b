// A batch shape no machine can hold (a sequence of 2^37 tokens, a pass of 2^34 sequences) is
// refused in one line naming its key, before the data is read or a buffer of that size is
// allocated: no std::bad_alloc, no advice for a run that can never start, no output folder.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

TEST(CliBatchSize, AShapeOverTheMachineIsOneLineNamingItsKey) {
  auto d = tmpdir();
  auto model = tiny_model(d);
  write(d / "data.jsonl", "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  const std::string train = "train " + (d / "spec.json").string();
  for (const auto& [set, key] :
       {std::pair<std::string, std::string>{" --set seq_len=137438953472", "seq_len"},
        {" --set sequences_per_step=17179869184", "sequences_per_step"}}) {
    const CliRun r = roundpipe(train + set, d);
    expect_one_line_error(r, "key '" + key + "': ");
    EXPECT_NE(r.err.find("of host memory"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("loading data"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("host memory: this run needs"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(d / "run")) << set;
    // --dump-batch alone builds the same batch
    expect_one_line_error(roundpipe(train + set + " --dump-batch " + (d / "b.json").string(), d),
                          "key '" + key + "': ");
    EXPECT_FALSE(fs::exists(d / "b.json")) << set;
  }
  fs::remove_all(d);
}

}  // namespace
