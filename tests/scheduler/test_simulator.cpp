// Bubble simulator: closed form in the uniform case, no flush across iterations, transfer
// hiding, staleness, trace output.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"
#include "scheduler/simulator.hpp"
#include "tests/scheduler/stage_plans.hpp"
#include "trace/trace_check.hpp"

namespace rp {
namespace {

std::vector<StageCost> uniform(int S, double c) {
  return std::vector<StageCost>(size_t(S), StageCost{c, 0, 0, 0, 0});
}

TEST(Simulator, UniformIterationReproducesTheClosedForm) {
  for (int N = 1; N <= 4; ++N)
    for (int k = 1; k <= 4; ++k)
      for (int64_t M = N; M <= N + 5; ++M) {
        const int S = k * N;  // the closed form holds for S a multiple of N (and M >= N)
        if (S < 3) continue;
        SCOPED_TRACE(testing::Message() << "N=" << N << " S=" << S << " M=" << M);
        SimOptions o;
        o.gpus = N;
        o.micro_batches = M;
        o.iterations = 1;
        SimResult r = simulate(plan_with_stages(S), uniform(S, 0.25), o);
        EXPECT_NEAR(r.bubble_ratio, uniform_bubble_ratio(N, M, S), 1e-12);
        EXPECT_NEAR(r.makespan, (double(M) * S / N + N - 1) * 0.25, 1e-12);
        for (int g = 0; g < N; ++g) EXPECT_NEAR(r.gpu_idle[size_t(g)], (N - 1) * 0.25, 1e-12);
        // synchronous training flushes every iteration: the same bubble in steady state
        o.iterations = 4;
        o.staleness = 0;
        SimResult s = simulate(plan_with_stages(S), uniform(S, 0.25), o);
        EXPECT_NEAR(s.iteration_seconds, (double(M) * S / N + N - 1) * 0.25, 1e-12);
        EXPECT_NEAR(s.steady_bubble_ratio, uniform_bubble_ratio(N, M, S), 1e-12);
        // asynchronous (staleness 1) with the pointer carried over: no flush, no bubble
        o.staleness = 1;
        SimResult a = simulate(plan_with_stages(S), uniform(S, 0.25), o);
        EXPECT_NEAR(a.iteration_seconds, double(M) * S / N * 0.25, 1e-12);
        EXPECT_NEAR(a.steady_bubble_ratio, 0.0, 1e-12);
        EXPECT_NEAR(a.first_iteration_seconds, r.makespan, 1e-12);
      }
}

TEST(Simulator, RoundRobinPointerCarriesOver) {
  // 5 stages on 2 GPUs: iteration 1 starts on GPU 1 (5 mod 2)
  SimOptions o;
  o.gpus = 2;
  o.micro_batches = 2;
  o.iterations = 2;
  o.record_timeline = true;
  SimResult r = simulate(plan_with_stages(5), uniform(5, 1.0), o);
  for (auto& i : r.timeline) {
    if (i.stream == SimInterval::compute) {
      EXPECT_EQ(i.gpu, (i.iteration * 5 + i.stage) % 2);
    }
  }
  // the same with a starting pointer of 1
  o.pointer = 1;
  r = simulate(plan_with_stages(5), uniform(5, 1.0), o);
  for (auto& i : r.timeline) {
    if (i.stream == SimInterval::compute) {
      EXPECT_EQ(i.gpu, (1 + i.iteration * 5 + i.stage) % 2);
    }
  }
}

TEST(Simulator, EarlyActivationUploadsHideTransfers) {
  const int N = 2, S = 6;
  const int64_t M = 8;
  auto costs = uniform(S, 1.0);
  for (auto& c : costs) c.act_up_bytes = c.act_down_bytes = 50;  // 0.5 s each at 100 B/s
  SimOptions o;
  o.gpus = N;
  o.micro_batches = M;
  o.iterations = 6;
  o.bandwidth = StreamBandwidths::uniform(100);
  SimResult r = simulate(plan_with_stages(S), costs, o);
  EXPECT_NEAR(r.iteration_seconds, double(M) * S / N, 1e-9);  // steady state: hidden
  // transfers slower than compute are not hidden: the upload stream is the bottleneck, M
  // uploads of u = 2 s per task; and at each stage switch the next stage's first upload waits
  // for the slot's last download (the worker's early start, scheduler/stage_progress.hpp):
  // micro-batch M-2's output lands c + d after its upload ended, the stream is free u after
  // it, so the stream idles c + d - u = 1 s per task (S / N tasks per GPU and iteration)
  o.bandwidth = StreamBandwidths::uniform(25);  // 2 s per upload
  SimResult slow = simulate(plan_with_stages(S), costs, o);
  const double u = 2, c = 1, d = 2;
  EXPECT_NEAR(slow.iteration_seconds, double(S) / N * (double(M) * u + c + d - u), 1e-9);
}

// The replay follows the worker's per-micro-batch rules (scheduler/stage_progress.hpp) on every
// GPU: an upload of micro-batch m waits for the compute of m-2 (its slot's previous user), a
// compute for its upload and the download of m-2, and a stage's first uploads into a slot for
// the previous stage's last download from it (early start) or its retirement (fresh slots). Checked on the
// recorded timeline, with uneven stage costs so that every kind of wait binds somewhere.
TEST(Simulator, TimelineFollowsTheWorkersPerMicroBatchRules) {
  const int N = 2, S = 7;
  const int64_t M = 5;
  std::vector<StageCost> costs;
  for (int s = 0; s < S; ++s)
    costs.push_back(StageCost{0.5 + 0.3 * (s % 3), 40 + 15 * (s % 2), 60 - 10 * (s % 3), 80, 30});
  SimOptions o;
  o.gpus = N;
  o.micro_batches = M;
  o.iterations = 4;
  o.bandwidth = StreamBandwidths::uniform(100);
  o.record_timeline = true;
  SimResult r = simulate(plan_with_stages(S), costs, o);
  // per (iteration, stage, micro-batch): [start, end] of each stream
  std::map<std::tuple<int, int, int64_t, int>, std::pair<double, double>> at;
  for (auto& i : r.timeline) at[{i.iteration, i.stage, i.micro, int(i.stream)}] = {i.start, i.end};
  auto get = [&](int t, int s, int64_t m, SimInterval::Stream st) { return at.at({t, s, m, int(st)}); };
  int checked = 0;
  for (int t = 0; t < 4; ++t)
    for (int s = 0; s < S; ++s)
      for (int64_t m = 0; m < M; ++m) {
        const auto up = get(t, s, m, SimInterval::act_up), comp = get(t, s, m, SimInterval::compute);
        EXPECT_GE(comp.first, up.second - 1e-12);
        if (s > 0) {
          EXPECT_GE(up.first, get(t, s - 1, m, SimInterval::act_down).second - 1e-12);
        }
        if (m >= 2) {
          EXPECT_GE(up.first, get(t, s, m - 2, SimInterval::compute).second - 1e-12);
          EXPECT_GE(comp.first, get(t, s, m - 2, SimInterval::act_down).second - 1e-12);
        }
        // the previous task on this GPU (q - N) hands the slot over after its last download
        // there, or retires (its last compute) and the task allocates fresh slots
        const int q = t * S + s, pq = q - N;
        if (m < 2 && pq >= 0) {
          const int64_t last = (M - 1 - m) / 2 * 2 + m;
          const double handed = get(pq / S, pq % S, last, SimInterval::act_down).second;
          const double retired = get(pq / S, pq % S, M - 1, SimInterval::compute).second;
          EXPECT_GE(up.first, std::min(handed, retired) - 1e-12);
          ++checked;
        }
      }
  EXPECT_EQ(checked, 2 * (4 * S - N));
}

TEST(Simulator, ParameterPrefetchFillsGaps) {
  const int N = 2, S = 6;
  auto costs = uniform(S, 1.0);
  for (auto& c : costs) c.param_bytes = 200, c.grad_bytes = 100;  // 2 s and 1 s at 100 B/s
  SimOptions o;
  o.gpus = N;
  o.micro_batches = 4;
  o.iterations = 6;
  o.bandwidth = StreamBandwidths::uniform(100);
  const double prefetch = simulate(plan_with_stages(S), costs, o).iteration_seconds;
  EXPECT_NEAR(prefetch, 4.0 * S / N, 1e-9);  // 2 s uploads hide behind 4 s tasks
  o.weight_buffers = 1;                      // upload only after the previous task finished
  const double serial = simulate(plan_with_stages(S), costs, o).iteration_seconds;
  EXPECT_GT(serial, prefetch + 1.0);
}

TEST(Simulator, ARefusedPrefetchUploadsAfterThePreviousTaskRetired) {
  // one GPU, 4 stages of 4 micro-batches x 1 s; every stage uploads 2 s of weights
  const int S = 4;
  auto costs = uniform(S, 1.0);
  for (auto& c : costs) c.param_bytes = 200;
  SimOptions o;
  o.gpus = 1;
  o.micro_batches = 4;
  o.iterations = 4;
  o.bandwidth = StreamBandwidths::uniform(100);
  o.record_timeline = true;
  const SimResult all = simulate(plan_with_stages(S), costs, o);
  EXPECT_NEAR(all.iteration_seconds, 4.0 * S, 1e-9);  // every upload hides behind the task before it
  costs[0].params_after_previous = true;              // the cap refuses stage 0's prefetch
  const SimResult refused = simulate(plan_with_stages(S), costs, o);
  EXPECT_NEAR(refused.iteration_seconds, 4.0 * S + 2.0, 1e-9);  // the GPU waits for the whole upload
  int checked = 0;
  for (const SimInterval& v : refused.timeline) {
    if (v.stream != SimInterval::param_up || v.stage != 0 || v.iteration == 0) continue;
    double retired = -1;  // the end of the last compute of stage 3 of the iteration before
    for (const SimInterval& w : refused.timeline)
      if (w.stream == SimInterval::compute && w.iteration == v.iteration - 1 && w.stage == S - 1)
        retired = std::max(retired, w.end);
    EXPECT_GE(v.start, retired - 1e-12);
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(Simulator, OptimizerTimeDelaysSynchronousTrainingOnly) {
  const int S = 6;
  std::vector<double> opt(5, 3.0);  // plan_with_stages(6) has 5 layers
  SimOptions o;
  o.gpus = 2;
  o.micro_batches = 4;
  o.iterations = 6;
  o.optimizer_seconds = opt;
  o.staleness = 1;
  const double async = simulate(plan_with_stages(S), uniform(S, 1.0), o).iteration_seconds;
  EXPECT_NEAR(async, 4.0 * S / 2, 1e-9);
  o.staleness = 0;
  const double sync = simulate(plan_with_stages(S), uniform(S, 1.0), o).iteration_seconds;
  EXPECT_NEAR(sync, 4.0 * S / 2 + 1 + 3.0, 1e-9);  // fill (N-1) + the optimizer
}

TEST(Simulator, PredictionAndTrace) {
  const int S = 7;
  auto plan = plan_with_stages(S);
  auto costs = uniform(S, 0.5);
  SimOptions o;
  o.iterations = 5;
  o.gpus = 3;
  o.micro_batches = 6;
  EXPECT_DOUBLE_EQ(predict_iteration_seconds(plan, costs, 3, 6, o),
                   simulate(plan, costs, o).iteration_seconds);
  o.record_timeline = true;
  o.iterations = 2;
  SimResult r = simulate(plan, costs, o);
  EXPECT_EQ(r.timeline.size(), size_t(2 * S * 6));  // compute only: transfers are instantaneous
  nlohmann::json j = sim_trace_json(r, plan);
  ASSERT_TRUE(j.contains("traceEvents"));
  EXPECT_TRUE(check_trace_nesting(j).ok()) << check_trace_nesting(j).summary();
  int complete = 0;
  for (auto& e : j["traceEvents"])
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_GE(e["dur"].get<double>(), 0);
    }
  EXPECT_EQ(complete, 2 * S * 6);
  const auto path = (std::filesystem::temp_directory_path() / "rp_test_sim_trace.json").string();
  write_sim_trace(path, r, plan);
  std::ifstream f(path);
  EXPECT_EQ(nlohmann::json::parse(f), j);
  std::filesystem::remove(path);
}

// A default replay covers whole deal cycles on up to 64 GPUs and 130 iterations on more: a pool
// of 1024 replayed 2050 iterations for minutes. The steady state it reports is still that of
// whole cycles.
TEST(Simulator, DefaultReplayOfALargePoolIsBounded) {
  EXPECT_EQ(default_iterations(5, 1), 4);
  EXPECT_EQ(default_iterations(5, 8), 18);      // cycle 8
  EXPECT_EQ(default_iterations(6, 8), 10);      // cycle 4
  EXPECT_EQ(default_iterations(5, 64), 130);    // cycle 64
  EXPECT_EQ(default_iterations(5, 1024), 130);  // cycle 1024, capped
  std::vector<StageCost> c = uniform(5, 0.25);
  for (StageCost& x : c) x.act_up_bytes = x.act_down_bytes = x.param_bytes = 1000;
  SimOptions o;
  o.gpus = 1024;
  o.micro_batches = 4;
  o.bandwidth = StreamBandwidths::uniform(4000);  // a transfer takes as long as a compute
  const SimResult r = simulate(plan_with_stages(5), c, o);
  EXPECT_EQ(r.iteration_end.size(), 130u);
  o.iterations = 2 * 1024 + 2;  // whole cycles
  const SimResult full = simulate(plan_with_stages(5), c, o);
  EXPECT_NEAR(r.iteration_seconds, full.iteration_seconds, 1e-9);
  EXPECT_NEAR(r.steady_bubble_ratio, full.steady_bubble_ratio, 1e-9);
}

TEST(Simulator, RejectsBadInput) {
  auto plan = plan_with_stages(5);
  SimOptions o;
  EXPECT_THROW(simulate(plan, uniform(4, 1.0), o), std::invalid_argument);
  o.gpus = 0;
  try {
    simulate(plan, uniform(5, 1.0), o);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'gpus'"), std::string::npos);
  }
  o.gpus = 1;
  auto c = uniform(5, 1.0);
  c[2].compute = -1;
  EXPECT_THROW(simulate(plan, c, o), std::invalid_argument);
}

TEST(Simulator, PartitionedQwen3PlanHasASmallBubble) {
  ModelShape m;
  m.vocab_size = 151936, m.hidden_size = 2048, m.intermediate_size = 6144, m.num_layers = 28;
  m.num_heads = 16, m.num_kv_heads = 8, m.head_dim = 128, m.tie_word_embeddings = true, m.qk_norm = true;
  DeviceModel d;
  d.peak_flops = 165e12, d.mem_bandwidth = 1.0e12, d.pcie_bandwidth = 25e9;  // RTX 4090-like
  auto costs = layer_costs(estimate_layers(m, 1, 4096, d));
  PartitionOptions po;
  po.gpus = 8;
  po.micro_batches = 16;
  po.pcie_bandwidth = d.pcie_bandwidth;
  po.memory_cap = int64_t(24) << 30;
  PartitionResult pr = partition(costs, po);
  SimOptions o;
  o.gpus = 8;
  o.micro_batches = 16;
  o.bandwidth = StreamBandwidths::uniform(d.pcie_bandwidth);
  SimResult r = simulate(pr.plan, stage_costs(costs, pr.plan, po), o);
  EXPECT_LT(r.steady_bubble_ratio, 0.15) << pr.plan.summary();
  EXPECT_GT(r.iteration_seconds, 0);
}

}  // namespace
}  // namespace rp
