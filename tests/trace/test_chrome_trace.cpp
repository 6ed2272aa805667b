// The Chrome trace writer's track layout (trace/chrome_trace.hpp) and the nesting check
// (trace/trace_check.hpp): the check finds partial overlaps in hand-built traces, and
// whatever the writer is given comes out nested or disjoint per track, in as few lanes as
// the largest number of intervals open at once, each lane joining its track again on reading.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "trace/chrome_trace.hpp"
#include "trace/trace_check.hpp"
#include "trace/trace_stats.hpp"

namespace rp {
namespace {

using nlohmann::json;

json thread(int pid, int tid, const std::string& name) {
  return {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}
// a slice from a to b microseconds
json X(int pid, int tid, const std::string& name, double a, double b) {
  return {{"ph", "X"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"ts", a}, {"dur", b - a}};
}
json trace_of(const std::vector<json>& events) { return {{"traceEvents", events}}; }

TEST(TraceCheck, NestedTouchingAndEmptySlicesPass) {
  const json t = trace_of({thread(1, 1, "a"), X(1, 1, "outer", 0, 10), X(1, 1, "inner", 2, 5),
                           X(1, 1, "inner2", 5, 10), X(1, 1, "same start", 0, 2), X(1, 1, "next", 10, 20),
                           X(1, 1, "empty", 15, 15), X(1, 1, "twin", 10, 20),
                           // 0.3 ns of overlap, gone once both are rounded to whole nanoseconds
                           X(1, 2, "rounded", 20, 30.0004), X(1, 2, "after", 30.0001, 31)});
  const NestingReport r = check_trace_nesting(t);
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.slices, 9u);
  EXPECT_EQ(r.tracks, 2u);
  EXPECT_EQ(r.summary(), "9 slices on 2 tracks, nested or disjoint");
}

TEST(TraceCheck, PartialOverlapsAreCountedPerTrack) {
  // track (1,1): a chain of three slices, each partly over the next; (2,1) holds the same
  // times on another process (its own track); (1,2): the last slice nests in none
  const json t = trace_of({thread(1, 1, "worker0.act_up"), X(1, 1, "c0", 0, 10), X(1, 1, "c1", 5, 15),
                           X(1, 1, "c2", 12, 20), X(2, 1, "d0", 0, 10), X(2, 1, "d1", 10, 15),
                           X(1, 2, "e0", 0, 10), X(1, 2, "e1", 1, 2), X(1, 2, "e2", 9.99, 10.01)});
  const NestingReport r = check_trace_nesting(t);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.slices, 8u);
  EXPECT_EQ(r.tracks, 3u);
  EXPECT_EQ(r.overlapping_pairs, 3u);   // c0-c1, c1-c2, e0-e2
  EXPECT_EQ(r.overlapping_slices, 5u);  // c0 c1 c2 e0 e2
  ASSERT_EQ(r.examples.size(), 3u);
  EXPECT_EQ(r.examples[0].track, "worker0.act_up");
  EXPECT_EQ(r.examples[0].first, "c0");
  EXPECT_EQ(r.examples[0].second, "c1");
  EXPECT_DOUBLE_EQ(r.examples[0].second_start_us, 5);
  EXPECT_EQ(r.examples[2].track, "pid 1 tid 2");
  EXPECT_EQ(check_trace_nesting(t, 1).examples.size(), 1u);
  EXPECT_NE(r.summary().find("5 of 8 slices partly overlap"), std::string::npos) << r.summary();
  EXPECT_THROW(check_trace_nesting(json::object()), std::runtime_error);
  EXPECT_THROW(check_trace_nesting(trace_of({json{{"ph", "X"}, {"ts", 1}}})), std::runtime_error);
  // a slice that ends before it starts is refused, naming its event and the duration
  try {
    check_trace_nesting(trace_of({thread(1, 1, "a"), X(1, 1, "back", 10, 5)}));
    ADD_FAILURE() << "a negative duration was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "traceEvents[1]: key 'dur': expected a duration >= 0 (microseconds), got -5.0");
  }
  // times whose nanoseconds overflow an int64 are refused: the overflowed slices read as disjoint
  // (an overlap passed as "nested or disjoint")
  const auto error_of = [](const json& t) -> std::string {
    try {
      check_trace_nesting(t);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(error_of(trace_of({thread(1, 1, "a"), X(1, 1, "far", 0, 1e19), X(1, 1, "overlap", 1e18, 2e19)})),
            "traceEvents[1]: key 'dur': expected microseconds within +-4e+15 (about 127 years), got 1e+19");
  EXPECT_EQ(
      error_of(trace_of({thread(1, 1, "a"), json{{"ph", "X"}, {"tid", 1}, {"ts", -1e300}, {"dur", 1}}})),
      "traceEvents[1]: key 'ts': expected microseconds within +-4e+15 (about 127 years), got -1e+300");
  EXPECT_EQ(error_of(trace_of({X(1, 1, "a", 1.8e15, 1.8e15 + 1), X(1, 1, "b", 1.8e15 + 2, 1.8e15 + 3)})),
            "accepted");
  // the arguments a summary adds up are bounded too: a 300-digit copy size printed as it summed
  json copy = X(1, 1, "copy", 0, 1);
  copy["args"] = {{"bytes", 1e300}};
  try {
    parse_trace(trace_of({thread(1, 1, "worker0.act_up"), copy}));
    ADD_FAILURE() << "a copy of 1e300 bytes was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "traceEvents[1]: key 'args.bytes': expected a number from 0 to 1e+15, got 1e+300");
  }
  copy["args"] = {{"bytes", 4096}, {"other", 1e300}};  // an argument no summary reads is kept as it is
  EXPECT_EQ(parse_trace(trace_of({copy})).slices.at(0).args.at("bytes"), 4096);
  EXPECT_THROW(check_trace_nesting_file("/nonexistent/trace.json"), std::runtime_error);
}

/// Thread name of every tid, and the complete events.
std::map<int, std::string> thread_names(const json& t) {
  std::map<int, std::string> n;
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") n[e["tid"].get<int>()] = e["args"]["name"];
  return n;
}

TEST(ChromeTrace, OverlappingIntervalsOfATrackGetLanes) {
  // [0,2] [1,3] [2,4] [2.5,5] ms: lanes 1, 2, 1, 3
  std::vector<TraceInterval> iv = {{"worker0.act_up", "a", 0.000, 0.002, {{"bytes", 64}}},
                                   {"worker0.act_up", "b", 0.001, 0.003, {}},
                                   {"worker0.act_up", "c", 0.002, 0.004, {}},
                                   {"worker0.act_up", "d", 0.0025, 0.005, {}},
                                   {"worker0.compute", "e", 0.0, 0.010, {}}};
  const json t = chrome_trace_json(iv, {{"backend", "cpu"}});
  EXPECT_TRUE(check_trace_nesting(t).ok()) << check_trace_nesting(t).summary();
  std::map<std::string, std::string> lane_of;  // slice -> thread name
  const auto names = thread_names(t);
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "X") lane_of[e["name"]] = names.at(e["tid"].get<int>());
  EXPECT_EQ(lane_of["a"], "worker0.act_up");
  EXPECT_EQ(lane_of["b"], "worker0.act_up #2");
  EXPECT_EQ(lane_of["c"], "worker0.act_up");
  EXPECT_EQ(lane_of["d"], "worker0.act_up #3");
  EXPECT_EQ(lane_of["e"], "worker0.compute");
  EXPECT_EQ(t["otherData"]["backend"], "cpu");
  // reading joins the lanes again
  const Trace r = parse_trace(t);
  ASSERT_EQ(r.slices.size(), 5u);
  for (auto& s : r.slices) EXPECT_EQ(s.track, s.name == "e" ? "worker0.compute" : "worker0.act_up") << s.name;
  EXPECT_EQ(base_track("worker0.act_up #12"), "worker0.act_up");
  EXPECT_EQ(base_track("worker0.act_up #"), "worker0.act_up #");
  EXPECT_EQ(base_track("stage #2b"), "stage #2b");
}

TEST(ChromeTrace, ProcessesPerWorkerInNaturalOrder) {
  std::vector<TraceInterval> iv = {{"worker10.compute", "x", 0, 1, {}},
                                   {"worker2.compute", "y", 0, 1, {}},
                                   {"worker2.act_up", "z", 0, 1, {}},
                                   {"session", "s", 0, 1, {}}};
  const json t = chrome_trace_json(iv);
  std::map<int, std::string> process;
  std::vector<std::pair<int, std::string>> threads;  // (pid, name) in tid order
  std::map<int, std::pair<int, std::string>> by_tid;
  for (auto& e : t["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") process[e["pid"].get<int>()] = e["args"]["name"];
    if (e["name"] == "thread_name") by_tid[e["tid"].get<int>()] = {e["pid"].get<int>(), e["args"]["name"]};
  }
  for (auto& [tid, pt] : by_tid) threads.push_back(pt);
  EXPECT_EQ(process,
            (std::map<int, std::string>{{2, "worker2"}, {3, "worker10"}}));  // pid 1: no dot, no name
  const std::vector<std::pair<int, std::string>> want = {
      {1, "session"}, {2, "worker2.act_up"}, {2, "worker2.compute"}, {3, "worker10.compute"}};
  EXPECT_EQ(threads, want);
}

TEST(ChromeTrace, TimesAreWholeNanosecondsAndNegativeSpansAreEmpty) {
  const json t =
      chrome_trace_json({{"w.s", "a", 1.0000000004, 1.0000012346, {}}, {"w.s", "b", 2.0, 1.5, {}}});
  std::vector<json> x;
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "X") x.push_back(e);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_DOUBLE_EQ(x[0]["ts"].get<double>(), 1000000.0);
  EXPECT_DOUBLE_EQ(x[0]["dur"].get<double>(), 1.235);
  EXPECT_DOUBLE_EQ(x[1]["ts"].get<double>(), 2000000.0);
  EXPECT_DOUBLE_EQ(x[1]["dur"].get<double>(), 0.0);
}

TEST(ChromeTrace, RandomIntervalsComeOutNestedOrDisjointInTheFewestLanes) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> start(0, 2000), len(0, 300), track(0, 2);
  std::vector<TraceInterval> iv;
  for (int i = 0; i < 600; ++i) {
    const double a = start(rng) * 1e-6, b = a + len(rng) * 1e-6;  // whole microseconds
    iv.push_back({"worker" + std::to_string(track(rng)) + ".act_up", "i" + std::to_string(i), a, b, {}});
  }
  const json t = chrome_trace_json(iv);
  const NestingReport r = check_trace_nesting(t);
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.slices, iv.size());
  // lanes per track = the most intervals open at one instant (touching ones are not both open)
  std::map<std::string, int> lanes;
  for (auto& [tid, name] : thread_names(t)) lanes[base_track(name)]++;
  for (auto& [tr, n] : lanes) {
    std::vector<std::pair<int64_t, int>> ev;  // whole nanoseconds, as the writer lays them out
    for (auto& i : iv)
      if (i.track == tr)
        ev.push_back({std::llround(i.t0 * 1e9), 1}), ev.push_back({std::llround(i.t1 * 1e9), -1});
    std::sort(ev.begin(), ev.end());  // at equal times the end (-1) comes first
    int open = 0, most = 0;
    for (auto& [time, d] : ev) most = std::max(most, open += d);
    EXPECT_EQ(n, most) << tr;
  }
  // the layout depends on the intervals, not on the order they were recorded in
  std::vector<TraceInterval> shuffled = iv;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  const json u = chrome_trace_json(shuffled);
  std::map<std::string, std::string> lane_t, lane_u;
  const auto nt = thread_names(t), nu = thread_names(u);
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "X") lane_t[e["name"]] = nt.at(e["tid"].get<int>());
  for (auto& e : u["traceEvents"])
    if (e["ph"] == "X") lane_u[e["name"]] = nu.at(e["tid"].get<int>());
  // intervals with identical times on one track may trade lanes; nothing else moves
  std::map<std::tuple<std::string, int64_t, int64_t>, int> copies;
  for (auto& i : iv) copies[{i.track, std::llround(i.t0 * 1e9), std::llround(i.t1 * 1e9)}]++;
  size_t checked = 0;
  for (auto& i : iv)
    if (copies[{i.track, std::llround(i.t0 * 1e9), std::llround(i.t1 * 1e9)}] == 1) {
      EXPECT_EQ(lane_u.at(i.label), lane_t.at(i.label)) << i.label;
      ++checked;
    }
  EXPECT_GT(checked, iv.size() / 2);
}

}  // namespace
}  // namespace rp
