// Frozen groups made on demand (SessionOptions::frozen_source) and the whole run's host budget
// (FrozenTierOptions::host_budget_gib):
//  - a session whose frozen groups come from a source trains bit for bit like one handed the
//    same weights, with and without the disk tier; with the tier the source is asked once per
//    streamed group while the cache is written, and not at all when a valid cache is reused;
//    an exception of the source leaves the constructor and no cache behind;
//  - a budget that holds everything opens no tier; a budget between the trainable state and
//    the whole run keeps part of the base resident and trains bit for bit like no tier; a
//    budget too small for the activations with saved attention drops it (and trains like a run
//    without it), as does an automatic save_attention when that keeps more of the base; one too
//    small for the activations spills the saved inputs of the layers it cannot hold (and trains
//    like a run holding them); too small a budget,
//    one beside resident_gib, a source without identity are refused in one line naming the key,
//    and the least budget such a line names is taken.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include <linux/magic.h>
#include <sys/vfs.h>

#include "base/host_resources.hpp"
#include "kernels/weight_format.hpp"
#include "scheduler/host_memory.hpp"
#include "tests/actors/frozen_tier_fixture.hpp"

namespace rp::test {
namespace {

using namespace tier_fixture;
constexpr double kGiB = double(uint64_t(1) << 30);

// The storage form of frozen group g of weights w, as the session would quantize it.
std::vector<std::byte> stored(const ModelLayout& m, const std::vector<std::vector<float>>& w, int g) {
  const ParamGroup& grp = m.groups[size_t(g)];
  std::vector<std::byte> out(size_t(grp.storage_bytes));
  for (const TensorSpec& t : grp.tensors)
    quantize_weights(t.format, w[size_t(g)].data() + t.offset, out.data() + t.byte_offset, t.numel(),
                     weight_format_cols(t.shape));
  return out;
}

// A source making the frozen groups of random_weights(m, seed), counting its calls per group;
// the weights it returns have the frozen groups emptied (the session asks the source for them).
struct CountingSource {
  std::map<int, int> calls;
  std::vector<std::vector<float>> full;
  bool fail = false;
  std::chrono::milliseconds delay{0};  // each group's making takes at least this long
  FrozenSource source(const ModelLayout& m, const std::string& identity) {
    return FrozenSource{identity, [this, &m](int g, std::span<std::byte> out) {
                          ++calls[g];
                          if (fail) throw std::runtime_error("source: cannot read the base");
                          std::this_thread::sleep_for(delay);
                          const std::vector<std::byte> b = stored(m, full, g);
                          ASSERT_EQ(b.size(), out.size());
                          std::memcpy(out.data(), b.data(), b.size());
                        }};
  }
  std::vector<std::vector<float>> trainable_only(const ModelLayout& m) const {
    std::vector<std::vector<float>> w = full;
    for (size_t g = 0; g < m.groups.size(); ++g)
      if (m.groups[g].frozen) w[g].clear();
    return w;
  }
};

void expect_same(const Result& a, const Result& b, const ModelLayout& m) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t g = 0; g < b.weights.size(); ++g) EXPECT_EQ(a.weights[g], b.weights[g]) << m.groups[g].name;
}

TEST(FrozenSource, MakesEachGroupOnceWhenNeededAndTrainsLikeGivenWeights) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  TestSession off(m, random_weights(m, 7), options(2, nullptr));
  const Result base = train(off);

  CountingSource src;
  src.full = random_weights(m, 7);
  {  // no tier: every frozen group is made at construction, once
    TestSessionOptions o = options(2, nullptr);
    o.frozen_source = src.source(m, "random 7");
    TestSession s(m, src.trainable_only(m), o);
    for (size_t g = 0; g < m.groups.size(); ++g) EXPECT_EQ(src.calls[int(g)], m.groups[g].frozen ? 1 : 0);
    expect_same(train(s), base, m);
  }
  src.calls.clear();
  {  // the tier: made while the cache is written, once each; the report counts the making
    TestSessionOptions o = options(2, nullptr);
    o.frozen_tier = tier_at(sc.path("base.cache"));
    src.delay = std::chrono::milliseconds(30);
    o.frozen_source = src.source(m, "random 7");
    TestSession s(m, src.trainable_only(m), o);
    src.delay = std::chrono::milliseconds(0);
    ASSERT_TRUE(s.frozen_tier().enabled);
    EXPECT_TRUE(s.frozen_tier().built);
    for (size_t g = 0; g < m.groups.size(); ++g) EXPECT_EQ(src.calls[int(g)], m.groups[g].frozen ? 1 : 0);
    int frozen = 0;
    for (const auto& g : m.groups) frozen += g.frozen ? 1 : 0;
    EXPECT_GE(s.frozen_tier().source_seconds, 0.03 * frozen) << "every frozen group is made during the build";
    EXPECT_LE(s.frozen_tier().source_seconds, s.frozen_tier().seconds);
    expect_same(train(s), base, m);
  }
  src.calls.clear();
  {  // a valid cache of the same identity: nothing made
    TestSessionOptions o = options(1, nullptr);
    o.frozen_tier = tier_at(sc.path("base.cache"));
    o.frozen_source = src.source(m, "random 7");
    TestSession s(m, src.trainable_only(m), o);
    EXPECT_FALSE(s.frozen_tier().built);
    EXPECT_TRUE(src.calls.empty()) << "a reused cache needs no group made";
    EXPECT_EQ(s.frozen_tier().source_seconds, 0);
    expect_same(train(s), base, m);
  }
  {  // another identity: rebuilt
    TestSessionOptions o = options(1, nullptr);
    o.frozen_tier = tier_at(sc.path("base.cache"));
    o.frozen_source = src.source(m, "random 7, second edition");
    TestSession s(m, src.trainable_only(m), o);
    EXPECT_TRUE(s.frozen_tier().built);
    EXPECT_NE(s.frozen_tier().rebuilt_because, "");
  }
}

TEST(FrozenSource, AFailingSourceLeavesTheConstructorAndNoCache) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  CountingSource src;
  src.full = random_weights(m, 7);
  src.fail = true;
  TestSessionOptions o = options(1, nullptr);
  o.frozen_tier = tier_at(sc.path("base.cache"));
  o.frozen_source = src.source(m, "random 7");
  try {
    TestSession s(m, src.trainable_only(m), o);
    ADD_FAILURE() << "a failing source was taken";
  } catch (const std::runtime_error& e) {
    // the source's own line: the base file is what failed, not the cache's path
    EXPECT_EQ(std::string(e.what()), "source: cannot read the base");
  }
  EXPECT_FALSE(fs::exists(sc.path("base.cache")));
  for (const auto& e : fs::directory_iterator(sc.dir))
    ADD_FAILURE() << e.path() << ": left in the folder (no cache, temporary or lock should be)";

  TestSessionOptions anon = options(1, nullptr);
  anon.frozen_source = FrozenSource{"", [](int, std::span<std::byte>) {}};
  try {
    TestSession s(m, src.trainable_only(m), anon);
    ADD_FAILURE() << "a source without identity was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("frozen_source: ", 0), 0u) << e.what();
  }
  try {  // no source: an empty frozen group is refused as before
    TestSession s(m, src.trainable_only(m), options(1, nullptr));
    ADD_FAILURE() << "a frozen group without weights was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
  }
}

// The host need of this test's run (options(): kM micro-batches of kNSeq x kSeqLen, fp32 CPU
// devices) by the planner's model, with or without saved attention.
HostMemoryNeed need_of(const ModelLayout& m, int workers, bool attention) {
  HostRun run;
  run.seq_len = kSeqLen;
  run.sequences_per_micro = kNSeq;
  run.micro_batches = kM;
  run.workers = workers;
  run.pass_slots = TestSessionOptions{}.pass_slots;
  run.saved_attention = attention;
  run.elem_bytes = 4;
  return host_memory_need(m, run);
}

// Two buffers of the largest frozen group, 4 KiB-aligned: the tier's smallest ring.
double smallest_ring(const ModelLayout& m) {
  uint64_t largest = 0;
  for (const ParamGroup& g : m.groups)
    if (g.frozen) largest = std::max<uint64_t>(largest, (uint64_t(g.storage_bytes) + 4095) / 4096 * 4096);
  return 2.0 * double(largest);
}

// Options with a budget of `bytes` and nothing set aside for the process (so the figures below
// are the whole budget whatever this test process holds).
TestSessionOptions budgeted(int workers, const std::string& path, double bytes,
                            std::vector<std::string>* log) {
  TestSessionOptions o = options(workers, log);
  o.frozen_tier = tier_at(path);
  o.frozen_tier->host_budget_gib = bytes / kGiB;
  o.host_budget_reserve = 0;
  return o;
}

TEST(FrozenTierBudget, KeepsWhatFitsStreamsTheRestAndTrainsLikeNoTier) {
  Scratch sc;
  const ModelLayout m = lora_layout(12);  // a base several times its two largest groups (the ring)
  ASSERT_GT(double(frozen_bytes(m)) / 2, smallest_ring(m));
  TestSession off(m, random_weights(m, 7), options(2, nullptr));
  const Result base = train(off);
  const HostMemoryNeed need = need_of(m, 2, true);
  const double frozen = double(frozen_bytes(m));
  {  // room for everything: no tier
    TestSession s(m, random_weights(m, 7), budgeted(2, sc.path("all.cache"), need.total(), nullptr));
    EXPECT_FALSE(s.frozen_tier().enabled);
    EXPECT_FALSE(fs::exists(sc.path("all.cache")));
  }
  {  // room for about half the base beside the rest: part stays, the rest streams, same training
    std::vector<std::string> log;
    const double bytes = need.total() - frozen + smallest_ring(m) + frozen / 2;
    TestSessionOptions o = budgeted(2, sc.path("half.cache"), bytes, &log);
    o.save_attention = true;  // kept as asked (automatic would drop it to keep more of the base)
    TestSession s(m, random_weights(m, 7), o);
    const FrozenTierReport& r = s.frozen_tier();
    ASSERT_TRUE(r.enabled);
    EXPECT_GT(r.resident_bytes, 0u);
    EXPECT_LE(double(r.resident_bytes), frozen / 2);
    EXPECT_EQ(double(r.bytes), frozen) << "the file holds every frozen group, the resident ones too";
    EXPECT_FALSE(r.attention_dropped);
    EXPECT_EQ(r.budget_line.rfind("frozen tier: host budget ", 0), 0u) << r.budget_line;
    EXPECT_NE(std::find(log.begin(), log.end(), r.budget_line), log.end()) << "the budget's line is logged";
    expect_same(train(s), base, m);
  }
}

TEST(FrozenTierBudget, DropsTheSavedAttentionWhenOnlyTheActivationsFit) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  const HostMemoryNeed with = need_of(m, 1, true);
  ASSERT_GT(with.attention, 0.0);
  const double trainable = with.master + with.moments + with.weights + with.gradients;
  TestSessionOptions plain = options(1, nullptr);
  plain.save_attention = false;
  TestSession off(m, random_weights(m, 7), plain);
  const Result base = train(off);
  // the activations and half the attention: the attention goes, the base streams
  TestSessionOptions o =
      budgeted(1, sc.path("drop.cache"), trainable + smallest_ring(m) + with.activations + with.attention / 2,
               nullptr);
  o.save_attention = true;
  TestSession s(m, random_weights(m, 7), o);
  ASSERT_TRUE(s.frozen_tier().enabled);
  EXPECT_TRUE(s.frozen_tier().attention_dropped);
  EXPECT_NE(s.frozen_tier().budget_line.find("saved attention dropped"), std::string::npos)
      << s.frozen_tier().budget_line;
  expect_same(train(s), base, m);
}

TEST(FrozenTierBudget, AutomaticSavedAttentionGoesWhenThatKeepsMoreOfTheBase) {
  Scratch sc;
  const ModelLayout m = lora_layout(12, WeightFormat::bf16);  // a base well above its attention
  ASSERT_GT(double(frozen_bytes(m)) / 2, need_of(m, 1, true).attention + smallest_ring(m));
  const HostMemoryNeed with = need_of(m, 1, true);
  const double frozen = double(frozen_bytes(m));
  TestSessionOptions plain = options(1, nullptr);
  plain.save_attention = false;
  TestSession off(m, random_weights(m, 7), plain);
  const Result base = train(off);
  // everything but half the base fits with the attention saved; save_attention left automatic
  const double bytes = with.total() - frozen + smallest_ring(m) + frozen / 2;
  TestSessionOptions kept = budgeted(1, sc.path("kept.cache"), bytes, nullptr);
  kept.save_attention = true;
  TestSession k(m, random_weights(m, 7), kept);
  ASSERT_TRUE(k.frozen_tier().enabled);
  EXPECT_FALSE(k.frozen_tier().attention_dropped) << "asked for: kept";
  TestSession a(m, random_weights(m, 7), budgeted(1, sc.path("auto.cache"), bytes, nullptr));
  EXPECT_TRUE(a.frozen_tier().attention_dropped);
  EXPECT_GT(a.frozen_tier().resident_bytes, k.frozen_tier().resident_bytes);
  EXPECT_NE(a.frozen_tier().budget_line.find("to keep more of the base resident"), std::string::npos)
      << a.frozen_tier().budget_line;
  expect_same(train(a), base, m);
}

TEST(FrozenTierBudget, ActivationsTheBudgetCannotHoldSpillAndTrainLikeNoTier) {
  Scratch sc;
  const ModelLayout m = lora_layout(12);
  // micro-batches of 2 x 64 tokens: a layer's saved input (2 x 64 x 32 fp32) is one 16 KiB
  // record, so the spill's staging buffers are small beside the activations
  constexpr int64_t kLen = 64;
  auto shaped = [&](TestSessionOptions o) {
    o.micro = {kNSeq, kLen};
    o.spill_staging = 2;
    return o;
  };
  HostRun run;
  run.seq_len = kLen, run.sequences_per_micro = kNSeq, run.micro_batches = kM, run.workers = 1;
  run.saved_attention = false, run.elem_bytes = 4;
  const HostMemoryNeed need = host_memory_need(m, run);
  const double trainable = need.master + need.moments + need.weights + need.gradients;
  TestSessionOptions plain = shaped(options(1, nullptr));
  plain.save_attention = false;
  TestSession off(m, random_weights(m, 7), plain);
  const Result base = train(off, kM * kNSeq * kLen);
  // room for half the activations and a generous staging allowance: the rest of the layers spill
  const double record = 2.0 * kNSeq * kLen * 32;  // 16 KiB
  std::vector<std::string> log;
  TestSession s(m, random_weights(m, 7),
                shaped(budgeted(1, sc.path("spill.cache"),
                                trainable + smallest_ring(m) + need.activations / 2 + 16 * record, &log)));
  const FrozenTierReport& r = s.frozen_tier();
  EXPECT_GE(r.spill_layers.size(), 1u) << r.budget_line;
  EXPECT_LT(r.spill_layers.size(), size_t(m.num_layers() - 1)) << r.budget_line;
  EXPECT_NE(r.budget_line.find("spilled to the disk"), std::string::npos) << r.budget_line;
  EXPECT_TRUE(r.attention_dropped);
  EXPECT_EQ(r.resident_bytes, 0u);
  expect_same(train(s, kM * kNSeq * kLen), base, m);
}

// The least budget a refusal names places the run: it counts the spill's staging buffers and
// the saved inputs no layer can spill, not only the trainable state and the ring.
TEST(FrozenTierBudget, TheLeastBudgetARefusalNamesIsTaken) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  const HostMemoryNeed need = need_of(m, 1, false);
  const double trainable = need.master + need.moments + need.weights + need.gradients;
  // sequences of 8192 tokens: a layer's saved input is a 2 MiB record, so the staging buffers
  // and the inputs that cannot spill (tens of MiB) dwarf the trainable state and the ring
  auto attempt = [&](double bytes) {
    TestSessionOptions o = budgeted(1, sc.path("least.cache"), bytes, nullptr);
    o.micro = {kNSeq, 8192};
    TestSession s(m, random_weights(m, 7), o);
  };
  std::string msg;
  try {
    attempt(trainable + smallest_ring(m) + (1 << 20));
    ADD_FAILURE() << "a budget below the spill's staging was taken";
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  const auto at = msg.find("expected at least ");
  ASSERT_NE(at, std::string::npos) << msg;
  const double least = std::stod(msg.substr(at + std::strlen("expected at least ")));
  EXPECT_NO_THROW(attempt(least * kGiB)) << msg;
  // the line names what takes the budget beyond the trainable state and the ring
  EXPECT_NE(msg.find("the saved activations no layer can spill, with the spill's staging, "),
            std::string::npos)
      << msg;
}

// A ring_gib whose read ring the budget cannot hold beside the trainable state: the refusal says
// that a smaller ring_gib would fit too (0, two buffers, does); a ring that is not the cause is not
// named.
TEST(FrozenTierBudget, ARingTooLargeForTheBudgetSaysASmallerOneFits) {
  Scratch sc;
  const ModelLayout m = lora_layout(8);
  const HostMemoryNeed need = need_of(m, 1, false);
  const double frozen = double(frozen_bytes(m));
  const double bytes = need.total() - frozen + smallest_ring(m);  // room for the least ring only
  TestSessionOptions o = budgeted(1, sc.path("ring.cache"), bytes, nullptr);
  o.frozen_tier->ring_gib = 2 * frozen / kGiB;  // a buffer per frozen group: the whole base
  std::string msg;
  try {
    TestSession s(m, random_weights(m, 7), o);
    ADD_FAILURE() << "a ring larger than the budget was taken";
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind("frozen_tier.host_budget_gib: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("; or a smaller frozen_tier.ring_gib: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("and 0 (two buffers, "), std::string::npos) << msg;
  o.frozen_tier->ring_gib = 0;
  EXPECT_NO_THROW(TestSession(m, random_weights(m, 7), o)) << "the hint is true";
  // a budget below the trainable state alone: no ring would do, none is named
  o = budgeted(1, sc.path("ring.cache"), need.master + need.moments, nullptr);
  o.frozen_tier->ring_gib = 2 * frozen / kGiB;
  try {
    TestSession s(m, random_weights(m, 7), o);
    ADD_FAILURE() << "a budget below the trainable state was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find("ring_gib"), std::string::npos) << e.what();
  }
}

// On the CPU backend the virtual GPUs are arenas in host memory the budget does not hold: the
// budget's line says so, with their size.
TEST(FrozenTierBudget, TheBudgetLineSaysTheCpuBackendsDevicesAreOutsideIt) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  std::vector<std::string> log;
  TestSessionOptions o = budgeted(2, sc.path("cpu.cache"), need_of(m, 2, false).total(), &log);
  TestSession s(m, random_weights(m, 7), o);
  const std::string& line = s.frozen_tier().budget_line;
  EXPECT_NE(line.find("; the CPU backend's 2 virtual GPUs (up to "), std::string::npos) << line;
  EXPECT_NE(line.find(": the plan's largest stage on each) are host memory outside this budget"),
            std::string::npos)
      << line;
  EXPECT_NE(std::find(log.begin(), log.end(), line), log.end()) << "logged as it is reported";
}

// A cache folder in memory (tmpfs) takes host RAM no budget counts: one line says so.
TEST(FrozenTierBudget, AFolderInMemoryIsNamedInOneLine) {
  std::error_code ec;
  struct statfs st {};
  if (!fs::is_directory("/dev/shm", ec) || ::statfs("/dev/shm", &st) != 0 || st.f_type != TMPFS_MAGIC)
    GTEST_SKIP() << "no tmpfs at /dev/shm on this machine";
  const fs::path dir = fs::path("/dev/shm") / fmt::format("rp_tier_test_{}", ::getpid());
  const ModelLayout m = lora_layout();
  std::vector<std::string> log;
  TestSessionOptions o = options(1, &log);
  o.frozen_tier = tier_at((dir / "base.cache").string());
  { TestSession s(m, random_weights(m, 7), o); }
  fs::remove_all(dir, ec);
  int warned = 0;
  for (const std::string& l : log)
    warned += l.find("warning: the folder is in memory (tmpfs)") != std::string::npos;
  EXPECT_EQ(warned, 1);
}

TEST(FrozenTierBudget, BadBudgetsAreRefusedInOneLineNamingTheKey) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  auto refused = [&](FrozenTierOptions t, const std::string& what) {
    TestSessionOptions o = options(1, nullptr);
    o.frozen_tier = t;
    try {
      TestSession s(m, random_weights(m, 7), o);
      ADD_FAILURE() << what << " was taken";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("frozen_tier.host_budget_gib: ", 0), 0u) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  FrozenTierOptions t = tier_at(sc.path("bad.cache"));
  t.host_budget_gib = 0.01;  // below this process's own memory
  refused(t, "a budget below the process");
  {  // room for the trainable state and the ring only: even every layer's saved input on the disk
     // leaves more than the budget holds
    const HostMemoryNeed need = need_of(m, 1, true);
    const double trainable = need.master + need.moments + need.weights + need.gradients;
    TestSessionOptions o = budgeted(1, sc.path("bad.cache"), trainable + smallest_ring(m), nullptr);
    try {
      TestSession s(m, random_weights(m, 7), o);
      ADD_FAILURE() << "a budget without room for any activation was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("frozen_tier.host_budget_gib: ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected at least"), std::string::npos) << e.what();
    }
  }
  t.host_budget_gib = -2;
  refused(t, "a negative budget");
  t.host_budget_gib = 64;
  t.resident_gib = 1;
  refused(t, "a budget beside resident_gib");
  EXPECT_FALSE(fs::exists(sc.path("bad.cache")));
}

}  // namespace
}  // namespace rp::test
