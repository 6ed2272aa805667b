// base/output_folder: the folders no command may write as a whole (/, $HOME, the working
// directory and its parents) and the overlap of an output folder with an input.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "base/output_folder.hpp"
#include "tests/in_folder.hpp"

namespace fs = std::filesystem;

namespace {

using rp::testing::InFolder;

TEST(OutputFolder, TheRootHomeWorkingDirectoryItsParentsAndATildeAreRefused) {
  const fs::path d = fs::temp_directory_path() / ("rp_outdir_" + std::to_string(::getpid()));
  fs::create_directories(d / "work/sub");
  fs::create_directories(d / "home");
  {
    InFolder in(d / "work", d / "home");
    EXPECT_EQ(rp::unsafe_output_folder("/"), "is the root folder");
    EXPECT_EQ(rp::unsafe_output_folder("//"), "is the root folder");
    EXPECT_EQ(rp::unsafe_output_folder((d / "home").string()), "is the home folder ($HOME)");
    EXPECT_EQ(rp::unsafe_output_folder((d / "home/").string()), "is the home folder ($HOME)");
    EXPECT_EQ(rp::unsafe_output_folder("."), "is the working directory");
    EXPECT_EQ(rp::unsafe_output_folder("sub/.."), "is the working directory");
    EXPECT_EQ(rp::unsafe_output_folder(".."), "contains the working directory");
    EXPECT_EQ(rp::unsafe_output_folder(d.string()), "contains the working directory");
    EXPECT_EQ(rp::unsafe_output_folder("sub"), "");
    EXPECT_EQ(rp::unsafe_output_folder("new/run"), "");
    EXPECT_EQ(rp::unsafe_output_folder((d / "home/runs").string()), "");
    EXPECT_EQ(rp::unsafe_output_folder("~"),
              "starts with '~', which only a shell expands (write the full path)");
    EXPECT_EQ(rp::unsafe_output_folder("~/runs/x"),
              "starts with '~', which only a shell expands (write the full path)");
    EXPECT_EQ(rp::unsafe_output_folder("runs/~x"), "");
  }
  fs::remove_all(d);
}

// The folders a writer makes for a path, and taking back only those, only while empty.
TEST(OutputFolder, MissingFoldersAreTheOnesMadeAndOnlyEmptyOnesGo) {
  const fs::path d = fs::temp_directory_path() / ("rp_missing_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "there");
  const std::string out = (d / "there" / "a" / "b").string();
  const std::vector<std::string> missing = rp::missing_folders(out + "/");
  EXPECT_EQ(missing, (std::vector<std::string>{out, (d / "there" / "a").string()}));
  EXPECT_TRUE(rp::missing_folders((d / "there").string()).empty());
  fs::create_directories(out);
  std::FILE* f = std::fopen((d / "there" / "a" / "keep.txt").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  rp::remove_empty_folders(missing);
  EXPECT_FALSE(fs::exists(out)) << "empty: removed";
  EXPECT_TRUE(fs::exists(d / "there" / "a" / "keep.txt")) << "a folder holding a file stays";
  EXPECT_TRUE(fs::is_directory(d / "there"));
  fs::remove_all(d);
}

TEST(OutputFolder, AnOutputThatIsHoldsOrLiesInsideAnInputIsNamed) {
  const fs::path d = fs::temp_directory_path() / ("rp_outdir_in_" + std::to_string(::getpid()));
  fs::create_directories(d / "runs/x/final");
  const std::string model = (d / "runs/x/final").string(), data = (d / "data.jsonl").string();
  EXPECT_EQ(rp::overlapping_input((d / "runs/x").string(), {"", model, data}), model);
  EXPECT_EQ(rp::overlapping_input((d / "runs/x/final/").string(), {data, model}), model);
  EXPECT_EQ(rp::overlapping_input((d / "runs/x/final/sub").string(), {model}), model);
  EXPECT_EQ(rp::overlapping_input(d.string(), {data}), data);
  EXPECT_EQ(rp::overlapping_input((d / "runs/y").string(), {model, data}), "");
  EXPECT_EQ(rp::overlapping_input((d / "runs/x/fin").string(), {model}), "")
      << "a prefix of a name is not inside";
  fs::remove_all(d);
}

}  // namespace
