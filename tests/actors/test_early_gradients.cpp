// Early gradient drains (SessionOptions::early_gradients, actors/stage_task.cpp): in the last
// micro-batch of a backward or tail stage, a layer's gradient accumulators go to the host as
// soon as the last backward call touching them ran (GradsFinal), while the calls below it
// compute, instead of all at once when the stage retires.
//  - which groups are final after which call (grads_final_after): a group two calls share (a
//    tied embedding read by the LM head and the embedding of one stage) only after the later;
//  - the drains change no result: on, off, and with every GradsFinal delivered after the
//    micro-batch's ComputeDone (the task has retired, often finished and gone: the latest order
//    the compute stream's callbacks allow), the losses and weights are bit for bit the same,
//    with and without a memory cap that makes starts wait for drains;
//  - with them on, the workers receive GradsFinal (traced) and the capped run still completes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/session_testing.hpp"
#include "actors/stage_task.hpp"
#include "tests/actors/bounded.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

/// Backward calls of `layers` in that order (arguments unused by grads_final_after).
LayerCalls calls(const std::vector<int>& layers) {
  LayerCalls c;
  for (int l : layers) c.emplace_back(l, LayerArgs{});
  return c;
}

TEST(EarlyGradients, GroupsAreFinalAfterTheLastCallThatTouchesThem) {
  // tiny model: embedding 0, decoders 1..4, tail 5; groups 0..5, the tied tail also reads 0
  for (bool tied : {true, false}) {
    const ModelLayout m = make_layout(tiny_config(false, tied));
    // a backward stage B[3-1]: each decoder's group is final after its own call, the last left out
    auto f = grads_final_after(m, calls({3, 2, 1}), {1, 2, 3});
    EXPECT_EQ(f, (std::vector<std::vector<int>>{{3}, {2}, {}}));
    // a whole-model tail stage: the tail, then decoders 4..1, then the embedding
    // (group 0, tied or not, is the embedding's, whose call is the last: never sent early)
    f = grads_final_after(m, calls({5, 4, 3, 2, 1, 0}), {0, 1, 2, 3, 4, 5});
    EXPECT_EQ(f, (std::vector<std::vector<int>>{{5}, {4}, {3}, {2}, {1}, {}}));
    // calls in an order no stage uses, so that the tied group's two calls are not adjacent to
    // the end: tied, group 0 is final only after the head's call, which follows the embedding's
    f = grads_final_after(m, calls({0, 5, 4}), {0, 4, 5});
    EXPECT_EQ(f, tied ? (std::vector<std::vector<int>>{{}, {0, 5}, {}})
                      : (std::vector<std::vector<int>>{{0}, {5}, {}}));
    // frozen groups (not in grad_groups) are never drained
    f = grads_final_after(m, calls({3, 2, 1}), {2});
    EXPECT_EQ(f, (std::vector<std::vector<int>>{{}, {2}, {}}));
    EXPECT_TRUE(grads_final_after(m, calls({}), {1}).empty());
  }
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  int64_t grads_final = 0;  ///< GradsFinal messages the workers received (traced)
  int64_t start_waits = 0;
  size_t peak_bytes = 0;
};

enum class Drains { early, late_messages, off };

/// `steps` steps of the tiny model, one pass of 3 micro-batches of 2 x `seq` tokens each, over a
/// throttled link.
Outcome run(Drains drains, int workers, size_t capacity, const IterationPlan& plan, int64_t seq = 16,
            int steps = 3) {
  ModelLayout m = make_layout(tiny_config(false, true));
  TestSessionOptions o;
  o.workers = workers;
  o.micro_batches = 3;
  o.micro = {2, seq};
  o.adam = adam_opts();
  o.plan = plan;
  o.shards = 2;
  o.device.pcie_bytes_per_s = 5e7;
  if (capacity > 0) o.device.capacity_bytes = capacity;
  o.early_gradients = drains != Drains::off;
  o.late_grads_final = drains == Drains::late_messages;
  o.trace = true;
  o.trace_messages = true;
  TestSession s(m, random_weights(m, 7), o);
  for (int t = 0; t < steps; ++t) {
    std::vector<int32_t> ids, tg;
    random_tokens(m.config.vocab_size, 3 * 2 * seq, 100 + t, ids, tg);
    s.forward_backward(ids, tg);
    s.step(1e-3);
  }
  Outcome r;
  for (int t = 0; t < steps; ++t) {
    const StepResult sr = s.wait(t);
    r.losses.push_back(sr.loss_sum / sr.tokens);
  }
  s.synchronize();
  r.weights = s.master_weights();
  r.start_waits = s.memory_events().start_waits;
  r.peak_bytes = s.peak_device_bytes();
  const auto path =
      std::filesystem::temp_directory_path() / ("rp_early_grads_" + std::to_string(::getpid()) + ".json");
  s.write_trace(path.string());
  std::ifstream f(path);
  const nlohmann::json t = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  for (const auto& e : t.at("traceEvents"))
    if (e.value("name", "").find("GradsFinal") != std::string::npos && e.value("ph", "") == "X")
      ++r.grads_final;
  return r;
}

// Stages of several layers, so that calls follow the first ones in a last micro-batch:
// F[0-2] T[3-5] B[2-0] (the tail stage holds decoders 3-4 and the head, which reads the tied 0).
IterationPlan plan() {
  IterationPlan p;
  p.num_layers = 6;
  p.stages = {{StageKind::forward, 0, 2}, {StageKind::tail, 3, 5}, {StageKind::backward, 0, 2}};
  validate_plan(p, "early-gradient plan");
  return p;
}

TEST(EarlyGradients, DrainsInAnyOrderChangeNoResult) {
  for (int workers : {1, 2}) {
    const std::string what = "workers=" + std::to_string(workers);
    const Outcome off = bounded(what + " off", [&] { return run(Drains::off, workers, 0, plan()); });
    const Outcome early = bounded(what + " early", [&] { return run(Drains::early, workers, 0, plan()); });
    const Outcome late =
        bounded(what + " late", [&] { return run(Drains::late_messages, workers, 0, plan()); });
    EXPECT_EQ(off.grads_final, 0) << what;
    EXPECT_GT(early.grads_final, 0) << what << ": no layer's gradients drained early";
    EXPECT_GT(late.grads_final, 0) << what << ": the late messages were not delivered";
    for (const Outcome* r : {&early, &late}) {
      EXPECT_EQ(r->losses, off.losses) << what;
      EXPECT_EQ(r->weights, off.weights) << what;
    }
  }
}

// The cap is the largest stage's own need (its peak with every stage on a worker of its own):
// each start then waits for the drains of the stage before it on the worker, and the early
// drains (whose accumulators go back one group at a time, each retrying the wait) must not
// lose a wake-up: the run completes, with the uncapped result.
TEST(EarlyGradients, CappedRunsCompleteWithTheSameResult) {
  const IterationPlan p = make_uniform_plan(6, 4, 2, 1);  // F[0-3] T[4-5] B[3-2] B[1-0]
  const Outcome free_run = bounded("uncapped", [&] { return run(Drains::off, 1, 0, p, 5); });
  const size_t cap =
      bounded("one stage per worker", [&] { return run(Drains::off, 4, 0, p, 5, 1); }).peak_bytes;
  ASSERT_LT(cap, free_run.peak_bytes) << "the cap must bind";
  for (Drains d : {Drains::off, Drains::early, Drains::late_messages}) {
    const std::string what = "cap " + std::to_string(cap) + " drains " + std::to_string(int(d));
    Outcome r;
    try {
      r = bounded(what, [&] { return run(d, 1, cap, p, 5); });
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": " << e.what();
      continue;
    }
    EXPECT_GT(r.start_waits, 0) << what << ": no start waited, so this cap does not test the wait";
    EXPECT_EQ(r.losses, free_run.losses) << what;
    EXPECT_EQ(r.weights, free_run.weights) << what;
    std::printf("%s: %lld start waits, %lld GradsFinal\n", what.c_str(),
                static_cast<long long>(r.start_waits), static_cast<long long>(r.grads_final));
  }
}

}  // namespace
}  // namespace rp::test
