// tier/direct_reader: O_DIRECT reads of cache entries through io_uring or the pread pool, in
// submission order, checksums, injected and real read errors, shutdown; and the bandwidth probe.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tier/buffer_ring.hpp"
#include "tier/direct_reader.hpp"
#include "tier_test_util.hpp"

using namespace std::chrono_literals;
using namespace rp::tier;
using namespace rp::tier::testing;

namespace {

std::shared_ptr<const CacheFile> make_cache(const Scratch& s) {
  return ensure_cache(s.path("w.cache"), "key-a", odd_specs(), pattern_fill(), small_chunks()).file;
}

/// Small reads and a shallow queue, so that one entry takes several reads and they queue.
DirectReaderOptions small_reads(IoEngineKind kind) {
  DirectReaderOptions o;
  o.engine = kind;
  o.queue_depth = 2;
  o.max_io_bytes = 4096;
  return o;
}

/// A reader of `kind`, or nullptr after a visible skip when io_uring cannot be set up here.
std::unique_ptr<DirectReader> reader_or_skip(std::shared_ptr<const CacheFile> f, DirectReaderOptions o) {
  try {
    return std::make_unique<DirectReader>(std::move(f), std::move(o));
  } catch (const std::runtime_error& e) {
    return nullptr;
  }
}

class ByEngine : public ::testing::TestWithParam<IoEngineKind> {};

std::string engine_name(const ::testing::TestParamInfo<IoEngineKind>& i) {
  return i.param == IoEngineKind::io_uring ? "io_uring" : "pread_pool";
}

TEST_P(ByEngine, ReadsEveryEntryInSubmissionOrder) {
  Scratch s;
  auto r = reader_or_skip(make_cache(s), small_reads(GetParam()));
  if (!r) GTEST_SKIP() << "io_uring cannot be set up on this machine";
  EXPECT_EQ(r->engine_name().rfind(GetParam() == IoEngineKind::io_uring ? "io_uring" : "pread pool", 0), 0u);
  BufferRing ring(5, 16384);
  std::vector<BufferRing::Lease> leases;
  for (size_t i = 0; i < 5; ++i) {
    leases.push_back(std::move(*ring.acquire(1s)));
    std::memset(leases.back().data(), 0xee, leases.back().bytes());
    EXPECT_EQ(
        r->submit(
            {.entry = i, .dst = leases.back().data(), .capacity = leases.back().bytes(), .tag = 100 + i}),
        i + 1);
  }
  EXPECT_EQ(r->outstanding(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const auto res = r->next();
    ASSERT_TRUE(res);
    ASSERT_TRUE(res->ok()) << res->error;
    EXPECT_EQ(res->ticket, i + 1);
    EXPECT_EQ(res->tag, 100 + i);
    EXPECT_EQ(res->entry, i);
    EXPECT_EQ(res->bytes, odd_specs()[i].bytes);
    EXPECT_TRUE(res->verified);
    EXPECT_EQ(first_mismatch(res->dst, i, 0, res->bytes), res->bytes) << odd_specs()[i].name;
  }
  EXPECT_FALSE(r->next());  // nothing outstanding
}

TEST_P(ByEngine, AnInjectedReadErrorIsOneErrorThenACleanShutdown) {
  Scratch s;
  auto o = small_reads(GetParam());
  // reads: layers.0.attn 0 and 1, layers.0.mlp 2, (empty: none), layers.1.attn 3, lm_head 4..7
  o.fault = fail_nth_read(3, EIO);
  auto r = reader_or_skip(make_cache(s), o);
  if (!r) GTEST_SKIP() << "io_uring cannot be set up on this machine";
  alignas(4096) static std::byte bufs[5][16384];
  for (size_t i = 0; i < 5; ++i) r->submit({.entry = i, .dst = bufs[i], .capacity = 16384});
  std::vector<std::string> errors;
  for (size_t i = 0; i < 5; ++i) {
    const auto res = r->next();
    ASSERT_TRUE(res);
    if (!res->ok()) {
      errors.push_back(res->error);
      EXPECT_EQ(res->entry, 3u);
      EXPECT_EQ(res->error_code, EIO);
      EXPECT_FALSE(res->verified);
    } else {
      EXPECT_EQ(first_mismatch(res->dst, i, 0, res->bytes), res->bytes);
    }
  }
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_HAS(errors[0], s.path("w.cache") +
                            ": entry 'layers.1.attn' at offset 16384: read of 4096 bytes at file offset "
                            "16384 failed: Input/output error");
  // still usable, then shut down with reads queued: returns, no hang
  r->submit({.entry = 4, .dst = bufs[4], .capacity = 16384});
  r->submit({.entry = 0, .dst = bufs[0], .capacity = 16384});
  r->shutdown();
  EXPECT_EQ(r->outstanding(), 0u);
  EXPECT_THROW(r->submit({.entry = 0, .dst = bufs[0], .capacity = 16384}), std::logic_error);
}

TEST_P(ByEngine, AFileTruncatedAfterOpenGivesOneError) {
  Scratch s;
  auto r = reader_or_skip(make_cache(s), small_reads(GetParam()));
  if (!r) GTEST_SKIP() << "io_uring cannot be set up on this machine";
  std::filesystem::resize_file(s.path("w.cache"), 24576);  // lm_head (20480..32785) cut after one block
  alignas(4096) static std::byte bufs[5][16384];
  for (size_t i = 0; i < 5; ++i) r->submit({.entry = i, .dst = bufs[i], .capacity = 16384});
  int failed = 0;
  for (size_t i = 0; i < 5; ++i) {
    const auto res = r->next();
    ASSERT_TRUE(res);
    if (i < 4) {
      EXPECT_TRUE(res->ok()) << res->error;
      continue;
    }
    ++failed;
    EXPECT_EQ(res->error_code, ENODATA);
    EXPECT_HAS(res->error, s.path("w.cache") +
                               ": entry 'lm_head' at offset 20480: short read: 0 of 4096 bytes at "
                               "file offset 24576");
  }
  EXPECT_EQ(failed, 1);
  r->submit({.entry = 4, .dst = bufs[4], .capacity = 16384});
}  // the destructor shuts down with a request outstanding

INSTANTIATE_TEST_SUITE_P(Engines, ByEngine,
                         ::testing::Values(IoEngineKind::io_uring, IoEngineKind::pread_pool), engine_name);

TEST(DirectReader, AFlippedByteIsNamedWithTheEntryAndItsOffset) {
  Scratch s;
  const auto f = make_cache(s);
  flip_byte(s.path("w.cache"), 20480 + 12000);  // in lm_head's last block
  DirectReader r(f);
  alignas(4096) static std::byte a[16384], b[16384];
  r.submit({.entry = 4, .dst = a, .capacity = sizeof(a)});
  r.submit({.entry = 0, .dst = b, .capacity = sizeof(b)});
  const auto bad = r.next();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->error_code, EBADMSG);
  EXPECT_HAS(bad->error,
             s.path("w.cache") + ": entry 'lm_head' at offset 20480 (12305 bytes): checksum mismatch");
  const auto good = r.next();
  ASSERT_TRUE(good && good->ok());  // the next request is unaffected
  // verification off: the bytes as they are
  DirectReaderOptions o;
  o.verify = false;
  DirectReader unverified(f, o);
  unverified.submit({.entry = 4, .dst = a, .capacity = sizeof(a)});
  const auto res = unverified.next();
  ASSERT_TRUE(res && res->ok());
  EXPECT_FALSE(res->verified);
  EXPECT_EQ(first_mismatch(a, 4, 0, 12305), 12000u);
}

TEST(DirectReader, RangesOfWholeBlocksAreVerifiedBlockByBlock) {
  Scratch s;
  const auto f = make_cache(s);
  flip_byte(s.path("w.cache"), 20480 + 9000);  // lm_head's block 1 (bytes 8192..12305)
  DirectReader r(f);
  alignas(4096) static std::byte buf[16384];
  r.submit({.entry = 4, .offset = 0, .bytes = 8192, .dst = buf, .capacity = 8192});
  r.submit({.entry = 4, .offset = 8192, .dst = buf + 8192, .capacity = 8192});
  const auto first = r.next(), second = r.next();
  ASSERT_TRUE(first && first->ok()) << first->error;
  EXPECT_TRUE(first->verified);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->error_code, EBADMSG);
  EXPECT_HAS(second->error, s.path("w.cache") +
                                ": entry 'lm_head' at offset 20480: block 1 (bytes 8192..12305 of "
                                "the entry): checksum mismatch");
  EXPECT_EQ(f->check_blocks(4, 0, buf, 8192), "");  // block 0 still matches
  EXPECT_THROW(f->check_blocks(4, 4096, buf, 4096), std::invalid_argument);
  try {
    f->verify_all();
    FAIL() << "expected a mismatch";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(), "entry 'lm_head' at offset 20480");
  }
}

TEST(DirectReader, ByteRangesAndBadRequests) {
  Scratch s;
  DirectReader r(make_cache(s));
  alignas(4096) static std::byte buf[16384];
  r.submit({.entry = 4, .offset = 8192, .dst = buf, .capacity = sizeof(buf)});  // to the end: 4113 bytes
  r.submit({.entry = 0, .offset = 4096, .bytes = 100, .dst = buf + 8192, .capacity = 4096});
  auto a = r.next(), b = r.next();
  ASSERT_TRUE(a && a->ok() && b && b->ok());
  EXPECT_EQ(a->bytes, 4113u);
  EXPECT_TRUE(a->verified);   // lm_head's last checksum block, whole
  EXPECT_FALSE(b->verified);  // part of a block: returned unverified
  EXPECT_EQ(first_mismatch(buf, 4, 8192, 4113), 4113u);
  EXPECT_EQ(first_mismatch(buf + 8192, 0, 4096, 100), 100u);
  const auto expect_bad = [&](ReadRequest q, const std::string& part) {
    try {
      r.submit(q);
      ADD_FAILURE() << "expected a refusal: " << part;
    } catch (const std::invalid_argument& e) {
      EXPECT_HAS(e.what(), part);
    }
  };
  expect_bad({.entry = 4, .offset = 100, .dst = buf, .capacity = sizeof(buf)},
             "entry 'lm_head': offset 100 is not");
  expect_bad({.entry = 4, .offset = 8192, .bytes = 5000, .dst = buf, .capacity = sizeof(buf)},
             "run past its 12305");
  expect_bad({.entry = 4, .dst = buf + 8, .capacity = 8192}, "not 4096-aligned");
  expect_bad({.entry = 4, .dst = buf, .capacity = 12288}, "a buffer of 12288 bytes, the read needs 16384");
  EXPECT_THROW(r.submit({.entry = 9, .dst = buf, .capacity = sizeof(buf)}), std::out_of_range);
  EXPECT_EQ(r.outstanding(), 0u);
}

TEST(DirectReader, IoUringRefusedFallsBackToPreadThreads) {
  Scratch s;
  set_io_uring_init_failure_for_testing(EPERM);  // as under a seccomp profile
  DirectReader r(make_cache(s), small_reads(IoEngineKind::automatic));
  set_io_uring_init_failure_for_testing(0);
  EXPECT_EQ(r.engine_name().rfind("pread pool", 0), 0u);
  EXPECT_EQ(r.fallback_reason(), "io_uring_queue_init: Operation not permitted");
  alignas(4096) static std::byte buf[16384];
  r.submit({.entry = 4, .dst = buf, .capacity = sizeof(buf)});
  const auto res = r.next();
  ASSERT_TRUE(res && res->ok()) << (res ? res->error : "");
  EXPECT_TRUE(res->verified);
  // asked for explicitly, io_uring failing is an error
  set_io_uring_init_failure_for_testing(ENOSYS);
  EXPECT_THROW(DirectReader(make_cache(s), small_reads(IoEngineKind::io_uring)), std::runtime_error);
  set_io_uring_init_failure_for_testing(0);
}

TEST(DirectReader, BufferedReadsWhenDirectIsOffAndTryNextNeverWaits) {
  Scratch s;
  auto o = small_reads(IoEngineKind::automatic);
  o.direct = false;
  DirectReader r(make_cache(s), o);
  EXPECT_FALSE(r.direct());
  alignas(4096) static std::byte buf[16384];
  EXPECT_FALSE(r.try_next());  // nothing submitted
  r.submit({.entry = 4, .dst = buf, .capacity = sizeof(buf)});
  std::optional<ReadResult> res;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!(res = r.try_next()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(res && res->ok());
  EXPECT_TRUE(res->verified);
  EXPECT_EQ(first_mismatch(buf, 4, 0, 12305), 12305u);
}

TEST(ProbeReadBandwidth, TimesReadsOfTheFile) {
  Scratch s;
  const auto path = s.path("blob");
  {
    std::ofstream f(path, std::ios::binary);
    std::vector<char> block(100000, 'x');
    f.write(block.data(), std::streamsize(block.size()));
  }
  const auto all = probe_read_bandwidth(path, uint64_t(1) << 30, 4, 16384);
  EXPECT_EQ(all.bytes, 100000u);  // the whole file, its unaligned tail included
  EXPECT_GT(all.seconds, 0.0);
  EXPECT_GT(all.gb_per_s, 0.0);
  EXPECT_FALSE(all.engine.empty());
  const auto part = probe_read_bandwidth(path, 32768, 2, 4096, IoEngineKind::pread_pool);
  EXPECT_EQ(part.bytes, 32768u);
  EXPECT_EQ(part.engine.rfind("pread pool", 0), 0u);
  try {
    probe_read_bandwidth(s.path("missing"), 4096);
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(e.what(), s.path("missing") + ": cannot open to time reads");
  }
  EXPECT_THROW(probe_read_bandwidth(path, 4096, 2, 1000), std::invalid_argument);
}

}  // namespace
