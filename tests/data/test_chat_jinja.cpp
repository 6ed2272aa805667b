// The model's own chat template through the Jinja interpreter: Qwen3's template (the one in
// the Qwen3 tokenizer fixture's tokenizer_config.json) renders and masks what the hand-written
// Qwen3 renderer does, and carries tool calls, tool messages and a tools list into training
// examples with the loss on the assistant turns only.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "data/chat_jinja.hpp"
#include "data/dataset.hpp"

using namespace rp;
using ojson = nlohmann::ordered_json;
using rp::test::fixture;
using rp::test::masked_runs;
using rp::test::qwen;
using rp::test::read_file;

namespace {

std::string qwen3_template() {
  return nlohmann::json::parse(read_file(fixture("qwen3-tokenizer/tokenizer_config.json")))["chat_template"];
}

const JinjaChat& qwen3_chat() {
  static const JinjaChat c(qwen3_template(), "", "<|im_end|>");
  return c;
}

ojson as_json(const std::vector<ChatMessage>& msgs) {
  ojson out = ojson::array();
  for (const auto& m : msgs) {
    ojson o = {{"role", m.role}, {"content", m.content}};
    if (!m.reasoning.empty()) o["reasoning_content"] = m.reasoning;
    out.push_back(o);
  }
  return out;
}

/// The Qwen3 tool conversation of the goldens (tests/fixtures/chat_templates/cases.json).
ojson golden_case(const std::string& file, const std::string& name) {
  const ojson doc = ojson::parse(read_file(fixture("chat_templates/cases.json")));
  for (const auto& c : doc["cases"])
    if (c["template"] == file && c["case"] == name) return c;
  ADD_FAILURE() << "no case " << file << " / " << name;
  return {};
}

}  // namespace

TEST(ChatJinja, Qwen3TemplateMatchesTheHandWrittenRenderer) {
  // reasoning in an earlier turn (dropped by both), a think block in the content of the last
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."},
      {"user", "Is 17 prime?"},
      {"assistant", "Yes.", "17 has no divisor between 2 and 4."},
      {"user", "Is 21?"},
      {"assistant", "<think>\n21 = 3 * 7.\n</think>\n\nNo, 21 = 3 x 7."},
  };
  const RenderedChat hand = render_chat(qwen(), ChatTemplate::qwen3, msgs);
  const RenderedChat jinja = qwen3_chat().render_chat(qwen(), as_json(msgs), nullptr);
  EXPECT_EQ(qwen().decode(jinja.ids), render_chat_text(ChatTemplate::qwen3, msgs));
  EXPECT_EQ(jinja.ids, hand.ids);
  EXPECT_EQ(jinja.loss_mask, hand.loss_mask);
  EXPECT_EQ(masked_runs(qwen(), jinja),
            (std::vector<std::string>{"Yes.<|im_end|>",
                                      "<think>\n21 = 3 * 7.\n</think>\n\nNo, 21 = 3 x 7.<|im_end|>"}));
}

TEST(ChatJinja, ToolCallsToolMessagesAndToolsReachTheTemplate) {
  const ojson c = golden_case("Qwen-Qwen3-0.6B.jinja", "tools");
  const std::string text = qwen3_chat().render(c["messages"], c["tools"], false);
  EXPECT_EQ(text, c["expected"].get<std::string>());  // what transformers renders
  const RenderedChat r = qwen3_chat().render_chat(qwen(), c["messages"], c["tools"]);
  EXPECT_EQ(qwen().decode(r.ids), text);
  const auto runs = masked_runs(qwen(), r);
  ASSERT_EQ(runs.size(), 2u);
  // the tool-calling turn: both calls with their arguments as written, then the end of turn
  EXPECT_EQ(runs[0].rfind("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                          "\"unit\": \"celsius\"}}",
                          0),
            0u)
      << runs[0];
  EXPECT_NE(
      runs[0].find("{\"name\": \"add\", \"arguments\": {\"a\": 1.5, \"b\": 2}}\n</tool_call><|im_end|>"),
      std::string::npos)
      << runs[0];
  EXPECT_EQ(runs[1], "<think>\n\n</think>\n\nIt is 21 °C and clear in Paris; 1.5 + 2 = 3.5.<|im_end|>");
  // tool results, the tools list, the system and user turns are not trained on
  for (const auto& run : runs) {
    EXPECT_EQ(run.find("tool_response"), std::string::npos);
    EXPECT_EQ(run.find("<tools>"), std::string::npos);
  }
}

TEST(ChatJinja, DatasetPassesToolRecordsThrough) {
  test::TempDir dir;
  const ojson c = golden_case("Qwen-Qwen3-0.6B.jinja", "tools");
  const ojson record = {{"messages", c["messages"]}, {"tools", c["tools"]}};
  const std::string path = dir.write("tools.jsonl", record.dump() + "\n" + record.dump() + "\n");
  const ChatFormat format(std::make_shared<const JinjaChat>(qwen3_template(), "", "<|im_end|>"));
  const Dataset d = load_dataset(path, qwen(), format);
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(qwen().decode(d.examples[0].ids), c["expected"].get<std::string>());
  size_t masked = 0;
  for (uint8_t m : d.examples[0].loss_mask) masked += m;
  EXPECT_GT(masked, 40u);
  // the hand-written renderers refuse the tool role, naming the line
  try {
    load_dataset(path, qwen(), ChatTemplate::qwen3);
    ADD_FAILURE() << "loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tools.jsonl:1: messages[3]: unknown role \"tool\""),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatJinja, TemplateRefusalsNameTheRecordAndTheTemplateLine) {
  test::TempDir dir;
  const std::string path = dir.write("d.jsonl",
                                     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
                                     "\"assistant\", \"content\": \"yo\"}]}\n"
                                     "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": "
                                     "\"user\", \"content\": \"hi\"}, "
                                     "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
  const std::string gemma = read_file(fixture("chat_templates/google-gemma-2-2b-it.jinja"));
  const ChatFormat format(std::make_shared<const JinjaChat>(gemma, "<bos>", "<eos>"));
  try {
    load_dataset(path, qwen(), format);
    ADD_FAILURE() << "loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("d.jsonl:2: chat_template.jinja:1: System role not supported"),
              std::string::npos)
        << e.what();
  }
  // no assistant turn: nothing to train on
  const std::string none =
      dir.write("n.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
  EXPECT_THROW(load_dataset(none, qwen(), format), std::runtime_error);
}

TEST(ChatJinja, NullKeysAreDroppedAndReasoningIsAliasedAsTransformersDoes) {
  const JinjaChat chat(
      "{% for m in messages %}{{ m.content is defined }} {{ m.thinking }}|{{ m.reasoning_content }};{% "
      "endfor %}",
      "", "");
  const ojson msgs = ojson::parse(
      R"([{"role": "assistant", "content": null, "tool_calls": []}, {"role": "assistant", "content": "a", "reasoning": "r"}])");
  EXPECT_EQ(chat.render(msgs, nullptr, false), "False |;True r|r;");
}

TEST(ChatJinja, MasksCoverAssistantTurnsOfEveryGoldenTemplate) {
  // every golden template: each assistant answer lies inside a span, no user text does
  const ojson doc = ojson::parse(read_file(fixture("chat_templates/cases.json")));
  size_t checked = 0;
  for (const auto& c : doc["cases"]) {
    if (c.contains("error") || c["add_generation_prompt"].get<bool>()) continue;
    const std::string file = c["template"];
    auto token = [&](const char* key) {
      const ojson& v = c["variables"][key];
      return v.is_string() ? v.get<std::string>() : std::string();
    };
    const JinjaChat chat(read_file(fixture("chat_templates/" + file)), token("bos_token"), token("eos_token"),
                         file);
    const std::string full = chat.render(c["messages"], c["tools"], false, c["variables"]);
    const auto spans = chat.assistant_spans(c["messages"], c["tools"], full);
    std::string trained, untrained = full;
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      trained += full.substr(it->first, it->second - it->first) + "\n";
      untrained.erase(it->first, it->second - it->first);
    }
    for (const auto& m : c["messages"]) {
      if (!m.contains("content") || !m["content"].is_string()) continue;
      std::string text = m["content"];
      if (text.find("</think>") != std::string::npos) text = text.substr(text.find("</think>") + 8);
      text.erase(0, text.find_first_not_of(" \n"));
      text.erase(text.find_last_not_of(" \n") + 1);
      if (text.empty()) continue;
      if (m["role"] == "assistant") {
        EXPECT_NE(trained.find(text), std::string::npos) << file << " / " << c["case"] << ": " << text;
      }
      if (m["role"] == "user") {
        EXPECT_EQ(trained.find(text), std::string::npos) << file << " / " << c["case"] << ": " << text;
      }
    }
    EXPECT_EQ(untrained.find("It is 21 °C"), std::string::npos) << file << " / " << c["case"];
    ++checked;
  }
  EXPECT_GE(checked, 50u);
}

TEST(ChatJinja, SmolLM2TemplateTrainsExactlyAsTheHandWrittenRenderer) {
  // the default run's data (assets/kjv_instruct.jsonl, SmolLM2's own template): the same
  // tokens and loss mask as the hand-written smollm2 renderer, record for record
  const std::string data = std::string(RP_SOURCE_DIR) + "/assets/kjv_instruct.jsonl";
  if (!std::filesystem::exists(data))
    GTEST_SKIP() << data << " is absent (assets/ holds the default run's data)";
  const Tokenizer smol = Tokenizer::from_file(fixture("smollm2-tokenizer/tokenizer.json"));
  std::ifstream in(data);
  std::string lines, line;
  for (int i = 0; i < 300 && std::getline(in, line); ++i) lines += line + "\n";
  test::TempDir dir;
  const std::string path = dir.write("kjv.jsonl", lines);
  const std::string tmpl = read_file(fixture("chat_templates/HuggingFaceTB-SmolLM2-135M-Instruct.jinja"));
  const auto [bos, eos] = template_special_tokens(smol);
  const Dataset jinja =
      load_dataset(path, smol, ChatFormat(std::make_shared<const JinjaChat>(tmpl, bos, eos)));
  const Dataset hand = load_dataset(path, smol, ChatTemplate::smollm2);
  ASSERT_EQ(jinja.examples.size(), 300u);
  ASSERT_EQ(hand.examples.size(), 300u);
  for (size_t i = 0; i < 300; ++i) {
    EXPECT_EQ(jinja.examples[i].ids, hand.examples[i].ids) << "record " << i + 1;
    EXPECT_EQ(jinja.examples[i].loss_mask, hand.examples[i].loss_mask) << "record " << i + 1;
  }
}
