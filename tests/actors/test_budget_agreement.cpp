// The host budget as `roundpipe plan` predicts it (scheduler/disk_tier.hpp plan_disk_tier) and
// as the runtime takes it (frozen_tier.host_budget_gib): for the same run and budget both refuse
// or both place, a refusal's least budget is the same, and a placement spills the same layers
// and keeps or drops the saved attention alike (save_attention automatic).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "scheduler/disk_tier.hpp"
#include "scheduler/host_memory.hpp"
#include "tests/actors/frozen_tier_fixture.hpp"

namespace rp::test {
namespace {

using namespace tier_fixture;

constexpr double kGiB = double(uint64_t(1) << 30);

// The run of options(1) with sequences of `seq_len` tokens, as the planner sees it (CPU: fp32).
HostRun run_of(int64_t seq_len) {
  HostRun run;
  run.seq_len = seq_len;
  run.sequences_per_micro = kNSeq;
  run.micro_batches = kM;
  run.workers = 1;
  run.pass_slots = TestSessionOptions{}.pass_slots;
  run.saved_attention = true;  // the runtime's save_attention left unset: automatic
  run.elem_bytes = 4;
  return run;
}

// Forward over the decoders, the tail, backward over the decoders: a valid plan of m's layers.
IterationPlan plan_of(const ModelLayout& m) {
  const int a = m.num_layers() - 2;
  IterationPlan p;
  p.num_layers = m.num_layers();
  p.stages = {{StageKind::forward, 0, a - 1}, {StageKind::tail, a, a + 1}, {StageKind::backward, 0, a - 1}};
  validate_plan(p, "test plan");
  return p;
}

// What `roundpipe plan` predicts for a budget of `bytes` with nothing set aside (as the runtime
// below): the runtime's ring of two buffers and its spill staging.
DiskPlan planned(const ModelLayout& m, const HostRun& run, double bytes) {
  DiskTier t;
  t.read_bandwidth = 7e9;
  t.host_budget = bytes;
  t.ring_buffers = 2;
  return plan_disk_tier(m, run, t, plan_of(m));
}

// The runtime with a budget of `bytes` and nothing set aside: "" when it places (its report in
// `report`), else its refusal's line.
std::string runtime(const ModelLayout& m, int64_t seq_len, double bytes, const std::string& path,
                    FrozenTierReport* report = nullptr) {
  TestSessionOptions o = options(1, nullptr);
  o.micro = {kNSeq, seq_len};
  o.frozen_tier = tier_at(path);
  o.frozen_tier->host_budget_gib = bytes / kGiB;
  o.host_budget_reserve = 0;
  try {
    TestSession s(m, random_weights(m, 7), o);
    if (report) *report = s.frozen_tier();
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

double least_named(const std::string& refusal) {
  const auto at = refusal.find("expected at least ");
  if (at == std::string::npos) return NAN;
  return std::stod(refusal.substr(at + std::strlen("expected at least ")));
}

// Room for the trainable state and the ring only: the planner used to spill every activation
// and predict a run, which the runtime refuses (layer 0's input and the boundary gradients
// cannot spill, and the spill's staging takes room too). Both now refuse and name the same least.
TEST(BudgetAgreement, PlanRefusesWhatTheRuntimeRefusesWithTheSameLeastBudget) {
  Scratch sc;
  const ModelLayout m = lora_layout();
  for (int64_t seq_len : {kSeqLen, int64_t(8192)}) {
    SCOPED_TRACE(seq_len);
    const HostRun run = run_of(seq_len);
    const HostMemoryNeed need = host_memory_need(m, run);
    const double bytes = need.master + need.moments + need.weights + need.gradients +
                         2 * largest_frozen_group(m) + need.activations / 4;
    const DiskPlan d = planned(m, run, bytes);
    const std::string refusal = runtime(m, seq_len, bytes, sc.path("least.cache"));
    ASSERT_FALSE(refusal.empty()) << "the runtime placed " << bytes << " bytes";
    EXPECT_FALSE(d.fits) << "the plan predicts a run the runtime refuses: " << refusal;
    const double least = least_named(refusal);
    ASSERT_FALSE(std::isnan(least)) << refusal;
    EXPECT_NEAR(d.least_budget / kGiB, least, 0.011) << refusal;
    // at the least the runtime names, both place and spill the same layers
    FrozenTierReport r;
    EXPECT_EQ(runtime(m, seq_len, least * kGiB, sc.path("least.cache"), &r), "");
    const DiskPlan at = planned(m, run, least * kGiB);
    EXPECT_TRUE(at.fits);
    EXPECT_EQ(size_t(at.spilled_layers), r.spill_layers.size()) << r.budget_line;
    if (seq_len == 8192) {  // the least rounded to 0.01 GiB still spills these long sequences
      EXPECT_GT(at.spilled_layers, 0) << r.budget_line;
    }
  }
}

// save_attention automatic: the runtime drops the saved attention whenever that keeps more of
// the base resident; the plan makes the same choice and keeps the same bytes resident.
TEST(BudgetAgreement, PlanDropsTheSavedAttentionWhenTheRuntimeDoes) {
  Scratch sc;
  const ModelLayout m = lora_layout(12, WeightFormat::bf16);  // a base well above its attention
  const HostRun run = run_of(kSeqLen);
  const HostMemoryNeed with = host_memory_need(m, run);
  const double frozen = double(frozen_bytes(m));
  for (double share : {0.5, 0.9}) {  // half the base beside everything else, then most of it
    SCOPED_TRACE(share);
    const double bytes = with.total() - frozen + 2 * largest_frozen_group(m) + frozen * share;
    FrozenTierReport r;
    ASSERT_EQ(runtime(m, kSeqLen, bytes, sc.path("auto.cache"), &r), "");
    const DiskPlan d = planned(m, run, bytes);
    ASSERT_TRUE(d.fits);
    EXPECT_EQ(d.attention_dropped, r.attention_dropped) << r.budget_line;
    EXPECT_EQ(d.dropped_for_base, r.attention_dropped) << r.budget_line;
    if (r.enabled) {
      EXPECT_EQ(uint64_t(d.resident_bytes), r.resident_bytes) << r.budget_line;
    }
  }
}

}  // namespace
}  // namespace rp::test
