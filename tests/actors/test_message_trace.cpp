// Protocol messages in the trace (SessionOptions::trace_messages): every message between the
// scheduler, the workers and the optimizer shards is a flow arrow from a slice on the
// sender's "messages" track to one on the receiver's, both ends present, in time order, with
// the message's identity as args; the file still passes the track check, and without the
// option there is no flow at all.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "roundpipe/session.hpp"
#include "tests/actors/runtime_reference.hpp"
#include "trace/chrome_trace.hpp"
#include "trace/trace_check.hpp"

namespace rp {
namespace {
using namespace rp::test;

nlohmann::json traced_run(bool messages, const std::string& path) {
  const ModelLayout m = make_layout(tiny_config(false, true));
  SessionOptions o;
  o.workers = 2;
  o.micro_batches = 2;
  o.micro = {1, 8};
  o.trace = true;
  o.trace_messages = messages;
  o.max_grad_norm = 1.0;  // guarded steps: GradSumSq and StepScale too
  Session s(m, random_weights(m, 2), o);
  std::vector<int32_t> ids, tg;
  for (int t = 0; t < 2; ++t) {
    random_tokens(67, 16, uint64_t(t), ids, tg);
    s.forward_backward(ids, tg);
    s.step(1e-3);
  }
  s.synchronize();
  s.write_trace(path);
  return read_trace_json(path);
}
}  // namespace

TEST(MessageTrace, EveryProtocolMessageIsAFlowBetweenTwoSlices) {
  const std::string path = (std::filesystem::temp_directory_path() / "rp_message_trace.json").string();
  const nlohmann::json j = traced_run(true, path);
  std::map<int64_t, std::string> thread;                                    // tid -> track
  std::map<std::tuple<int64_t, int64_t, double>, nlohmann::json> slice_at;  // (pid, tid, ts) -> X event
  std::map<int64_t, nlohmann::json> starts, ends;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "thread_name") thread[e["tid"]] = e["args"]["name"];
    if (ph == "X") slice_at[{e["pid"], e["tid"], e["ts"]}] = e;
    if (ph == "s") {
      ASSERT_TRUE(starts.emplace(e["id"], e).second) << "two starts of flow " << e["id"];
    }
    if (ph == "f") {
      ASSERT_TRUE(ends.emplace(e["id"], e).second) << "two ends of flow " << e["id"];
    }
  }
  ASSERT_GT(starts.size(), 100u);
  EXPECT_EQ(starts.size(), ends.size()) << "every message sent was received";
  std::set<std::string> types;
  for (const auto& [id, s] : starts) {
    ASSERT_TRUE(ends.count(id)) << "flow " << id << " (" << s["name"] << ") has no end";
    const auto& f = ends.at(id);
    EXPECT_EQ(s["name"], f["name"]);
    EXPECT_EQ(s["cat"], "message");
    EXPECT_EQ(f["bp"], "e");
    EXPECT_LE(s["ts"].get<double>(), f["ts"].get<double>()) << s["name"];
    // both ends sit on a slice of a messages track with the same identity
    const auto& a = slice_at.at({s["pid"], s["tid"], s["ts"]});
    const auto& b = slice_at.at({f["pid"], f["tid"], f["ts"]});
    EXPECT_NE(base_track(thread.at(s["tid"])).find(".messages"), std::string::npos);
    EXPECT_NE(base_track(thread.at(f["tid"])).find(".messages"), std::string::npos);
    EXPECT_EQ(a["args"], b["args"]) << s["name"];
    types.insert(s["name"]);
    // who talks to whom
    const std::string from = base_track(thread.at(s["tid"])), to = base_track(thread.at(f["tid"]));
    if (s["name"] == "RunStage") {
      EXPECT_TRUE(from == "scheduler.messages" && to.rfind("worker", 0) == 0) << from << to;
    }
    if (s["name"] == "WeightsGranted") {
      EXPECT_TRUE(from.rfind("shard", 0) == 0 && to.rfind("worker", 0) == 0);
    }
    if (s["name"] == "FillPass") {
      EXPECT_TRUE(from == "scheduler.messages" && to == "filler.messages") << from << to;
    }
    if (s["name"] == "PassFilled") {
      EXPECT_TRUE(from == "filler.messages" && to == "scheduler.messages") << from << to;
    }
    if (s["name"] == "GroupUpdated") {
      EXPECT_TRUE(from.rfind("shard", 0) == 0 && to == "scheduler.messages");
    }
  }
  for (const char* t : {"RunStage", "ActReady", "AcquireWeights", "WeightsGranted", "ReleaseWeights",
                        "AcquireGradSlot", "GradGrant", "GradWritten", "StageDone", "CloseStep", "GradSumSq",
                        "StepScale", "GroupUpdated", "FillPass", "PassFilled"})
    EXPECT_TRUE(types.count(t)) << t << " never traced";
  EXPECT_EQ(check_trace_nesting(j).overlapping_pairs, 0);
  // off by default
  const nlohmann::json plain = traced_run(false, path);
  for (const auto& e : plain["traceEvents"]) EXPECT_NE(e["ph"], "s");
  std::filesystem::remove(path);
}

}  // namespace rp
