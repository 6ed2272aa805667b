// Chat templates: exact rendered text and the assistant-only loss mask.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "data/chat_template.hpp"
#include "data/tokenizer.hpp"

using namespace rp;
using rp::test::fixture;
using rp::test::masked_runs;
using rp::test::qwen;
using rp::test::read_file;

namespace {
// Qwen3's tokenizer plus the four Llama 3 chat special tokens.
const Tokenizer& qwen_with_llama_tokens() {
  static const Tokenizer t = [] {
    auto j = nlohmann::json::parse(read_file(fixture("qwen3-tokenizer/tokenizer.json")));
    int id = 151669;
    for (const char* s : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
      j["added_tokens"].push_back({{"id", id++}, {"content", s}, {"special", true}});
    return Tokenizer::from_json(j, "qwen+llama3");
  }();
  return t;
}
}  // namespace

TEST(ChatTemplate, ChatMLTextAndMask) {
  std::vector<ChatMessage> msgs = {{"system", "You are terse."},
                                   {"user", "Hi"},
                                   {"assistant", "Hello there!"},
                                   {"user", "2+2?"},
                                   {"assistant", " 4\n"}};
  const std::string want =
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello there!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
      "<|im_start|>assistant\n 4\n<|im_end|>\n";
  EXPECT_EQ(render_chat_text(ChatTemplate::chatml, msgs), want);
  auto r = render_chat(qwen(), ChatTemplate::chatml, msgs);
  ASSERT_EQ(r.ids.size(), r.loss_mask.size());
  EXPECT_EQ(qwen().decode(r.ids), want);
  EXPECT_EQ(r.ids.front(), 151644);
  EXPECT_EQ(r.ids.back(), 198);  // "\n" after the last <|im_end|>: not trained on
  EXPECT_EQ(r.loss_mask.back(), 0);
  EXPECT_EQ(masked_runs(qwen(), r), (std::vector<std::string>{"Hello there!<|im_end|>", " 4\n<|im_end|>"}));
  // The first run is exactly the content's own tokens plus <|im_end|>.
  auto content = qwen().encode("Hello there!");
  size_t first = std::find(r.loss_mask.begin(), r.loss_mask.end(), 1) - r.loss_mask.begin();
  ASSERT_LE(first + content.size() + 1, r.ids.size());
  for (size_t k = 0; k < content.size(); ++k) EXPECT_EQ(r.ids[first + k], content[k]) << k;
  EXPECT_EQ(r.ids[first + content.size()], 151645);
}

TEST(ChatTemplate, SmolLM2DefaultSystemPrompt) {
  std::vector<ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "Hey"}};
  EXPECT_EQ(
      render_chat_text(ChatTemplate::smollm2, msgs),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHey<|im_end|>\n");
  std::vector<ChatMessage> with_sys = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hey"}};
  EXPECT_EQ(render_chat_text(ChatTemplate::smollm2, with_sys),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHey<|im_end|>\n");
  auto r = render_chat(qwen(), ChatTemplate::smollm2, msgs);
  EXPECT_EQ(masked_runs(qwen(), r), (std::vector<std::string>{"Hey<|im_end|>"}));
  EXPECT_EQ(render_chat_text(ChatTemplate::smollm2, msgs, nullptr, true)
                .substr(render_chat_text(ChatTemplate::smollm2, msgs).size()),
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3TextAndMask) {
  std::vector<ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "  Yo \n"}};
  const std::string want =
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>";
  EXPECT_EQ(render_chat_text(ChatTemplate::llama3, msgs), want);
  const auto& t = qwen_with_llama_tokens();
  auto r = render_chat(t, ChatTemplate::llama3, msgs);
  EXPECT_EQ(t.decode(r.ids), want);
  EXPECT_EQ(r.ids.front(), 151669);
  EXPECT_EQ(r.ids.back(), 151672);
  EXPECT_EQ(r.loss_mask.back(), 1);
  EXPECT_EQ(masked_runs(t, r), (std::vector<std::string>{"Yo<|eot_id|>"}));
}

TEST(ChatTemplate, SpansAndRoles) {
  std::vector<std::pair<size_t, size_t>> spans;
  std::vector<ChatMessage> msgs = {{"user", "a"}, {"assistant", "b"}};
  std::string s = render_chat_text(ChatTemplate::chatml, msgs, &spans);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(s.substr(spans[0].first, spans[0].second - spans[0].first), "b<|im_end|>");
  try {
    render_chat_text(ChatTemplate::chatml, {{"user", "a"}, {"bot", "b"}});
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("messages[1]: unknown role \"bot\""), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, NamesAndDetection) {
  EXPECT_EQ(parse_chat_template_name("chatml"), ChatTemplate::chatml);
  EXPECT_EQ(parse_chat_template_name("Qwen3"), ChatTemplate::qwen3);
  EXPECT_EQ(parse_chat_template_name("qwen3-no-think"), ChatTemplate::chatml);
  EXPECT_EQ(parse_chat_template_name("smollm2"), ChatTemplate::smollm2);
  EXPECT_EQ(parse_chat_template_name("llama3"), ChatTemplate::llama3);
  try {
    parse_chat_template_name("alpaca");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    std::string w = e.what();
    for (const char* n : {"alpaca", "chatml", "smollm2", "llama3"})
      EXPECT_NE(w.find(n), std::string::npos) << w;
  }
  EXPECT_EQ(detect_chat_template(qwen().chat_template()), ChatTemplate::qwen3);
  EXPECT_EQ(detect_chat_template("{{ '<|im_start|>' + message['role'] + '\n' }}"), ChatTemplate::chatml);
  EXPECT_EQ(detect_chat_template(
                "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
                "%}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] }}"),
            ChatTemplate::smollm2);
  EXPECT_EQ(detect_chat_template("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"),
            ChatTemplate::llama3);
  EXPECT_THROW(detect_chat_template("{{ messages }}"), std::invalid_argument);
  EXPECT_THROW(detect_chat_template(""), std::invalid_argument);
  EXPECT_STREQ(chat_template_name(ChatTemplate::smollm2), "smollm2");
}

// Expected texts: Qwen3's own Jinja template (tests/fixtures/qwen3-tokenizer/
// tokenizer_config.json) rendered with jinja2 for these conversations.
TEST(ChatTemplate, Qwen3ThinkBlocksAsItsOwnTemplate) {
  using M = std::vector<ChatMessage>;
  EXPECT_EQ(render_chat_text(ChatTemplate::qwen3, M{{"user", "Q"}, {"assistant", "A"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
  EXPECT_EQ(
      render_chat_text(ChatTemplate::qwen3, M{{"system", "S"},
                                              {"user", "Q1"},
                                              {"assistant", "<think>\nr1\n</think>\n\nA1"},
                                              {"user", "Q2"},
                                              {"assistant", "A2"}}),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
      "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n");
  EXPECT_EQ(render_chat_text(ChatTemplate::qwen3, M{{"user", "Q"}, {"assistant", "A", "why"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\nA<|im_end|>\n");
  EXPECT_EQ(
      render_chat_text(ChatTemplate::qwen3, M{{"user", "Q"}, {"assistant", "A1", "w1"}, {"assistant", "A2"}}),
      "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nw1\n</think>\n\nA1<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n");
  EXPECT_EQ(render_chat_text(ChatTemplate::qwen3, M{{"user", "Q"}}, nullptr, true, false),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // without the think block (chatml, alias qwen3-no-think)
  EXPECT_EQ(
      render_chat_text(parse_chat_template_name("qwen3-no-think"), M{{"user", "Q"}, {"assistant", "A"}}),
      "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n");
  // the think block is trained on with the answer
  auto r = render_chat(qwen(), ChatTemplate::qwen3, M{{"user", "Q"}, {"assistant", "A"}});
  EXPECT_EQ(masked_runs(qwen(), r), (std::vector<std::string>{"<think>\n\n</think>\n\nA<|im_end|>"}));
}
