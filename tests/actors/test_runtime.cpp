// The actor runtime against a plain sequential loop (tests/actors/runtime_reference.hpp):
// for a fixed number of micro-batches the result must not depend on the number of
// workers, the plan, or the split of a step into passes; sync mode is a textbook AdamW
// loop, async mode is the staleness-1 loop (step t's gradient is taken at the weights
// from before step t-1).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>

#include "actors/session_testing.hpp"
#include "tests/actors/bounded.hpp"
#include "tests/actors/runtime_reference.hpp"
#include "trace/trace_check.hpp"

namespace rp::test {
namespace {

struct Scenario {
  bool qwen3 = false, tied = true, async = true;
  int workers = 1;
  int64_t M = 3;
  int steps = 3;
  int passes_per_step = 1;
  std::optional<IterationPlan> plan;
  double max_grad_norm = 0;  // > 0: global-norm clipping (guarded steps)
  ProfilingOptions profiling;
  Replanner::Planner planner;  // replaces the partitioner at re-plan time
  bool transfer_priorities = true;
  size_t transfer_chunk_bytes = size_t(32) << 20;
  double pcie_bytes_per_s = 0;
  size_t capacity_bytes = 0;           // > 0: per-device memory cap (else the default)
  std::optional<bool> save_attention;  // SessionOptions::save_attention (empty: automatic)
};

struct Outcome {
  std::vector<double> losses;      // mean loss per step
  std::vector<double> grad_norms;  // guarded runs: global norm before clipping
  std::vector<std::vector<float>> weights;
  IterationPlan initial_plan, final_plan;
  std::vector<std::string> replan_log;
  size_t peak_bytes = 0;  // Session::peak_device_bytes
  MemoryEvents memory;
};

constexpr int64_t kNSeq = 2, kSeqLen = 5;

Outcome run_runtime(const Scenario& sc) {
  ModelLayout m = make_layout(tiny_config(sc.qwen3, sc.tied));
  TestSessionOptions o;
  o.workers = sc.workers;
  o.micro_batches = sc.M;
  o.micro = {kNSeq, kSeqLen};
  o.async = sc.async;
  o.adam = adam_opts();
  o.plan = sc.plan;
  o.shards = 2;
  o.max_grad_norm = sc.max_grad_norm;
  o.profiling = sc.profiling;
  o.planner = sc.planner;
  o.transfer_priorities = sc.transfer_priorities;
  o.transfer_chunk_bytes = sc.transfer_chunk_bytes;
  o.device.pcie_bytes_per_s = sc.pcie_bytes_per_s;
  if (sc.capacity_bytes > 0) o.device.capacity_bytes = sc.capacity_bytes;
  o.save_attention = sc.save_attention;
  TestSession s(m, random_weights(m, 7), o);
  const int64_t n = sc.M * kNSeq * kSeqLen;
  for (int t = 0; t < sc.steps; ++t) {
    for (int p = 0; p < sc.passes_per_step; ++p) {
      std::vector<int32_t> ids, tg;
      random_tokens(m.config.vocab_size, n, 100 + t * 10 + p, ids, tg);
      s.forward_backward(ids, tg);
    }
    s.step(lr_at(t));
  }
  Outcome out;
  for (int t = 0; t < sc.steps; ++t) {
    StepResult r = s.wait(t);
    out.losses.push_back(r.loss_sum / r.tokens);
    out.grad_norms.push_back(r.grad_norm);
  }
  s.synchronize();
  out.weights = s.master_weights();
  out.initial_plan = s.initial_plan();
  out.final_plan = s.plan();
  out.replan_log = s.replan_log();
  out.peak_bytes = s.peak_device_bytes();
  out.memory = s.memory_events();
  return out;
}

// The reference: staleness s (0 sync, 1 async); micro-batches of all passes of a step.
Outcome run_reference(const Scenario& sc) {
  ModelLayout m = make_layout(tiny_config(sc.qwen3, sc.tied));
  auto w = random_weights(m, 7);
  std::vector<std::vector<std::vector<float>>> versions{w};  // versions[k] = after k steps
  std::vector<TextbookAdamW> opt(m.groups.size());
  const int staleness = sc.async ? 1 : 0;
  const int64_t n = sc.M * kNSeq * kSeqLen;
  Outcome out;
  for (int t = 0; t < sc.steps; ++t) {
    const auto& used = versions[std::max(0, t - staleness)];
    std::vector<std::vector<double>> grads(m.groups.size());
    for (size_t g = 0; g < grads.size(); ++g) grads[g].assign(w[g].size(), 0.0);
    double loss = 0, count = 0;
    for (int p = 0; p < sc.passes_per_step; ++p) {
      std::vector<int32_t> ids, tg;
      random_tokens(m.config.vocab_size, n, 100 + t * 10 + p, ids, tg);
      sequential_forward_backward(m, used, ids, tg, sc.M, {kNSeq, kSeqLen}, grads, loss, count);
    }
    out.losses.push_back(loss / count);
    double sumsq = 0;
    for (size_t g = 0; g < grads.size(); ++g)
      for (auto& x : grads[g]) x /= count, sumsq += x * x;
    const double norm = std::sqrt(sumsq);
    out.grad_norms.push_back(norm);
    const double coef = sc.max_grad_norm > 0 ? std::min(1.0, sc.max_grad_norm / (norm + 1e-6)) : 1.0;
    for (size_t g = 0; g < grads.size(); ++g) {
      for (auto& x : grads[g]) x *= coef;
      opt[g].step(w[g], grads[g], adam_opts(), lr_at(t));
    }
    versions.push_back(w);
  }
  out.weights = w;
  return out;
}

void expect_same(const Outcome& got, const Outcome& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t t = 0; t < ref.losses.size(); ++t)
    EXPECT_NEAR(got.losses[t], ref.losses[t], tol * std::abs(ref.losses[t])) << what << " step " << t;
  ASSERT_EQ(got.weights.size(), ref.weights.size());
  for (size_t g = 0; g < ref.weights.size(); ++g)
    EXPECT_LT(rel_err(got.weights[g], ref.weights[g]), tol) << what << " group " << g;
}

class RuntimeVsSequential : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(RuntimeVsSequential, LossesAndWeightsMatch) {
  auto [workers, async] = GetParam();
  Scenario sc;
  sc.workers = workers;
  sc.async = async;
  Outcome ref = run_reference(sc);
  // The reference itself must be non-trivial: weights move and losses differ per step.
  Outcome init = ref;
  ModelLayout m = make_layout(tiny_config(false, true));
  EXPECT_GT(rel_err(ref.weights[1], random_weights(m, 7)[1]), 1e-4);
  expect_same(run_runtime(sc), ref, 1e-5, "workers=" + std::to_string(workers));
}

INSTANTIATE_TEST_SUITE_P(Workers, RuntimeVsSequential,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8), ::testing::Bool()));

// Global-norm clipping across shards (each group reports its sum of squares; the step waits
// only for that scalar) equals clip_grad_norm_ over all gradients of the reference loop.
TEST(Runtime, GlobalNormClippingMatchesReference) {
  for (bool async : {false, true})
    for (int workers : {1, 3}) {
      Scenario sc;
      sc.async = async;
      sc.workers = workers;
      sc.steps = 4;
      Outcome unclipped = run_reference(sc);
      sc.max_grad_norm = 0.5 * unclipped.grad_norms[0];  // active on the first steps at least
      Outcome ref = run_reference(sc);
      EXPECT_GT(rel_err(ref.weights[1], unclipped.weights[1]), 1e-4) << "clipping must matter";
      Outcome got = run_runtime(sc);
      const std::string what = std::string(async ? "async" : "sync") + " workers=" + std::to_string(workers);
      expect_same(got, ref, 1e-5, what);
      for (size_t t = 0; t < ref.grad_norms.size(); ++t)
        EXPECT_NEAR(got.grad_norms[t], ref.grad_norms[t], 1e-5 * ref.grad_norms[t]) << what << " step " << t;
    }
}

// Without clipping (no guard) the global norm is still reported: each group's update job sums
// its gradient's squares. It equals the reference loop's norm, and measuring it changes no
// weight: the run equals, bit for bit, one guarded by a clipping threshold that never clips.
TEST(Runtime, GradNormWithoutClippingMatchesReferenceAndChangesNothing) {
  for (bool async : {false, true})
    for (int workers : {1, 3}) {
      Scenario sc;
      sc.async = async;
      sc.workers = workers;
      sc.steps = 4;
      const std::string what = std::string(async ? "async" : "sync") + " workers=" + std::to_string(workers);
      const Outcome ref = run_reference(sc);
      const Outcome got = run_runtime(sc);
      ASSERT_EQ(got.grad_norms.size(), ref.grad_norms.size());
      for (size_t t = 0; t < ref.grad_norms.size(); ++t) {
        EXPECT_GT(ref.grad_norms[t], 0) << what;
        EXPECT_NEAR(got.grad_norms[t], ref.grad_norms[t], 1e-5 * ref.grad_norms[t]) << what << " step " << t;
      }
      sc.max_grad_norm = 1e30;  // guarded steps, clip coefficient 1
      const Outcome guarded = run_runtime(sc);
      for (size_t g = 0; g < got.weights.size(); ++g)
        EXPECT_EQ(got.weights[g], guarded.weights[g]) << what << " group " << g;
      for (size_t t = 0; t < got.grad_norms.size(); ++t)
        EXPECT_EQ(got.grad_norms[t], guarded.grad_norms[t]) << what << " step " << t;
    }
}

// A NaN in the weights makes every gradient NaN: with skip_nonfinite each step is skipped,
// so the fp32 masters (and the protocol: every step still completes) stay exactly as they were.
TEST(Runtime, NonFiniteGradientsSkipTheStep) {
  for (bool async : {false, true}) {
    ModelLayout m = make_layout(tiny_config(false, true));
    auto w0 = random_weights(m, 7);
    w0.back()[0] = std::numeric_limits<float>::quiet_NaN();
    SessionOptions o;
    o.workers = 2;
    o.micro_batches = 2;
    o.micro = {kNSeq, kSeqLen};
    o.async = async;
    o.adam = adam_opts();
    o.shards = 2;
    o.skip_nonfinite = true;
    TestSession s(m, w0, o);
    const int64_t n = 2 * kNSeq * kSeqLen;
    for (int t = 0; t < 4; ++t) {
      std::vector<int32_t> ids, tg;
      random_tokens(m.config.vocab_size, n, 100 + t, ids, tg);
      s.forward_backward(ids, tg);
      s.step(lr_at(t));
    }
    for (int t = 0; t < 4; ++t) EXPECT_TRUE(s.wait(t).skipped) << "step " << t;
    s.synchronize();
    for (size_t g = 0; g < w0.size(); ++g) {
      ASSERT_EQ(0, std::memcmp(s.master_weights()[g].data(), w0[g].data(), w0[g].size() * 4))
          << "group " << g;
      EXPECT_EQ(s.optimizer_states()[g].step, 0) << "group " << g;
    }
  }
}

TEST(Runtime, AsyncDiffersFromSyncAfterTwoSteps) {
  // Guards against a runtime that silently ignores the staleness setting.
  Scenario a, s;
  s.async = false;
  Outcome ra = run_runtime(a), rs = run_runtime(s);
  EXPECT_NEAR(ra.losses[0], rs.losses[0], 1e-6);
  EXPECT_NEAR(ra.losses[1], run_reference(a).losses[1], 1e-5);
  EXPECT_GT(std::abs(ra.losses[2] - rs.losses[2]), 1e-7);
}

TEST(Runtime, UntiedQwen3MatchesSequential) {
  Scenario sc;
  sc.qwen3 = true;
  sc.tied = false;
  sc.workers = 3;
  expect_same(run_runtime(sc), run_reference(sc), 1e-5, "qwen3 untied");
}

TEST(Runtime, PlansDoNotChangeTheResult) {
  const int L = 6;  // 4 decoders + embedding + tail
  for (auto plan : {make_uniform_plan(L, 1, 1, 0), make_uniform_plan(L, 3, 1, 2),
                    make_uniform_plan(L, 2, 4, 1), make_uniform_plan(L, 5, 5, 0)}) {
    Scenario sc;
    sc.workers = 2;
    sc.plan = plan;
    expect_same(run_runtime(sc), run_reference(sc), 1e-5, plan.summary());
  }
}

// Re-planning (scheduler/replan.hpp) swaps the plan between passes, here in the middle of a
// step (3 passes per step, 2 pass slots: pass 2 is dealt after pass 0 finished and its
// timings settled the profile). The forced plan moves decoders into / out of the tail, so the
// per-group upload and gradient counts of the step change with it (CloseStep totals).
TEST(Runtime, ReplanningMidTrainingEqualsSequential) {
  const int L = 6;
  for (bool async : {true, false}) {
    Scenario sc;
    sc.workers = 2;
    sc.async = async;
    sc.passes_per_step = 3;
    sc.profiling.settle_min_samples = 1;
    sc.profiling.settle_rel_tol = 1e9;  // settled as soon as every series has a kept sample
    IterationPlan forced;
    int calls = 0;
    sc.planner = [&](const std::vector<LayerCost>& measured) {
      ++calls;
      EXPECT_EQ(measured.size(), size_t(L));
      return forced;
    };
    // the forced plan must differ from the automatic initial one in its tail
    const IterationPlan a = make_uniform_plan(L, 2, 1, 2), b = make_uniform_plan(L, 1, 1, 0);
    {
      ModelLayout m = make_layout(tiny_config(false, true));
      SessionOptions probe;
      probe.workers = 2;
      probe.micro_batches = sc.M;
      probe.micro = {kNSeq, kSeqLen};
      probe.profiling.enabled = false;
      Session s(m, random_weights(m, 7), probe);
      forced =
          s.initial_plan().stages[size_t(s.initial_plan().num_forward())] == a.stages[size_t(a.num_forward())]
              ? b
              : a;
    }
    const std::string what = std::string(async ? "async" : "sync");
    Outcome got = run_runtime(sc);
    EXPECT_EQ(calls, 1) << what;
    ASSERT_EQ(got.replan_log.size(), 1u) << what;
    EXPECT_NE(got.replan_log[0].find("->"), std::string::npos) << got.replan_log[0];
    EXPECT_EQ(got.final_plan.stages, forced.stages) << what << ": " << got.final_plan.summary();
    EXPECT_NE(got.initial_plan.stages, forced.stages) << what;
    expect_same(got, run_reference(sc), 1e-5, what + " re-planned " + got.replan_log[0]);
  }
}

// The real decision (partition of the measured costs, kept or switched): whatever it picks,
// the result equals the sequential loop, and it is taken exactly once.
TEST(Runtime, MeasuredReplanningEqualsSequential) {
  Scenario sc;
  sc.workers = 3;
  sc.steps = 4;
  sc.passes_per_step = 2;
  sc.profiling.settle_min_samples = 1;
  sc.profiling.settle_rel_tol = 1e9;
  sc.profiling.min_gain = 0;  // switch on any predicted gain
  Outcome got = run_runtime(sc);
  ASSERT_EQ(got.replan_log.size(), 1u);
  std::printf("%s\n", got.replan_log[0].c_str());
  expect_same(got, run_reference(sc), 1e-5, got.replan_log[0]);
}

// An explicit plan is never changed, however settled the profile.
TEST(Runtime, ExplicitPlansAreNotReplanned) {
  Scenario sc;
  sc.workers = 2;
  sc.plan = make_uniform_plan(6, 1, 1, 0);
  sc.profiling.settle_min_samples = 1;
  sc.profiling.settle_rel_tol = 1e9;
  int calls = 0;
  sc.planner = [&](const std::vector<LayerCost>&) {
    ++calls;
    return make_uniform_plan(6, 2, 1, 2);
  };
  Outcome got = run_runtime(sc);
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(got.replan_log.empty());
  EXPECT_EQ(got.final_plan.stages, sc.plan->stages);
}

// Chunked, window-packed and arbitrated copies (and their absence) move the same bytes: the
// result equals the reference and does not change by a bit between transfer settings. Tiny
// chunks (1 KiB: ~40 per decoder layer) and a throttled link make chunks of prefetches and
// gradient drains interleave with activation copies.
TEST(Runtime, TransferSettingsDoNotChangeTheResult) {
  Scenario sc;
  sc.workers = 3;
  sc.M = 4;
  sc.pcie_bytes_per_s = 2e8;
  Outcome ref = run_reference(sc);
  std::vector<Outcome> runs;
  for (auto [prio, chunk] :
       {std::pair{true, size_t(1024)}, {false, size_t(1024)}, {false, size_t(0)}, {true, size_t(0)}}) {
    sc.transfer_priorities = prio;
    sc.transfer_chunk_bytes = chunk;
    runs.push_back(run_runtime(sc));
    expect_same(runs.back(), ref, 1e-5,
                "priorities " + std::to_string(prio) + " chunk " + std::to_string(chunk));
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].losses, runs[0].losses) << "settings " << i;
    EXPECT_EQ(runs[i].weights, runs[0].weights) << "settings " << i;
  }
}

// Forward stages keep each decoder's attention output and log-sum-exp and backward stages use
// them instead of recomputing the attention: the same numbers as recomputing, bit for bit
// (the same kernels on the same inputs), on plans with and without decoders in the tail and
// with one worker (shared pass activations) or three.
TEST(Runtime, SavedAttentionEqualsRecomputingIt) {
  for (int workers : {1, 3})
    for (bool qwen3 : {false, true}) {
      Scenario sc;
      sc.workers = workers;
      sc.qwen3 = qwen3;
      sc.M = 3;
      sc.plan = make_uniform_plan(6, 2, 1, 1);  // F[0-1] F[2-3] T[4-5] B[3-3] B[2-2] B[1-1] B[0-0]
      sc.save_attention = false;
      const Outcome off = run_runtime(sc);
      sc.save_attention = true;
      const Outcome on = run_runtime(sc);
      EXPECT_EQ(on.losses, off.losses) << workers << " workers, qwen3 " << qwen3;
      EXPECT_EQ(on.weights, off.weights) << workers << " workers, qwen3 " << qwen3;
      expect_same(on, run_reference(sc), 1e-5, "saved attention");
    }
}

TEST(Runtime, AccumulationOverPassesEqualsOneBigBatch) {
  // 2 passes of 2 micro-batches per step vs the reference that sees all 4 micro-batches
  // at once, normalised by the global number of target tokens.
  Scenario sc;
  sc.workers = 2;
  sc.M = 2;
  sc.passes_per_step = 2;
  expect_same(run_runtime(sc), run_reference(sc), 1e-5, "2 passes");
  Scenario one = sc;
  one.passes_per_step = 1;
  // A single pass must give another result (the test data differ), proving the passes count.
  EXPECT_GT(rel_err(run_runtime(one).weights[1], run_runtime(sc).weights[1]), 1e-6);
}

TEST(Runtime, DeviceOutOfMemoryIsATypedFailure) {
  ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.workers = 2;
  o.micro = {kNSeq, kSeqLen};
  o.device.capacity_bytes = 4096;  // far too small for any stage
  Session s(m, random_weights(m, 7), o);
  std::vector<int32_t> ids, tg;
  random_tokens(m.config.vocab_size, kNSeq * kSeqLen, 1, ids, tg);
  s.forward_backward(ids, tg);
  int64_t t = s.step(1e-3);
  try {
    s.wait(t);
    FAIL() << "expected RuntimeFailure";
  } catch (const RuntimeFailure& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("worker"), std::string::npos) << what;
    EXPECT_NE(what.find("cannot allocate"), std::string::npos) << what;
  }
}

// ---- The device memory cap (SessionOptions::device.capacity_bytes) ----------------------------
// A worker's stage start allocates the stage's weights and work buffers while the stages it ran
// before may still be writing their gradients back. A start the cap refuses then waits for a
// drain to finish instead of failing the run (actors/worker.cpp: start_next, begin_current);
// a refused prefetch leaves the next stage queued intact. Capacities are found from the
// session's own peak bytes, not hard-coded, so the tests follow changes of the buffers a
// stage allocates. Session::memory_events() tells whether a run went through the wait.

/// Device bytes of the plan's largest stage on its own: one pass with every stage on a worker
/// of its own (no prefetched stage beside it, no earlier stage's gradients draining), so each
/// device's peak is one stage's weights plus work buffers. The smallest capacity a run with the
/// start wait completes with: any start then fits once the drains ahead of it are done.
size_t largest_stage_bytes(Scenario sc) {
  sc.workers = int(sc.plan->stages.size());
  sc.steps = 1;
  sc.passes_per_step = 1;
  sc.capacity_bytes = 0;
  sc.pcie_bytes_per_s = 0;
  return bounded("largest stage probe", [&] { return run_runtime(sc); }).peak_bytes;
}

/// run_runtime, with a runtime failure reported as a test failure (its one-line message says
/// which allocation the cap refused) instead of an exception.
std::optional<Outcome> run_capped(const Scenario& sc, const std::string& what) {
  try {
    return bounded(what, [&] { return run_runtime(sc); });
  } catch (const RuntimeFailure& e) {
    ADD_FAILURE() << what << ": capacity " << sc.capacity_bytes << " bytes: " << e.what();
    return std::nullopt;
  }
}

/// The CPU backend's allocation failure, naming the capacity in bytes.
bool names_the_capacity(const std::string& what, size_t cap) {
  return what.find("cannot allocate") != std::string::npos &&
         what.find("capacity (" + std::to_string(cap) + " bytes)") != std::string::npos;
}

// Plans over embedding + 4 decoders + tail (layers 0-5); stages are dealt round-robin.
// F[0-3] T[4-5] B[3-2] B[1-0]: the largest stage is the tail. On one worker B[3-2] starts right
// after it, on two workers the tail starts right after B[1-0]: the starting stage's weights
// fit beside the previous stage's gradients, its work buffers do not (begin_current waits).
IterationPlan work_bound_plan() { return make_uniform_plan(6, 4, 2, 1); }
// F[0-4] T[5-5] B[4-3] B[2-0]: the largest stage is B[2-0] (about 186 KB). F[0-4] holds most
// of the weights (132 KB) and small work buffers; it starts right after a backward stage (on
// one worker B[2-0] of the previous pass, on two B[4-3]) whose 62-71 KB of gradients leave no
// room for its weights: the cap refuses already prepare() (start_next waits).
IterationPlan weight_bound_plan() {
  IterationPlan p;
  p.num_layers = 6;
  p.stages = {{StageKind::forward, 0, 4},
              {StageKind::tail, 5, 5},
              {StageKind::backward, 3, 4},
              {StageKind::backward, 0, 2}};
  validate_plan(p, "weight-bound plan");
  return p;
}

// (a) The cap is the largest stage's own need, the smallest capacity any run can complete
// with (one 256-byte block less fails, test (b)): every stage fits on an empty device, but not
// beside the gradients of the stage its worker ran before, which are still on the device
// when it starts (a stage's drain begins when its last micro-batch is downloaded, and the
// next stage starts in the same message; the drain then crosses a throttled link). Each such
// start waits for the drain and retries; without the wait the run fails with the device's
// "cannot allocate". The result equals the sequential loop, async and sync.
TEST(RuntimeMemoryCap, StartRefusedByTheCapWaitsForDrainingGradients) {
  for (auto [plan, workers] : {std::pair{work_bound_plan(), 1},
                               {work_bound_plan(), 2},
                               {weight_bound_plan(), 1},
                               {weight_bound_plan(), 2}})
    for (bool async : {true, false}) {
      Scenario sc;
      sc.plan = plan;
      sc.async = async;
      sc.workers = workers;
      sc.pcie_bytes_per_s = 5e7;  // a 31 KB decoder gradient takes 0.6 ms to drain
      const std::string what =
          plan.summary() + (async ? " async" : " sync") + " workers=" + std::to_string(workers);
      const Outcome uncapped = bounded(what, [&] { return run_runtime(sc); });
      EXPECT_EQ(uncapped.memory.start_waits, 0) << what;
      EXPECT_EQ(uncapped.memory.prefetch_refusals, 0) << what;
      sc.capacity_bytes = largest_stage_bytes(sc);
      ASSERT_LT(sc.capacity_bytes, uncapped.peak_bytes) << what << ": the cap must bind";
      const std::optional<Outcome> got = run_capped(sc, what);
      if (!got) continue;
      std::printf("%s: cap %zu bytes (uncapped peak %zu): %lld start waits, %lld prefetches refused\n",
                  what.c_str(), sc.capacity_bytes, uncapped.peak_bytes,
                  static_cast<long long>(got->memory.start_waits),
                  static_cast<long long>(got->memory.prefetch_refusals));
      EXPECT_GT(got->memory.start_waits, 0)
          << what << ": no start waited, so this cap does not test the wait";
      EXPECT_EQ(got->peak_bytes, sc.capacity_bytes) << what;
      expect_same(*got, run_reference(sc), 1e-5, what + " capped");
    }
}

// (b) A stage that does not fit an empty device fails the run with the device's one-line
// typed error, which names the capacity, whether no stage fits (the start fails at once) or
// only the largest does not (it waits for the drains ahead of it, then fails); a wait with
// nothing left to drain would hang, so every run is bounded.
TEST(RuntimeMemoryCap, StageLargerThanTheCapFailsWithATypedErrorAndNeverHangs) {
  for (auto [plan, workers] :
       {std::pair{work_bound_plan(), 1}, {work_bound_plan(), 2}, {weight_bound_plan(), 1}}) {
    Scenario sc;
    sc.plan = plan;
    sc.workers = workers;
    sc.pcie_bytes_per_s = 5e7;
    const size_t largest = largest_stage_bytes(sc);
    for (size_t cap : {size_t(4096), largest - 256 /* allocations are 256-byte multiples */}) {
      sc.capacity_bytes = cap;
      const std::string what = plan.summary() + " workers=" + std::to_string(workers) + " capacity " +
                               std::to_string(cap) + " (largest stage " + std::to_string(largest) + ")";
      try {
        bounded(what, [&] { return run_runtime(sc); });
        ADD_FAILURE() << what << ": expected RuntimeFailure";
      } catch (const RuntimeFailure& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        EXPECT_EQ(msg.rfind("worker ", 0), 0u) << msg;
        EXPECT_TRUE(names_the_capacity(msg, cap)) << what << ": " << msg;
      }
    }
  }
}

// (c) A cap that fits the largest stage but not the next stage's weights beside it refuses
// prefetches (the next stage then starts when the current one ends). A refused prefetch must
// leave the queued stage as it was: it used to be moved into prepare() and left behind
// moved-from, with no buffers. Several workers, passes per step and micro-batches, full-speed
// link: the result equals the sequential loop.
TEST(RuntimeMemoryCap, PrefetchRefusedByTheCapKeepsTheQueuedStage) {
  for (int workers : {2, 3})
    for (bool async : {true, false}) {
      Scenario sc;
      sc.plan = make_uniform_plan(6, 2, 2, 1);  // F[0-1] F[2-3] T[4-5] B[3-2] B[1-0]
      sc.workers = workers;
      sc.async = async;
      sc.M = 4;
      sc.passes_per_step = 2;
      sc.capacity_bytes = largest_stage_bytes(sc);
      const std::string what = std::string(async ? "async" : "sync") + " workers=" + std::to_string(workers) +
                               " capacity " + std::to_string(sc.capacity_bytes);
      const std::optional<Outcome> got = run_capped(sc, what);
      if (!got) continue;
      EXPECT_GT(got->memory.prefetch_refusals, 0) << what << ": no prefetch was refused";
      expect_same(*got, run_reference(sc), 1e-5, what);
    }
}

TEST(Runtime, RejectsBadInputs) {
  ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.micro = {kNSeq, kSeqLen};
  Session s(m, random_weights(m, 7), o);
  std::vector<int32_t> ids(kNSeq * kSeqLen, 1), tg(kNSeq * kSeqLen, 1);
  EXPECT_THROW(s.forward_backward(std::vector<int32_t>(3, 1), tg), std::invalid_argument);
  ids[4] = 67;  // == vocab
  EXPECT_THROW(s.forward_backward(ids, tg), std::invalid_argument);
  EXPECT_THROW(s.step(1e-3), std::logic_error);  // no pass in this step
  auto w = random_weights(m, 7);
  w[1].pop_back();
  EXPECT_THROW(Session(m, w, o), std::invalid_argument);
}

TEST(Runtime, TraceRecordsStreamsAndTasks) {
  ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.workers = 2;
  o.micro = {kNSeq, kSeqLen};
  o.micro_batches = 2;
  o.trace = true;
  Session s(m, random_weights(m, 7), o);
  std::vector<int32_t> ids, tg;
  random_tokens(m.config.vocab_size, 2 * kNSeq * kSeqLen, 1, ids, tg);
  s.forward_backward(ids, tg);
  s.step(1e-3);
  s.synchronize();
  auto path = std::filesystem::temp_directory_path() / "rp_trace_test.json";
  s.write_trace(path.string());
  EXPECT_TRUE(check_trace_nesting_file(path.string()).ok())
      << check_trace_nesting_file(path.string()).summary();
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(text.find("worker0.compute"), std::string::npos);
  EXPECT_NE(text.find("worker1.act_down"), std::string::npos);
  EXPECT_NE(text.find("param_up"), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace rp::test
