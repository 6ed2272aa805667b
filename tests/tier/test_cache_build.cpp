// tier/cache_file: building the cache (free-space check, failures leave nothing behind,
// O_DIRECT or buffered writes) and two runs sharing one cache file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/atomic_file.hpp"
#include "tier/cache_file.hpp"
#include "tier/direct_reader.hpp"
#include "tier_test_util.hpp"

using namespace std::chrono_literals;
using namespace rp::tier;
using namespace rp::tier::testing;

namespace {

TEST(CacheBuild, TooLittleDiskSpaceIsOneLineAndWritesNothing) {
  Scratch s;
  auto opt = small_chunks();
  std::string asked_dir;
  opt.free_bytes = [&](const std::string& dir) {
    asked_dir = dir;
    return uint64_t(36863);  // one byte short of the 36864 the file needs
  };
  int fills = 0;
  try {
    build_cache(
        s.path("w.cache"), "key-a", odd_specs(), [&](size_t, uint64_t, std::span<std::byte>) { ++fills; },
        opt);
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, s.path("w.cache") + ": not enough disk space for the tier cache: needs 36864 bytes");
    EXPECT_HAS(m, s.dir.string() + " has 36863 bytes");
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_EQ(asked_dir, s.dir.string());
  EXPECT_EQ(fills, 0);
  EXPECT_TRUE(s.names().empty());
  opt.free_bytes = [](const std::string&) { return uint64_t(36864); };  // exactly enough
  EXPECT_NO_THROW(build_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt));
  EXPECT_EQ(CacheFile::open(s.path("w.cache"), "key-a").state, CacheState::valid);
  // a rebuild over a stale file: the line says the old file holds its space until the new one is done
  opt.free_bytes = [](const std::string&) { return uint64_t(36863); };
  try {
    ensure_cache(s.path("w.cache"), "key-b", odd_specs(), pattern_fill(), opt);
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, "not enough disk space");
    EXPECT_HAS(m, "the old cache at this path (36.0 KiB, " + s.path("w.cache") + ": ");
    EXPECT_HAS(m, "remove it to make room");
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_EQ(CacheFile::open(s.path("w.cache"), "key-a").state, CacheState::valid) << "the old file was kept";
}

// A build that fails in folders it made (a full disk here) takes them back: nothing of the run
// is left, and a folder that was there before (or that holds something) stays.
TEST(CacheBuild, AFailedBuildRemovesTheFoldersItMade) {
  Scratch s;
  auto opt = small_chunks();
  opt.free_bytes = [](const std::string&) { return uint64_t(4096); };
  const std::string path = (s.dir / "new" / "deeper" / "w.cache").string();
  EXPECT_THROW(ensure_cache(path, "key-a", odd_specs(), pattern_fill(), opt), std::runtime_error);
  EXPECT_EQ(s.names(), std::vector<std::string>{});
  std::filesystem::create_directories(s.dir / "new");
  { std::ofstream(s.path("new/keep.txt")) << "the user's"; }
  EXPECT_THROW(ensure_cache(path, "key-a", odd_specs(), pattern_fill(), opt), std::runtime_error);
  EXPECT_EQ(s.names(), std::vector<std::string>{"new"});
  EXPECT_FALSE(std::filesystem::exists(s.dir / "new" / "deeper"));
  EXPECT_TRUE(std::filesystem::exists(s.dir / "new" / "keep.txt"));
}

// A cache path under a symbolic link to a missing folder: the refusal names the link and its
// target (creating the folder would only say "File exists"), and nothing is made.
TEST(CacheBuild, ACachePathUnderADanglingLinkNamesTheLink) {
  Scratch s;
  std::filesystem::create_directory_symlink(s.dir / "gone", s.dir / "dead");
  const std::string path = (s.dir / "dead" / "w.cache").string();
  try {
    ensure_cache(path, "key-a", odd_specs(), pattern_fill(), small_chunks());
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, "cannot create the cache's folder: '" + (s.dir / "dead").string() +
                      "' is a symbolic link to '" + (s.dir / "gone").string() + "', which does not exist");
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(s.dir / "gone"));
}

// Space promised to another file in the folder (the activation spill's, not yet allocated) is
// not the cache's: the check counts it and the refusal says so.
TEST(CacheBuild, SpacePromisedToAnotherFileIsNotTheCaches) {
  Scratch s;
  auto opt = small_chunks();
  opt.free_bytes = [](const std::string&) { return uint64_t(36864 + 4096); };
  opt.reserved_bytes = 4097;  // one byte more than the cache can spare
  try {
    build_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt);
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, s.path("w.cache") + ": not enough disk space for the tier cache: needs 36864 bytes");
    EXPECT_HAS(m,
               "has 40960 bytes (40.0 KiB) free, 4097 bytes (4.00 KiB) of them promised to the activation "
               "spill's file");
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_TRUE(s.names().empty());
  opt.reserved_bytes = 4096;  // exactly enough beside it
  EXPECT_NO_THROW(build_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt));
  opt.reserved_bytes = uint64_t(1) << 40;  // more than the folder has: refused, no wrap-around
  EXPECT_THROW(ensure_cache(s.path("x.cache"), "key-a", odd_specs(), pattern_fill(), opt),
               std::runtime_error);
}

TEST(CacheBuild, AFillThrowingMidwayLeavesNoFileAndKeepsThePreviousOne) {
  Scratch s;
  auto fill_failing_at = [](size_t bad) {
    return [bad](size_t e, uint64_t off, std::span<std::byte> out) {
      if (e == bad) throw std::domain_error("tensor 'lm_head' could not be read");
      pattern_fill()(e, off, out);
    };
  };
  try {
    build_cache(s.path("w.cache"), "key-a", odd_specs(), fill_failing_at(4), small_chunks());
    FAIL() << "expected the fill's exception";
  } catch (const std::domain_error& e) {  // propagates unchanged
    EXPECT_STREQ(e.what(), "tensor 'lm_head' could not be read");
  }
  EXPECT_TRUE(s.names().empty());  // no cache, no temporary, no owner marker
  // over a valid cache: the old one stays as it was
  ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks());
  EXPECT_THROW(ensure_cache(s.path("w.cache"), "key-b", odd_specs(), fill_failing_at(3), small_chunks()),
               std::domain_error);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"w.cache"}));
  const auto o = CacheFile::open(s.path("w.cache"), "key-a");
  ASSERT_EQ(o.state, CacheState::valid);
  EXPECT_NO_THROW(o.file->verify_all());
}

TEST(CacheBuild, AWriteFailureLeavesNoFile) {
  Scratch s;
  for (const auto& [at, err] : std::vector<std::pair<uint64_t, int>>{{12288, ENOSPC}, {0, EIO}}) {
    auto opt = small_chunks();
    std::vector<uint64_t> writes;
    opt.write_fault = [&, at = at, err = err](uint64_t offset, size_t) {
      writes.push_back(offset);
      return offset == at ? err : 0;
    };
    try {
      build_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt);
      FAIL() << "expected a write failure at " << at;
    } catch (const std::runtime_error& e) {
      EXPECT_HAS(e.what(), s.path("w.cache") + ": writing 4096 bytes at offset " + std::to_string(at) +
                               " failed: " + std::strerror(err));
    }
    EXPECT_EQ(writes.back(), at);
    EXPECT_TRUE(s.names().empty()) << "after a failure at " << at;
  }
}

TEST(CacheBuild, BufferedWritesGiveTheSameFile) {
  Scratch s;
  auto opt = small_chunks();
  const auto direct = build_cache(s.path("a.cache"), "key-a", odd_specs(), pattern_fill(), opt);
  if (!direct.direct) {
    EXPECT_FALSE(direct.buffered_reason.empty());  // a file system without O_DIRECT says why
  }
  opt.direct = false;
  const auto buffered = build_cache(s.path("b.cache"), "key-a", odd_specs(), pattern_fill(), opt);
  EXPECT_FALSE(buffered.direct);
  EXPECT_EQ(buffered.bytes, 36864u);
  EXPECT_EQ(slurp(s.path("a.cache")), slurp(s.path("b.cache")));
  const auto o = CacheFile::open(s.path("b.cache"), "key-a");
  ASSERT_EQ(o.state, CacheState::valid);
  EXPECT_NO_THROW(o.file->verify_all());
}

TEST(CacheBuild, AnODirectWriteRefusedSwitchesToBufferedWrites) {
  Scratch s;
  auto opt = small_chunks();
  int refused = 0;
  opt.write_fault = [&](uint64_t offset, size_t) { return offset == 4096 && refused++ == 0 ? EINVAL : 0; };
  const auto rep = build_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt);
  if (refused == 1 && rep.buffered_reason == "O_DIRECT: Invalid argument")
    GTEST_SKIP() << "this file system refuses O_DIRECT at open: the write fallback is not reached";
  EXPECT_FALSE(rep.direct);
  EXPECT_EQ(rep.buffered_reason, "O_DIRECT write: Invalid argument");
  const auto o = CacheFile::open(s.path("w.cache"), "key-a");
  ASSERT_EQ(o.state, CacheState::valid);
  EXPECT_NO_THROW(o.file->verify_all());  // the refused write was written again, buffered
}

TEST(CacheBuild, AKilledBuildersTemporaryIsCleanedByTheNextBuild) {
  Scratch s;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // a builder killed midway: its temporary and owner marker stay behind
    build_cache(
        s.path("w.cache"), "key-a", odd_specs(),
        [](size_t e, uint64_t, std::span<std::byte>) {
          if (e == 3) ::_exit(0);
        },
        small_chunks());
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string tmp = "w.cache.tmp-" + std::to_string(child);
  ASSERT_EQ(s.names(), (std::vector<std::string>{tmp, tmp + ".roundpipe-owner"}));
  // a name of that form with a dead pid but without our marker is not provably ours: left alone
  { std::ofstream(s.path("w.cache.tmp-999999999")) << "not ours"; }
  const auto r = ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks());
  EXPECT_TRUE(r.built);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"w.cache", "w.cache.tmp-999999999"}));
}

// In a child: builds `path` until its fourth entry, then does what `roundpipe train`'s stop
// handler does (removes the unfinished temporaries, then _Exits 0). Returns the child's exit
// code (1: the build ended first; -1: it did not exit).
int build_until_stop_signal(const std::string& path) {
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ensure_cache(
        path, "key-a", odd_specs(),
        [](size_t e, uint64_t, std::span<std::byte>) {
          if (e == 3) {
            rp::remove_unfinished_temporaries();
            std::_Exit(0);
          }
        },
        small_chunks());
    std::_Exit(1);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// A stop signal during the build (the handler of `roundpipe train` removes the unfinished
// temporaries, then _Exits): neither the half-written cache nor the builders' lock is left.
TEST(CacheBuild, AStopSignalDuringTheBuildLeavesNoTemporaryAndNoLock) {
  Scratch s;
  ASSERT_EQ(build_until_stop_signal(s.path("new/deeper/w.cache")), 0);  // in folders it makes: they go too
  EXPECT_EQ(s.names(), std::vector<std::string>{});
  // a finished build keeps its folders: nothing recorded is left for a later signal to take
  ASSERT_TRUE(
      ensure_cache(s.path("kept/w.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks()).built);
  std::filesystem::remove(s.path("kept/w.cache"));
  rp::remove_unfinished_temporaries();
  EXPECT_EQ(s.names(), std::vector<std::string>{"kept"});
  std::filesystem::remove(s.path("kept"));
  // a lock file another run made is not this run's to remove
  { std::ofstream(s.path("v.cache.lock")) << ""; }
  ASSERT_EQ(build_until_stop_signal(s.path("v.cache")), 0);
  EXPECT_EQ(s.names(), std::vector<std::string>{"v.cache.lock"});
}

TEST(CacheBuild, TwoBuildersAtOnceBuildOnce) {
  Scratch s;
  std::atomic<int> fills_a{0}, fills_b{0};
  std::promise<void> a_filling;
  auto a = std::async(std::launch::async, [&] {
    return ensure_cache(
        s.path("w.cache"), "key-a", odd_specs(),
        [&](size_t e, uint64_t off, std::span<std::byte> out) {
          if (fills_a++ == 0) {
            a_filling.set_value();
            std::this_thread::sleep_for(150ms);  // builder b arrives meanwhile
          }
          pattern_fill()(e, off, out);
        },
        small_chunks());
  });
  a_filling.get_future().wait();
  int waited = 0;
  std::string wait_line;
  auto waiting = small_chunks();
  waiting.on_wait = [&](const std::string& l) {
    ++waited;
    wait_line = l;
  };
  auto b = std::async(std::launch::async, [&] {
    return ensure_cache(
        s.path("w.cache"), "key-a", odd_specs(),
        [&](size_t e, uint64_t off, std::span<std::byte> out) {
          ++fills_b;
          pattern_fill()(e, off, out);
        },
        waiting);
  });
  const auto ra = a.get(), rb = b.get();
  EXPECT_EQ(waited, 1) << "b waited for a's lock without a word";
  EXPECT_HAS(wait_line, s.path("w.cache") + ": another run holds the builders' lock");
  EXPECT_TRUE(ra.built);
  EXPECT_FALSE(rb.built);  // waited for a's lock, then found a's valid file
  EXPECT_EQ(fills_b.load(), 0);
  EXPECT_GT(fills_a.load(), 0);
  std::vector<std::byte> buf(12305);
  rb.file->read_entry(4, buf);
  EXPECT_EQ(first_mismatch(buf.data(), 4, 0, 12305), 12305u);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"w.cache"}));
}

// The builders' lock file goes with the build that created it; one this run did not create (a
// killed run's, or a user's file of that name) stays as it was.
TEST(CacheBuild, TheBuildersLockGoesWithItsCreatorOnly) {
  Scratch s;
  ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks());
  EXPECT_EQ(s.names(), (std::vector<std::string>{"w.cache"}));
  { std::ofstream(s.path("x.cache.lock")) << "a user's notes"; }
  ensure_cache(s.path("x.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks());
  EXPECT_EQ(s.names(), (std::vector<std::string>{"w.cache", "x.cache", "x.cache.lock"}));
  std::ifstream in(s.path("x.cache.lock"));
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "a user's notes");
}

// A stop signal during a build ends the process with remove_unfinished_temporaries (cli/train.cpp):
// the builders' lock this run created goes with the half-written cache (it was left behind).
TEST(CacheBuild, AStopSignalMidBuildTakesTheLockItCreated) {
  Scratch s;
  bool signalled = false, lock_during_build = false, lock_after_signal = true;
  auto fill = [&](size_t e, uint64_t off, std::span<std::byte> out) {
    if (!signalled) {  // the first piece: the lock is held, the temporary open
      signalled = true;
      lock_during_build = std::filesystem::exists(s.path("w.cache.lock"));
      rp::remove_unfinished_temporaries();  // what the signal handler does before std::_Exit
      lock_after_signal = std::filesystem::exists(s.path("w.cache.lock"));
    }
    pattern_fill()(e, off, out);
  };
  EXPECT_ANY_THROW(ensure_cache(s.path("w.cache"), "key-a", odd_specs(), fill, small_chunks()));
  EXPECT_TRUE(lock_during_build);
  EXPECT_FALSE(lock_after_signal);
  EXPECT_TRUE(s.names().empty());
}

// A lock path that cannot be opened is one error, never a retry loop: a dangling symbolic link
// (O_EXCL finds the name, the plain open not its target) and a folder that takes no new files
// (procfs answers ENOENT to O_CREAT, as a race with the lock's creator would). Run in a
// child so that a spinning build fails the test instead of hanging it.
TEST(CacheBuild, ALockPathThatCannotBeOpenedIsAnErrorNotASpin) {
  Scratch s;
  ASSERT_EQ(::symlink(s.path("gone/target").c_str(), s.path("d.cache.lock").c_str()), 0);
  const std::pair<std::string, std::string> cases[] = {
      {s.path("d.cache"), "a symbolic link to a missing file"},
      {"/proc/self/rp-test.cache", std::strerror(ENOENT)}};
  for (const auto& [path, why] : cases) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        ensure_cache(path, "key-a", odd_specs(), pattern_fill(), small_chunks());
      } catch (const std::exception& e) {
        // the cache path the user gave first, then the lock beside it
        const std::string want = path + ": needs a build (no cache file), and it cannot be built here: " +
                                 "cannot open the builders' lock " + path + ".lock (" + why + ")";
        ::_exit(std::string(e.what()) == want ? 0 : 2);
      }
      ::_exit(1);  // opened and built
    }
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 200 && (got = ::waitpid(child, &status, WNOHANG)) == 0; ++i)
      std::this_thread::sleep_for(50ms);
    if (got == 0) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      FAIL() << path << ": still trying to open the lock after 10 s";
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << path << ": exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
        << " (1: built, 2: another error)";
  }
  EXPECT_EQ(s.names(), (std::vector<std::string>{"d.cache.lock"}));  // the link stays; nothing else made
}

// Where no lock can be made beside it (a cache shared on a read-only file system; here its lock
// path is a link to nowhere), a valid cache of the wanted source is reused as it is, its bytes
// read back; a stale one, which would need a build, is refused saying both why it needs one and
// the lock's error, and left.
TEST(CacheBuild, AValidCacheIsReusedWhereNoLockCanBeMade) {
  Scratch s;
  const std::string path = s.path("shared.cache");
  ensure_cache(path, "key-a", odd_specs(), pattern_fill(), small_chunks());
  const auto before = std::filesystem::file_size(path);
  ASSERT_EQ(::symlink(s.path("gone/target").c_str(), (path + ".lock").c_str()), 0);
  CacheBuildOptions verify = small_chunks();
  verify.verify_reused = true;
  const auto r = ensure_cache(path, "key-a", odd_specs(), pattern_fill(), verify);
  EXPECT_FALSE(r.built);
  ASSERT_TRUE(r.file);
  std::vector<std::byte> buf(5000), want(5000);
  r.file->read_entry(0, buf);
  pattern_fill()(0, 0, want);
  EXPECT_EQ(0, std::memcmp(buf.data(), want.data(), want.size()));
  try {
    ensure_cache(path, "key-b", odd_specs(), pattern_fill(), small_chunks());
    ADD_FAILURE() << "rebuilt without a lock";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), path +
                                         ": needs a rebuild (built for source key 'key-a', wanted 'key-b'), "
                                         "and it cannot be rebuilt here: cannot open the builders' lock " +
                                         path + ".lock (a symbolic link to a missing file)");
  }
  EXPECT_EQ(std::filesystem::file_size(path), before);
  const auto again = CacheFile::open(path, "key-a");
  EXPECT_EQ(again.state, CacheState::valid) << again.reason;
}

TEST(CacheBuild, TwoProcessesAtOnceBuildOnce) {
  Scratch s;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the first run: builds, slowly
    ::close(ready[0]);
    bool told = false;
    const auto r = ensure_cache(
        s.path("w.cache"), "key-a", odd_specs(),
        [&](size_t e, uint64_t off, std::span<std::byte> out) {
          if (!told) {
            told = ::write(ready[1], "x", 1) == 1;
            std::this_thread::sleep_for(150ms);
          }
          pattern_fill()(e, off, out);
        },
        small_chunks());
    ::_exit(r.built ? 0 : 1);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);  // the child holds the lock and is filling
  ::close(ready[0]);
  int fills = 0;
  const auto r = ensure_cache(s.path("w.cache"), "key-a", odd_specs(),
                              [&](size_t, uint64_t, std::span<std::byte>) { ++fills; });
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // the child built
  EXPECT_FALSE(r.built);                                       // this run waited and reused it
  EXPECT_EQ(fills, 0);
  EXPECT_NO_THROW(r.file->verify_all());
}

TEST(CacheBuild, AReaderOfTheOldFileReadsItDuringARebuild) {
  Scratch s;
  const auto old =
      ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(1), small_chunks()).file;
  DirectReader reader(old);
  alignas(4096) static std::byte buf[16384];
  // a rebuild for another key renames a new file (other bytes) over the path
  const auto fresh = ensure_cache(s.path("w.cache"), "key-b", odd_specs(), pattern_fill(7), small_chunks());
  ASSERT_TRUE(fresh.built);
  EXPECT_EQ(CacheFile::open(s.path("w.cache"), "key-a").state, CacheState::stale);
  // the old handle still reads the old bytes, checksums and all, buffered and O_DIRECT
  std::vector<std::byte> e4(12305);
  old->read_entry(4, e4);
  EXPECT_EQ(first_mismatch(e4.data(), 4, 0, 12305, 1), 12305u);
  reader.submit({.entry = 4, .dst = buf, .capacity = sizeof(buf)});
  const auto r = reader.next();
  ASSERT_TRUE(r && r->ok()) << (r ? r->error : "no result");
  EXPECT_TRUE(r->verified);
  EXPECT_EQ(first_mismatch(buf, 4, 0, 12305, 1), 12305u);
  // the new file has the new bytes
  fresh.file->read_entry(4, e4);
  EXPECT_EQ(first_mismatch(e4.data(), 4, 0, 12305, 7), 12305u);
}

TEST(CacheBuild, AVerifiedReuseRebuildsADamagedEntryAndNamesIt) {
  Scratch s;
  auto opt = small_chunks();
  opt.verify_reused = true;
  ASSERT_TRUE(ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt).built);
  EXPECT_FALSE(ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt).built);
  flip_byte(s.path("w.cache"), 20480 + 9000);  // lm_head's second checksum block
  const auto r = ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt);
  EXPECT_TRUE(r.built);
  EXPECT_HAS(r.rebuilt_because, "entry 'lm_head'");
  EXPECT_NO_THROW(r.file->verify_all());
  EXPECT_EQ(s.names(), (std::vector<std::string>{"w.cache"}));
}

TEST(CacheBuild, ADamagedEntryBehindASymbolicLinkIsRefusedAndTheLinkKept) {
  Scratch s;
  auto opt = small_chunks();
  opt.verify_reused = true;
  ASSERT_TRUE(ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), opt).built);
  std::filesystem::create_symlink(s.path("w.cache"), s.path("link.cache"));
  flip_byte(s.path("w.cache"), 20480 + 9000);
  try {  // the user's link is not replaced by a file, nor removed
    ensure_cache(s.path("link.cache"), "key-a", odd_specs(), pattern_fill(), opt);
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(), s.path("link.cache") + ": is a symbolic link");
    EXPECT_HAS(e.what(), "entry 'lm_head'");
  }
  EXPECT_TRUE(std::filesystem::is_symlink(s.path("link.cache")));
  EXPECT_EQ(s.names(), (std::vector<std::string>{"link.cache", "w.cache"}));
}

}  // namespace
