// tier/cache_file: what ensure_cache says when it cannot use or replace the cache at a path (a
// file it cannot read, a damaged cache where no lock can be made), and what its result says
// about a wait for another builder.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/as_unprivileged.hpp"
#include "tier/cache_file.hpp"
#include "tier_test_util.hpp"

using namespace std::chrono_literals;
using namespace rp::tier;
using namespace rp::tier::testing;

namespace {

std::string refusal(const std::string& path, const std::string& key, const CacheBuildOptions& opt) {
  try {
    ensure_cache(path, key, odd_specs(), pattern_fill(), opt);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(accepted)";
}

// A file at the path that cannot be read is said to be unreadable, with the system's reason, not
// "not a roundpipe tier cache"; it is left as it was. A loop of symbolic links (root too gets
// ELOOP), and a cache without read permission (run as nobody when root, who reads any file).
TEST(CacheRefusals, AFileThatCannotBeReadIsSaidSoAndLeft) {
  Scratch s;
  std::filesystem::create_symlink(s.path("b.cache"), s.path("a.cache"));
  std::filesystem::create_symlink(s.path("a.cache"), s.path("b.cache"));
  const auto o = CacheFile::open(s.path("a.cache"), "key-a");
  EXPECT_TRUE(o.unreadable);
  EXPECT_TRUE(o.foreign) << "never replaced";
  const std::string loop = refusal(s.path("a.cache"), "key-a", small_chunks());
  EXPECT_EQ(loop.rfind(s.path("a.cache") + ": cannot be read (" + std::strerror(ELOOP) + "); ", 0), 0u)
      << loop;
  EXPECT_EQ(loop.find("not a roundpipe tier cache"), std::string::npos) << loop;
  EXPECT_HAS(loop, "(nothing was written)");

  ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks());
  ::chmod(s.dir.c_str(), 0777);  // the lock beside it can be made by anyone
  ::chmod(s.path("w.cache").c_str(), 0);
  const std::string denied =
      rp::testing::as_unprivileged([&] { return refusal(s.path("w.cache"), "key-a", small_chunks()); });
  ::chmod(s.path("w.cache").c_str(), 0644);
  if (denied == rp::testing::kNoDrop) GTEST_SKIP() << "running as root and cannot become nobody";
  EXPECT_EQ(denied.rfind(s.path("w.cache") + ": cannot be read (" + std::strerror(EACCES) + "); ", 0), 0u)
      << denied;
  EXPECT_EQ(denied.find("not a roundpipe tier cache"), std::string::npos) << denied;
  EXPECT_EQ(CacheFile::open(s.path("w.cache"), "key-a").state, CacheState::valid) << "left as it was";
}

// A file where the cache's folder goes: the line names that file, not "File exists" of a folder
// below it; nothing is made.
TEST(CacheRefusals, AFileWhereAFolderGoesIsNamed) {
  Scratch s;
  { std::ofstream(s.path("f")) << "x"; }
  const std::string e = refusal(s.path("f") + "/a/b/w.cache", "key-a", small_chunks());
  EXPECT_EQ(e, "cannot create the cache's folder: '" + s.path("f") + "/a/b' lies under '" + s.path("f") +
                   "', which is a file, not a folder");
  const std::string direct = refusal(s.path("f") + "/w.cache", "key-a", small_chunks());
  EXPECT_EQ(direct, "cannot create the cache's folder: '" + s.path("f") + "' is a file, not a folder");
  EXPECT_EQ(s.names(), (std::vector<std::string>{"f"}));
}

// A damaged cache where no builders' lock can be made (its lock path a link to nowhere, as a
// read-only folder would refuse it) is refused naming the damage and the lock, and left.
TEST(CacheRefusals, ADamagedCacheWhereNoLockCanBeMadeNamesTheDamageAndTheLock) {
  Scratch s;
  const std::string path = s.path("shared.cache");
  auto opt = small_chunks();
  opt.verify_reused = true;
  ensure_cache(path, "key-a", odd_specs(), pattern_fill(), opt);
  ASSERT_EQ(::symlink(s.path("gone/target").c_str(), (path + ".lock").c_str()), 0);
  flip_byte(path, 20480 + 9000);  // lm_head's second checksum block
  const std::string e = refusal(path, "key-a", opt);
  EXPECT_EQ(e.rfind(path + ": needs a rebuild (entry 'lm_head' at offset 20480", 0), 0u) << e;
  EXPECT_HAS(e, "checksum mismatch");
  EXPECT_HAS(e, "and it cannot be rebuilt here: cannot open the builders' lock " + path + ".lock (");
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // none there at all: it needs a build
  const std::string none = s.path("none.cache");
  ASSERT_EQ(::symlink(s.path("gone/target").c_str(), (none + ".lock").c_str()), 0);
  const std::string m = refusal(none, "key-a", opt);
  EXPECT_EQ(m.rfind(none + ": needs a build (no cache file), and it cannot be built here: ", 0), 0u) << m;
}

// A run that waited for another run's lock says so, and what it found after the wait decides the
// rest: another run's cache of another key is replaced (and the reason kept), though the path
// held no file when this run first looked.
TEST(CacheRefusals, WhatAppearedDuringTheWaitIsWhatTheResultSays) {
  Scratch s;
  std::promise<void> a_filling;
  bool told = false;
  auto a = std::async(std::launch::async, [&] {
    return ensure_cache(
        s.path("w.cache"), "key-a", odd_specs(),
        [&](size_t e, uint64_t off, std::span<std::byte> out) {
          if (!told) {
            told = true;
            a_filling.set_value();
            std::this_thread::sleep_for(150ms);  // b arrives meanwhile, finds no file, waits
          }
          pattern_fill()(e, off, out);
        },
        small_chunks());
  });
  a_filling.get_future().wait();
  ASSERT_FALSE(std::filesystem::exists(s.path("w.cache")));
  auto b = std::async(std::launch::async, [&] {
    return ensure_cache(s.path("w.cache"), "key-b", odd_specs(), pattern_fill(2), small_chunks());
  });
  const auto ra = a.get(), rb = b.get();
  EXPECT_TRUE(ra.built);
  EXPECT_FALSE(ra.replaced) << "a found no file";
  EXPECT_FALSE(ra.waited);
  EXPECT_TRUE(rb.built);
  EXPECT_TRUE(rb.waited);
  EXPECT_TRUE(rb.replaced) << "a's file was there once b held the lock";
  EXPECT_HAS(rb.rebuilt_because, "built for source key 'key-a', wanted 'key-b'");
  // nothing in the way: built, nothing replaced, no wait
  const auto rc = ensure_cache(s.path("x.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks());
  EXPECT_TRUE(rc.built);
  EXPECT_FALSE(rc.replaced);
  EXPECT_FALSE(rc.waited);
}

}  // namespace
