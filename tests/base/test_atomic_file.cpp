// base/atomic_file: the one replace policy (temporary in the same folder, fsync, rename,
// fsync the folder) for files and folders, and the cleaning of a killed writer's leftovers.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <typeinfo>

#include "base/atomic_file.hpp"
#include "base/output_folder.hpp"

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

// A process that ends at once on a signal mid-write (as `roundpipe train` does before its first
// step) removes its unfinished temporary and marker first: only the previous file remains.
void exit_on_signal(int) {
  rp::remove_unfinished_temporaries();
  std::_Exit(130);
}

TEST(AtomicFile, ASignalExitMidWriteLeavesNoTemporary) {
  const auto d = scratch();
  const auto f = d / "cache.bin";
  rp::write_file_atomically(f.string(), [](std::ostream& os) { os << "good"; });
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGUSR2, exit_on_signal);
    rp::replace_file(f.string(), [](const std::string& tmp) {
      std::ofstream(tmp, std::ios::binary) << std::string(1 << 20, 'x');
      ::raise(SIGUSR2);  // the handler never returns
    });
    std::_Exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_EQ(slurp(f), "good");
  EXPECT_EQ(entries(d), 1u) << "a temporary or its marker was left behind";
  // after finished writes the table is empty: calling it removes nothing of ours
  rp::write_file_atomically(f.string(), [](std::ostream& os) { os << "newer"; });
  rp::remove_unfinished_temporaries();
  EXPECT_EQ(slurp(f), "newer");
  fs::remove_all(d);
}

// A second stop signal while a checkpoint folder is written: the thread the handler wakes
// removes the unfinished folder and its marker while the writer still fills it, and the writer
// never swaps what is left of it into place; the previous version stays.
TEST(AtomicFile, AnExitOnASignalRemovesTheUnfinishedFolder) {
  const auto d = scratch();
  const auto ck = d / "final";
  rp::replace_folder(ck.string(),
                     [](const std::string& tmp) { std::ofstream(fs::path(tmp) / "w") << "old"; });
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rp::replace_folder(ck.string(), [](const std::string& tmp) {
      std::ofstream(fs::path(tmp) / "w") << std::string(1 << 20, 'x');
      std::thread([] {
        rp::remove_unfinished_folders();
        std::_Exit(130);
      }).detach();
      for (int i = 0; i < 100; ++i) {  // still writing while the folder goes
        std::ofstream(fs::path(tmp) / ("part" + std::to_string(i))) << "x";
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    std::_Exit(0);  // the swap waits for the exit instead
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_EQ(slurp(ck / "w"), "old");
  std::string left;
  for (const auto& e : fs::directory_iterator(d)) left += e.path().filename().string() + " ";
  EXPECT_EQ(left, "final ") << "the unfinished folder or its marker was left behind";
  fs::remove_all(d);
}

// The exit on a second stop signal during a checkpoint's first save: the state/ folder that save
// made (RecordedFolders) goes with the unfinished folder inside it, parents it made too; a state/
// that was there before stays, empty or not, and so does one made by a save that finished.
TEST(AtomicFile, AnExitOnASignalTakesBackTheFoldersASaveMade) {
  for (const int c : {0, 1, 2}) {  // 0: the save made a/state/; 1: a/state/ was there; 2: the save finished
    SCOPED_TRACE(c);
    const auto d = scratch();
    if (c == 1) fs::create_directories(d / "a" / "state");
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::error_code ec;
      std::optional<rp::RecordedFolders> made;
      made.emplace((d / "a" / "state").string(), ec);
      if (ec || made->made().size() != (c == 1 ? 0u : 2u)) std::_Exit(3);
      if (c == 2) {
        rp::replace_folder((d / "a" / "state" / "done").string(),
                           [](const std::string& tmp) { std::ofstream(fs::path(tmp) / "w") << "x"; });
        made.reset();
        rp::remove_unfinished_temporaries();
        std::_Exit(130);
      }
      rp::replace_folder((d / "a" / "state" / "final").string(), [](const std::string& tmp) {
        std::ofstream(fs::path(tmp) / "w") << "x";
        std::thread([] {
          rp::remove_unfinished_folders();
          rp::remove_unfinished_temporaries();
          std::_Exit(130);
        }).detach();
        for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      });
      std::_Exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 130);
    if (c == 0) {
      EXPECT_FALSE(fs::exists(d / "a")) << "the folders the save made were left behind";
    } else if (c == 1) {
      EXPECT_TRUE(fs::is_directory(d / "a" / "state")) << "a folder that was there before went";
      EXPECT_TRUE(fs::is_empty(d / "a" / "state"));
    } else {
      EXPECT_EQ(slurp(d / "a" / "state" / "done" / "w"), "x");
    }
    fs::remove_all(d);
  }
}

// A stop signal the moment a temporary's owner marker exists, before its text is written, leaves
// no marker (empty or not) and no temporary, for a file's temporary and a folder's alike.
TEST(AtomicFile, ASignalWhileTheMarkerIsWrittenLeavesNothing) {
  for (const bool folder : {false, true}) {
    const auto d = scratch();
    const auto f = d / "target";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::signal(SIGUSR2, exit_on_signal);
      rp::set_atomic_write_hook([](const std::string& event, const std::string&) {
        if (event == "marker-created") ::raise(SIGUSR2);  // the handler never returns
      });
      if (folder) rp::replace_folder(f.string(), [](const std::string&) {});
      else rp::write_file_atomically(f.string(), [](std::ostream& os) { os << "x"; });
      std::_Exit(0);  // not reached while the hook is called
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 130) << (folder ? "folder" : "file") << ": no stop at the marker";
    EXPECT_EQ(entries(d), 0u) << (folder ? "folder" : "file") << ": a marker or temporary was left behind";
    fs::remove_all(d);
  }
}

// A marker with no temporary beside it (a run stopped long ago whose process id came back): the
// refusal names the marker, the file in the way, not the temporary that does not exist.
TEST(AtomicFile, ALoneMarkerInTheWayIsTheNameTheRefusalGives) {
  const auto d = scratch();
  const std::string self = std::to_string(::getpid());
  const auto marker = d / ("a.txt.tmp-" + self + ".roundpipe-owner");
  std::ofstream(marker) << "";
  try {
    rp::write_file_atomically((d / "a.txt").string(), [](std::ostream& o) { o << "new"; });
    ADD_FAILURE() << "wrote past a marker it did not make";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(marker.string() + ": exists", 0), 0u) << e.what();
  }
  EXPECT_TRUE(fs::exists(marker));
  fs::remove_all(d);
}

TEST(AtomicFile, ReplacesAFolderAndKeepsTheOldOneOnFailure) {
  const auto d = scratch();
  const auto ck = d / "final";
  rp::replace_folder(ck.string() + "/",
                     [](const std::string& tmp) { std::ofstream(tmp + "/a.txt") << "one"; });
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

// A write error names the temporary it was writing ("final.tmp-42/model.safetensors: write failed:
// No space left on device"), which is removed before anyone reads the message: it is rethrown
// naming the file in the target, saying nothing was replaced. Other errors pass as they were.
TEST(AtomicFile, AnErrorNamingTheTemporaryNamesTheTargetInstead) {
  const auto d = scratch();
  const std::string ck = (d / "final").string(), f = (d / "state.bin").string();
  const auto error_of = [](const std::function<void()>& write) -> std::string {
    try {
      write();
    } catch (const std::runtime_error& e) {
      return std::string(typeid(e) == typeid(std::runtime_error) ? "" : "(other type) ") + e.what();
    } catch (const std::invalid_argument& e) {
      return std::string("(invalid_argument) ") + e.what();
    }
    return "no error";
  };
  const auto fill_throwing = [](auto make) { return [make](const std::string& tmp) { throw make(tmp); }; };
  EXPECT_EQ(error_of([&] {
              rp::replace_folder(
                  ck, fill_throwing([](const std::string& tmp) {
                    return std::runtime_error(tmp + "/model.safetensors: write failed: No space");
                  }));
            }),
            ck + "/model.safetensors: write failed: No space (nothing was replaced)");
  EXPECT_EQ(error_of([&] {
              rp::replace_file(f, fill_throwing([](const std::string& tmp) {
                                 return std::runtime_error(tmp + ": write failed (disk full?)");
                               }));
            }),
            f + ": write failed (disk full?) (nothing was replaced)");
  // another type, another path, a longer name that merely starts like the temporary's: as they were
  const std::string tmp = rp::temporary_path(ck);
  EXPECT_EQ(error_of([&] {
              rp::replace_folder(ck, fill_throwing([](const std::string& t) {
                                   return std::invalid_argument(t + "/x: refused");
                                 }));
            }),
            "(invalid_argument) " + tmp + "/x: refused");
  EXPECT_EQ(error_of([&] {
              rp::replace_folder(
                  ck, fill_throwing([](const std::string&) { return std::runtime_error("y: failed"); }));
            }),
            "y: failed");
  EXPECT_EQ(error_of([&] {
              rp::replace_folder(ck, fill_throwing([](const std::string& t) {
                                   return std::runtime_error(t + "0/x: failed");
                                 }));
            }),
            tmp + "0/x: failed");
  EXPECT_EQ(entries(d), 0u);  // nothing left behind
  fs::remove_all(d);
}

/// The marker a roundpipe writer leaves beside "<target>.<kind>-<pid>" (base/atomic_file.hpp).
void mark(const fs::path& leftover, const std::string& kind, const std::string& target,
          const std::string& pid, const std::string& start = "1") {
  std::ofstream(rp::owner_marker_path(leftover.string()))
      << "roundpipe leftover v1\npid=" << pid << "\nstart=" << start << "\nkind=" << kind
      << "\ntarget=" << target << "\n";
}

TEST(AtomicFile, LeftoversOfDeadWritersAreRemovedOrRestored) {
  const auto d = scratch();
  const std::string dead = "999999999";  // above any pid_max: never a live process
  fs::create_directories(d / ("final.tmp-" + dead));
  mark(d / ("final.tmp-" + dead), "tmp", "final", dead);
  std::ofstream(d / ("metrics.csv.tmp-" + dead)) << "torn";
  mark(d / ("metrics.csv.tmp-" + dead), "tmp", "metrics.csv", dead);
  fs::create_directories(d / ("checkpoint-2.old-" + dead));  // killed before the new one was in place
  std::ofstream(d / ("checkpoint-2.old-" + dead) / "w") << "kept";
  mark(d / ("checkpoint-2.old-" + dead), "old", "checkpoint-2", dead);
  fs::create_directories(d / "checkpoint-4");
  fs::create_directories(d / ("checkpoint-4.old-" + dead));  // killed after: the new one is there
  mark(d / ("checkpoint-4.old-" + dead), "old", "checkpoint-4", dead);
  mark(d / ("gone.tmp-" + dead), "tmp", "gone", dead);  // killed after the rename: only the marker
  fs::create_directories(d / ("mine.tmp-" + std::to_string(::getpid())));  // this process: a live writer
  fs::create_directories(d / "other.tmp-1");                               // pid 1 is alive
  fs::create_directories(d / "notes.tmp-abc");                             // not a pid
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
  for (const auto& e : fs::directory_iterator(d))  // every marker went with its leftover
    EXPECT_EQ(e.path().string().find(".roundpipe-owner"), std::string::npos) << e.path();
  int restored = 0;
  for (const auto& s : done) {
    restored += s.restored;
    EXPECT_FALSE(s.left_alone) << s.path;
    if (s.restored) {
      EXPECT_EQ(s.target, (d / "checkpoint-2").string());
    }
  }
  EXPECT_EQ(restored, 1);
  EXPECT_TRUE(rp::clean_stale_temporaries((d / "missing").string()).empty());
  fs::remove_all(d);
}

// Names that only look like a dead writer's leftovers (the user's "build.tmp-4242/", a
// "backup.old-2023/") are never removed or renamed: without our marker, or with a marker that
// names another leftover, a live writer or garbage, they are reported and left alone.
TEST(AtomicFile, LeftoversWithoutOurMarkerAreLeftAlone) {
  const auto d = scratch();
  fs::create_directories(d / "build.tmp-999999998/src");
  std::ofstream(d / "build.tmp-999999998/src/main.c") << "int main() {}";
  fs::create_directories(d / "backup.old-999999997");
  std::ofstream(d / "backup.old-999999997/notes.txt") << "mine";
  std::ofstream(d / "report.tmp-999999996") << "mine";
  mark(d / "report.tmp-999999996", "tmp", "other-name", "999999996");  // names another target
  fs::create_directories(d / "data.old-999999995");
  mark(d / "data.old-999999995", "old", "data", "999999994");  // names another pid
  const std::string self = std::to_string(::getpid());
  std::ofstream(d / ("plain.tmp-" + self)) << "mine";
  std::ofstream(d / "forged.tmp-999999993") << "mine";
  std::ofstream(rp::owner_marker_path((d / "forged.tmp-999999993").string())) << "rm -rf\n";
  const auto before = std::distance(fs::recursive_directory_iterator(d), {});
  const auto done = rp::clean_stale_temporaries(d.string());
  EXPECT_EQ(std::distance(fs::recursive_directory_iterator(d), {}), before) << "something was removed";
  EXPECT_EQ(slurp(d / "build.tmp-999999998/src/main.c"), "int main() {}");
  EXPECT_EQ(slurp(d / "backup.old-999999997/notes.txt"), "mine");
  EXPECT_FALSE(fs::exists(d / "backup")) << "renamed a folder it did not move aside";
  EXPECT_FALSE(fs::exists(d / "data"));
  size_t left_alone = 0;
  for (const auto& s : done) {
    EXPECT_TRUE(s.left_alone) << s.path;
    left_alone += s.left_alone;
  }
  EXPECT_EQ(left_alone, 5u) << "build, backup, report, data and forged are reported; the live one is not";
  // a marker naming this process with another start time is a dead writer whose pid was reused
  fs::create_directories(d / ("reused.tmp-" + self));
  mark(d / ("reused.tmp-" + self), "tmp", "reused", self, "0");
  rp::clean_stale_temporaries(d.string());
  EXPECT_FALSE(fs::exists(d / ("reused.tmp-" + self)));
  EXPECT_TRUE(fs::exists(d / ("plain.tmp-" + self)));
  fs::remove_all(d);
}

// A temporary or aside name that exists and is not provably a dead writer's is never reused:
// the write fails naming it, and it and the target stay as they were.
TEST(AtomicFile, AWriteNeverReusesAForeignTemporaryName) {
  const auto d = scratch();
  const std::string self = std::to_string(::getpid());
  std::ofstream(d / ("a.txt.tmp-" + self)) << "mine";
  EXPECT_THROW(rp::write_file_atomically((d / "a.txt").string(), [](std::ostream& o) { o << "new"; }),
               std::runtime_error);
  EXPECT_EQ(slurp(d / ("a.txt.tmp-" + self)), "mine");
  EXPECT_FALSE(fs::exists(d / "a.txt"));
  fs::create_directories(d / ("f.tmp-" + self));
  std::ofstream(d / ("f.tmp-" + self) / "keep") << "mine";
  try {
    rp::replace_folder((d / "f").string(), [](const std::string&) {});
    ADD_FAILURE() << "reused f.tmp-" << self;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("was not made by roundpipe"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(d / ("f.tmp-" + self) / "keep"), "mine");
  fs::create_directories(d / "g");
  std::ofstream(d / "g" / "w") << "old";
  fs::create_directories(d / ("g.old-" + self));
  std::ofstream(d / ("g.old-" + self) / "keep") << "mine";
  EXPECT_THROW(
      rp::replace_folder((d / "g").string(),
                         [](const std::string& tmp) { std::ofstream(fs::path(tmp) / "w") << "new"; }),
      std::runtime_error);
  EXPECT_EQ(slurp(d / "g" / "w"), "old");
  EXPECT_EQ(slurp(d / ("g.old-" + self) / "keep"), "mine");
  EXPECT_FALSE(fs::exists(d / ("g.tmp-" + self))) << "the failed write's own temporary went";
  EXPECT_FALSE(fs::exists(rp::owner_marker_path((d / ("g.tmp-" + self)).string())));
  fs::remove_all(d);
}

// A writer killed (SIGKILL) at any point of a folder swap leaves only marked leftovers, which
// the next clean puts back or removes: the finished version is never lost.
TEST(AtomicFile, AWriterKilledMidSwapIsCleanedUpByTheNextRun) {
  for (const char* when : {"fill", "folder-aside"}) {
    const auto d = scratch();
    fs::create_directories(d / "ckpt");
    std::ofstream(d / "ckpt" / "w") << "finished";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      rp::set_atomic_write_hook([&](const std::string& event, const std::string&) {
        if (event == when) ::kill(::getpid(), SIGKILL);
      });
      rp::replace_folder((d / "ckpt").string(), [&](const std::string& tmp) {
        std::ofstream(fs::path(tmp) / "w") << "new";
        if (std::string(when) == "fill") ::kill(::getpid(), SIGKILL);
      });
      ::_exit(0);  // not reached
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << when;
    const std::string pid = std::to_string(child);
    EXPECT_TRUE(fs::exists(d / ("ckpt.tmp-" + pid))) << when;
    EXPECT_TRUE(fs::exists(rp::owner_marker_path((d / ("ckpt.tmp-" + pid)).string()))) << when;
    const auto done = rp::clean_stale_temporaries(d.string());
    EXPECT_EQ(slurp(d / "ckpt" / "w"), "finished") << when;
    EXPECT_EQ(entries(d), 1u) << when << ": only ckpt/ is left";
    for (const auto& s : done) EXPECT_FALSE(s.left_alone) << s.path;
    fs::remove_all(d);
  }
}

}  // namespace

namespace {

void put(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// A folder written with a manifest (base/output_folder.hpp) is rewritten keeping what the
// manifest does not list: the user's files and folders survive, the files the earlier version
// wrote and the new one does not are gone, and a listed file the user changed stops the write
// before anything is replaced. Without a manifest the folder is replaced as a whole.
TEST(AtomicFile, ARewriteKeepsWhatTheManifestDoesNotList) {
  const fs::path d = scratch(), ck = d / "ck";
  rp::replace_folder(ck.string(), [](const std::string& tmp) {
    put(fs::path(tmp) / "a.bin", "ours");
    put(fs::path(tmp) / "old-shard.bin", "ours");
    rp::write_manifest(tmp, "test");
  });
  put(ck / "notes.txt", "mine");
  fs::create_directories(ck / "sub");
  put(ck / "sub/x.txt", "mine too");
  rp::replace_folder(ck.string(), [](const std::string& tmp) {
    put(fs::path(tmp) / "a.bin", "new!");
    rp::write_manifest(tmp, "test");
  });
  EXPECT_EQ(slurp(ck / "a.bin"), "new!");
  EXPECT_FALSE(fs::exists(ck / "old-shard.bin"));
  EXPECT_EQ(slurp(ck / "notes.txt"), "mine");
  EXPECT_EQ(slurp(ck / "sub/x.txt"), "mine too");
  put(ck / "a.bin", "changed by the user");
  EXPECT_THROW(
      rp::replace_folder(ck.string(), [](const std::string& tmp) { put(fs::path(tmp) / "a.bin", "x"); }),
      std::runtime_error);
  EXPECT_EQ(slurp(ck / "a.bin"), "changed by the user");
  EXPECT_EQ(entries(d), 1u) << "no temporary left";
  fs::remove(ck / "roundpipe_manifest.json");  // nothing proves what is ours: replaced as a whole
  rp::replace_folder(ck.string(), [](const std::string& tmp) { put(fs::path(tmp) / "a.bin", "x"); });
  EXPECT_EQ(entries(ck), 1u);
  fs::remove_all(d);
}

}  // namespace

namespace {

// A writer that records what it writes (its new version holds a manifest) keeps everything no
// manifest proves roundpipe's: all of a folder without one (an earlier release's), and a listed
// file whose content changed at the same size (the manifest's XXH3 shows it). A kept entry whose
// name the new version writes fails the write with FolderConflict, nothing replaced.
TEST(AtomicFile, AWriterThatRecordsKeepsWhatNoManifestProvesOurs) {
  const fs::path d = scratch(), ck = d / "ck";
  fs::create_directories(ck);
  put(ck / "mine.txt", "mine");
  auto write_with_manifest = [&](const std::string& content) {
    rp::replace_folder(ck.string(), [&](const std::string& tmp) {
      put(fs::path(tmp) / "a.bin", content);
      rp::write_manifest(tmp, "test");
    });
  };
  write_with_manifest("ours");
  EXPECT_EQ(slurp(ck / "mine.txt"), "mine");
  EXPECT_EQ(rp::manifest_files(ck)->count("mine.txt"), 0u);
  put(ck / "a.bin", "OURS");  // the user's edit, same size
  EXPECT_EQ(rp::foreign_names(ck), (std::vector<std::string>{"a.bin", "mine.txt"}));
  try {
    write_with_manifest("new!");
    ADD_FAILURE() << "replaced the user's a.bin";
  } catch (const rp::FolderConflict& e) {
    EXPECT_NE(std::string(e.what()).find((ck / "a.bin").string() + ": changed since roundpipe wrote it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(slurp(ck / "a.bin"), "OURS");
  fs::remove(ck / "a.bin");
  fs::remove(ck / rp::kManifestFile);  // a folder nothing proves ours: all of it kept
  put(ck / "a.bin", "old");
  EXPECT_THROW(write_with_manifest("new"), rp::FolderConflict);
  fs::remove(ck / "a.bin");
  write_with_manifest("new");
  EXPECT_EQ(slurp(ck / "mine.txt"), "mine");
  EXPECT_EQ(slurp(ck / "a.bin"), "new");
  EXPECT_EQ(entries(d), 1u) << "no temporary left";
  fs::remove_all(d);
}

}  // namespace
