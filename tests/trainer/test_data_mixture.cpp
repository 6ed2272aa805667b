// "data" as a weighted list of files: the spec's parsing, the mixture TokenStream serves, and
// its resumption at a saved position.
#include <gtest/gtest.h>

#include <unistd.h>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
#include "roundpipe/spec.hpp"
#include "tests/cli/cli_util.hpp"

using namespace rp::clitest;

namespace {
std::string spec_error(const std::string& data) {
  const fs::path p = fs::temp_directory_path() / ("rp_mixture_spec_" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << R"({"model": "m.gguf", "optimizer": {"lr": 0.001}, "data": )" + data + "}";
  std::string out = "no error";
  try {
    rp::load_spec(p.string());
  } catch (const std::invalid_argument& e) {
    out = e.what();
  }
  fs::remove(p);
  return out;
}

rp::TrainSpec spec_with(const std::string& data) {
  const fs::path p = fs::temp_directory_path() / ("rp_mixture_spec_" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << R"({"model": "m.gguf", "optimizer": {"lr": 0.001}, "data": )" + data + "}";
  rp::TrainSpec s = rp::load_spec(p.string());
  fs::remove(p);
  return s;
}

// n prompt/completion lines whose completions start with `word`
void write_lines(const fs::path& f, const std::string& word, int n) {
  std::string text;
  for (int i = 0; i < n; ++i)
    text += "{\"prompt\": \"q" + std::to_string(i) + "\", \"completion\": \" " + word + std::to_string(i) +
            "\"}\n";
  write(f, text);
}
}  // namespace

TEST(DataMixture, SpecListsFilesAndWeights) {
  const rp::TrainSpec s = spec_with(R"(["a.jsonl", {"path": "b.parquet", "weight": 3}])");
  ASSERT_EQ(s.data_mixture.size(), 2u);
  EXPECT_EQ(s.data_mixture[0].path, "a.jsonl");
  EXPECT_EQ(s.data_mixture[0].weight, 1);
  EXPECT_EQ(s.data_mixture[1].path, "b.parquet");
  EXPECT_EQ(s.data_mixture[1].weight, 3);
  EXPECT_EQ(rp::data_paths(s), (std::vector<std::string>{"a.jsonl", "b.parquet"}));
  // one entry is that file alone
  const rp::TrainSpec one = spec_with(R"([{"path": "a.jsonl", "weight": 2}])");
  EXPECT_TRUE(one.data_mixture.empty());
  EXPECT_EQ(one.data, "a.jsonl");
  EXPECT_NE(spec_error(R"(["a.jsonl", {"path": "b", "weight": 0}])")
                .find("key 'data[1].weight': expected a number > 0"),
            std::string::npos);
  EXPECT_NE(spec_error(R"(["a.jsonl", 3])")
                .find("key 'data[1]': expected a file name or a {\"path\", \"weight\"} object"),
            std::string::npos);
  EXPECT_NE(spec_error(R"([{"path": "a", "wieght": 2}])").find("data[0].wieght"), std::string::npos);
  EXPECT_NE(spec_error("[]").find("key 'data'"), std::string::npos);
}

// Evaluation files are each evaluated whole: a list, no weights.
TEST(DataMixture, EvalDataListsFilesWithoutWeights) {
  const fs::path p = fs::temp_directory_path() / ("rp_mixture_eval_" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << R"({"model": "m.gguf", "data": "d.jsonl", "optimizer": {"lr": 0.001},
                          "eval_data": ["e1.jsonl", {"path": "e2.parquet"}]})";
  const rp::TrainSpec s = rp::load_spec(p.string());
  fs::remove(p);
  EXPECT_EQ(rp::eval_data_paths(s), (std::vector<std::string>{"e1.jsonl", "e2.parquet"}));
  EXPECT_EQ(rp::eval_data_paths(spec_with(R"("d.jsonl")")), std::vector<std::string>{});
  std::ofstream(p) << R"({"model": "m.gguf", "data": "d.jsonl", "optimizer": {"lr": 0.001},
                          "eval_data": [{"path": "e1.jsonl", "weight": 2}]})";
  try {
    rp::load_spec(p.string());
    ADD_FAILURE() << "a weight on an evaluation file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(
        std::string(e.what()).find("key 'eval_data[0].weight': expected nothing: every evaluation file is "
                                   "evaluated whole"),
        std::string::npos)
        << e.what();
  }
  fs::remove(p);
}

// Both files' sequences are served in about their weights' proportions; a stream sought to a
// position continues exactly as the uninterrupted one (what --resume does with the saved
// data position).
TEST(DataMixture, TokenStreamMixesByWeightAndResumesExactly) {
  const auto d = tmpdir();
  const rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  write_lines(d / "a.jsonl", "alpha", 12);
  write_lines(d / "b.jsonl", "beta", 5);
  const std::vector<rp::DataSource> sources = {{(d / "a.jsonl").string(), 1}, {(d / "b.jsonl").string(), 3}};
  rp::TokenStreamOptions o;
  o.seq_len = 32;
  o.seed = 5;
  rp::TokenStream whole(lm, sources, o);
  EXPECT_EQ(whole.stats().examples, 17u);
  EXPECT_EQ(whole.stats().sequences, 17);
  std::vector<rp::TokenBatch> batches;
  for (int i = 0; i < 100; ++i) batches.push_back(whole.next(4));
  const std::string mix = whole.mixture_proportions();
  EXPECT_NE(mix.find("a.jsonl 2"), std::string::npos) << mix;  // about 25% of 400 draws
  EXPECT_NE(mix.find("(weight 75.0%)"), std::string::npos) << mix;
  rp::TokenStream resumed(lm, sources, o);
  resumed.seek(40 * 4);
  for (size_t i = 40; i < batches.size(); ++i) {
    const rp::TokenBatch b = resumed.next(4);
    ASSERT_EQ(b.ids, batches[i].ids) << "batch " << i;
    ASSERT_EQ(b.targets, batches[i].targets) << "batch " << i;
  }
  EXPECT_EQ(resumed.mixture_proportions(), mix);
  EXPECT_EQ(rp::TokenStream(lm, (d / "a.jsonl").string(), o).mixture_proportions(), "");
  fs::remove_all(d);
}
