// `roundpipe trace`: statistics of a trace file and the check of its track layout, as text
// and JSON; unreadable files and bad options give one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.hpp"
#include "trace/chrome_trace.hpp"

namespace rp::clitest {
namespace {

using nlohmann::json;

// worker0: compute [0, 40] ms busy half of [0, 80]; two activation uploads in flight at once
// ([10, 20] and [15, 25] ms): a writer that put both on one track would break the format.
std::vector<TraceInterval> intervals() {
  return {{"worker0.compute", "F0 L0-1 mb0 (pass 0)", 0.000, 0.040, {}},
          {"worker0.act_up", "copy 1000 B", 0.010, 0.020, {{"bytes", 1000}, {"queued_us", 0}}},
          {"worker0.act_up", "copy 1000 B", 0.015, 0.025, {{"bytes", 1000}, {"queued_us", 0}}},
          {"worker0.tasks", "forward stage 0 (pass 0)", 0.000, 0.080, {}}};
}

TEST(CliTrace, PrintsTheStatisticsAndChecksTheTracks) {
  auto d = tmpdir();
  write_trace_file((d / "good.json").string(), chrome_trace_json(intervals(), {{"backend", "cpu"}}));
  // the same slices the way earlier versions wrote them: one thread per track
  json bad = {{"traceEvents", json::array()}};
  bad["traceEvents"].push_back(
      {{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", 1}, {"args", {{"name", "worker0.act_up"}}}});
  for (auto [a, b] : {std::pair{10e3, 20e3}, {15e3, 25e3}})
    bad["traceEvents"].push_back(
        {{"ph", "X"}, {"name", "copy"}, {"pid", 1}, {"tid", 1}, {"ts", a}, {"dur", b - a}});
  write(d / "bad.json", bad.dump());

  CliRun r = roundpipe("trace " + (d / "good.json").string() + " " + (d / "bad.json").string() + " --json " +
                           (d / "stats.json").string(),
                       d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("worker0: window 0.080 s, compute busy 0.040 s, utilisation 50.0%"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("settings: backend=cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tracks: 4 slices on 4 tracks, nested or disjoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tracks: 2 of 2 slices partly overlap another slice on their track (1 pairs)"),
            std::string::npos)
      << r.out;
  const json s = json::parse(slurp(d / "stats.json"));
  const json& g = s.at((d / "good.json").string());
  EXPECT_DOUBLE_EQ(g["workers"][0]["utilisation"].get<double>(), 0.5);
  EXPECT_EQ(g["workers"][0]["streams"]["act_up"]["copies"], 2) << "both lanes count as one stream";
  EXPECT_EQ(g["tracks"]["overlapping_slices"], 0);
  EXPECT_EQ(s.at((d / "bad.json").string())["tracks"]["overlapping_slices"], 2);

  // --skip-passes leaves pass 0 out: no slice is left in the window
  r = roundpipe("trace --skip-passes 1 " + (d / "good.json").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(no worker slices in the window)"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(CliTrace, ErrorsAreOneLine) {
  auto d = tmpdir();
  write(d / "notjson.json", "{\"traceEvents\": [");
  write(d / "nottrace.json", "{\"events\": []}");
  write(d / "metrics.csv", "step,loss\n1,2.5\n");
  // a slice that would end before it starts: no writer records one, the statistics took it as 0
  write(
      d / "negative.json",
      R"({"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "w0.compute"}},
            {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
            {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 10, "dur": -5.5}]})");
  // an event that is no object, and fields of the wrong type: the library's type errors before
  write(d / "notevent.json",
        R"({"traceEvents": [{"ph": "X", "name": "a", "tid": 1, "ts": 0, "dur": 1}, 1]})");
  write(d / "stringtid.json",
        R"({"traceEvents": [{"ph": "X", "name": "a", "tid": "w0", "ts": 0, "dur": 1}]})");
  write(d / "numbername.json",
        R"({"traceEvents": [{"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": 7}}]})");
  for (auto [args, code, needle] :
       {std::tuple{"trace " + (d / "missing.json").string(), 1, std::string("missing.json: cannot open (")},
        {"trace " + (d / "notevent.json").string(), 1,
         std::string("notevent.json: traceEvents[1]: expected an object (an event), got 1")},
        {"trace " + (d / "stringtid.json").string(), 1,
         std::string("stringtid.json: traceEvents[0]: key 'tid': expected an integer, got \"w0\"")},
        {"trace " + (d / "numbername.json").string(), 1,
         std::string("numbername.json: traceEvents[0]: key 'args.name': expected a string, got 7")},
        // a syntax error as every JSON reader names it (file, line, column), not the library's text
        {"trace " + (d / "notjson.json").string(), 1, std::string("notjson.json:1:18: invalid JSON: ")},
        {"trace " + (d / "metrics.csv").string(), 1, std::string("metrics.csv:1:1: invalid JSON: ")},
        {"trace " + (d / "nottrace.json").string(), 1, std::string("nottrace.json: not a Chrome trace")},
        {"trace " + (d / "negative.json").string(), 1,
         (d / "negative.json").string() +
             ": traceEvents[2]: key 'dur': expected a duration >= 0 (microseconds), got -5.5"},
        {std::string("trace"), 2, std::string("files is required")},
        {"trace x.json --skip-passes -1", 2, std::string("--skip-passes")},
        // rates and sizes past what the statistics print ("inf GB/s", a 300-digit chunk), hex
        {"trace x.json --h2d-gbps 1e300", 2,
         std::string("--h2d-gbps: expected 0 (estimate) or a rate from 0.001 to 1e6 GB/s, got 1e300")},
        {"trace x.json --d2h-gbps 1e-300", 2, std::string("--d2h-gbps: expected 0 (estimate) or a rate")},
        {"trace x.json --chunk-bytes 1e300", 2,
         std::string("--chunk-bytes: expected 0 (the trace's) or 1 to 1e15 bytes, got 1e300")},
        {"trace x.json --h2d-gbps 0x10", 2, std::string("--h2d-gbps: expected 0 (estimate)")}}) {
    CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, code) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("roundpipe: error: "), 0u) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << args << ": " << r.err;
  }
  fs::remove_all(d);
}

// Numbers in track and slice names past what they are read into (a worker number, a copy's bytes,
// a pass): the statistics ended in a bare "stoi" / "stod" naming neither file nor event.
TEST(CliTrace, NamesWithNumbersOutOfRangeAreNoError) {
  auto d = tmpdir();
  const std::string digits(400, '9');
  write(
      d / "big.json",
      R"j({"traceEvents": [{"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": "worker99999999999.compute"}},
            {"ph": "X", "name": "F[0-1] (pass 99999999999)", "tid": 1, "ts": 0, "dur": 10},
            {"ph": "M", "name": "thread_name", "tid": 2, "args": {"name": "worker0.param_up"}},
            {"ph": "X", "name": "copy )j" +
          digits + R"j( B", "tid": 2, "ts": 0, "dur": 10},
            {"ph": "M", "name": "thread_name", "tid": 3, "args": {"name": "worker0.compute"}},
            {"ph": "X", "name": "F[0-1] (pass 1)", "tid": 3, "ts": 0, "dur": 20}]})j");
  const std::string big = (d / "big.json").string();
  for (const std::string& args : {"trace " + big, "trace " + big + " --skip-passes 1"}) {
    CliRun r = roundpipe(args, d);
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("sto"), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.out.find("worker0"), std::string::npos) << args << ": " << r.out;
  }
  fs::remove_all(d);
}

// --json naming one of the traces it reads is refused before anything is written: it used to
// replace the trace with its own statistics.
TEST(CliTrace, JsonOutputNeverReplacesAnInput) {
  auto d = tmpdir();
  const std::string good = (d / "good.json").string();
  write_trace_file(good, chrome_trace_json(intervals(), {{"backend", "cpu"}}));
  const std::string before = slurp(good);
  CliRun r = roundpipe("trace " + good + " --json " + good, d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--json: '" + good + "' is or lies inside the input '" + good + "'"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(slurp(good), before);
  fs::remove_all(d);
}

// A trace whose file name is not UTF-8 (a Latin-1 name) gets its statistics under that name with
// the byte written \xNN: JSON holds only UTF-8, and the write failed with nlohmann's
// "[json.exception.type_error.316] invalid UTF-8 byte", naming no file.
TEST(CliTrace, JsonOutputOfATraceWhoseNameIsNotUtf8) {
  auto d = tmpdir();
  const std::string latin1 = (d / "caf\xe9.json").string();
  write_trace_file(latin1, chrome_trace_json(intervals(), {{"backend", "cpu"}}));
  const fs::path out = d / "stats.json";
  CliRun r = roundpipe("trace '" + latin1 + "' --json " + out.string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  const json stats = json::parse(slurp(out));
  EXPECT_TRUE(stats.contains((d / "caf\\xe9.json").string())) << stats.dump().substr(0, 300);
  fs::remove_all(d);
}

// An output a flag names never replaces a file already there without --force: plan --trace,
// trace --json (a file of the user's at a mistyped name); and --force replaces only a file of
// the kind the flag writes (a trace, the statistics), as --dump-batch only replaces an earlier dump.
TEST(CliTrace, OutputFilesReplaceAnExistingFileOnlyWithForce) {
  auto d = tmpdir();
  const std::string good = (d / "good.json").string(), mine = (d / "notes.json").string();
  write_trace_file(good, chrome_trace_json(intervals(), {{"backend", "cpu"}}));
  write(mine, "{\"my\": \"notes\"}\n");
  CliRun r = roundpipe("trace " + good + " --json " + mine, d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--json " + mine + ": a file is already there; choose another name or add --force"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(mine), "{\"my\": \"notes\"}\n");
  r = roundpipe("trace " + good + " --json " + mine + " --force", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--json " + mine +
                       ": the file there is not statistics written by roundpipe trace --json; --force "
                       "replaces only such a file"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(mine), "{\"my\": \"notes\"}\n");
  const std::string stats = (d / "stats.json").string();
  ASSERT_EQ(roundpipe("trace " + good + " --json " + stats, d).code, 0);
  write(stats, slurp(stats) + " ");  // an earlier run's statistics, not byte for byte these
  r = roundpipe("trace " + good + " --json " + stats + " --force", d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(slurp(stats).find(good), std::string::npos);  // the statistics, keyed by the trace
  EXPECT_NE(slurp(stats).back(), ' ');
  // a trace is not statistics
  r = roundpipe("trace " + good + " --json " + good + ".copy --force", d);
  EXPECT_EQ(r.code, 0) << r.err;  // nothing there
  fs::copy_file(good, good + ".trace");
  r = roundpipe("trace " + good + " --json " + good + ".trace --force", d);
  EXPECT_EQ(r.code, 2) << r.err;
  fs::create_directories(d / "out");
  r = roundpipe("trace " + good + " --json " + (d / "out").string(), d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("is a folder"), std::string::npos) << r.err;

  const std::string cfg = std::string(RP_SOURCE_DIR) + "/examples/configs/qwen3-1.7b.json";
  write(mine, "keep\n");
  r = roundpipe("plan --model " + cfg + " --gpus 2 --seq 1024 --micro 4 --trace " + mine, d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--trace " + mine + ": a file is already there"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(slurp(mine), "keep\n");
  r = roundpipe("plan --model " + cfg + " --gpus 2 --seq 1024 --micro 4 --trace " + mine + " --force", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(
      r.err.find("--trace " + mine +
                 ": the file there is not a trace written by roundpipe; --force replaces only such a file"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(slurp(mine), "keep\n");
  // a trace: one plan --trace wrote, or a run's (the same writer)
  const std::string sim = (d / "sim.json").string();
  ASSERT_EQ(roundpipe("plan --model " + cfg + " --gpus 2 --seq 1024 --micro 2 --trace " + sim, d).code, 0);
  for (const std::string& trace : {sim, good}) {
    r = roundpipe("plan --model " + cfg + " --gpus 2 --seq 1024 --micro 4 --trace " + trace + " --force", d);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(slurp(trace).find("traceEvents"), std::string::npos);
  }
  // statistics are no trace
  r = roundpipe("plan --model " + cfg + " --gpus 2 --seq 1024 --micro 4 --trace " + stats + " --force", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(slurp(stats).find("\"workers\""), std::string::npos);
  // --force replaces a file, never a link (nor a device or a pipe) with one
  const std::string link = (d / "link.json").string();
  write(mine, "keep\n");
  fs::create_symlink(mine, link);
  r = roundpipe("plan --model " + cfg + " --gpus 2 --seq 1024 --micro 4 --trace " + link + " --force", d);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--trace " + link + ": something other than a regular file is there"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(mine), "keep\n");
  fs::remove_all(d);
}

}  // namespace
}  // namespace rp::clitest
