// estimate_reduction (scheduler/replica_cost.hpp): bytes per node, link time, and what the
// synchronous and the staleness-1 optimizer expose, against hand-computed cases.
#include <gtest/gtest.h>

#include "scheduler/replica_cost.hpp"

namespace {

using rp::LayerCost;

// embedding, one decoder, tail: 1000, 2000, 1000 fp32 gradient values; backward costs 1, 2, 1
std::vector<LayerCost> three_layers() {
  std::vector<LayerCost> c(3);
  c[0].bwd = 1, c[0].grad_bytes = 4000;
  c[1].bwd = 2, c[1].grad_bytes = 8000;
  c[2].tail = 1, c[2].grad_bytes = 4000;
  return c;
}

TEST(ReplicaCost, OneNodeReducesNothing) {
  const auto e = rp::estimate_reduction(three_layers(), 4, 1, 1e9, 1e-5, 1.0, 2);
  EXPECT_DOUBLE_EQ(e.values, 4000);
  EXPECT_DOUBLE_EQ(e.link_s, 0);
  EXPECT_DOUBLE_EQ(e.step_sync_s, 2.0);
  EXPECT_DOUBLE_EQ(e.step_async_s, 2.0);
}

TEST(ReplicaCost, BytesAndLinkTimeFollowTwoTimesNMinusOneOverN) {
  // 4 nodes: each sends 2 * 3/4 of 16000 bytes = 24000 bytes; at 24000 B/s that is 1 s, plus
  // 3 groups x 6 messages x 0.01 s latency
  const auto e = rp::estimate_reduction(three_layers(), 4, 4, 24000, 0.01, 10.0, 1);
  EXPECT_DOUBLE_EQ(e.values, 4000);
  EXPECT_DOUBLE_EQ(e.bytes_per_node, 24000);
  EXPECT_NEAR(e.link_s, 1.0 + 0.18, 1e-12);
  // the embedding's sum starts at the step's end (its gradient is last): 0.25 s + 0.06 s exposed
  // in sync mode at least; the other groups were done long before
  EXPECT_NEAR(e.exposed_sync_s, 0.25 + 0.06, 1e-12);
  EXPECT_DOUBLE_EQ(e.exposed_async_s, 0);  // 1.18 s of link per 10 s step
}

TEST(ReplicaCost, ASlowLinkBoundsTheAsyncStep) {
  // 2 nodes, 16000 bytes each way at 1000 B/s = 16 s of link per 2 s step
  const auto e = rp::estimate_reduction(three_layers(), 4, 2, 1000, 0, 2.0, 1);
  EXPECT_DOUBLE_EQ(e.link_s, 16.0);
  EXPECT_NEAR(e.step_async_s, 16.0, 1e-9);
  // sync: the queue starts with the tail 0.5 s into the step (a quarter of the backward, spread
  // over the 2 s iteration), runs back to back: ends at 0.5 + 16 = 16.5 s, 14.5 s after the step
  EXPECT_NEAR(e.exposed_sync_s, 14.5, 1e-9);
}

TEST(ReplicaCost, ATiedHeadIsSummedOnceWithTheEmbedding) {
  auto c = three_layers();
  c[2].grad_bytes = 4000 + c[0].grad_bytes;  // the tail's accumulators hold the embedding's too
  EXPECT_DOUBLE_EQ(rp::estimate_reduction(c, 4, 2, 1e9, 0, 1.0, 1, true).values, 4000);
  EXPECT_DOUBLE_EQ(rp::estimate_reduction(c, 4, 2, 1e9, 0, 1.0, 1, false).values, 5000);
}

TEST(ReplicaCost, PassesToHideCoverTheLink) {
  const auto e = rp::estimate_reduction(three_layers(), 4, 2, 1000, 0, 2.0, 1);  // 16 s of link
  EXPECT_EQ(e.passes_to_hide, 8);
  const auto f = rp::estimate_reduction(three_layers(), 4, 2, 1000, 0, 2.0, 8);
  EXPECT_DOUBLE_EQ(f.exposed_async_s, 0);
}

}  // namespace
