// `roundpipe export-gguf`: writes a GGUF our reader loads, refuses to replace an existing file
// without --force (and any file it did not write even with it), and reports errors on one line.
#include <gtest/gtest.h>

#include "roundpipe/checkpoint.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

TEST(CliExportGguf, WritesAGgufAndReplacesOnlyItsOwnWithForce) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  const std::string out = (d / "tiny.gguf").string();
  CliRun r = roundpipe("export-gguf " + model.string() + " " + out + " --type q8_0", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + out), std::string::npos) << r.out;
  const rp::LoadedModel a = rp::load_model(model.string()), b = rp::load_model(out);
  EXPECT_EQ(b.config.hidden_size, a.config.hidden_size);
  EXPECT_EQ(b.tensors.size(), a.tensors.size());
  expect_one_line_error(roundpipe("export-gguf " + model.string() + " " + out, d), "exists; pass --force");
  EXPECT_EQ(roundpipe("export-gguf " + model.string() + " " + out + " --force", d).code, 0);
  write(d / "notes.gguf", "mine");
  expect_one_line_error(
      roundpipe("export-gguf " + model.string() + " " + (d / "notes.gguf").string() + " --force", d),
      "was not written by roundpipe export-gguf");
  EXPECT_EQ(roundpipe("export-gguf " + model.string() + " " + out + " --type q4_k", d).code, 2);
  expect_one_line_error(
      roundpipe("export-gguf " + (d / "missing").string() + " " + (d / "m.gguf").string(), d),
      "not a folder");
  fs::remove_all(d);
}

}  // namespace
