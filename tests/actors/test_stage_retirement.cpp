// What a stage transfers and when the next one may start (actors/worker.cpp):
//  - a backward stage uploads no weight the embedding alone reads: the embedding's
//    backward scatters dy into gradient rows and reads no weight (ModelLayout::
//    groups_uploaded); the shards' per-pass upload counts (count_per_pass) agree;
//  - a stage retires when its last micro-batch is computed: the next stage computes while
//    the retiring stage's last outputs are still on the link, and the retiring stage
//    reports StageDone (its "tasks" trace interval ends) only when they have landed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "actors/scheduler_actor.hpp"
#include "roundpipe/session.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

TEST(StageGroups, BackwardStagesLeaveOutTheEmbeddingWeights) {
  for (bool tied : {true, false}) {
    const ModelLayout m = make_layout(tiny_config(false, tied));  // layers 0..5, groups 0..5
    const int tail = m.num_layers() - 1;
    EXPECT_EQ(m.groups_uploaded({0}, true), std::vector<int>{});
    EXPECT_EQ(m.groups_uploaded({2, 1, 0}, true), (std::vector<int>{1, 2}));
    EXPECT_EQ(m.groups_uploaded({0, 1}, false), (std::vector<int>{0, 1}));  // forward: the lookup reads it
    // a tied LM head reads the embedding matrix in every stage that holds the tail
    const std::vector<int> tail_groups = tied ? std::vector<int>{0, 4, tail} : std::vector<int>{4, tail};
    EXPECT_EQ(m.groups_uploaded({4, tail}, false), tail_groups);
    // a whole-model tail runs the embedding's forward
    EXPECT_EQ(m.groups_uploaded({0, 1, 2, 3, 4, tail}, false), (std::vector<int>{0, 1, 2, 3, 4, tail}));
    EXPECT_EQ(m.groups_of(std::vector<int>{tail, 0, 3}), tied ? (std::vector<int>{0, 3, tail}) : (std::vector<int>{0, 3, tail}));
  }
}

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

struct Interval {
  double start = 0, end = 0;
};

/// Runs one step of the tiny model on one worker over a slow link and returns the loss
/// and the trace's compute and task intervals by name.
double run_traced(double pcie_bytes_per_s, std::map<std::string, Interval>& slices) {
  ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.workers = 1;
  o.micro_batches = 2;
  o.micro = {4, 64};  // 32 KiB of activations per layer and micro-batch
  o.adam = adam_opts();
  o.plan = make_uniform_plan(m.num_layers(), 2, 2, 1);  // F[0-1] F[2-3] T[4-5] B[3-2] B[1-0]
  o.device.pcie_bytes_per_s = pcie_bytes_per_s;
  o.trace = true;
  Session s(m, random_weights(m, 7), o);
  std::vector<int32_t> ids, tg;
  random_tokens(m.config.vocab_size, 2 * 4 * 64, 11, ids, tg);
  s.forward_backward(ids, tg);
  s.step(1e-3);
  const StepResult r = s.wait(0);
  s.synchronize();
  const auto path = std::filesystem::temp_directory_path() /
                    ("rp_retire_" + std::to_string(::getpid()) + ".json");
  s.write_trace(path.string());
  std::ifstream f(path);
  const nlohmann::json t = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  for (const auto& e : t.at("traceEvents"))
    if (e.value("ph", "") == "X") {
      const double ts = e.at("ts").get<double>();
      slices[e.at("name").get<std::string>()] = {ts, ts + e.at("dur").get<double>()};
    }
  return r.loss_sum / r.tokens;
}

// 32 KiB at 2 MB/s: each output download takes ~16 ms, far longer than starting the next
// stage's first micro-batch, whose input and weights are on the device by then.
TEST(StageRetirement, NextStageComputesWhileTheLastOutputsDownload) {
  std::map<std::string, Interval> slow, fast;
  const double loss_slow = run_traced(2e6, slow);
  const double loss_fast = run_traced(0, fast);
  EXPECT_DOUBLE_EQ(loss_slow, loss_fast) << "the overlap must not change the result";
  for (auto [retiring, next_mb0] : {std::pair{"forward stage 0 (pass 0)", "F1 L2-3 mb0 (pass 0)"},
                                    {"forward stage 1 (pass 0)", "T2 L4-5 mb0 (pass 0)"}}) {
    ASSERT_TRUE(slow.count(retiring)) << retiring;
    ASSERT_TRUE(slow.count(next_mb0)) << next_mb0;
    const Interval done = slow.at(retiring), next = slow.at(next_mb0);
    // the retiring stage's task interval ends when its last output has landed
    EXPECT_LT(next.start, done.end) << next_mb0 << " started " << (next.start - done.end) / 1e3
                                    << " ms after " << retiring << " ended";
  }
}

}  // namespace
}  // namespace rp::test
