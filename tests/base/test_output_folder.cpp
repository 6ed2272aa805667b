// base/output_folder: the folders no command may write as a whole (/, $HOME, the working
// directory and its parents) and the overlap of an output folder with an input.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/output_folder.hpp"
#include "tests/as_unprivileged.hpp"
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
TEST(OutputFolder, CreatedFoldersAreTheOnesMadeAndOnlyEmptyOnesGo) {
  const fs::path d = fs::temp_directory_path() / ("rp_missing_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "there");
  const std::string out = (d / "there" / "a" / "b").string();
  std::error_code ec;
  std::vector<std::string> heard;  // each folder the moment it is made, shallowest first
  const std::vector<std::string> made = rp::create_folders(out + "/", ec, [&](const std::string& f) {
    EXPECT_TRUE(fs::is_directory(f)) << f;
    heard.push_back(f);
  });
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(made, (std::vector<std::string>{out, (d / "there" / "a").string()}));
  EXPECT_EQ(heard, (std::vector<std::string>{(d / "there" / "a").string(), out}));
  EXPECT_TRUE(fs::is_directory(out));
  EXPECT_TRUE(rp::create_folders((d / "there").string(), ec).empty()) << "there before: not made";
  std::FILE* f = std::fopen((d / "there" / "a" / "keep.txt").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  rp::remove_empty_folders(made);
  EXPECT_FALSE(fs::exists(out)) << "empty: removed";
  EXPECT_TRUE(fs::exists(d / "there" / "a" / "keep.txt")) << "a folder holding a file stays";
  EXPECT_TRUE(fs::is_directory(d / "there"));
  fs::remove_all(d);
}

// A symbolic link to a missing target, as the path itself or as one of its folders, is named
// with its target; a live link, a missing path and a path under a missing folder name nothing.
TEST(OutputFolder, ADanglingLinkOnThePathIsNamed) {
  const fs::path d = fs::temp_directory_path() / ("rp_dangling_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "real");
  fs::create_directory_symlink(d / "gone", d / "dead");
  fs::create_directory_symlink(d / "real", d / "live");
  const std::string dead = (d / "dead").string();
  EXPECT_EQ(rp::dangling_link_text(dead),
            "'" + dead + "' is a symbolic link to '" + (d / "gone").string() + "', which does not exist");
  EXPECT_EQ(rp::dangling_link_text(dead + "/"),
            "'" + dead + "/' is a symbolic link to '" + (d / "gone").string() + "', which does not exist");
  const std::string under = (d / "dead" / "run").string();
  EXPECT_EQ(rp::dangling_link_text(under), "'" + under + "' lies under '" + dead +
                                               "', which is a symbolic link to '" + (d / "gone").string() +
                                               "', which does not exist");
  EXPECT_EQ(rp::dangling_link_text((d / "live" / "run").string()), "");
  EXPECT_EQ(rp::dangling_link_text((d / "missing" / "run").string()), "");
  EXPECT_EQ(rp::dangling_link_text((d / "real").string()), "");
  EXPECT_FALSE(fs::exists(d / "gone")) << "nothing is made";
  fs::remove_all(d);
}

// A path through "..": the folder it passes through is made too, so it is one to take back
// (the made list was the normalised path's, "new2" without "new1", and new1 stayed behind);
// an existing folder reached through ".." is not.
TEST(OutputFolder, AFolderMadeOnTheWayThroughDotDotIsTakenBack) {
  const fs::path d = fs::temp_directory_path() / ("rp_dotdot_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "old");
  std::error_code ec;
  std::vector<std::string> made = rp::create_folders((d / "new1" / ".." / "new2").string(), ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(made, (std::vector<std::string>{(d / "new1" / ".." / "new2").string(), (d / "new1").string()}));
  rp::remove_empty_folders(made);
  EXPECT_FALSE(fs::exists(d / "new1"));
  EXPECT_FALSE(fs::exists(d / "new2"));
  made = rp::create_folders((d / "new3" / ".." / "old").string(), ec);
  EXPECT_EQ(made, (std::vector<std::string>{(d / "new3").string()})) << "old was there before";
  rp::remove_empty_folders(made);
  EXPECT_TRUE(fs::is_directory(d / "old"));
  EXPECT_FALSE(fs::exists(d / "new3"));
  // a parent that is a file: nothing made, the error set
  std::FILE* f = std::fopen((d / "afile").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_TRUE(rp::create_folders((d / "afile" / "sub").string(), ec).empty());
  EXPECT_TRUE(ec);
  fs::remove_all(d);
}

// What stands in the way of a path, in one line naming the part that does: a file where a folder
// goes, a loop of symbolic links, a name too long (quoted shortened), a folder that cannot be
// entered; nothing for a path that is there or can be made.
TEST(OutputFolder, WhatBlocksAPathIsNamed) {
  const fs::path d = fs::temp_directory_path() / ("rp_blocker_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "dir");
  std::FILE* f = std::fopen((d / "afile").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const std::string afile = (d / "afile").string();
  EXPECT_EQ(rp::path_blocker_text((d / "dir" / "x.tier").string()), "");
  EXPECT_EQ(rp::path_blocker_text((d / "new" / "sub" / "x.tier").string()), "") << "missing: made later";
  EXPECT_EQ(rp::path_blocker_text(afile), "") << "a file where a file goes";
  EXPECT_EQ(rp::path_blocker_text(afile, true), "'" + afile + "' is a file, not a folder");
  EXPECT_EQ(rp::path_blocker_text((d / "dir").string() + "/", true), "");
  const std::string under = afile + "/a/b/x.tier";
  EXPECT_EQ(rp::path_blocker_text(under),
            "'" + under + "' lies under '" + afile + "', which is a file, not a folder");
  EXPECT_EQ(rp::path_blocker_text(afile + "/a", true),
            "'" + afile + "/a' lies under '" + afile + "', which is a file, not a folder");
  // a loop of symbolic links
  fs::create_symlink(d / "b", d / "a");
  fs::create_symlink(d / "a", d / "b");
  const std::string loop = (d / "a").string();
  EXPECT_EQ(rp::path_blocker_text(loop), "'" + loop + "': cannot reach (" + std::strerror(ELOOP) + ")");
  // a name longer than the file system takes: quoted shortened, with its length
  const std::string longer = (d / std::string(300, 'x')).string() + ".tier";
  const std::string said = rp::path_blocker_text(longer);
  EXPECT_EQ(said, "'" + longer.substr(0, rp::kPathQuoteBytes) + "... (" + std::to_string(longer.size()) +
                      " bytes)': cannot reach (" + std::strerror(ENAMETOOLONG) + ")");
  // a folder this user cannot enter (root enters any: the check runs as nobody then)
  fs::create_directories(d / "locked");
  fs::permissions(d / "locked", fs::perms::none);
  const std::string inside = (d / "locked" / "x.tier").string();
  const std::string denied = rp::testing::as_unprivileged([&] { return rp::path_blocker_text(inside); });
  fs::permissions(d / "locked", fs::perms::owner_all);
  fs::remove_all(d);
  if (denied == rp::testing::kNoDrop) GTEST_SKIP() << "running as root and cannot become nobody";
  EXPECT_EQ(denied, "'" + inside + "': cannot reach (" + std::strerror(EACCES) + ")");
}

// A folder's entries in name order; one that cannot be listed is one line naming it and the
// reason (a path through a file as any user; a folder without read permission as nobody).
TEST(OutputFolder, FolderEntriesNameAFolderThatCannotBeListed) {
  const fs::path d = fs::temp_directory_path() / ("rp_entries_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "f");
  for (const char* n : {"b", "a", "c"}) std::ofstream(d / "f" / n) << n;
  EXPECT_EQ(rp::folder_entries((d / "f").string()),
            (std::vector<fs::path>{d / "f" / "a", d / "f" / "b", d / "f" / "c"}));
  auto listed = [](const std::string& dir) {
    try {
      return std::to_string(rp::folder_entries(dir).size()) + " entries";
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
  };
  const std::string through_file = (d / "f" / "a" / "x").string();
  EXPECT_EQ(listed(through_file), through_file + ": cannot open the folder (" + std::strerror(ENOTDIR) + ")");
  fs::permissions(d / "f", fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec);
  const std::string denied = rp::testing::as_unprivileged([&] { return listed((d / "f").string()); });
  fs::permissions(d / "f", fs::perms::owner_all);
  fs::remove_all(d);
  if (denied == rp::testing::kNoDrop) GTEST_SKIP() << "running as root and cannot become nobody";
  EXPECT_EQ(denied, (d / "f").string() + ": cannot open the folder (" + std::strerror(EACCES) + ")");
}

// What a stop signal takes back: the recorded folders, deepest first, only while empty.
TEST(OutputFolder, RecordedFoldersAreRemovedOnlyWhileEmpty) {
  const fs::path d = fs::temp_directory_path() / ("rp_recorded_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::error_code ec;
  rp::record_folders_made(rp::create_folders((d / "a" / "b").string(), ec));
  rp::remove_recorded_folders();
  EXPECT_FALSE(fs::exists(d / "a"));
  EXPECT_TRUE(fs::is_directory(d)) << "not made: not recorded";
  rp::record_folders_made(rp::create_folders((d / "c" / "e").string(), ec));
  std::FILE* f = std::fopen((d / "c" / "e" / "mine.txt").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  rp::remove_recorded_folders();
  EXPECT_TRUE(fs::exists(d / "c" / "e" / "mine.txt")) << "a folder holding a file stays, and its parents";
  rp::record_folders_made({});
  fs::remove(d / "c" / "e" / "mine.txt");
  rp::remove_recorded_folders();
  EXPECT_TRUE(fs::is_directory(d / "c" / "e")) << "a cleared record removes nothing";
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

// An output file's path: nothing there or a file with `replace` may be written; a folder, a
// link (even to a file), a pipe or a device never; a file without `replace` is named as such.
TEST(OutputFileProblem, OnlyANewPathOrAReplaceableFile) {
  const fs::path d = fs::temp_directory_path() / ("rp_output_file_" + std::to_string(::getpid()));
  fs::create_directories(d / "folder");
  const std::string file = (d / "file.json").string(), link = (d / "link.json").string(),
                    fifo = (d / "fifo.json").string();
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  fs::create_symlink(file, link);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(rp::output_file_problem((d / "new.json").string(), false), "");
  EXPECT_EQ(rp::output_file_problem(file, true), "");
  EXPECT_NE(rp::output_file_problem(file, false).find("a file is already there"), std::string::npos);
  EXPECT_NE(rp::output_file_problem((d / "folder").string(), true).find("is a folder"), std::string::npos);
  for (const std::string& p : {link, fifo, std::string("/dev/null")})
    EXPECT_NE(rp::output_file_problem(p, true).find("something other than a regular file"), std::string::npos)
        << p;
  fs::remove_all(d);
}

}  // namespace
