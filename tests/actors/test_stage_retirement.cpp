// What a stage transfers and when the next one may start (actors/worker.cpp):
//  - a backward stage uploads no weight the embedding alone reads: the embedding's
//    backward scatters dy into gradient rows and reads no weight (ModelLayout::
//    groups_uploaded; the shards' per-pass counts agree: tests/scheduler/test_group_plan.cpp);
//  - a stage retires when its last micro-batch is computed: the next stage computes while
//    the retiring stage's last outputs are still on the link, and the retiring stage
//    reports StageDone (its "tasks" trace interval ends) only when they have landed;
//  - behind a weightless next stage (the embedding's backward) the stage after it
//    prefetches its weights too, before the weightless one becomes current.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "actors/optimizer_shard.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"
#include "trace/trace_check.hpp"

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
    EXPECT_EQ(m.groups_of(std::vector<int>{tail, 0, 3}),
              tied ? (std::vector<int>{0, 3, tail}) : (std::vector<int>{0, 3, tail}));
  }
}

struct Interval {
  double start = 0, end = 0;
};

/// The session's recorded trace (Session::write_trace), parsed.
nlohmann::json trace_of(const Session& s) {
  const auto path =
      std::filesystem::temp_directory_path() / ("rp_stage_trace_" + std::to_string(::getpid()) + ".json");
  s.write_trace(path.string());
  std::ifstream f(path);
  nlohmann::json t = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  EXPECT_TRUE(check_trace_nesting(t).ok()) << check_trace_nesting(t).summary();
  return t;
}

/// Runs one step of the tiny model on one worker over a slow link and returns the loss
/// and the trace's compute and task intervals by name.
double run_traced(double pcie_bytes_per_s, std::map<std::string, Interval>& slices) {
  ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.workers = 1;
  o.micro_batches = 2;
  o.micro = {4, 256};  // 128 KiB of activations per layer and micro-batch
  o.adam = adam_opts();
  o.plan = make_uniform_plan(m.num_layers(), 2, 2, 1);  // F[0-1] F[2-3] T[4-5] B[3-2] B[1-0]
  o.device.pcie_bytes_per_s = pcie_bytes_per_s;
  // first come, first served: the next stage's weights (<= 40 KB) go up while the current
  // stage waits for its inputs, not only in gaps between activation copies
  o.transfer_priorities = false;
  o.trace = true;
  Session s(m, random_weights(m, 7), o);
  std::vector<int32_t> ids, tg;
  random_tokens(m.config.vocab_size, 2 * 4 * 256, 11, ids, tg);
  s.forward_backward(ids, tg);
  s.step(1e-3);
  const StepResult r = s.wait(0);
  s.synchronize();
  const nlohmann::json t = trace_of(s);
  for (const auto& e : t.at("traceEvents"))
    if (e.value("ph", "") == "X") {
      const double ts = e.at("ts").get<double>();
      slices[e.at("name").get<std::string>()] = {ts, ts + e.at("dur").get<double>()};
    }
  return r.loss_sum / r.tokens;
}

// 128 KiB at 1 MB/s: each output download takes ~131 ms, far longer than starting the next
// stage's first micro-batch, whose input and weights are on the device by then.
TEST(StageRetirement, NextStageComputesWhileTheLastOutputsDownload) {
  std::map<std::string, Interval> slow, fast;
  const double loss_slow = run_traced(1e6, slow);
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

// F[0-1] F[2-3] T[4-5] B[3-2] B[1-1] B[0-0]: the last backward stage uploads no weight.
TEST(StageRetirement, NextPassPrefetchesBehindTheEmbeddingsBackwardStage) {
  ModelLayout m = make_layout(tiny_config(false, true));
  IterationPlan plan;
  plan.num_layers = m.num_layers();
  plan.stages = {{StageKind::forward, 0, 1},  {StageKind::forward, 2, 3},  {StageKind::tail, 4, 5},
                 {StageKind::backward, 2, 3}, {StageKind::backward, 1, 1}, {StageKind::backward, 0, 0}};
  validate_plan(plan, "test");
  SessionOptions o;
  o.workers = 1;
  o.micro_batches = 2;
  o.micro = {4, 64};  // 32 KiB activations: B[1-1] spends >= 4 x 16 ms on its uploads
  o.adam = adam_opts();
  o.plan = plan;
  o.device.pcie_bytes_per_s = 2e6;  // an 8.6 KB embedding upload takes ~4 ms, a decoder's ~15
  // first come, first served: a weight copy is issued when requested (with priorities it
  // waits for a gap in the activation uploads, which would make the issue time racy)
  o.transfer_priorities = false;
  o.trace = true;
  Session s(m, random_weights(m, 7), o);
  for (int t = 0; t < 2; ++t) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, 2 * 4 * 64, 20 + t, ids, tg);
    s.forward_backward(ids, tg);
    s.step(1e-3);
  }
  s.wait(1);
  s.synchronize();
  const nlohmann::json t = trace_of(s);
  // track ids by name, then the embedding group's uploads (the only 8576-byte weight copies:
  // 67 x 32 fp32) in issue order: F[0-1] of pass 0, the tied tail of pass 0, F[0-1] of pass 1
  std::map<int, std::string> track;
  for (const auto& e : t.at("traceEvents"))
    if (e.value("ph", "") == "M") track[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
  std::vector<double> embed_up;
  double weightless_current = -1;
  for (const auto& e : t.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const std::string name = e.at("name").get<std::string>();
    if (track[e.at("tid").get<int>()] == "worker0.param_up" && name == "copy 8576 B")
      embed_up.push_back(e.at("ts").get<double>());
    if (name == "backward stage 5 (pass 0)") weightless_current = e.at("ts").get<double>();
  }
  std::sort(embed_up.begin(), embed_up.end());
  ASSERT_GE(embed_up.size(), 3u);
  ASSERT_GE(weightless_current, 0) << "no task interval for B[0-0] of pass 0";
  EXPECT_LT(embed_up[2], weightless_current)
      << "pass 1's first forward stage uploaded its weights only " << (embed_up[2] - weightless_current) / 1e3
      << " ms after B[0-0] of pass 0 became current";
}

}  // namespace
}  // namespace rp::test
