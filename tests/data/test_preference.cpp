// Preference data (data/preference.hpp): typed pairs and one-line errors.
#include <gtest/gtest.h>

#include "common.hpp"
#include "data/chat_template.hpp"
#include "data/preference.hpp"
#include "data/tokenizer.hpp"

using namespace rp;
using rp::test::qwen;
using rp::test::TempDir;

namespace {
std::vector<PreferencePair> load(const std::string& lines) {
  TempDir dir;
  return load_preference_records(dir.write("pref.jsonl", lines), qwen(), ChatTemplate::chatml);
}
std::string error_of(const std::string& lines) {
  try {
    load(lines);
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "<no exception>";
}
Example as_prompt_completion(const std::string& line) {
  TempDir dir;
  return load_dataset(dir.write("pc.jsonl", line + "\n"), qwen(), ChatTemplate::chatml).examples.at(0);
}
}  // namespace

// Each side is exactly the prompt / completion record with that completion.
TEST(Preference, SidesAreTheirPromptCompletionExamples) {
  const auto pairs = load(
      R"({"prompt": "Is the sky blue?", "chosen": " Yes.", "rejected": " No, green."})"
      "\n"
      R"({"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello!"}], "rejected": [{"role": "assistant", "content": "Go away."}]})"
      "\n");
  ASSERT_EQ(pairs.size(), 2u);
  const Example c0 = as_prompt_completion(R"({"prompt": "Is the sky blue?", "completion": " Yes."})");
  const Example r0 = as_prompt_completion(R"({"prompt": "Is the sky blue?", "completion": " No, green."})");
  EXPECT_EQ(pairs[0].chosen.ids, c0.ids);
  EXPECT_EQ(pairs[0].chosen.loss_mask, c0.loss_mask);
  EXPECT_EQ(pairs[0].rejected.ids, r0.ids);
  EXPECT_EQ(pairs[0].rejected.loss_mask, r0.loss_mask);
  EXPECT_EQ(pairs[0].shared_prefix, qwen().encode("Is the sky blue?").size());
  const Example c1 = as_prompt_completion(
      R"({"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello!"}]})");
  EXPECT_EQ(pairs[1].chosen.ids, c1.ids);
  EXPECT_EQ(pairs[1].chosen.loss_mask, c1.loss_mask);
  EXPECT_NE(pairs[1].rejected.ids, pairs[1].chosen.ids);
}

// Without "prompt", two conversations carry it: the messages both start with (TRL's implicit
// prompt), so the pair equals the explicit one.
TEST(Preference, ImplicitPromptIsTheSharedLeadingMessages) {
  const std::string user = R"({"role": "user", "content": "Hi"})";
  const std::string a = R"({"role": "assistant", "content": "Hello!"})",
                    b = R"({"role": "assistant", "content": "Bye."})";
  const auto implicit =
      load("{\"chosen\": [" + user + ", " + a + "], \"rejected\": [" + user + ", " + b + "]}\n");
  const auto explicit_ =
      load("{\"prompt\": [" + user + "], \"chosen\": [" + a + "], \"rejected\": [" + b + "]}\n");
  ASSERT_EQ(implicit.size(), 1u);
  EXPECT_EQ(implicit[0].chosen.ids, explicit_[0].chosen.ids);
  EXPECT_EQ(implicit[0].chosen.loss_mask, explicit_[0].chosen.loss_mask);
  EXPECT_EQ(implicit[0].rejected.loss_mask, explicit_[0].rejected.loss_mask);
  // a null prompt is no prompt (datasets' to_json writes a null for a column a row lacks)
  const auto null_prompt = load("{\"prompt\": null, \"chosen\": [" + user + ", " + a + "], \"rejected\": [" +
                                user + ", " + b + "]}\n");
  ASSERT_EQ(null_prompt.size(), 1u);
  EXPECT_EQ(null_prompt[0].chosen.ids, explicit_[0].chosen.ids);
  EXPECT_EQ(null_prompt[0].rejected.ids, explicit_[0].rejected.ids);
}

TEST(Preference, BadRecordsAreOneLineNamingTheLine) {
  const auto has = [](const std::string& got, const std::string& want) {
    EXPECT_NE(got.find(want), std::string::npos) << got;
  };
  has(error_of(R"({"prompt": "a", "chosen": "b", "rejected": "c"})"
               "\n"
               R"({"text": "x"})"
               "\n"),
      "pref.jsonl:2: expected the keys \"prompt\", \"chosen\" and \"rejected\" of preference data (missing "
      "\"chosen\")");
  has(error_of(R"({"prompt": "a", "chosen": "b"})"
               "\n"),
      "pref.jsonl:1: expected the keys");
  has(error_of(R"({"prompt": "a", "chosen": "b", "rejected": 3})"
               "\n"),
      "pref.jsonl:1: expected a string at key \"rejected\", got number");
  has(error_of(R"({"prompt": "a", "chosen": " b", "rejected": " b"})"
               "\n"),
      "pref.jsonl:1: \"chosen\" and \"rejected\" are the same (nothing to prefer)");
  has(error_of(R"({"chosen": "a b", "rejected": "a c"})"
               "\n"),
      "pref.jsonl:1: missing key \"prompt\"");
  has(error_of(R"({"prompt": [{"role": "user", "content": "Hi"}], "chosen": "x", "rejected": "y"})"
               "\n"),
      "pref.jsonl:1: expected a list of messages at key \"chosen\"");
  has(error_of(
          R"({"chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "user", "content": "b"}]})"
          "\n"),
      "pref.jsonl:1: \"chosen\" and \"rejected\" share no leading message");
  has(error_of("\n"), "pref.jsonl: no preference pairs");
}
