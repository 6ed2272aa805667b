// `roundpipe merge ADAPTER_DIR OUT_DIR`: a PEFT adapter folder made by the real peft library
// (tests/fixtures/peft) folded into its base model, the base found through the adapter's
// base_model_name_or_path; errors are one line naming the file and key.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "formats/checkpoint.hpp"
#include "formats/safetensors.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const std::string kPeft = std::string(RP_FIXTURES_DIR) + "/peft/";

TEST(CliMerge, WritesPeftsMergeAsAPlainFolderUntiedWhenPeftUntied) {
  auto d = tmpdir();
  const CliRun r =
      roundpipe("merge " + kPeft + "tied_untie/adapter " + (d / "out").string() + " --dtype f32", d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("merged"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "out/adapter_config.json"));
  const rp::LoadedModel m = rp::load_model((d / "out").string());
  EXPECT_FALSE(m.config.tie_word_embeddings);  // peft trained lm_head apart from the tied embedding
  rp::SafetensorsFile peft(kPeft + "tied_untie/merged.safetensors");
  for (const auto& e : peft.entries()) {
    const rp::HostTensor ref = peft.read_f32(e);
    const rp::HostTensor& got = m.tensors.at(e.name);
    ASSERT_EQ(got.shape, ref.shape) << e.name;
    double diff = 0;
    for (size_t i = 0; i < ref.data.size(); ++i)
      diff = std::max(diff, double(std::abs(got.data[i] - ref.data[i])));
    EXPECT_LE(diff, 1e-6) << e.name;
  }
  fs::remove_all(d);
}

TEST(CliMerge, ErrorsAreOneLine) {
  auto d = tmpdir();
  expect_one_line_error(roundpipe("merge " + (d / "none").string() + " " + (d / "out").string(), d),
                        "not a folder");
  expect_one_line_error(roundpipe("merge " + kPeft + "base_tied " + (d / "out").string(), d),
                        "base_tied/adapter_config.json: missing (not a PEFT adapter folder)");
  expect_one_line_error(roundpipe("merge " + kPeft + "untied_all/adapter " + (d / "out").string() +
                                      " --base " + (d / "nobase").string(),
                                  d),
                        "nobase: no such file or directory");
  EXPECT_FALSE(fs::exists(d / "out"));
  fs::remove_all(d);
}

// An empty --base (an unset shell variable) is refused, not taken as no --base, which would
// merge onto whatever base the adapter's config names.
TEST(CliMerge, AnEmptyBaseIsRefusedNotTakenAsLeftOut) {
  auto d = tmpdir();
  const std::string adapter = kPeft + "untied_all/adapter";
  for (const std::string& cmd : {"merge " + adapter + " " + (d / "out").string(),
                                 "export-gguf " + adapter + " " + (d / "out.gguf").string(),
                                 "generate " + adapter + " --prompt hi --max-tokens 1"}) {
    SCOPED_TRACE(cmd);
    const CliRun r = roundpipe(cmd + " --base ''", d);
    EXPECT_EQ(r.code, 2) << r.err;  // a usage error, as every bad option
    EXPECT_EQ(r.err.find("roundpipe: error: --base: expected a path, got an empty one (leave --base out for "
                         "the adapter's base_model_name_or_path)"),
              0u)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // "--base=" with nothing after it: CLI11 took the next argument as the base (here the adapter)
  for (const std::string& args : {"merge --base= " + adapter + " " + adapter + " " + (d / "out").string(),
                                  "generate --base= " + adapter + " --prompt hi"}) {
    SCOPED_TRACE(args);
    const CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: --base=: nothing after '=' (an unset shell variable?): give a "
                         "value or leave --base out"),
              0u)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(fs::exists(d / "out"));
  EXPECT_FALSE(fs::exists(d / "out.gguf"));
  fs::remove_all(d);
}

// A folder's files and their sizes: "unchanged" is checked against this.
std::map<std::string, uintmax_t> listing(const fs::path& dir) {
  std::map<std::string, uintmax_t> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? e.file_size() : 0;
  return out;
}

// An output folder that is an input, lies inside one or holds user files is refused before
// anything is written: replacing it atomically would delete what it holds.
TEST(CliMerge, RefusesAnOutputThatWouldReplaceAnInputOrUserFiles) {
  auto d = tmpdir();
  fs::copy(kPeft + "untied_all/adapter", d / "adapter");
  fs::copy(kPeft + "base_untied", d / "base");
  const std::string adapter = (d / "adapter").string(), base = " --base " + (d / "base").string();
  const auto adapter_files = listing(d / "adapter"), base_files = listing(d / "base");
  expect_one_line_error(roundpipe("merge " + adapter + " " + adapter + base, d),
                        "is, contains or lies inside the input");
  expect_one_line_error(roundpipe("merge " + adapter + " " + adapter + "/ " + base, d),
                        "lies inside the input");
  expect_one_line_error(roundpipe("merge " + adapter + " " + (d / "adapter/sub").string() + base, d),
                        "the input");
  expect_one_line_error(roundpipe("merge " + adapter + " " + (d / "base").string() + base, d), "the input");
  expect_one_line_error(roundpipe("merge " + adapter + " " + d.string() + base, d), "contains");
  fs::create_directories(d / "notes");
  write(d / "notes/notes.txt", "mine");
  expect_one_line_error(roundpipe("merge " + adapter + " " + (d / "notes").string() + base, d),
                        "holds a file roundpipe did not write there (notes.txt)");
  EXPECT_EQ(listing(d / "adapter"), adapter_files);
  EXPECT_EQ(listing(d / "base"), base_files);
  EXPECT_TRUE(fs::exists(d / "notes/notes.txt"));
  EXPECT_FALSE(fs::exists(d / "adapter/sub"));
  // an earlier merge's output is replaced, as before (its roundpipe_manifest.json lists it all)
  ASSERT_EQ(roundpipe("merge " + adapter + " " + (d / "out").string() + base, d).code, 0);
  EXPECT_TRUE(fs::exists(d / "out" / rp::kModelManifestFile));
  const CliRun again = roundpipe("merge " + adapter + " " + (d / "out").string() + base, d);
  EXPECT_EQ(again.code, 0) << again.err;
  // ... but not once it holds anything the merge did not write
  fs::create_directories(d / "out/src");
  write(d / "out/src/main.c", "int main() {}");
  expect_one_line_error(roundpipe("merge " + adapter + " " + (d / "out").string() + base, d),
                        "holds a folder roundpipe did not write there (src/)");
  EXPECT_TRUE(fs::exists(d / "out/src/main.c"));
  fs::remove_all(d);
}

// convert checks its output folder the same way.
TEST(CliMerge, ConvertRefusesAnOutputThatWouldReplaceItsInputOrUserFiles) {
  auto d = tmpdir();
  fs::create_directories(d / "m");
  fs::copy(std::string(RP_FIXTURES_DIR) + "/gguf_moe/tiny_qwen3_moe.f32.gguf", d / "m/model.gguf");
  write(d / "m/notes.txt", "mine");
  expect_one_line_error(roundpipe("convert " + (d / "m/model.gguf").string() + " " + (d / "m").string(), d),
                        "contains");
  expect_one_line_error(
      roundpipe("convert " + (d / "m/model.gguf").string() + " " + (d / "m/model.gguf").string(), d),
      "the input");
  fs::create_directories(d / "notes");
  write(d / "notes/notes.txt", "mine");
  expect_one_line_error(
      roundpipe("convert " + (d / "m/model.gguf").string() + " " + (d / "notes").string(), d),
      "notes: output holds a file roundpipe did not write there (notes.txt)");
  write(d / "file", "mine");
  expect_one_line_error(
      roundpipe("convert " + (d / "m/model.gguf").string() + " " + (d / "file").string(), d),
      "file: output exists and is not a folder; expected a folder");
  const CliRun help = roundpipe("convert --help", d);
  EXPECT_NE(help.out.find("input output"), std::string::npos) << help.out;  // the name the errors use
  EXPECT_TRUE(fs::exists(d / "m/model.gguf"));
  EXPECT_TRUE(fs::exists(d / "m/notes.txt"));
  EXPECT_TRUE(fs::exists(d / "notes/notes.txt"));
  fs::remove_all(d);
}

// A model folder is no manifest: convert into a folder that holds a config.json (or any
// *.safetensors) and the user's other files is refused, and nothing in it changes.
TEST(CliMerge, ConvertNeverReplacesAFolderWithTheUsersFiles) {
  auto d = tmpdir();
  const std::string gguf = std::string(RP_FIXTURES_DIR) + "/gguf_moe/tiny_qwen3_moe.f32.gguf";
  fs::create_directories(d / "p/src");
  write(d / "p/config.json", "{}");
  write(d / "p/src/main.c", "int main() {}");
  const auto before = listing(d / "p");
  expect_one_line_error(roundpipe("convert " + gguf + " " + (d / "p").string(), d), "config.json, src");
  EXPECT_EQ(listing(d / "p"), before);
  fs::remove(d / "p/config.json");
  write(d / "p/model.safetensors", "x");
  expect_one_line_error(roundpipe("convert " + gguf + " " + (d / "p").string(), d), "model.safetensors, src");
  EXPECT_TRUE(fs::exists(d / "p/src/main.c"));
  // its own earlier output it replaces; an empty folder it fills
  fs::create_directories(d / "empty");
  ASSERT_EQ(roundpipe("convert " + gguf + " " + (d / "empty").string(), d).code, 0);
  const CliRun again = roundpipe("convert " + gguf + " " + (d / "empty").string(), d);
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(fs::exists(d / "empty/config.json"));
  fs::remove_all(d);
}

// A convert killed (kill -9) while writing OUT leaves OUT.tmp-<pid>, and one killed during the
// swap OUT.old-<pid> (the previous output, moved aside) and maybe no OUT; the next convert into
// OUT cleans what that dead run provably left (its marker) and puts the previous output back
// before it checks OUT, and never touches look-alikes no roundpipe writer marked.
TEST(CliMerge, AKilledConvertsLeftoversAreCleanedByTheNextOne) {
  auto d = tmpdir();
  const std::string gguf = std::string(RP_FIXTURES_DIR) + "/gguf_moe/tiny_qwen3_moe.f32.gguf";
  ASSERT_EQ(roundpipe("convert " + gguf + " " + (d / "out").string(), d).code, 0);
  fs::rename(d / "out", d / "out.old-999999999");  // killed between the two renames of the swap
  mark(d / "out.old-999999999", "old", "out", "999999999");
  fs::create_directories(d / "out.tmp-999999999");  // and its half-written new version
  write(d / "out.tmp-999999999/model.safetensors", "half");
  mark(d / "out.tmp-999999999", "tmp", "out", "999999999");
  fs::create_directories(d / "out.tmp-999999998");  // a look-alike nobody marked
  write(d / "out.tmp-999999998/mine.txt", "mine");
  fs::create_directories(d /
                         "other.tmp-999999999");  // another folder's leftover: not this convert's business
  mark(d / "other.tmp-999999999", "tmp", "other", "999999999");
  const CliRun r = roundpipe("convert " + gguf + " " + (d / "out").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("restored " + (d / "out").string() + " from " + (d / "out.old-999999999").string()),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("removed " + (d / "out.tmp-999999999").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("left alone " + (d / "out.tmp-999999998").string()), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d / "out/config.json"));
  for (const char* gone : {"out.old-999999999", "out.old-999999999.roundpipe-owner", "out.tmp-999999999",
                           "out.tmp-999999999.roundpipe-owner"})
    EXPECT_FALSE(fs::exists(d / gone)) << gone;
  EXPECT_EQ(slurp(d / "out.tmp-999999998/mine.txt"), "mine");
  EXPECT_TRUE(fs::exists(d / "other.tmp-999999999"));
  EXPECT_TRUE(fs::exists(d / "other.tmp-999999999.roundpipe-owner"));
  fs::remove_all(d);
}

// A manifest proves nothing by its name: one a user wrote (no sizes), one that lists a folder,
// or one whose listed file has another size than recorded leaves the folder refused and whole.
TEST(CliMerge, ConvertTrustsOnlyAManifestWhoseFilesHaveTheirRecordedSizes) {
  auto d = tmpdir();
  const std::string gguf = std::string(RP_FIXTURES_DIR) + "/gguf_moe/tiny_qwen3_moe.f32.gguf";
  fs::create_directories(d / "t/sub");
  write(d / "t/notes.txt", "keep");
  write(d / "t/sub/inner.txt", "keep");
  write(d / "t/roundpipe_manifest.json",
        R"({"files": ["notes.txt", "sub"], "written_by": "roundpipe convert"})");
  const auto before = listing(d / "t");
  expect_one_line_error(roundpipe("convert " + gguf + " " + (d / "t").string(), d), "notes.txt");
  EXPECT_EQ(listing(d / "t"), before);
  EXPECT_TRUE(fs::exists(d / "t/sub/inner.txt"));
  // a real earlier output whose config.json the user replaced is no longer all ours
  ASSERT_EQ(roundpipe("convert " + gguf + " " + (d / "c").string(), d).code, 0);
  write(d / "c/config.json", "{\"my\": \"edits\"}");
  expect_one_line_error(roundpipe("convert " + gguf + " " + (d / "c").string(), d), "config.json");
  EXPECT_EQ(slurp(d / "c/config.json"), "{\"my\": \"edits\"}");
  fs::remove_all(d);
}

// "/", $HOME, the working directory and its parents are never an output folder (each would be
// replaced as a whole), whatever they hold. The refusal names the folder as --help does,
// `output`.
TEST(CliMerge, ConvertAndMergeRefuseTheRootHomeAndWorkingDirectory) {
  auto d = tmpdir();
  const std::string gguf = std::string(RP_FIXTURES_DIR) + "/gguf_moe/tiny_qwen3_moe.f32.gguf";
  fs::create_directories(d / "home/work");
  const std::string home = "HOME='" + (d / "home").string() + "'";
  expect_one_line_error(roundpipe_in(d / "home/work", "convert " + gguf + " .", d, home),
                        ".: output is the working directory");
  expect_one_line_error(roundpipe_in(d / "home/work", "convert " + gguf + " ..", d, home),
                        "..: output is the home folder ($HOME)");
  expect_one_line_error(roundpipe_in(d / "home/work", "convert " + gguf + " " + d.string(), d, home),
                        "output contains the working directory");
  expect_one_line_error(roundpipe_in(d / "home/work", "convert " + gguf + " /", d, home),
                        "output is the root folder");
  // an empty output is no folder (it read as the root before); nothing is looked for or touched
  fs::create_directories(d / "home/work/out.tmp-999999999");
  for (const std::string& cmd :
       {"convert " + gguf + " ''",
        "merge " + kPeft + "untied_all/adapter '' --base " + kPeft + "base_untied"}) {
    const CliRun r = roundpipe_in(d / "home/work", cmd, d, home);
    expect_one_line_error(r, "output folder: an empty path");
    EXPECT_EQ(r.out, "") << cmd;
  }
  fs::remove(d / "home/work/out.tmp-999999999");
  expect_one_line_error(
      roundpipe_in(d / "home/work", "merge " + kPeft + "untied_all/adapter . --base " + kPeft + "base_untied",
                   d, home),
      "output is the working directory");
  EXPECT_TRUE(fs::is_empty(d / "home/work"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d / "home"), {}), 1);
  fs::remove_all(d);
}

// Expert adapters on a dense base would be dropped without a word: merge and generate refuse
// the pair as training does, naming the adapter folder.
TEST(CliMerge, RefusesExpertAdaptersOnADenseBase) {
  auto d = tmpdir();
  const std::string adapter = std::string(RP_FIXTURES_DIR) + "/hf_lora/tiny_qwen3_moe_lora/adapter";
  const std::string dense = std::string(RP_FIXTURES_DIR) + "/hf_lora/tiny_qwen3_lora";
  const char* what =
      "tiny_qwen3_moe_lora/adapter: lora.target_parameters: the model has no mixture-of-experts layer";
  expect_one_line_error(roundpipe("merge " + adapter + " " + (d / "out").string() + " --base " + dense, d),
                        what);
  EXPECT_FALSE(fs::exists(d / "out"));
  expect_one_line_error(
      roundpipe("generate " + adapter + " --base " + dense + " --prompt hi --max-tokens 2", d), what);
  fs::remove_all(d);
}

}  // namespace
