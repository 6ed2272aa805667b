// Trace statistics (trace/trace_stats.hpp) on a hand-built trace whose answers are worked
// out by hand below, and a round trip through the real Tracer.
#include <gtest/gtest.h>

#include <filesystem>

#include "trace/trace_check.hpp"
#include "trace/trace_stats.hpp"
#include "trace/tracer.hpp"

namespace rp {
namespace {

using nlohmann::json;

json meta(int tid, const std::string& name) {
  return {{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", name}}}};
}
// a slice from a to b milliseconds
json X(int tid, const std::string& name, double a, double b, json args = nullptr) {
  json e = {{"ph", "X"}, {"name", name}, {"pid", 1}, {"tid", tid}, {"ts", a * 1e3}, {"dur", (b - a) * 1e3}};
  if (!args.is_null()) e["args"] = args;
  return e;
}
json copy(double bytes, double queued_ms) { return {{"bytes", bytes}, {"queued_us", queued_ms * 1e3}}; }

// worker0: compute [10,30] [25,40] [60,80]; act_up [0,2] [5,13] (queued 3 ms) [50,51], 1 MB
// each; param_up 4 MB chunks [2,10] [12,20] [41,49] (0.5 GB/s); act_down [40,45] 1 MB queued
// 1 ms; grad_down [81,91] 5 MB. worker1: compute [20,70]. A task slice spans [0,100].
json synthetic() {
  json ev = json::array();
  const char* tracks[] = {"worker0.compute",   "worker0.act_up", "worker0.param_up", "worker0.act_down",
                          "worker0.grad_down", "worker0.tasks",  "worker1.compute"};
  for (int i = 0; i < 7; ++i) ev.push_back(meta(i + 1, tracks[i]));
  ev.push_back(X(6, "forward stage 0 (pass 0)", 0, 100));
  ev.push_back(X(1, "F0 L0-1 mb0 (pass 0)", 10, 30));
  ev.push_back(X(1, "F0 L0-1 mb1 (pass 0)", 25, 40));
  ev.push_back(X(1, "F0 L0-1 mb0 (pass 1)", 60, 80));
  ev.push_back(X(2, "copy 1000000 B", 0, 2, copy(1e6, 0)));
  ev.push_back(X(2, "copy 1000000 B", 5, 13, copy(1e6, 3)));
  ev.push_back(X(2, "copy 1000000 B", 50, 51, copy(1e6, 0)));
  for (double a : {2.0, 12.0, 41.0}) ev.push_back(X(3, "copy 4000000 B (1/3)", a, a + 8, copy(4e6, 0)));
  ev.push_back(X(4, "copy 1000000 B", 40, 45, copy(1e6, 1)));
  ev.push_back(X(5, "copy 5000000 B", 81, 91));  // bytes from the label
  ev.push_back(X(7, "B1 (pass 0)", 20, 70));
  return {{"traceEvents", ev}, {"otherData", {{"transfer_priorities", "on"}}}};
}

TEST(TraceStats, HandBuiltTraceGivesTheHandComputedAnswers) {
  Trace t = parse_trace(synthetic());
  EXPECT_EQ(t.info.at("transfer_priorities"), "on");
  auto s = trace_stats(t);
  ASSERT_EQ(s.size(), 2u);
  const WorkerStats& w = s[0];
  EXPECT_EQ(w.worker, "worker0");
  EXPECT_NEAR(w.wall_s, 0.100, 1e-9);
  EXPECT_NEAR(w.compute_busy_s, 0.050, 1e-9);  // [10,40] + [60,80]
  EXPECT_NEAR(w.utilisation, 0.5, 1e-9);
  // copies: union [0,20] [40,49] [50,51] [81,91] = 40 ms; under compute only [10,20]
  EXPECT_NEAR(w.copy_busy_s, 0.040, 1e-9);
  EXPECT_NEAR(w.copy_hidden_s, 0.010, 1e-9);
  EXPECT_NEAR(w.hidden_share, 0.25, 1e-9);
  EXPECT_NEAR(w.streams.at("act_up").hidden_share, 3.0 / 11.0, 1e-9);
  EXPECT_NEAR(w.streams.at("param_up").hidden_share, 8.0 / 24.0, 1e-9);
  EXPECT_EQ(w.streams.at("act_up").copies, 3u);
  EXPECT_DOUBLE_EQ(w.streams.at("act_up").bytes, 3e6);
  EXPECT_DOUBLE_EQ(w.streams.at("param_up").bytes, 12e6);
  EXPECT_DOUBLE_EQ(w.streams.at("act_down").bytes, 1e6);
  EXPECT_DOUBLE_EQ(w.streams.at("grad_down").bytes, 5e6);
  // link 0.5 GB/s both ways; one chunk = 4 MB = 8 ms; an activation's own time 2 ms
  EXPECT_NEAR(w.h2d_bytes_per_s, 0.5e9, 1);
  EXPECT_NEAR(w.d2h_bytes_per_s, 0.5e9, 1);
  EXPECT_NEAR(w.chunk_s, 0.008, 1e-9);
  // latencies 2, 11 (enqueued at 2), 1 ms; queued 0, 3, 0
  EXPECT_NEAR(w.act_up_latency.max, 0.011, 1e-9);
  EXPECT_NEAR(w.act_up_latency.p50, 0.002, 1e-9);
  EXPECT_NEAR(w.act_up_queued.max, 0.003, 1e-9);
  // waits: 2-0-2 = 0; 13 - max(2, 2) - 2 = 9; 51 - 50 - 2 < 0 -> 0
  EXPECT_EQ(w.act_up_wait.n, 3u);
  EXPECT_NEAR(w.act_up_wait.max, 0.009, 1e-9);
  EXPECT_NEAR(w.act_up_wait.p50, 0.0, 1e-9);
  EXPECT_NEAR(w.act_up_wait.p99, 0.009, 1e-9);
  EXPECT_NEAR(w.act_up_wait.mean, 0.003, 1e-9);
  EXPECT_EQ(w.act_up_waits_over_chunk, 1u);
  // act_down: enqueued at 39, done at 45, own 2 ms -> 4 ms
  EXPECT_NEAR(w.act_down_wait.max, 0.004, 1e-9);
  EXPECT_EQ(s[1].worker, "worker1");
  EXPECT_NEAR(s[1].utilisation, 0.5, 1e-9);
  EXPECT_TRUE(s[1].streams.empty());
  EXPECT_NE(format_trace_stats(t, s).find("utilisation 50.0%"), std::string::npos);
  EXPECT_EQ(trace_stats_json(t, s)["workers"][0]["act_up_waits_over_chunk"], 1);
}

TEST(TraceStats, SkippingPassesAndGivenBandwidths) {
  Trace t = parse_trace(synthetic());
  TraceStatsOptions o;
  o.skip_passes = 1;  // window [60, 100]: the pass-1 compute slice starts it
  o.h2d_bytes_per_s = 1e9;
  auto s = trace_stats(t, o);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NEAR(s[0].wall_s, 0.040, 1e-9);
  EXPECT_NEAR(s[0].compute_busy_s, 0.020, 1e-9);
  EXPECT_EQ(s[0].act_up_wait.n, 0u);
  EXPECT_EQ(s[0].streams.at("grad_down").copies, 1u);
  EXPECT_EQ(s[0].streams.at("param_up").copies, 0u);
  EXPECT_NEAR(s[0].streams.at("param_up").busy_s, 0.0, 1e-12);
  EXPECT_NEAR(s[0].chunk_s, 0.004, 1e-9);         // 4 MB at the given 1 GB/s
  EXPECT_NEAR(s[1].compute_busy_s, 0.010, 1e-9);  // [60,70]
  // a given reference chunk replaces the largest parameter copy; waits are counted against it
  o.skip_passes = 0;
  o.h2d_bytes_per_s = 0;
  o.chunk_bytes = 2e6;
  s = trace_stats(t, o);
  EXPECT_NEAR(s[0].chunk_s, 0.004, 1e-9);       // 2 MB at the estimated 0.5 GB/s
  EXPECT_EQ(s[0].act_up_waits_over_chunk, 1u);  // 9 ms > 4 ms; the zero waits are not
  o.chunk_bytes = 5e6;                          // 10 ms: the 9 ms wait is within one chunk
  EXPECT_EQ(trace_stats(t, o)[0].act_up_waits_over_chunk, 0u);
  // the trace's own transfer_chunk_bytes stands in when none is given, and must be bytes
  o.chunk_bytes = 0;
  t.info["transfer_chunk_bytes"] = "2000000";
  EXPECT_NEAR(trace_stats(t, o)[0].chunk_s, 0.004, 1e-9);
  t.info["transfer_chunk_bytes"] = "0";  // a run without chunks: the largest parameter copy
  o.chunk_bytes = 0;
  const double whole = trace_stats(t, o)[0].chunk_s;
  t.info.erase("transfer_chunk_bytes");
  EXPECT_EQ(trace_stats(t, o)[0].chunk_s, whole);
  for (const std::string bad : {"1e300", "-5", "abc", "2e6x"}) {
    t.info["transfer_chunk_bytes"] = bad;
    try {
      trace_stats(t, o);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(
          std::string(e.what()),
          "otherData: key 'transfer_chunk_bytes': expected a number of bytes from 0 to 1e+15, got " + bad);
    }
  }
}

TEST(TraceStats, PercentilesAndErrors) {
  Distribution d = distribution({5, 1, 4, 2, 3});
  EXPECT_EQ(d.n, 5u);
  EXPECT_EQ(d.max, 5);
  EXPECT_EQ(d.p50, 3);
  EXPECT_EQ(d.p99, 5);
  EXPECT_EQ(d.mean, 3);
  std::vector<double> hundred(100);
  for (int i = 0; i < 100; ++i) hundred[size_t(i)] = i + 1;
  EXPECT_EQ(distribution(hundred).p99, 99);
  EXPECT_EQ(distribution({}).n, 0u);
  EXPECT_THROW(parse_trace(json::object()), std::runtime_error);
  json no_ts = json::object();
  no_ts["traceEvents"] = json::array({json{{"ph", "X"}, {"tid", 1}}});
  EXPECT_THROW(parse_trace(no_ts), std::runtime_error);
  EXPECT_THROW(read_trace("/nonexistent/trace.json"), std::runtime_error);
}

TEST(TraceStats, ReadsWhatTheTracerWrites) {
  Tracer tr;
  tr.set_info("transfer_chunk_bytes", "4096");
  tr.interval("worker0.compute", "F0 (pass 0)", 1.0, 1.5);
  tr.interval("worker0.act_up", "copy 100 B", 1.0, 1.25, {{"bytes", 100}, {"queued_us", 250000}});
  auto path = std::filesystem::temp_directory_path() / "rp_trace_stats_roundtrip.json";
  tr.write(path.string());
  EXPECT_TRUE(check_trace_nesting_file(path.string()).ok())
      << check_trace_nesting_file(path.string()).summary();
  Trace t = read_trace(path.string());
  std::filesystem::remove(path);
  ASSERT_EQ(t.slices.size(), 2u);
  EXPECT_EQ(t.info.at("transfer_chunk_bytes"), "4096");
  auto s = trace_stats(t);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_NEAR(s[0].wall_s, 0.5, 1e-9);
  EXPECT_NEAR(s[0].act_up_latency.max, 0.5, 1e-9);  // 0.25 s queued + 0.25 s in flight
  EXPECT_NEAR(s[0].act_up_queued.max, 0.25, 1e-9);
  EXPECT_NEAR(s[0].hidden_share, 1.0, 1e-9);
  EXPECT_EQ(s[0].chunk_bytes, 4096) << "the run's chunk setting is the reference chunk";
}

}  // namespace
}  // namespace rp
