// A model's tokenizer.json that does not belong to it, or is broken, stops the run at load with
// one line naming the file (not the model folder), the token and what was expected.
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;

void edit_tokenizer(const fs::path& model, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json tok = nlohmann::json::parse(slurp(model / "tokenizer.json"));
  edit(tok);
  write(model / "tokenizer.json", tok.dump());
}

// vocab_size 300: a token with id 300 has no embedding row; refused before any data is read,
// whatever the data uses
TEST(CliTokenizer, AnIdAtOrAboveVocabSizeIsRefusedAtLoad) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  edit_tokenizer(model, [](nlohmann::json& t) { t["model"]["vocab"]["zz"] = 300; });
  write(d / "data.jsonl", "{\"text\": \"hello\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  expect_one_line_error(r, (model / "tokenizer.json").string() +
                               ": token \"zz\" has id 300, not below the model's vocab_size 300");
  EXPECT_FALSE(fs::exists(d / "run/final"));
  // an added token likewise
  edit_tokenizer(model, [](nlohmann::json& t) {
    t["model"]["vocab"].erase("zz");
    t["added_tokens"].push_back({{"id", 412}, {"content", "<|extra|>"}, {"special", true}});
  });
  r = roundpipe("train " + (d / "spec.json").string(), d);
  expect_one_line_error(r, (model / "tokenizer.json").string() + ": token \"<|extra|>\" has id 412");
  fs::remove_all(d);
}

// errors inside the tokenizer name its file, <model>/tokenizer.json, not "<model> tokenizer"
TEST(CliTokenizer, TokenizerErrorsNameTheTokenizerFile) {
  auto d = tmpdir();
  const fs::path model = tiny_model(d);
  edit_tokenizer(model, [](nlohmann::json& t) { t["model"]["merges"] = {"h nosuchtoken"}; });
  write(d / "data.jsonl", "{\"text\": \"hello\"}\n");
  write(d / "spec.json", spec_for(model, d / "data.jsonl", d / "run"));
  CliRun r = roundpipe("train " + (d / "spec.json").string(), d);
  expect_one_line_error(r, "roundpipe: error: " + (model / "tokenizer.json").string() + ": merge #0");
  fs::remove_all(d);
}

}  // namespace
