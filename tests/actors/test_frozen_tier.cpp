// The disk tier in the runtime (SessionOptions::frozen_tier): a LoRA model's frozen base
// streams from a cache file through a ring of read buffers.
//  - training with the tier equals training with the base in host memory bit for bit (losses,
//    adapters, the base read back), with 1 and 2 workers and the smallest ring (2 buffers),
//    and the base's host copies are gone;
//  - Session::frozen_tier_reads counts what the run read;
//  - a second session on the same file reuses it; another base rebuilds it;
//  - a file damaged between runs (an entry's bytes, the header) is found and rebuilt, and says why;
//  - a read that fails mid-run ends the run with one error naming the file, in bounded time;
//  - bad options (an unwritable path, a budget below two buffers, an empty path) are refused
//    with one line naming the option.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>
#include <unistd.h>

#include "actors/session_testing.hpp"
#include "scheduler/disk_tier.hpp"
#include "tests/actors/frozen_tier_fixture.hpp"
#include "tests/actors/runtime_reference.hpp"
#include "tier/direct_reader.hpp"

namespace rp::test {
namespace {

using namespace tier_fixture;

class ByWorkers : public ::testing::TestWithParam<int> {};

TEST_P(ByWorkers, StreamingTheBaseTrainsBitForBitLikeHoldingIt) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  ASSERT_GT(frozen_bytes(m), 0u);
  TestSession off(m, random_weights(m, 7), options(GetParam(), nullptr));
  const Result base = train(off);
  std::vector<std::string> log;
  TestSessionOptions o = options(GetParam(), &log);
  o.frozen_tier = tier_at(sc.path("base.cache"));  // the minimum ring: 2 buffers
  TestSession on(m, random_weights(m, 7), o);
  const FrozenTierReport& rep = on.frozen_tier();
  ASSERT_TRUE(rep.enabled);
  EXPECT_TRUE(rep.built);
  EXPECT_EQ(rep.ring_buffers, 2u);
  EXPECT_EQ(rep.bytes, frozen_bytes(m));
  EXPECT_TRUE(fs::exists(sc.path("base.cache")));
  // the base's host copies are gone: only the pinning accounting of the other buffers is left
  EXPECT_EQ(off.host_pinning().pinned_bytes - on.host_pinning().pinned_bytes, frozen_bytes(m));
  bool logged = false;
  for (const auto& l : log) logged |= l.rfind("frozen tier: " + sc.path("base.cache") + ": built (", 0) == 0;
  EXPECT_TRUE(logged) << "no start line; got " << log.size() << " lines";
  const Result tiered = train(on);
  ASSERT_EQ(tiered.losses.size(), size_t(kSteps));
  EXPECT_EQ(tiered.losses, base.losses);
  ASSERT_EQ(tiered.weights.size(), base.weights.size());
  for (size_t g = 0; g < base.weights.size(); ++g)
    EXPECT_EQ(tiered.weights[g], base.weights[g]) << m.groups[g].name;
  EXPECT_NE(base.weights, std::vector<std::vector<float>>(base.weights.size()));
}

INSTANTIATE_TEST_SUITE_P(FrozenTier, ByWorkers, ::testing::Values(1, 2),
                         [](const auto& i) { return std::to_string(i.param) + "_workers"; });

// frozen_tier.resident_gib keeps the planner's choice of groups in host memory (decoders'
// first, scheduler/disk_tier.hpp) and streams only the rest: the cache holds exactly those,
// the run equals one without the tier bit for bit, and a room for the whole base opens no tier.
TEST(FrozenTier, KeepingPartOfTheBaseResidentStreamsOnlyTheRest) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  const std::vector<int> order = residency_order(m);
  ASSERT_GE(order.size(), 3u);
  // room for the first two groups of the order, in GiB (a hair more, for the rounding)
  const double kept =
      double(m.groups[size_t(order[0])].storage_bytes + m.groups[size_t(order[1])].storage_bytes);
  TestSession off(m, random_weights(m, 7), options(2, nullptr));
  const Result base = train(off);
  std::vector<std::string> log;
  TestSessionOptions o = options(2, &log);
  o.frozen_tier = tier_at(sc.path("base.cache"));
  o.frozen_tier->resident_gib = (kept + 0.5) / double(uint64_t(1) << 30);
  TestSession on(m, random_weights(m, 7), o);
  const FrozenTierReport& rep = on.frozen_tier();
  ASSERT_TRUE(rep.enabled);
  EXPECT_EQ(double(rep.bytes), double(frozen_bytes(m))) << "the cache holds every frozen group";
  EXPECT_TRUE(rep.built);
  EXPECT_EQ(double(rep.resident_bytes), kept);
  EXPECT_NE(rep.line.find("of the base resident"), std::string::npos) << rep.line;
  const Result tiered = train(on);
  EXPECT_EQ(tiered.losses, base.losses);
  ASSERT_EQ(tiered.weights.size(), base.weights.size());
  for (size_t g = 0; g < base.weights.size(); ++g)
    EXPECT_EQ(tiered.weights[g], base.weights[g]) << m.groups[g].name;

  {  // another residency (all streamed) reuses the same file: it holds every group
    TestSessionOptions again = options(1, nullptr);
    again.frozen_tier = tier_at(sc.path("base.cache"));
    TestSession s2(m, random_weights(m, 7), again);
    EXPECT_FALSE(s2.frozen_tier().built) << s2.frozen_tier().rebuilt_because;
    EXPECT_EQ(train(s2).losses, base.losses);
  }
  TestSessionOptions all = options(1, nullptr);
  all.frozen_tier = tier_at(sc.path("unused.cache"));
  all.frozen_tier->resident_gib = double(frozen_bytes(m) + 1) / double(uint64_t(1) << 30);
  TestSession whole(m, random_weights(m, 7), all);
  EXPECT_FALSE(whole.frozen_tier().enabled) << "the whole base fits: nothing streams";
  EXPECT_FALSE(fs::exists(sc.path("unused.cache")));

  TestSessionOptions bad = options(1, nullptr);
  bad.frozen_tier = tier_at(sc.path("bad.cache"));
  bad.frozen_tier->resident_gib = -1;
  try {
    TestSession b(m, random_weights(m, 7), bad);
    ADD_FAILURE() << "a negative resident_gib was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("frozen_tier.resident_gib: ", 0), 0u) << e.what();
  }
}

// Session::frozen_tier_reads counts the tier's reads: every iteration uploads each streamed
// group at least once (its forward stage) and at most twice (and its backward stage), so kSteps
// iterations read between kSteps and 2 (kSteps + 1) times the streamed bytes (a prefetch of
// the next iteration included); groups kept resident are never read; no tier, no reads.
TEST(FrozenTier, ReadTotalsCountTheStreamedUploads) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  TestSessionOptions o = options(1, nullptr);
  o.frozen_tier = tier_at(sc.path("base.cache"));
  TestSession on(m, random_weights(m, 7), o);
  EXPECT_EQ(on.frozen_tier_reads().bytes, 0u) << "nothing read before the first step";
  train(on);
  const FrozenTierReads r = on.frozen_tier_reads();
  const double streamed = double(frozen_bytes(m));
  EXPECT_GE(double(r.bytes), kSteps * streamed);
  EXPECT_LE(double(r.bytes), 2 * (kSteps + 1) * streamed);
  EXPECT_GE(r.reads, uint64_t(kSteps) * 2) << "at least two streamed groups per iteration";
  EXPECT_GT(r.seconds, 0);

  const std::vector<int> order = residency_order(m);
  ASSERT_GE(order.size(), 3u);
  TestSessionOptions part = options(1, nullptr);
  part.frozen_tier = tier_at(sc.path("base.cache"));
  const uint64_t kept = m.groups[size_t(order[0])].storage_bytes;
  part.frozen_tier->resident_gib = (double(kept) + 0.5) / double(uint64_t(1) << 30);
  TestSession p(m, random_weights(m, 7), part);
  train(p);
  const FrozenTierReads pr = p.frozen_tier_reads();
  EXPECT_GE(double(pr.bytes), kSteps * (streamed - double(kept)));
  EXPECT_LE(double(pr.bytes), 2 * (kSteps + 1) * (streamed - double(kept)));

  TestSession off(m, random_weights(m, 7), options(1, nullptr));
  train(off);
  EXPECT_EQ(off.frozen_tier_reads().reads, 0u);
  EXPECT_EQ(off.frozen_tier_reads().bytes, 0u);
}

TEST(FrozenTier, ASecondSessionReusesTheCacheAndAnotherBaseRebuildsIt) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  TestSessionOptions o = options(1, nullptr);
  o.frozen_tier = tier_at(sc.path("base.cache"), 1.0);
  fs::file_time_type written;
  {
    TestSession a(m, random_weights(m, 7), o);
    EXPECT_TRUE(a.frozen_tier().built);
    EXPECT_FALSE(a.frozen_tier().replaced) << "no file was there";
    EXPECT_EQ(a.frozen_tier().line.find("rebuilt because"), std::string::npos) << a.frozen_tier().line;
    EXPECT_GT(a.frozen_tier().ring_buffers, 2u);  // a GiB holds many buffers of this model
    written = fs::last_write_time(sc.path("base.cache"));
  }
  std::vector<std::string> log;
  TestSessionOptions o2 = options(1, &log);
  o2.frozen_tier = o.frozen_tier;
  {
    TestSession b(m, random_weights(m, 7), o2);
    EXPECT_FALSE(b.frozen_tier().built);
    EXPECT_NE(b.frozen_tier().line.find(": reused ("), std::string::npos) << b.frozen_tier().line;
    EXPECT_EQ(fs::last_write_time(sc.path("base.cache")), written);
    EXPECT_EQ(train(b).losses.size(), size_t(kSteps));
  }
  TestSession c(m, random_weights(m, 8), o);  // another base: the file is stale, the line says which input
  EXPECT_TRUE(c.frozen_tier().built);
  EXPECT_TRUE(c.frozen_tier().replaced);
  EXPECT_NE(c.frozen_tier().rebuilt_because.find("built for another source: weights given in memory: "),
            std::string::npos)
      << c.frozen_tier().rebuilt_because;
  EXPECT_NE(c.frozen_tier().line.find("; rebuilt because "), std::string::npos) << c.frozen_tier().line;
}

// A base stored in another format is named by its formats in words, before its bytes: the
// same bytes (bf16 -> f16) and twice the bytes (bf16 -> f32) alike.
TEST(FrozenTier, ABaseInAnotherFormatIsNamedByItsFormats) {
  Scratch sc;
  TestSessionOptions o = options(1, nullptr);
  o.frozen_tier = tier_at(sc.path("base.cache"), 1.0);
  const auto because = [&](WeightFormat f) {
    const ModelLayout m = lora_layout(4, f);
    TestSession s(m, random_weights(m, 7), o);
    return s.frozen_tier().rebuilt_because;
  };
  because(WeightFormat::bf16);  // built: no cache file yet
  const std::string f16 = because(WeightFormat::f16);
  because(WeightFormat::bf16);  // built for bf16 again
  const std::string f32 = because(WeightFormat::f32);
  for (const std::string& r : {f16, f32}) {
    EXPECT_NE(r.find("frozen groups: storage formats bf16 ("), std::string::npos) << r;
    EXPECT_EQ(r.find("xxh3"), std::string::npos) << r;
    EXPECT_EQ(r.find(" bytes when built"), std::string::npos) << r;
  }
  EXPECT_NE(f16.find(" tensors) when built, storage formats f16 ("), std::string::npos) << f16;
  EXPECT_NE(f32.find(" tensors) when built, storage formats f32 ("), std::string::npos) << f32;
}

// Flips one byte of the file at `offset`.
void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  f.seekg(std::streamoff(offset));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x5a);
  f.seekp(std::streamoff(offset));
  f.write(&c, 1);
}

TEST(FrozenTier, ACacheDamagedBetweenRunsIsFoundAndRebuilt) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  TestSession off(m, random_weights(m, 7), options(1, nullptr));
  const Result base = train(off);
  TestSessionOptions o = options(1, nullptr);
  o.frozen_tier = tier_at(sc.path("base.cache"));
  uint64_t first_entry = 0;
  {
    TestSession a(m, random_weights(m, 7), o);
    ASSERT_TRUE(a.frozen_tier().built);
    auto opened = tier::CacheFile::open(sc.path("base.cache"), "any key");  // stale, but the header is read
    EXPECT_EQ(opened.state, tier::CacheState::stale);
  }
  // an entry's bytes: the header stays valid, the entry's checksum does not
  {
    std::ifstream f(sc.path("base.cache"), std::ios::binary);
    char hdr[24];
    f.read(hdr, 24);
    std::memcpy(&first_entry, hdr + 16, 8);  // the header's size: where the first entry starts
  }
  ASSERT_GT(first_entry, 0u);
  flip_byte(sc.path("base.cache"), first_entry + 100);
  std::vector<std::string> log;
  TestSessionOptions o2 = options(1, &log);
  o2.frozen_tier = o.frozen_tier;
  {
    TestSession b(m, random_weights(m, 7), o2);
    EXPECT_TRUE(b.frozen_tier().built);
    EXPECT_NE(b.frozen_tier().rebuilt_because.find("checksum mismatch"), std::string::npos)
        << b.frozen_tier().rebuilt_because;
    EXPECT_NE(b.frozen_tier().line.find("rebuilt because"), std::string::npos) << b.frozen_tier().line;
    const Result r = train(b);
    EXPECT_EQ(r.losses, base.losses);
  }
  // the header: the file is damaged, rebuilt with the reason
  flip_byte(sc.path("base.cache"), 30);
  TestSession c(m, random_weights(m, 7), o);
  EXPECT_TRUE(c.frozen_tier().built);
  EXPECT_FALSE(c.frozen_tier().rebuilt_because.empty());
  EXPECT_EQ(train(c).losses, base.losses);
}

TEST(FrozenTier, AReadFailingMidRunEndsItWithOneErrorAndNoHang) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  TestSessionOptions o = options(2, nullptr);
  o.frozen_tier = tier_at(sc.path("base.cache"));
  o.frozen_tier_fault = tier::fail_nth_read(5, EIO);
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  {
    TestSession s(m, random_weights(m, 7), o);
    what = run_until_failure(s);
  }  // the teardown must not hang either
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), kWaitS);
  EXPECT_NE(what.find(sc.path("base.cache")), std::string::npos) << what;
  EXPECT_NE(what.find("offset"), std::string::npos) << what;
  EXPECT_NE(what.find("disk tier"), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
}

// A failed read names the stage whose weights it was reading: the stage running, or the later one
// whose weights were being read ahead. The entry's layer lies in the layers of the stage named.
// (Without the stage named, the line named only the running stage, whose layers hold none of a
// read-ahead entry's.)
TEST(FrozenTier, AFailedReadNamesTheStageWhoseWeightsItRead) {
  Scratch sc;
  const ModelLayout m = lora_layout(6);
  const std::regex entry("entry 'layer\\.([0-9]+)'");
  const std::regex ahead(
      "while prefetching those of [a-z]+ stage [0-9]+ of pass [0-9]+, layers (-?[0-9]+)-([0-9]+):");
  const std::regex running(
      "^worker [0-9]+ \\([a-z]+ stage [0-9]+ of pass [0-9]+, layers (-?[0-9]+)-([0-9]+)\\): "
      "reading this stage's frozen weights");
  int prefetches = 0, layer_reads = 0;
  for (uint64_t n : {2, 4, 6, 9, 12, 15}) {
    TestSessionOptions o = options(2, nullptr);
    o.frozen_tier = tier_at(sc.path("base.cache"));
    o.frozen_tier_fault = tier::fail_nth_read(n, EIO);
    std::string what;
    {
      TestSession s(m, random_weights(m, 7), o);
      what = run_until_failure(s);
    }
    std::smatch e, st;
    if (!std::regex_search(what, e, entry)) continue;  // not a layer's group (the embedding, the head)
    ++layer_reads;
    const bool prefetch = std::regex_search(what, st, ahead);
    ASSERT_TRUE(prefetch || std::regex_search(what, st, running)) << what;
    prefetches += prefetch;
    // the plan counts the embedding as layer 0: group layer.k is the plan's layer k + 1
    const int layer = std::stoi(e[1]) + 1, first = std::stoi(st[1]), last = std::stoi(st[2]);
    EXPECT_TRUE(first <= layer && layer <= last) << "read " << n << ": " << what;
  }
  EXPECT_GT(layer_reads, 0);
  EXPECT_GT(prefetches, 0) << "no read failed while another stage ran: the case is not exercised";
}

TEST(FrozenTier, BadOptionsAreRefusedWithOneLineNamingTheOption) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  const auto refused = [&](const FrozenTierOptions& t) -> std::string {
    TestSessionOptions o = options(1, nullptr);
    o.frozen_tier = t;
    try {
      TestSession s(m, random_weights(m, 7), o);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(accepted)";
  };
  {
    std::ofstream(sc.path("a_file")) << "not a folder";
    const std::string e = refused(tier_at(sc.path("a_file") + "/sub/base.cache"));
    EXPECT_EQ(e, "frozen_tier.path: '" + sc.path("a_file") + "/sub/base.cache' lies under '" +
                     sc.path("a_file") + "', which is a file, not a folder");
  }
  {  // what the system refuses to look up (root too): one line, not a std::filesystem exception
    fs::create_symlink(sc.path("loop_b"), sc.path("loop_a"));
    fs::create_symlink(sc.path("loop_a"), sc.path("loop_b"));
    const std::string e = refused(tier_at(sc.path("loop_a")));
    EXPECT_EQ(e,
              "frozen_tier.path: '" + sc.path("loop_a") + "': cannot reach (" + std::strerror(ELOOP) + ")");
    const std::string longer = sc.path(std::string(300, 'x'));
    const std::string l = refused(tier_at(longer));
    EXPECT_EQ(l.rfind("frozen_tier.path: '" + longer.substr(0, 100), 0), 0u) << l;
    EXPECT_NE(l.find("... (" + std::to_string(longer.size()) + " bytes)': cannot reach (" +
                     std::strerror(ENAMETOOLONG) + ")"),
              std::string::npos)
        << l;
    EXPECT_EQ(l.find(std::string(300, 'x')), std::string::npos) << "quoted shortened: " << l;
  }
  {
    // a folder that takes no new files (procfs): the line names the path given, the lock after it
    const std::string e = refused(tier_at("/proc/x.cache"));
    EXPECT_EQ(
        e.rfind("frozen_tier.path: /proc/x.cache: needs a build (no cache file), and it cannot be built "
                "here: cannot open the builders' lock /proc/x.cache.lock (",
                0),
        0u)
        << e;
    EXPECT_NE(e.find("expected a writable file"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  {
    const std::string e = refused(tier_at(sc.path("base.cache"), 1e-6));  // ~1 KiB: not even one buffer
    EXPECT_EQ(e.rfind("frozen_tier.ring_gib: ", 0), 0u) << e;
    EXPECT_NE(e.find("expected at least"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  {  // a legal name without room for the tier's lock and temporary beside it: refused up front
    const std::string name = std::string(250, 'x') + ".tier";
    const std::string e = refused(tier_at(sc.path(name)));
    EXPECT_EQ(e.rfind("frozen_tier.path: the file name '", 0), 0u) << e;
    EXPECT_NE(e.find("has 255 bytes"), std::string::npos) << e;
    EXPECT_NE(e.find("expected a name of at most"), std::string::npos) << e;
    EXPECT_EQ(e.find("builders' lock"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(sc.path(name)));
  }
  {
    const std::string e = refused(tier_at(""));
    EXPECT_EQ(e.rfind("frozen_tier.path: ", 0), 0u) << e;
  }
  {
    const std::string e = refused(tier_at(sc.path("base.cache"), -1));
    EXPECT_EQ(e.rfind("frozen_tier.ring_gib: ", 0), 0u) << e;
  }
  EXPECT_FALSE(fs::exists(sc.path("base.cache")));  // nothing refused wrote a cache
}

}  // namespace
}  // namespace rp::test
