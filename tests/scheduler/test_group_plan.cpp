// Per-group bookkeeping of a plan (scheduler/group_plan.hpp):
//  - the shards' per-pass upload counts (count_per_pass) agree with ModelLayout::
//    groups_uploaded: a backward stage uploads no weight the embedding alone reads;
//  - the optimizer shard of a group of a shard's share or more holds nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "scheduler/group_plan.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

TEST(StageGroups, PerPassCountsSkipTheEmbeddingInBackwardStages) {
  for (bool tied : {true, false}) {
    const ModelLayout m = make_layout(tiny_config(false, tied));
    const int L = m.num_layers();
    for (const IterationPlan& plan : {make_uniform_plan(L, 1, 1, 0), make_uniform_plan(L, 2, 2, 1)}) {
      std::vector<int> up, gr;
      count_per_pass(m, plan, up, gr);
      // group 0: the forward stage holding the embedding, plus the tail when tied; its
      // gradient: the backward stage holding the embedding, plus the tail when tied
      EXPECT_EQ(up[0], tied ? 2 : 1) << plan.summary();
      EXPECT_EQ(gr[0], tied ? 2 : 1) << plan.summary();
      for (int g = 1; g < L - 1; ++g) {  // decoders: read by one forward and one backward stage
        const bool in_tail = plan.stages[size_t(plan.num_forward())].first <= g;
        EXPECT_EQ(up[size_t(g)], in_tail ? 1 : 2) << plan.summary() << " group " << g;
        EXPECT_EQ(gr[size_t(g)], 1) << plan.summary() << " group " << g;
      }
    }
  }
}

TEST(ShardAssignment, ALargeGroupKeepsItsShardAndTheRestIsBalanced) {
  ModelConfig c = tiny_config(false, true);
  c.vocab_size = 4000;  // embedding 128000 elements, a decoder 7744: more than a shard's share
  const ModelLayout m = make_layout(c);
  for (int shards : {2, 3, 4}) {
    const std::vector<int> owner = assign_shards(m, shards);
    ASSERT_EQ(owner.size(), m.groups.size());
    for (size_t g = 1; g < owner.size(); ++g)
      EXPECT_NE(owner[g], owner[0]) << "group " << g << ", " << shards << " shards";
    std::vector<int64_t> load(size_t(shards), 0);
    for (size_t g = 0; g < owner.size(); ++g) load[size_t(owner[g])] += m.groups[g].numel;
    int64_t lo = INT64_MAX, hi = 0, largest = 0;
    for (int k = 0; k < shards; ++k)
      if (k != owner[0]) lo = std::min(lo, load[size_t(k)]), hi = std::max(hi, load[size_t(k)]);
    for (size_t g = 1; g < owner.size(); ++g) largest = std::max(largest, m.groups[g].numel);
    EXPECT_LE(hi - lo, largest) << shards << " shards: the other groups are not balanced";
  }
  // one shard holds everything; without a large group it is plain LPT over all shards
  for (int o : assign_shards(m, 1)) EXPECT_EQ(o, 0);
  const ModelLayout small = make_layout(tiny_config(false, true));  // embedding 2144 elements
  const std::vector<int> owner = assign_shards(small, 2);
  std::vector<int64_t> load(2, 0);
  for (size_t g = 0; g < owner.size(); ++g) load[size_t(owner[g])] += small.groups[g].numel;
  EXPECT_LE(std::abs(load[0] - load[1]), small.groups[1].numel);
  EXPECT_GT(std::count(owner.begin(), owner.end(), owner[0]), 1) << "the small embedding shares its shard";
  EXPECT_THROW(assign_shards(m, 0), std::invalid_argument);
}

// Frozen groups are never requested, have no gradient and belong to no shard; the large
// frozen embedding no longer keeps a shard to itself, and the trainable groups are balanced.
TEST(ShardAssignment, FrozenGroupsHaveNoShardAndNoCounts) {
  ModelConfig c = tiny_config(false, true);
  c.vocab_size = 4000;
  ModelLayout m = make_layout(c);
  freeze_group(m, 0, WeightFormat::q8_0);
  freeze_group(m, 2, WeightFormat::bf16);
  const std::vector<int> owner = assign_shards(m, 2);
  EXPECT_EQ(owner[0], -1);
  EXPECT_EQ(owner[2], -1);
  std::vector<int64_t> load(2, 0);
  for (size_t g = 0; g < owner.size(); ++g)
    if (owner[g] >= 0) load[size_t(owner[g])] += m.groups[g].numel;
  EXPECT_GT(load[0], 0);
  EXPECT_GT(load[1], 0);
  EXPECT_LE(std::abs(load[0] - load[1]), m.groups[1].numel);
  std::vector<int> up, gr;
  count_per_pass(m, make_uniform_plan(m.num_layers(), 2, 2, 1), up, gr);
  EXPECT_EQ(up[0], 0);
  EXPECT_EQ(gr[0], 0);
  EXPECT_EQ(up[2], 0);
  EXPECT_EQ(gr[2], 0);
  EXPECT_GT(up[1], 0);
  EXPECT_EQ(gr[1], 1);
}

}  // namespace
}  // namespace rp::test
