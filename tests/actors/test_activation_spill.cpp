// Activation spill (FrozenTierOptions::spill_layers): saved layer inputs live in a hidden file on
// the tier's disk instead of host memory.
//  - the store alone: a record reads back what was written; a read waits for the write of its
//    pass (it may be asked for first), and a record overwritten by a later pass fails the read;
//  - the layers chosen: lowest first, those beginning no stage of the plan first;
//  - training with spill equals training without it bit for bit (losses, every group's weights
//    after 3 steps) with 1 and 2 workers, LoRA and full fine-tuning, two staging buffers, and a
//    plan whose every stage begins with a spilled layer; the spilled inputs' host buffers are gone
//    and the spill file was written and read;
//  - the folder has no new entry while the session runs nor after;
//  - saved attention is turned off (one line);
//  - a read failing mid-run ends the run with one line naming the folder, layer, micro-batch and
//    offset, in bounded time;
//  - bad spill_layers values are refused with one line naming the option and the range.
#include <gtest/gtest.h>

#include <fstream>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <set>

#include <fmt/format.h>
#include <unistd.h>

#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "base/counted.hpp"
#include "tests/actors/frozen_tier_fixture.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

using namespace tier_fixture;

// ---- the store alone -------------------------------------------------------------------------

SpillConfig store_config(const std::string& folder) {
  SpillConfig c;
  c.folder = folder;
  c.layers = {1, 3};
  c.num_layers = 5;
  c.sets = 2;
  c.micro_batches = 2;
  c.act_bytes = 5000;  // two 4 KiB pages per record
  c.workers = 2;
  c.staging = 2;
  return c;
}

struct Answer {
  std::promise<std::pair<uint64_t, std::string>> p;
  ActivationSpill::Done done() {
    return [this](uint64_t t, const std::string& e) { p.set_value({t, e}); };
  }
};

void fill(ActivationSpill& s, uint64_t ticket, char v) { std::memset(s.buffer(ticket), v, 5000); }

TEST(ActivationSpillStore, AReadWaitsForTheWriteOfItsPassAndGetsItsBytes) {
  Scratch sc;
  ActivationSpill s(store_config(sc.dir.string()), tier::aligned_host_allocator());
  EXPECT_EQ(s.record_bytes(), 8192u);
  EXPECT_EQ(s.file_bytes(), 2u * 2 * 2 * 8192);
  EXPECT_TRUE(sc.entries().empty()) << "the spill file has no name";
  Answer r;
  auto got = r.p.get_future();
  s.read(1, SpillRecord{1, 3, 1, 7}, r.done());  // asked before the write
  EXPECT_EQ(got.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  const std::optional<uint64_t> w = s.stage_write(0);
  ASSERT_TRUE(w);
  fill(s, *w, 'a');
  Answer wa;
  auto wrote = wa.p.get_future();
  s.write(*w, SpillRecord{1, 3, 1, 7}, wa.done());
  EXPECT_EQ(wrote.get().second, "");
  ASSERT_EQ(got.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const auto [ticket, err] = got.get();
  EXPECT_EQ(err, "");
  const std::byte* d = s.buffer(ticket);
  ASSERT_NE(d, nullptr);
  for (size_t i = 0; i < 5000; ++i) ASSERT_EQ(char(d[i]), 'a') << i;
  s.release(ticket);
  EXPECT_EQ(s.buffer(ticket), nullptr);
}

// A record larger than one read piece (1 MiB) reads back byte for byte, across records written
// in another order than they are read.
TEST(ActivationSpillStore, LargeRecordsReadBackByteForByte) {
  Scratch sc;
  SpillConfig c = store_config(sc.dir.string());
  c.act_bytes = (size_t(3) << 20) + 5000;  // 4 pieces, the last partial
  ActivationSpill s(c, tier::aligned_host_allocator());
  const auto byte_at = [](size_t i, int rec) { return char((i * 7 + size_t(rec) * 13) % 251); };
  const SpillRecord recs[] = {{1, 3, 1, 4}, {0, 1, 0, 4}, {1, 1, 1, 4}};
  for (int k = 0; k < 3; ++k) {
    const std::optional<uint64_t> w = s.stage_write(k % 2);
    ASSERT_TRUE(w);
    std::byte* b = s.buffer(*w);
    for (size_t i = 0; i < c.act_bytes; ++i) b[i] = std::byte(byte_at(i, k));
    Answer wa;
    auto wrote = wa.p.get_future();
    s.write(*w, recs[k], wa.done());
    ASSERT_EQ(wrote.get().second, "");
  }
  for (int k : {2, 0, 1}) {
    Answer r;
    auto got = r.p.get_future();
    s.read(0, recs[k], r.done());
    ASSERT_EQ(got.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    const auto [ticket, err] = got.get();
    ASSERT_EQ(err, "");
    const std::byte* d = s.buffer(ticket);
    size_t bad = 0;
    for (size_t i = 0; i < c.act_bytes; ++i) bad += char(d[i]) != byte_at(i, k);
    EXPECT_EQ(bad, 0u) << "record " << k;
    s.release(ticket);
  }
}

TEST(ActivationSpillStore, ARecordOverwrittenByALaterPassFailsTheRead) {
  Scratch sc;
  ActivationSpill s(store_config(sc.dir.string()), tier::aligned_host_allocator());
  const std::optional<uint64_t> w = s.stage_write(1);
  ASSERT_TRUE(w);
  fill(s, *w, 'b');
  Answer wa;
  auto wrote = wa.p.get_future();
  s.write(*w, SpillRecord{0, 1, 0, 9}, wa.done());
  EXPECT_EQ(wrote.get().second, "");
  Answer r;
  auto got = r.p.get_future();
  s.read(0, SpillRecord{0, 1, 0, 8}, r.done());
  ASSERT_EQ(got.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const std::string e = got.get().second;
  EXPECT_NE(e.find("overwritten"), std::string::npos) << e;
  EXPECT_NE(e.find(sc.dir.string()), std::string::npos) << e;
}

TEST(ActivationSpillStore, AFolderWithoutRoomIsRefusedWithTheBytesNeededAndFree) {
  Scratch sc;
  SpillConfig c = store_config(sc.dir.string());
  c.micro_batches = int64_t(1) << 40;  // 2^40 records of 8 KiB per layer and set: no disk holds that
  try {
    ActivationSpill s(c, tier::aligned_host_allocator());
    ADD_FAILURE() << "a file of " << s.file_bytes() << " bytes was made";
  } catch (const std::runtime_error& e) {
    const std::string w = e.what();
    EXPECT_EQ(w.rfind("frozen_tier.spill_layers: 2 layers need a spill file of ", 0), 0u) << w;
    EXPECT_NE(w.find(fmt::format("{} bytes", uint64_t(2) * 2 * (uint64_t(1) << 40) * 8192)),
              std::string::npos)
        << w;
    EXPECT_NE(w.find("are free"), std::string::npos) << w;
    EXPECT_NE(w.find(sc.dir.string()), std::string::npos) << w;
    EXPECT_EQ(w.find('\n'), std::string::npos) << w;
  }
  EXPECT_TRUE(sc.entries().empty());
}

TEST(ActivationSpillStore, WriteBuffersAreAPoolOfTheirOwnPerWorker) {
  Scratch sc;
  ActivationSpill s(store_config(sc.dir.string()), tier::aligned_host_allocator());
  EXPECT_EQ(s.staging_buffers(), 2u * (2 + 2));
  auto a = s.stage_write(0), b = s.stage_write(0);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(s.stage_write(0)) << "worker 0 has two write buffers";
  EXPECT_TRUE(s.stage_write(1)) << "worker 1's are its own";
  s.release(*a);
  EXPECT_TRUE(s.stage_write(0));
}

TEST(ActivationSpillStore, TheLayersChosenAreTheTailsThenTheLowestBeginningNoForwardStage) {
  const IterationPlan p = make_uniform_plan(6, 2, 2, 1);  // F[0-1] F[2-3] T[4-5] B[3-2] B[1-0]
  EXPECT_EQ(tail_interior_layers(6, p), (std::vector<char>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(choose_spill_layers(6, p, 1), (std::vector<int>{5})) << "inside the tail: never written";
  EXPECT_EQ(choose_spill_layers(6, p, 2), (std::vector<int>{1, 5}));
  EXPECT_EQ(choose_spill_layers(6, p, 4), (std::vector<int>{1, 2, 3, 5}));
  EXPECT_EQ(choose_spill_layers(6, p, 5), (std::vector<int>{1, 2, 3, 4, 5}));
  // backward stages' first layers are not avoided: they upload every layer's input alike
  const IterationPlan q = make_uniform_plan(6, 4, 1, 0);  // F[0-3] F[4] T[5] B[4] B[3] B[2] B[1] B[0]
  EXPECT_EQ(choose_spill_layers(6, q, 2), (std::vector<int>{1, 2}));
  EXPECT_EQ(choose_spill_layers(6, q, 4), (std::vector<int>{1, 2, 3, 4}));
}

// ---- in the runtime ------------------------------------------------------------------------

ModelLayout spill_lora_layout() { return lora_layout(4, LoraConfig{}.base_format); }
ModelLayout full_layout() { return make_layout(tiny_config(false, false)); }

// The tier tests' options, with the default transfer chunks and without saved attention (spill
// turns it off: the runs compared must both be without).
TestSessionOptions spill_options(int workers, std::vector<std::string>* log) {
  TestSessionOptions o = options(workers, log);
  o.transfer_chunk_bytes = SessionOptions{}.transfer_chunk_bytes;
  o.save_attention = false;
  return o;
}

// A tier at `path` (its folder holds the spill file) that spills the saved inputs of `layers` layers.
void spill_to(TestSessionOptions& o, const std::string& path, int layers) {
  o.frozen_tier = FrozenTierOptions{};
  o.frozen_tier->path = path;
  o.frozen_tier->spill_layers = layers;
}

struct Case {
  int workers;
  bool lora;
  bool every_layer_begins_a_stage;  // plan F[0] F[1] ... T B ... B[0]: every spilled layer begins a stage
  double pcie_bytes_per_s = 0;      // > 0: a throttled link (copies slow, the spill's I/O not)
};

class SpillByCase : public ::testing::TestWithParam<Case> {};

TEST_P(SpillByCase, SpillingSavedInputsTrainsBitForBitLikeHoldingThem) {
  const Case c = GetParam();
  Scratch sc;
  const ModelLayout m = c.lora ? spill_lora_layout() : full_layout();
  const int L = m.num_layers();
  TestSessionOptions base_o = spill_options(c.workers, nullptr);
  if (c.every_layer_begins_a_stage) base_o.plan = make_uniform_plan(L, 1, 1, 0);
  base_o.device.pcie_bytes_per_s = c.pcie_bytes_per_s;
  TestSession off(m, random_weights(m, 7), base_o);
  const Result base = train(off);

  std::vector<std::string> log;
  TestSessionOptions o = spill_options(c.workers, &log);
  o.plan = base_o.plan;
  o.device = base_o.device;
  spill_to(o, sc.path("base.cache"), L - 1);  // every layer with a saved input
  o.spill_staging = 2;                        // the least: forces waits for buffers
  std::atomic<uint64_t> reads{0}, writes{0};
  o.spill_fault = [&](bool write, uint64_t, uint64_t) {
    (write ? writes : reads)++;
    return 0;
  };
  std::set<std::string> at_start;
  Result spilled;
  {
    TestSession on(m, random_weights(m, 7), o);
    const FrozenTierReport& rep = on.frozen_tier();
    EXPECT_EQ(int(rep.spill_layers.size()), L - 1);
    const size_t act = size_t(kNSeq * kSeqLen * m.config.hidden_size) * sizeof(float);
    const uint64_t sets = c.workers == 1 ? 1 : 2;  // pass slots sharing activations, or each its own
    EXPECT_EQ(rep.spill_bytes, sets * uint64_t(L - 1) * kM * tier::align_up(act));
    // the spilled inputs' host buffers are gone (the pin accounting counts every pass buffer), as is
    // a LoRA base (it streams from the tier's cache)
    uint64_t frozen = 0;
    for (const ParamGroup& g : m.groups) frozen += g.frozen ? uint64_t(g.storage_bytes) : 0;
    EXPECT_EQ(c.lora, frozen > 0);
    EXPECT_EQ(off.host_pinning().pinned_bytes + off.host_pinning().pageable_bytes -
                  on.host_pinning().pinned_bytes - on.host_pinning().pageable_bytes,
              sets * uint64_t(L - 1) * kM * act + frozen);
    bool logged = false;
    for (const auto& l : log)
      logged |= l.rfind(fmt::format("activation spill: the saved inputs of {} layers to ", L - 1), 0) == 0;
    EXPECT_TRUE(logged) << "no start line";
    at_start = sc.entries();
    // only the tier's cache (LoRA): the builders' lock goes with the build
    const std::set<std::string> tier_files = {"base.cache"};
    EXPECT_EQ(at_start, c.lora ? tier_files : std::set<std::string>());
    spilled = train(on, kM * kNSeq * kSeqLen,
                    [&] { EXPECT_EQ(sc.entries(), at_start) << "a visible file while training"; });
  }
  EXPECT_EQ(sc.entries(), at_start) << "something left behind";
  EXPECT_GT(writes.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
  ASSERT_EQ(spilled.losses.size(), size_t(kSteps));
  EXPECT_EQ(spilled.losses, base.losses);
  ASSERT_EQ(spilled.weights.size(), base.weights.size());
  for (size_t g = 0; g < base.weights.size(); ++g)
    EXPECT_EQ(spilled.weights[g], base.weights[g]) << m.groups[g].name;
}

INSTANTIATE_TEST_SUITE_P(ActivationSpill, SpillByCase,
                         ::testing::Values(Case{1, true, false}, Case{2, true, false}, Case{1, false, false},
                                           Case{2, false, false}, Case{1, false, true}, Case{2, true, true},
                                           Case{3, true, true, 2e7}),
                         [](const auto& i) {
                           return fmt::format("{}_workers_{}{}{}", i.param.workers,
                                              i.param.lora ? "lora" : "full",
                                              i.param.every_layer_begins_a_stage ? "_stage_first_layers" : "",
                                              i.param.pcie_bytes_per_s > 0 ? "_throttled" : "");
                         });

// Re-planning moves the stage boundaries after the layers were chosen (for the first plan): every
// layer then begins a stage, and the run still equals one without spill re-planned alike.
TEST(ActivationSpill, ReplanningTheStagesDoesNotMatter) {
  Scratch sc;
  const ModelLayout m = full_layout();
  const int L = m.num_layers();
  const IterationPlan forced = make_uniform_plan(L, 1, 1, 0);
  const auto replanned = [&](TestSessionOptions o) {
    o.profiling.settle_min_samples = 1;
    o.profiling.settle_rel_tol = 1e9;  // settled once every series has a sample
    o.planner = [forced](const std::vector<LayerCost>&) { return forced; };
    return o;
  };
  std::vector<std::string> off_log;
  TestSession off(m, random_weights(m, 7), replanned(spill_options(2, &off_log)));
  ASSERT_NE(off.initial_plan().stages, forced.stages);
  const Result base = train(off);
  TestSessionOptions o = replanned(spill_options(2, nullptr));
  spill_to(o, sc.path("base.cache"), 2);
  o.spill_staging = 2;
  TestSession on(m, random_weights(m, 7), o);
  const std::vector<int> chosen = on.frozen_tier().spill_layers;
  bool begins = false;
  for (const Stage& st : on.initial_plan().stages)
    for (int b : chosen) begins |= st.kind != StageKind::backward && st.first == b;
  EXPECT_FALSE(begins) << "the first plan has layers beginning no forward stage: those are chosen; "
                       << on.initial_plan().summary();
  const Result spilled = train(on);
  EXPECT_EQ(on.plan().stages, forced.stages) << "not re-planned: " << on.plan().summary();
  EXPECT_EQ(off.plan().stages, forced.stages) << "not re-planned: " << off.plan().summary();
  EXPECT_EQ(spilled.losses, base.losses);
  EXPECT_EQ(spilled.weights, base.weights);
}

// Evaluation passes (forward stages and the tail only) read the spilled inputs too.
TEST(ActivationSpill, EvaluationPassesReadTheSpilledInputs) {
  Scratch sc;
  const ModelLayout m = full_layout();
  TestSessionOptions o = spill_options(2, nullptr);
  o.plan = make_uniform_plan(m.num_layers(), 1, 1, 0);
  TestSession off(m, random_weights(m, 7), o);
  spill_to(o, sc.path("base.cache"), m.num_layers() - 1);
  TestSession on(m, random_weights(m, 7), o);
  for (int k = 0; k < 2; ++k) {
    std::vector<int32_t> tg, ids;
    random_tokens(67, kM * kNSeq * kSeqLen, 500 + uint64_t(k), ids, tg);
    const EvalResult a = off.wait_eval(off.evaluate(ids, tg)), b = on.wait_eval(on.evaluate(ids, tg));
    EXPECT_EQ(a.loss_sum, b.loss_sum) << k;
    EXPECT_EQ(a.tokens, b.tokens) << k;
    EXPECT_GT(a.tokens, 0) << k;
  }
}

// An evaluation pass has no backward: of a forward stage's outputs it writes only the next
// stage's input to the spill's file (each read back once), not the saved inputs of the layers
// within the stage, and its loss is the one without a spill.
TEST(ActivationSpill, AnEvaluationPassWritesOnlyTheInputsItReads) {
  Scratch sc;
  const ModelLayout m = full_layout();
  TestSessionOptions o = spill_options(2, nullptr);
  o.plan = make_uniform_plan(m.num_layers(), 3, 1, 0);  // forward stages of several layers
  TestSession off(m, random_weights(m, 7), o);
  spill_to(o, sc.path("base.cache"), m.num_layers() - 1);
  TestSession on(m, random_weights(m, 7), o);
  std::vector<int32_t> tg, ids;
  random_tokens(67, kM * kNSeq * kSeqLen, 700, ids, tg);
  const EvalResult a = off.wait_eval(off.evaluate(ids, tg)), b = on.wait_eval(on.evaluate(ids, tg));
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_GT(b.tokens, 0);
  const FrozenTierReads r = on.frozen_tier_reads();
  EXPECT_GT(r.spill_read, 0u);
  EXPECT_EQ(r.spill_written, r.spill_read) << "saved inputs written for a backward that never comes";
}

TEST(ActivationSpill, SpillingTurnsSavedAttentionOffWithOneLine) {
  Scratch sc;
  const ModelLayout m = full_layout();
  TestSession off(m, random_weights(m, 7), spill_options(1, nullptr));
  const Result base = train(off);
  std::vector<std::string> log;
  TestSessionOptions o = spill_options(1, &log);
  o.save_attention = true;
  spill_to(o, sc.path("base.cache"), 2);
  TestSession on(m, random_weights(m, 7), o);
  int lines = 0;
  for (const auto& l : log) lines += l.find("saved attention is off") != std::string::npos;
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(on.frozen_tier().spill_layers, choose_spill_layers(m.num_layers(), on.initial_plan(), 2));
  EXPECT_EQ(train(on).losses, base.losses) << "saved attention on would change the rounding";
}

// The spill's file is unnamed, so a folder the run made for it goes when the session ends; a
// folder that was there before stays, and so does one that holds something else.
TEST(ActivationSpill, FoldersMadeForTheSpillAreTakenBackAndOthersStay) {
  Scratch sc;
  const ModelLayout m = full_layout();  // nothing frozen: no cache file beside the spill
  auto run = [&](const fs::path& cache) {
    TestSessionOptions o = spill_options(1, nullptr);
    spill_to(o, cache.string(), 2);
    TestSession s(m, random_weights(m, 7), o);
    EXPECT_TRUE(fs::is_directory(cache.parent_path())) << "the spill's folder is made when the run starts";
    train(s);
  };
  run(sc.dir / "new" / "deeper" / "base.cache");
  EXPECT_FALSE(fs::exists(sc.dir / "new")) << "the folders the run made stay behind";
  fs::create_directories(sc.dir / "mine");
  run(sc.dir / "mine" / "base.cache");
  EXPECT_TRUE(fs::is_directory(sc.dir / "mine")) << "a folder that was there before is removed";
  run(sc.dir / "made" / "base.cache");
  fs::create_directories(sc.dir / "kept");
  std::ofstream(sc.dir / "kept" / "note.txt") << "the user's";
  run(sc.dir / "kept" / "sub" / "base.cache");
  EXPECT_FALSE(fs::exists(sc.dir / "kept" / "sub"));
  EXPECT_TRUE(fs::exists(sc.dir / "kept" / "note.txt"));
  EXPECT_EQ(sc.entries(), (std::set<std::string>{"kept", "mine"}));
}

// A spill folder under a symbolic link to a missing folder is refused naming the link, and
// neither the link's target nor anything else is made.
TEST(ActivationSpill, AFolderUnderADanglingLinkIsNamed) {
  Scratch sc;
  const ModelLayout m = full_layout();
  fs::create_directory_symlink(sc.dir / "gone", sc.dir / "dead");
  TestSessionOptions o = spill_options(1, nullptr);
  spill_to(o, (sc.dir / "dead" / "base.cache").string(), 2);
  try {
    TestSession s(m, random_weights(m, 7), o);
    ADD_FAILURE() << "a spill folder under a dangling link was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "frozen_tier.path: the spill file's folder cannot be made: '" +
                                         (sc.dir / "dead").string() + "' is a symbolic link to '" +
                                         (sc.dir / "gone").string() + "', which does not exist");
  }
  EXPECT_EQ(sc.entries(), (std::set<std::string>{"dead"}));
}

// A spill folder that cannot be made for another reason (here a file of the user's in its place;
// a read-only disk alike) is refused naming the folder and the system's reason, under the key
// frozen_tier.path, not later as a missing folder blamed on spill_layers.
TEST(ActivationSpill, AFolderThatCannotBeMadeIsNamedWithTheReason) {
  Scratch sc;
  const ModelLayout m = full_layout();
  std::ofstream(sc.dir / "afile") << "the user's";
  TestSessionOptions o = spill_options(1, nullptr);
  spill_to(o, (sc.dir / "afile" / "sub" / "base.cache").string(), 2);
  try {
    TestSession s(m, random_weights(m, 7), o);
    ADD_FAILURE() << "a spill folder under a file was taken";
  } catch (const std::runtime_error& e) {  // the file in the way named, not "File exists" of the folder
    EXPECT_EQ(std::string(e.what()),
              "frozen_tier.path: '" + (sc.dir / "afile" / "sub" / "base.cache").string() + "' lies under '" +
                  (sc.dir / "afile").string() + "', which is a file, not a folder");
  }
  EXPECT_EQ(sc.entries(), (std::set<std::string>{"afile"}));
}

// The start line counts in words that agree ("1 layer") and tells the bytes of one iteration from
// the file's (every activation set's) and the staging's workers.
TEST(ActivationSpill, TheStartLineSaysWhatIsPerIterationAndPerFile) {
  Scratch sc;
  const ModelLayout m = full_layout();
  TestSessionOptions o = spill_options(2, nullptr);
  spill_to(o, sc.path("base.cache"), 1);
  TestSession on(m, random_weights(m, 7), o);
  const FrozenTierReport& r = on.frozen_tier();
  const std::string& l = r.spill_line;
  EXPECT_EQ(l.rfind("activation spill: the saved inputs of 1 layer to " + sc.dir.string() + ": ", 0), 0u)
      << l;
  // two workers: each pass slot its own set; an iteration writes one set's records, the file holds both
  EXPECT_NE(l.find(byte_text(double(r.spill_bytes) / 2) + " written and read back per iteration, a file of " +
                   byte_text(double(r.spill_bytes)) + " for 2 activation sets"),
            std::string::npos)
      << l;
  EXPECT_EQ(l.find(" 0.00 "), std::string::npos) << "a small file in a unit that shows it: " << l;
  EXPECT_EQ(l.find(" 0.0 "), std::string::npos) << l;
  EXPECT_NE(l.find(" over 2 workers ("), std::string::npos) << l;
  EXPECT_EQ(l.find("1 layers"), std::string::npos) << l;
}

// What the spill wrote and read back is counted (Session::frozen_tier_reads, the end-of-run line's
// figures): each step writes one activation set's records and reads each back once, the
// traffic `roundpipe plan --disk-gbps` adds to the base's reads.
TEST(ActivationSpill, ItsTrafficIsCountedPerStep) {
  Scratch sc;
  const ModelLayout m = full_layout();
  TestSessionOptions o = spill_options(2, nullptr);
  spill_to(o, sc.path("base.cache"), 2);
  TestSession on(m, random_weights(m, 7), o);
  EXPECT_EQ(on.frozen_tier_reads().spill_written, 0u);
  train(on);
  const FrozenTierReads r = on.frozen_tier_reads();
  const uint64_t per_step = on.frozen_tier().spill_bytes / 2;  // two sets in the file, one per step
  ASSERT_GT(per_step, 0u);
  EXPECT_EQ(r.spill_written, uint64_t(kSteps) * per_step);
  EXPECT_EQ(r.spill_read, uint64_t(kSteps) * per_step);
  EXPECT_EQ(r.bytes, 0u) << "nothing frozen: no tier reads";
}

// A tail of several layers: its inner layers' inputs are never written (forward and backward run
// at once there), so the start line's bytes per iteration count only the layers outside it; a
// layer beginning a stage is read back twice. The figures match what each step writes and reads.
TEST(ActivationSpill, TheBytesPerIterationLeaveOutTheTailsInnerLayers) {
  Scratch sc;
  const ModelLayout m = full_layout();
  const int L = m.num_layers();
  TestSessionOptions o = spill_options(1, nullptr);
  o.plan = make_uniform_plan(L, 1, 1, 2);  // F[0] F[1] ... T[L-3..L-1] B ...: two layers inside the tail
  ASSERT_EQ(tail_interior_layers(L, *o.plan), ([&] {
              std::vector<char> v(size_t(L), 0);
              v[size_t(L - 2)] = v[size_t(L - 1)] = 1;
              return v;
            }()));
  spill_to(o, sc.path("base.cache"), L - 1);
  TestSession on(m, random_weights(m, 7), o);
  const FrozenTierReport& rep = on.frozen_tier();
  const uint64_t per_step = rep.spill_bytes / uint64_t(L - 1) * uint64_t(L - 3);  // one set, L-3 written
  EXPECT_NE(rep.spill_line.find("of " + std::to_string(L - 1) +
                                " layers (2 inside the tail stage, never written while it holds them) to "),
            std::string::npos)
      << rep.spill_line;
  // layers 1 and 2 are read by the forward stage they begin and by their backward stage; layer 3,
  // the tail's first, by the tail alone
  const uint64_t read_per_step = per_step / 3 * 5;
  EXPECT_NE(rep.spill_line.find(": " + byte_text(double(per_step)) + " written and " +
                                byte_text(double(read_per_step)) + " read back per iteration"),
            std::string::npos)
      << rep.spill_line;
  train(on);
  const FrozenTierReads r = on.frozen_tier_reads();
  EXPECT_EQ(r.spill_written, uint64_t(kSteps) * per_step);
  EXPECT_EQ(r.spill_read, uint64_t(kSteps) * read_per_step);
}

// Runs kSteps with the fault `fault`; returns the RuntimeFailure's line ("" when the run succeeded
// or hung: then a failure is recorded). The run and its teardown must end within kWaitS.
std::string failing_run(const Scratch& sc, const SpillFault& fault) {
  const ModelLayout m = full_layout();
  TestSessionOptions o = spill_options(2, nullptr);
  spill_to(o, sc.path("base.cache"), 3);
  o.spill_staging = 2;
  o.spill_fault = fault;
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  {
    TestSession s(m, random_weights(m, 7), o);
    what = run_until_failure(s);
  }  // the teardown must not hang either
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), kWaitS);
  return what;
}

TEST(ActivationSpill, AReadFailingMidRunEndsItWithOneErrorAndNoHang) {
  Scratch sc;
  const std::string what = failing_run(sc, fail_nth_spill_read(5, EIO));
  EXPECT_NE(what.find("activation spill: reading layer "), std::string::npos) << what;
  EXPECT_NE(what.find("micro-batch"), std::string::npos) << what;
  EXPECT_NE(what.find("offset"), std::string::npos) << what;
  EXPECT_NE(what.find(sc.dir.string()), std::string::npos) << what;
  EXPECT_NE(what.find(std::strerror(EIO)), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  EXPECT_TRUE(sc.entries().empty());
}

TEST(ActivationSpill, AWriteFailingMidRunEndsItWithOneErrorAndNoHang) {
  Scratch sc;
  const std::string what =
      failing_run(sc, [](bool write, uint64_t index, uint64_t) { return write && index == 7 ? ENOSPC : 0; });
  EXPECT_NE(what.find("activation spill: writing layer "), std::string::npos) << what;
  EXPECT_NE(what.find("offset"), std::string::npos) << what;
  EXPECT_NE(what.find(sc.dir.string()), std::string::npos) << what;
  EXPECT_NE(what.find(std::strerror(ENOSPC)), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
}

TEST(ActivationSpill, BadSpillLayersAreRefusedWithOneLineNamingTheRange) {
  Scratch sc;
  const ModelLayout m = full_layout();
  const int L = m.num_layers();
  for (int n : {-1, L, L + 5}) {
    TestSessionOptions o = spill_options(1, nullptr);
    spill_to(o, sc.path("base.cache"), n);
    try {
      TestSession s(m, random_weights(m, 7), o);
      ADD_FAILURE() << "spill_layers " << n << " was taken";
    } catch (const std::invalid_argument& e) {
      const std::string w = e.what();
      EXPECT_EQ(w.rfind("frozen_tier.spill_layers: expected 0..", 0), 0u) << w;
      EXPECT_NE(w.find(fmt::format("0..{}", L - 1)), std::string::npos) << w;
      EXPECT_NE(w.find(fmt::format("got {}", n)), std::string::npos) << w;
      EXPECT_EQ(w.find('\n'), std::string::npos) << w;
    }
  }
  EXPECT_TRUE(sc.entries().empty());
}

}  // namespace
}  // namespace rp::test
