// tier/cache_file: the layout, round trip, stale / damaged detection and checksums of the
// disk tier's cache file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "tier/cache_file.hpp"
#include "tier_test_util.hpp"

using namespace rp::tier;
using namespace rp::tier::testing;

namespace {

std::shared_ptr<const CacheFile> build_and_open(const Scratch& s, const std::string& key = "key-a") {
  const auto r = ensure_cache(s.path("w.cache"), key, odd_specs(), pattern_fill(), small_chunks());
  EXPECT_TRUE(r.built);
  return r.file;
}

TEST(CacheFile, RoundTripOfOddSizedEntries) {
  Scratch s;
  const auto f = build_and_open(s);
  ASSERT_TRUE(f);
  const auto specs = odd_specs();
  ASSERT_EQ(f->entries().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& e = f->entry(i);
    EXPECT_EQ(e.name, specs[i].name);
    EXPECT_EQ(e.bytes, specs[i].bytes);
    std::vector<std::byte> buf(e.bytes + 1);
    f->read_entry(i, buf);
    EXPECT_EQ(first_mismatch(buf.data(), i, 0, e.bytes), e.bytes) << e.name;
  }
  EXPECT_NO_THROW(f->verify_all());
  EXPECT_EQ(f->find("lm_head"), std::optional<size_t>(4));
  EXPECT_FALSE(f->find("nope"));
  EXPECT_THROW(f->entry(5), std::out_of_range);
  // a second ensure with the same key and entries reuses the file without filling
  int fills = 0;
  const auto again = ensure_cache(s.path("w.cache"), "key-a", odd_specs(),
                                  [&](size_t, uint64_t, std::span<std::byte>) { ++fills; });
  EXPECT_FALSE(again.built);
  EXPECT_EQ(fills, 0);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"w.cache"}));  // no temporary left
}

TEST(CacheFile, LayoutIsTheDocumentedOne) {
  Scratch s;
  const auto f = build_and_open(s);
  // header 4096; entries at 4096 (5000 -> 8192), 12288 (4096), 16384 (0), 16384 (1 -> 4096), 20480
  const std::vector<uint64_t> offsets{4096, 12288, 16384, 16384, 20480};
  for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(f->entry(i).offset, offsets[i]) << i;
  EXPECT_EQ(f->header_bytes(), 4096u);
  EXPECT_EQ(f->file_bytes(), 36864u);
  EXPECT_EQ(cache_file_bytes("key-a", odd_specs(), 8192), 36864u);
  EXPECT_EQ(f->checksum_block_bytes(), 8192u);
  const std::vector<size_t> blocks{1, 1, 0, 1, 2};  // ceil(bytes / 8192)
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(f->entry(i).block_checksums.size(), blocks[i]) << i;
  const std::string raw = slurp(s.path("w.cache"));
  ASSERT_EQ(raw.size(), 36864u);
  EXPECT_EQ(raw.substr(0, 8), std::string("RPTIERC\n"));
  uint32_t version = 0, count = 0;
  std::memcpy(&version, raw.data() + 8, 4);
  std::memcpy(&count, raw.data() + 12, 4);
  EXPECT_EQ(version, kCacheFormatVersion);
  EXPECT_EQ(count, 5u);
  uint64_t block = 0;
  std::memcpy(&block, raw.data() + 40, 8);
  EXPECT_EQ(block, 8192u);
  EXPECT_EQ(raw.substr(52, 5), "key-a");  // after the u32 key length at 48
  // an entry's bytes sit at its offset, its padding is zeros
  EXPECT_EQ(std::byte(raw[4096 + 4999]), pattern(0, 4999));
  EXPECT_EQ(std::byte(raw[20480]), pattern(4, 0));
  for (size_t i = 4096 + 5000; i < 12288; ++i) ASSERT_EQ(raw[i], 0) << i;
  for (size_t i = 20480 + 12305; i < 36864; ++i) ASSERT_EQ(raw[i], 0) << i;
}

// Long keys without fields that differ deep inside: the reason shows both from the word where
// they differ, not two equal prefixes cut short.
TEST(CacheFile, ALongKeyThatDiffersDeepInsideSaysWhere) {
  Scratch s;
  const std::string common =
      "model /models/qwen3 config.json 1234 bytes modified 1700000000.000000001 "
      "model.safetensors 9876543210 bytes modified ";
  build_and_open(s, common + "1700000001.000000002 inode 5");
  const auto o = CacheFile::open(s.path("w.cache"), common + "1800000009.000000002 inode 5");
  EXPECT_EQ(o.state, CacheState::stale);
  EXPECT_HAS(o.reason, "differs from byte " + std::to_string(common.size() + 1));
  EXPECT_HAS(o.reason, "'...1700000001.000000002 inode 5' where '...1800000009.000000002 inode 5' is wanted");
}

// Keys of fields ("<what>: <part>, <part>"; a model's files with their sizes and times): the
// reason names the field and the part of it that differ, as they were and as they are now.
TEST(CacheFile, AKeyOfFieldsNamesTheFieldThatDiffers) {
  Scratch s;
  const std::string head =
      "tier 3; frozen groups: 30 of 211, 123 bytes, layout xxh3 ab; source: model /m/x.gguf; ";
  build_and_open(s, head + "x.gguf: 1234 bytes, modified 2026-01-01 10:00:00.000000000 UTC, inode 5");
  auto o = CacheFile::open(s.path("w.cache"),
                           head + "x.gguf: 1234 bytes, modified 2026-02-02 11:00:00.000000000 UTC, inode 5");
  EXPECT_EQ(o.state, CacheState::stale);
  EXPECT_EQ(o.reason,
            s.path("w.cache") +
                ": built for another source: x.gguf: modified 2026-01-01 10:00:00.000000000 UTC when "
                "built, modified 2026-02-02 11:00:00.000000000 UTC now");
  o = CacheFile::open(
      s.path("w.cache"),
      "tier 3; frozen groups: 30 of 211, 246 bytes, layout xxh3 cd; source: model /m/x.gguf; x.gguf: "
      "1234 bytes, modified 2026-01-01 10:00:00.000000000 UTC, inode 5");
  EXPECT_HAS(o.reason, "built for another source: frozen groups: 123 bytes when built, 246 bytes now");
  o = CacheFile::open(s.path("w.cache"),
                      head +
                          "x.gguf: 1234 bytes, modified 2026-01-01 10:00:00.000000000 UTC, "
                          "inode 5; y.gguf: 1 bytes, modified 2026-01-01 10:00:00.000000000 UTC");
  EXPECT_HAS(o.reason, "built without 'y.gguf: 1 bytes, modified");
}

TEST(CacheFile, AnotherSourceKeyIsStaleAndRebuilt) {
  Scratch s;
  build_and_open(s, "qwen3-1.7b nf4 layout-v2");
  const auto o = CacheFile::open(s.path("w.cache"), "qwen3-1.7b q8_0 layout-v2");
  EXPECT_EQ(o.state, CacheState::stale);
  EXPECT_FALSE(o.file);
  EXPECT_FALSE(o.foreign);
  EXPECT_HAS(o.reason, s.path("w.cache") +
                           ": built for source key 'qwen3-1.7b nf4 layout-v2', wanted 'qwen3-1.7b q8_0");
  const auto r = ensure_cache(s.path("w.cache"), "qwen3-1.7b q8_0 layout-v2", odd_specs(), pattern_fill(2));
  EXPECT_TRUE(r.built);
  EXPECT_HAS(r.rebuilt_because, "built for source key");
  std::vector<std::byte> buf(5000);
  r.file->read_entry(0, buf);
  EXPECT_EQ(first_mismatch(buf.data(), 0, 0, 5000, 2), 5000u);  // the new content
  // other entries under the same key: rebuilt too
  auto specs = odd_specs();
  specs[1].bytes = 4097;
  const auto r2 = ensure_cache(s.path("w.cache"), "qwen3-1.7b q8_0 layout-v2", specs, pattern_fill());
  EXPECT_TRUE(r2.built);
  EXPECT_HAS(r2.rebuilt_because, "entries are not the ones asked for");
  EXPECT_EQ(r2.file->entry(1).bytes, 4097u);
}

TEST(CacheFile, MissingTruncatedAndForeignFiles) {
  Scratch s;
  const auto path = s.path("w.cache");
  EXPECT_EQ(CacheFile::open(path, "key-a").state, CacheState::missing);
  build_and_open(s);
  std::filesystem::resize_file(path, 20000);
  auto o = CacheFile::open(path, "key-a");
  EXPECT_EQ(o.state, CacheState::damaged);
  EXPECT_EQ(o.reason, path + ": truncated: 20000 bytes, the header says 36864");
  std::filesystem::resize_file(path, 30);
  o = CacheFile::open(path, "key-a");
  EXPECT_EQ(o.state, CacheState::damaged);
  EXPECT_FALSE(o.foreign);  // still starts with our magic: ours to rebuild
  EXPECT_HAS(o.reason, path + ": truncated: 30 bytes");
  const auto r = ensure_cache(path, "key-a", odd_specs(), pattern_fill());
  EXPECT_TRUE(r.built);
  EXPECT_HAS(r.rebuilt_because, "truncated: 30 bytes");

  // a file that is not a tier cache is never replaced
  const auto other = s.path("notes.txt");
  { std::ofstream(other) << "the user's notes, not a cache"; }
  o = CacheFile::open(other, "key-a");
  EXPECT_EQ(o.state, CacheState::damaged);
  EXPECT_TRUE(o.foreign);
  try {
    ensure_cache(other, "key-a", odd_specs(), pattern_fill());
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    // the path once, the reason once
    EXPECT_EQ(std::string(e.what()),
              other +
                  ": exists and is not a roundpipe tier cache (no RPTIERC magic at its "
                  "start); move it away or choose another cache path (nothing was written)");
  }
  EXPECT_EQ(slurp(other), "the user's notes, not a cache");
  // an empty file: its reason said once too
  const auto empty = s.path("empty.cache");
  { std::ofstream{empty}; }
  try {
    ensure_cache(empty, "key-a", odd_specs(), pattern_fill());
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              empty +
                  ": exists and is not a roundpipe tier cache (empty); move it away or "
                  "choose another cache path (nothing was written)");
  }
  // a user's file as short as a prefix of the magic is left alone too
  const auto letter = s.path("letter.txt");
  { std::ofstream(letter) << "RP"; }
  EXPECT_THROW(ensure_cache(letter, "key-a", odd_specs(), pattern_fill()), std::runtime_error);
  EXPECT_EQ(slurp(letter), "RP");

  // a symbolic link: a valid cache is reused through it, a rebuild is refused
  std::filesystem::create_symlink(path, s.path("link.cache"));
  EXPECT_FALSE(ensure_cache(s.path("link.cache"), "key-a", odd_specs(), pattern_fill()).built);
  try {
    ensure_cache(s.path("link.cache"), "key-b", odd_specs(), pattern_fill());
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(), s.path("link.cache") + ": is a symbolic link");
  }
  EXPECT_TRUE(std::filesystem::is_symlink(s.path("link.cache")));
  EXPECT_EQ(CacheFile::open(path, "key-a").state, CacheState::valid);

  // a named pipe at the path: refused at once as not a regular file (an open without
  // O_NONBLOCK would wait for a writer forever), and left where it is
  const auto fifo = s.path("fifo.cache");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  o = CacheFile::open(fifo, "key-a");
  EXPECT_EQ(o.state, CacheState::damaged);
  EXPECT_TRUE(o.foreign);
  EXPECT_EQ(o.reason, fifo + ": not a regular file");
  EXPECT_THROW(ensure_cache(fifo, "key-a", odd_specs(), pattern_fill()), std::runtime_error);
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
}

TEST(CacheFile, AFlippedHeaderByteIsDamaged) {
  Scratch s;
  build_and_open(s);
  flip_byte(s.path("w.cache"), 52 + 5 + 4 + 3);  // inside the first entry's name
  const auto o = CacheFile::open(s.path("w.cache"), "key-a");
  EXPECT_EQ(o.state, CacheState::damaged);
  EXPECT_HAS(o.reason, s.path("w.cache") + ": header checksum mismatch");
  flip_byte(s.path("w.cache"), 52 + 5 + 4 + 3);  // flipped back: valid again
  EXPECT_EQ(CacheFile::open(s.path("w.cache"), "key-a").state, CacheState::valid);
  flip_byte(s.path("w.cache"), 8);  // the version
  EXPECT_EQ(CacheFile::open(s.path("w.cache"), "key-a").state, CacheState::stale);
}

TEST(CacheFile, AFlippedEntryByteIsNamedWithItsOffset) {
  Scratch s;
  build_and_open(s);
  flip_byte(s.path("w.cache"), 20480 + 7);  // inside lm_head
  const auto o = CacheFile::open(s.path("w.cache"), "key-a");
  ASSERT_EQ(o.state, CacheState::valid);  // the header does not cover the entries' bytes
  std::vector<std::byte> buf(12305);
  try {
    o.file->read_entry(4, buf);
    FAIL() << "expected a checksum mismatch";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(),
               s.path("w.cache") + ": entry 'lm_head' at offset 20480 (12305 bytes): checksum mismatch");
  }
  EXPECT_NO_THROW(o.file->read_entry(0, buf));  // the others are fine
  try {
    o.file->verify_all();
    FAIL() << "expected a checksum mismatch";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(), "entry 'lm_head' at offset 20480");
  }
}

// Checking a reused cache reads the whole base once; like a build, it leaves none of it in the
// page cache (a base larger than the host's memory would otherwise push out what the run needs).
TEST(CacheFile, VerifyAllLeavesTheFileOutOfThePageCache) {
  Scratch s;
  const auto path = s.path("w.cache");
  std::vector<CacheEntrySpec> specs{{"big", uint64_t(4) << 20}};
  build_cache(path, "key-a", specs, pattern_fill(), small_chunks());
  auto resident_pages = [&] {
    const size_t bytes = std::filesystem::file_size(path);
    const int fd = ::open(path.c_str(), O_RDONLY);
    void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    std::vector<unsigned char> in((bytes + 4095) / 4096);
    const int rc = ::mincore(map, bytes, in.data());
    ::munmap(map, bytes);
    ::close(fd);
    size_t n = 0;
    for (unsigned char c : in) n += rc == 0 && (c & 1);
    return n;
  };
  (void)slurp(path);  // in the page cache now, where the file system keeps one
  if (resident_pages() == 0) GTEST_SKIP() << "this file system keeps no page cache to test";
  {  // and drops it when asked (tmpfs does not: its pages are the file)
    const int fd = ::open(path.c_str(), O_RDONLY);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  if (resident_pages() > 1) GTEST_SKIP() << "this file system keeps its pages when asked to drop them";
  (void)slurp(path);
  ASSERT_GT(resident_pages(), 1u);
  const auto o = CacheFile::open(path, "key-a");
  ASSERT_EQ(o.state, CacheState::valid);
  o.file->verify_all();
  // what open read of the header may stay (with the kernel's read-ahead): a few of 1026 pages
  EXPECT_LE(resident_pages(), 8u);
}

TEST(CacheFile, BlockChecksumsDoNotDependOnTheFillChunks) {
  Scratch s;
  const std::vector<CacheEntrySpec> specs{{"a", 30000}, {"b", 12288}, {"c", 5}};
  CacheBuildOptions small, large;
  small.chunk_bytes = 4096, small.checksum_block_bytes = 12288;   // blocks span chunks
  large.chunk_bytes = 16384, large.checksum_block_bytes = 12288;  // chunks span blocks
  build_cache(s.path("small.cache"), "k", specs, pattern_fill(), small);
  build_cache(s.path("large.cache"), "k", specs, pattern_fill(), large);
  EXPECT_EQ(slurp(s.path("small.cache")), slurp(s.path("large.cache")));
  const auto o = CacheFile::open(s.path("small.cache"), "k");
  ASSERT_EQ(o.state, CacheState::valid);
  EXPECT_NO_THROW(o.file->verify_all());
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<std::byte> want(specs[i].bytes);
    for (size_t k = 0; k < want.size(); ++k) want[k] = pattern(i, k);
    EXPECT_EQ(o.file->entry(i).block_checksums.size(), (specs[i].bytes + 12287) / 12288);
    for (uint64_t at = 0; at < want.size(); at += 12288)  // each block against its own checksum
      EXPECT_EQ(o.file->check_blocks(i, at, want.data() + at, std::min<uint64_t>(12288, want.size() - at)),
                "")
          << specs[i].name << " block " << at / 12288;
  }
}

TEST(CacheFile, EveryFlippedHeaderByteAndEveryTruncationIsCaught) {
  Scratch s;
  const auto path = s.path("w.cache");
  build_and_open(s);
  const std::string good = slurp(path);
  // the header proper: preamble 52 + key 5 + entries (4 + name + 24 + 8 per 8192-byte block)
  // + checksum 8
  size_t used = 52 + 5 + 8;
  for (const auto& e : odd_specs()) used += 4 + e.name.size() + 24 + 8 * ((e.bytes + 8191) / 8192);
  for (size_t at = 0; at < used; ++at) {
    flip_byte(path, at);
    const auto o = CacheFile::open(path, "key-a");
    EXPECT_NE(o.state, CacheState::valid) << "byte " << at;
    EXPECT_EQ(o.state, at >= 8 && at < 12 ? CacheState::stale : CacheState::damaged) << "byte " << at;
    EXPECT_EQ(o.foreign, at < 8) << "byte " << at;  // only a bad magic makes it someone else's
    EXPECT_EQ(o.reason.find('\n'), std::string::npos);
    flip_byte(path, at);
  }
  flip_byte(path, used + 10);  // the header's zero padding: not covered, harmless
  EXPECT_EQ(CacheFile::open(path, "key-a").state, CacheState::valid);
  for (uint64_t size : {1, 7, 8, 43, 51, 52, 100, 4095, 4096, 4097, 16384, 36863}) {
    std::filesystem::resize_file(path, size);
    const auto o = CacheFile::open(path, "key-a");
    EXPECT_EQ(o.state, CacheState::damaged) << size;
    // cut inside the magic: no longer provably ours (a user's one-byte "R" looks the same)
    EXPECT_EQ(o.foreign, size < 8) << size;
    EXPECT_HAS(o.reason, path + (size < 8 ? ": not a roundpipe tier cache" : ": truncated"));
    std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
  }
  std::ofstream(path, std::ios::binary | std::ios::app) << "x";  // longer than the header says
  EXPECT_EQ(CacheFile::open(path, "key-a").reason, path + ": 36865 bytes, the header says 36864");
}

}  // namespace
