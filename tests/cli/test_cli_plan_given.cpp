// `roundpipe plan --plan`: an explicit plan, inline or from a file (a plan object or a whole
// spec), is predicted as the partitioner's own would be; a switch whose prefetch the cap refuses
// is named and charged; a bad plan is one line naming --plan or the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

const std::string kConfigs = std::string(RP_SOURCE_DIR) + "/examples/configs/";
const std::string kBase =
    "plan --model " + kConfigs +
    "qwen3-1.7b.json --gpus 1 --gpu H200 --memory-cap 6.7GiB --micro 8 --seq 8192 --fp8 "
    "--host-gib 125";

// The line of `out` starting with `key` (without its newline), or "".
std::string line_of(const std::string& out, const std::string& key) {
  const auto at = out.find("\n" + key);
  if (at == std::string::npos) return "";
  return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

// The plan's summary line ("F[0-13] ... B[4-0]"): the line after "plan ".
std::string summary_of(const std::string& out) {
  const auto at = out.find("\nplan ");
  if (at == std::string::npos) return "";
  const auto next = out.find('\n', at + 1) + 1;
  std::string s = out.substr(next, out.find('\n', next) - next);
  s.erase(0, s.find_first_not_of(' '));
  return s;
}

// "F[0-13] F[14-28] T[29-29] B[28-23]" as --plan's JSON.
std::string json_of(const std::string& summary) {
  std::string fwd, bwd, tail;
  size_t i = 0;
  while (i < summary.size()) {
    const char k = summary[i];
    const auto open = summary.find('[', i), dash = summary.find('-', open), close = summary.find(']', dash);
    const std::string a = summary.substr(open + 1, dash - open - 1),
                      b = summary.substr(dash + 1, close - dash - 1);
    const std::string pair = "[" + a + "," + b + "]";
    if (k == 'F') fwd += (fwd.empty() ? "" : ",") + pair;
    if (k == 'B') bwd += (bwd.empty() ? "" : ",") + pair;
    if (k == 'T') tail = pair;
    i = close + 2;
  }
  return "{\"forward\":[" + fwd + "],\"tail\":" + tail + ",\"backward\":[" + bwd + "]}";
}

TEST(CliPlanGiven, TheAutomaticPlanGivenBackPredictsTheSame) {
  auto d = tmpdir();
  const CliRun a = roundpipe(kBase, d);
  ASSERT_EQ(a.code, 0) << a.err;
  const std::string plan = json_of(summary_of(a.out));
  const CliRun g = roundpipe(kBase + " --plan '" + plan + "'", d);
  ASSERT_EQ(g.code, 0) << g.err << plan;
  EXPECT_NE(g.out.find("stages, given with --plan"), std::string::npos) << g.out;
  EXPECT_EQ(summary_of(g.out), summary_of(a.out));
  EXPECT_EQ(line_of(g.out, "iteration"), line_of(a.out, "iteration"));
  EXPECT_EQ(line_of(g.out, "peak"), line_of(a.out, "peak"));
  // a spec file with the plan under "plan", beside other keys
  write(d / "spec.json", "{\"model\": \"m\", \"plan\": " + plan + "}");
  const CliRun f = roundpipe(kBase + " --plan " + (d / "spec.json").string(), d);
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(line_of(f.out, "iteration"), line_of(a.out, "iteration"));
  fs::remove_all(d);
}

// The partitioner's plan before the refinement: the last backward stage (the tied embedding's
// fp32 gradient beside five decoders) leaves no room for the next pass's first forward stage's
// weights, so the prediction charges the wait and names the stage; the automatic plan avoids it.
TEST(CliPlanGiven, ARefusedPrefetchIsNamedAndCharged) {
  auto d = tmpdir();
  const std::string refused =
      R"({"forward":[[0,13],[14,28]],"tail":[29,29],"backward":[[28,23],[22,17],[16,12],[11,6],[5,0]]})";
  const CliRun g = roundpipe(kBase + " --plan '" + refused + "'", d), a = roundpipe(kBase, d);
  ASSERT_EQ(g.code, 0) << g.err;
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(line_of(g.out, "prefetch").find("weights of stage 0 while"), std::string::npos) << g.out;
  EXPECT_EQ(line_of(a.out, "prefetch"), "") << a.out;
  auto ms = [](const std::string& line) { return std::stod(line.substr(line.find(' ') + 1)); };
  const double waits = ms(line_of(g.out, "iteration")), automatic = ms(line_of(a.out, "iteration"));
  // the whole upload of F[0-13]'s weights (~1.9 GB at 55 GB/s) is exposed once a step
  EXPECT_GT(waits - automatic, 20.0) << g.out << a.out;
  fs::remove_all(d);
}

// kBase under the H200's own memory cap instead of 6.7 GiB.
std::string uncapped() {
  const auto cap = kBase.find(" --memory-cap");
  return kBase.substr(0, cap) + kBase.substr(kBase.find(" --micro", cap));
}

// An error about a plan names a stage as the table and the summary line show it: its row,
// counted from 0, and its label; a layout error used to count from 1, a stage over the cap
// gave its layers lowest first.
TEST(CliPlanGiven, ErrorsNameAStageAsTheTableDoes) {
  auto d = tmpdir();
  const std::string plan =
      R"({"forward":[[0,13],[14,28]],"tail":[29,29],"backward":[[28,17],[16,12],[11,6],[5,0]]})";
  const CliRun t = roundpipe(uncapped() + " --plan '" + plan + "'", d);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("\n    3  backward  28-17 (d27..d16)"), std::string::npos) << t.out;
  EXPECT_NE(summary_of(t.out).find(" B[28-17] "), std::string::npos) << t.out;
  const CliRun over = roundpipe(kBase + " --plan '" + plan + "'", d);  // 6.7 GiB: B[28-17] is over
  EXPECT_EQ(over.err.find("roundpipe: error: --plan: stage 3 B[28-17] needs "), 0u) << over.err;
  const std::string gap =
      R"({"forward":[[0,13],[14,28]],"tail":[29,29],"backward":[[28,17],[15,12],[11,6],[5,0]]})";
  const CliRun g = roundpipe(uncapped() + " --plan '" + gap + "'", d);
  EXPECT_EQ(g.err.find("roundpipe: error: --plan: stage 4 B[15-12] starts at layer 15, expected layer 16"),
            0u)
      << g.err;
  const CliRun f = roundpipe(uncapped() + " --plan '" + R"({"forward":[[0,13],[15,28]],"tail":[29,29],)" +
                                 R"("backward":[[28,0]]})" + "'",
                             d);
  EXPECT_EQ(f.err.find("roundpipe: error: --plan: stage 1 F[15-28] starts at layer 15, expected layer 14"),
            0u)
      << f.err;
  fs::remove_all(d);
}

// The number before the first " GiB" that `pattern` (a regex ending in "([0-9.]+) GiB") matches in
// `text`, or -1.
double gib(const std::string& text, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? std::stod(m[1]) : -1;
}

// The table's memory column, GiB per stage in table order.
std::vector<double> memory_column(const std::string& out) {
  std::vector<double> v;
  const std::regex row("\n +[0-9]+  (forward|tail|backward) [^\n]* ([0-9.]+) (GiB|MiB)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), row); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[2]) / ((*it)[3] == "MiB" ? 1024 : 1));
  return v;
}

// The line above the table says what its memory column counts, and the column counts that: the
// working set plus as much again as the stage's weights for the next stage's prefetch, or the
// working set alone where the cap leaves no room to prefetch.
TEST(CliPlanGiven, TheMemoryColumnIsWhatItsLegendSays) {
  auto d = tmpdir();
  const std::string legend = "\n          memory = working set (weights, gradients, activations, scratch)";
  const std::string plan =
      R"({"forward":[[0,13],[14,28]],"tail":[29,29],"backward":[[28,17],[16,12],[11,6],[5,0]]})";
  const CliRun t = roundpipe(uncapped() + " --plan '" + plan + "'", d);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find(legend + " + as much again as its weights, to prefetch the next stage's\nstage  kind"),
            std::string::npos)
      << t.out;
  // stage 3 over a 6.7 GiB cap: the error gives its working set and its weights
  const CliRun over = roundpipe(kBase + " --plan '" + plan + "'", d);
  const double work = gib(over.err, " needs ([0-9.]+) GiB"),
               weights = gib(over.err, "\\(weights ([0-9.]+) GiB");
  ASSERT_GT(work, 0) << over.err;
  ASSERT_GT(weights, 0) << over.err;
  ASSERT_EQ(memory_column(t.out).size(), 7u) << t.out;
  EXPECT_NEAR(memory_column(t.out)[3], work + weights, 0.011) << t.out << over.err;
  // 4.6 GiB leaves the automatic plan no room to prefetch: its column is each stage's working
  // set, within the cap, and the same plan given back (whose stages are planned with the room)
  // shows more for every stage
  const std::string tight = uncapped() + " --memory-cap 4.6GiB";
  const CliRun a = roundpipe(tight, d);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.out.find(legend + "; no room under the cap to prefetch the next stage's weights\nstage  kind"),
            std::string::npos)
      << a.out;
  const CliRun g = roundpipe(uncapped() + " --plan '" + json_of(summary_of(a.out)) + "'", d);
  ASSERT_EQ(g.code, 0) << g.err;
  const std::vector<double> alone = memory_column(a.out), with_room = memory_column(g.out);
  ASSERT_EQ(alone.size(), with_room.size()) << a.out << g.out;
  ASSERT_GT(alone.size(), 3u) << a.out;
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_LE(alone[i], 4.6) << i << a.out;
    EXPECT_GT(with_room[i], alone[i]) << i << a.out << g.out;
  }
  fs::remove_all(d);
}

TEST(CliPlanGiven, ABadPlanIsOneLineNamingItsSource) {
  auto d = tmpdir();
  write(d / "bad.json", "{\"forward\": [[0, 3]],\n \"tail\": oops}");
  write(d / "list.json", "[1, 2]");
  write(d / "specplan.json", "{\"plan\": 3}");
  const std::string over = R"({"forward":[[0,28]],"tail":[29,29],"backward":[[28,0]]})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--plan '{\"forward\": '", "--plan: "},
      {"--plan " + (d / "bad.json").string(), (d / "bad.json").string() + ":2:"},
      {"--plan " + (d / "list.json").string(), (d / "list.json").string() + ": expected a plan object"},
      {"--plan " + (d / "specplan.json").string(), (d / "specplan.json").string() + ": key 'plan'"},
      {"--plan " + (d / "none.json").string(), (d / "none.json").string() + ": cannot open"},
      {"--plan '{\"forward\":[[0,5]],\"tail\":[6,6],\"backward\":[[5,0]]}'", "--plan"},
      {"--plan '" + over + "'", "--plan: stage 0 F[0-28] needs"},
      {"--max-seq --plan '" + over + "'", "--plan with --max-seq"},
      {"--plan ''", "--plan: expected a plan as JSON or a file holding one, got nothing"},
      {"--plan '[1, 2]'", "--plan: expected a plan object"},
      {"--plan '{\"tail\": [29, 29], \"tail\": [29, 29]}'", "--plan: key 'tail' given twice"},
      {"--plan " + (d / "spec_without_plan.json").string(),
       (d / "spec_without_plan.json").string() + ": no \"plan\" key and no plan keys"},
      {"--plan " + (d / "deep.json").string(),
       (d / "deep.json").string() + ": invalid JSON: objects and lists"},
      {"--plan /dev/zero", "/dev/zero: is a device, expected a JSON file"},
      {"--plan '{\"forward\":[[0,40]],\"tail\":[41,41],\"backward\":[[40,0]]}'",
       "--plan: stage 0 F[0-40] runs to layer 40; forward stages end by layer 28, before the tail "
       "(the model's layers are 0-29: the embedding, 28 decoders, the tail)"},
      {"--plan " + (d / "keep.json").string() + " --trace " + (d / "keep.json").string() + " --force",
       "--trace: '" + (d / "keep.json").string() + "' is or lies inside the input"},
      {"--plan '" + over + "' --trace " + (d / "no_folder" / "t.json").string(),
       "--trace " + (d / "no_folder" / "t.json").string() + ": the folder"},
      // an empty plan used to be read as the uniform default plan, printed as "given with --plan"
      {"--plan '{}'",
       "--plan: the plan is empty; expected \"forward\", \"tail\" and \"backward\" stages, or "
       "one or more of \"forward_layers\", \"backward_layers\", \"tail_decoders\""},
      {"--plan ' {\"plan\": {}}'", "--plan: key 'plan': the plan is empty; expected \"forward\""},
      {"--plan " + (d / "emptyplan.json").string(),
       (d / "emptyplan.json").string() + ": key 'plan': the plan is empty; expected \"forward\""},
  };
  write(d / "emptyplan.json", "{\"model\": \"m\", \"plan\": {}}");
  write(d / "spec_without_plan.json", "{\"model\": \"m\", \"steps\": 3}");
  write(d / "deep.json", "{\"forward\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  const std::string keep = R"({"forward":[[0,13],[14,28]],"tail":[29,29],"backward":[[28,0]]})";
  write(d / "keep.json", keep);
  for (const auto& [args, want] : cases) {
    const CliRun r = roundpipe(kBase + " " + args, d);
    // a plan file, or one that cannot be read, is the file's fault (exit 1), as every other input
    // file's; a usage error (exit 2) is the flag's own text only
    const bool file = want.rfind((d / "").string(), 0) == 0 || want.rfind("/dev/", 0) == 0;
    if (file && args.find("--trace") == std::string::npos) {
      EXPECT_EQ(r.code, 1) << args << ": " << r.err;
    }
    EXPECT_NE(r.code, 0) << args;
    EXPECT_EQ(r.err.find("roundpipe: error: " + want), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
  EXPECT_EQ(roundpipe(kBase + " --plan '[1, 2]'", d).code, 2) << "the flag's own JSON: a usage error";
  EXPECT_EQ(slurp(d / "keep.json"), keep) << "--trace --force replaced the --plan file";
  EXPECT_FALSE(fs::exists(d / "no_folder"));
  fs::remove_all(d);
}

}  // namespace
