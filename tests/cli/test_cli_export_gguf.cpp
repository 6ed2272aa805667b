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

// What a killed export left (OUT.tmp-<pid> and its owner marker, the writer gone) is removed by
// the next export to the same file and said so; a look-alike nobody marked is left alone.
TEST(CliExportGguf, AKilledExportsLeftoverIsCleanedByTheNextOne) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  write(d / "m.gguf.tmp-999999999", "half");
  mark(d / "m.gguf.tmp-999999999", "tmp", "m.gguf", "999999999");
  write(d / "m.gguf.tmp-999999998", "mine");
  const CliRun r = roundpipe("export-gguf " + model.string() + " " + (d / "m.gguf").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("removed " + (d / "m.gguf.tmp-999999999").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("left alone " + (d / "m.gguf.tmp-999999998").string()), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "m.gguf.tmp-999999999"));
  EXPECT_FALSE(fs::exists(d / "m.gguf.tmp-999999999.roundpipe-owner"));
  EXPECT_EQ(slurp(d / "m.gguf.tmp-999999998"), "mine");
  EXPECT_TRUE(fs::exists(d / "m.gguf"));
  fs::remove_all(d);
}

// A LoRA run's adapter folder whose base moved away: the error names --base, which export-gguf
// takes as generate and merge do, and the export then equals the one from the base's old place.
TEST(CliExportGguf, AnAdapterWhoseBaseMovedTakesItFromBase) {
  TinyRun t = tiny_run("{\"text\": \"hello world, hello world\"}\n", ", \"lora\": {\"r\": 2}");
  ASSERT_EQ(roundpipe("train " + t.spec.string(), t.d).code, 0);
  const std::string adapter = (t.d / "run/final").string();
  ASSERT_TRUE(fs::exists(adapter + "/adapter_config.json"));
  const std::string before = (t.d / "before.gguf").string(), after = (t.d / "after.gguf").string();
  ASSERT_EQ(roundpipe("export-gguf " + adapter + " " + before, t.d).code, 0);
  const fs::path moved = t.d / "moved-base";
  fs::rename(t.model, moved);
  expect_one_line_error(
      roundpipe("export-gguf " + adapter + " " + after, t.d),
      "pass the base model explicitly (--base of roundpipe generate / merge / export-gguf)");
  EXPECT_FALSE(fs::exists(after));
  const CliRun r = roundpipe("export-gguf " + adapter + " " + after + " --base " + moved.string(), t.d);
  ASSERT_EQ(r.code, 0) << r.err;
  const rp::LoadedModel a = rp::load_model(before), b = rp::load_model(after);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, tensor] : a.tensors) EXPECT_EQ(b.tensors.at(name).data, tensor.data) << name;
  // the base is an input: the GGUF is not written inside it, and --base needs an adapter
  expect_one_line_error(
      roundpipe("export-gguf " + adapter + " " + (moved / "x.gguf").string() + " --base " + moved.string(),
                t.d),
      "is or lies inside the input");
  expect_one_line_error(roundpipe("export-gguf " + moved.string() + " " + (t.d / "m.gguf").string() +
                                      " --base " + moved.string(),
                                  t.d),
                        "--base: only for a LoRA adapter folder");
  fs::remove_all(t.d);
}

}  // namespace
