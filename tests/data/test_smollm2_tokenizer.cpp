// SmolLM2's own tokenization: our tokenizer on the tokenizer.json exported from the GGUF
// must give exactly the ids Hugging Face `tokenizers` gives on the same file
// (tests/fixtures/smollm2-tokenizer/cases.json, made by scripts/make_smollm2_tokenizer_cases.py).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"

namespace {

TEST(SmolLM2Tokenizer, MatchesHuggingFaceTokenizers) {
  const std::string dir = std::string(RP_FIXTURES_DIR) + "/smollm2-tokenizer/";
  rp::Tokenizer tok = rp::Tokenizer::from_file(dir + "tokenizer.json");
  std::ifstream f(dir + "cases.json");
  auto j = nlohmann::json::parse(f);
  ASSERT_GE(j["cases"].size(), 50u);
  size_t checked = 0;
  for (auto& c : j["cases"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << "input: " << text;
    EXPECT_EQ(tok.decode(want), text) << "input: " << text;
    ++checked;
  }
  EXPECT_EQ(checked, j["cases"].size());
  EXPECT_EQ(tok.vocab_size(), 49152u);
}

}  // namespace
