// base/atomic_file: the one replace policy (temporary in the same folder, fsync, rename,
// fsync the folder) for files and folders, and the cleaning of a killed writer's leftovers.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/atomic_file.hpp"

namespace fs = std::filesystem;

namespace {

fs::path scratch() {
  auto d = fs::temp_directory_path() / ("rp_atomic_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t entries(const fs::path& d) {
  return size_t(std::distance(fs::directory_iterator(d), fs::directory_iterator()));
}

TEST(AtomicFile, ReplacesAFileAndLeavesNoTemporary) {
  const auto d = scratch();
  const auto f = d / "state.bin";
  rp::write_file_atomically(f.string(), [](std::ostream& os) { os << "first"; });
  EXPECT_EQ(slurp(f), "first");
  rp::write_file_atomically(f.string(), [](std::ostream& os) { os << "second"; });
  EXPECT_EQ(slurp(f), "second");
  EXPECT_EQ(entries(d), 1u);
  // replace_file hands the temporary's path to any writer
  rp::replace_file(f.string(), [&](const std::string& tmp) {
    EXPECT_EQ(tmp, rp::temporary_path(f.string()));
    EXPECT_EQ(fs::path(tmp).parent_path(), d);  // same folder: the rename is atomic
    std::ofstream(tmp) << "third";
  });
  EXPECT_EQ(slurp(f), "third");
  EXPECT_EQ(entries(d), 1u);
  fs::remove_all(d);
}

TEST(AtomicFile, AFailedWriteKeepsThePreviousFile) {
  const auto d = scratch();
  const auto f = d / "state.bin";
  rp::write_file_atomically(f.string(), [](std::ostream& os) { os << "good"; });
  EXPECT_THROW(rp::write_file_atomically(f.string(),
                                         [](std::ostream& os) {
                                           os << "partial";
                                           throw std::runtime_error("writer failed");
                                         }),
               std::runtime_error);
  EXPECT_EQ(slurp(f), "good");
  EXPECT_EQ(entries(d), 1u);
  // a folder that does not exist: one line naming the file, nothing created
  const auto nowhere = d / "missing" / "x.bin";
  try {
    rp::write_file_atomically(nowhere.string(), [](std::ostream& os) { os << "x"; });
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(nowhere.string() + ": cannot write", 0), 0u) << e.what();
  }
  EXPECT_FALSE(fs::exists(d / "missing"));
  fs::remove_all(d);
}

TEST(AtomicFile, ReplacesAFolderAndKeepsTheOldOneOnFailure) {
  const auto d = scratch();
  const auto ck = d / "final";
  rp::replace_folder(ck.string() + "/", [](const std::string& tmp) { std::ofstream(tmp + "/a.txt") << "one"; });
  EXPECT_EQ(slurp(ck / "a.txt"), "one");
  rp::replace_folder(ck.string(), [](const std::string& tmp) { std::ofstream(tmp + "/b.txt") << "two"; });
  EXPECT_FALSE(fs::exists(ck / "a.txt"));  // replaced as a whole
  EXPECT_EQ(slurp(ck / "b.txt"), "two");
  EXPECT_THROW(rp::replace_folder(ck.string(),
                                  [](const std::string& tmp) {
                                    std::ofstream(tmp + "/c.txt") << "three";
                                    throw std::runtime_error("fill failed");
                                  }),
               std::runtime_error);
  EXPECT_EQ(slurp(ck / "b.txt"), "two");
  EXPECT_EQ(entries(d), 1u);  // no temporary, no .old left behind
  std::ofstream(d / "file") << "x";
  try {
    rp::replace_folder((d / "file").string(), [](const std::string&) {});
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exists and is not a directory"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(AtomicFile, LeftoversOfDeadWritersAreRemovedOrRestored) {
  const auto d = scratch();
  const std::string dead = "999999999";  // above any pid_max: never a live process
  fs::create_directories(d / ("final.tmp-" + dead));
  std::ofstream(d / ("metrics.csv.tmp-" + dead)) << "torn";
  fs::create_directories(d / ("checkpoint-2.old-" + dead));  // killed before the new one was in place
  std::ofstream(d / ("checkpoint-2.old-" + dead) / "w") << "kept";
  fs::create_directories(d / "checkpoint-4");
  fs::create_directories(d / ("checkpoint-4.old-" + dead));  // killed after: the new one is there
  fs::create_directories(d / ("mine.tmp-" + std::to_string(::getpid())));  // this process: a live writer
  fs::create_directories(d / "other.tmp-1");                                 // pid 1 is alive
  fs::create_directories(d / "notes.tmp-abc");                               // not a pid
  auto done = rp::clean_stale_temporaries(d.string());
  EXPECT_EQ(done.size(), 4u);
  EXPECT_FALSE(fs::exists(d / ("final.tmp-" + dead)));
  EXPECT_FALSE(fs::exists(d / ("metrics.csv.tmp-" + dead)));
  EXPECT_EQ(slurp(d / "checkpoint-2" / "w"), "kept");
  EXPECT_FALSE(fs::exists(d / ("checkpoint-4.old-" + dead)));
  EXPECT_TRUE(fs::exists(d / "checkpoint-4"));
  EXPECT_TRUE(fs::exists(d / ("mine.tmp-" + std::to_string(::getpid()))));
  EXPECT_TRUE(fs::exists(d / "other.tmp-1"));
  EXPECT_TRUE(fs::exists(d / "notes.tmp-abc"));
  int restored = 0;
  for (const auto& s : done) {
    restored += s.restored;
    if (s.restored) {
      EXPECT_EQ(s.target, (d / "checkpoint-2").string());
    }
  }
  EXPECT_EQ(restored, 1);
  EXPECT_TRUE(rp::clean_stale_temporaries((d / "missing").string()).empty());
  fs::remove_all(d);
}

}  // namespace
