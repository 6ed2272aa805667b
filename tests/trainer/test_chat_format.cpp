// Which chat template the trainer's data uses: the model's own (Jinja) by default, a
// hand-written family as fallback or when named, and tool conversations reaching the data.
#include <gtest/gtest.h>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
#include "tests/cli/cli_util.hpp"

using namespace rp::clitest;

namespace {

// SmolLM2-Instruct's template (tests/fixtures/chat_templates), which renders any role
const char* kChatML =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

}  // namespace

TEST(ChatFormat, TheModelsOwnTemplateByDefaultHandWrittenAsFallback) {
  const auto d = tmpdir();
  rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  EXPECT_EQ(rp::TokenStream::chat_template_for(lm, "auto"), "chatml");  // no template: ChatML
  EXPECT_THROW(rp::TokenStream::chat_template_for(lm, "jinja"), std::invalid_argument);
  lm.chat_template = kChatML;
  EXPECT_EQ(rp::TokenStream::chat_template_for(lm, "auto"), "jinja");
  EXPECT_EQ(rp::TokenStream::chat_template_for(lm, "jinja"), "jinja");
  EXPECT_EQ(rp::TokenStream::chat_template_for(lm, "llama3"), "llama3");  // a named family wins
  // a template the interpreter cannot parse: the hand-written family it resembles
  lm.chat_template = std::string(kChatML) + "{% include 'extra.jinja' %}";
  EXPECT_EQ(rp::TokenStream::chat_template_for(lm, "auto"), "smollm2");
  try {
    rp::TokenStream::chat_template_for(lm, "jinja");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported statement 'include'"), std::string::npos) << e.what();
  }
  // one that resembles no family either: "auto" names the model and the parse error too
  lm.chat_template = "{% for m in messages %}{{ m.content";
  try {
    rp::TokenStream::chat_template_for(lm, "auto");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(lm.source), std::string::npos) << what;
    EXPECT_NE(what.find("unclosed"), std::string::npos) << what;
  }
  fs::remove_all(d);
}

// A model whose tokenizer_config.json lists templates without a "default" (LoadedModel::
// chat_template_error): its own template is refused with that line ("auto" and "jinja" alike,
// not a silent ChatML), while a named hand-written template still works.
TEST(ChatFormat, AListOfTemplatesWithoutADefaultIsRefusedWhenFormatting) {
  const auto d = tmpdir();
  rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  lm.chat_template.clear();
  lm.chat_template_error = "tokenizer_config.json: key 'chat_template': a list of templates with no entry";
  for (const char* requested : {"auto", "jinja"}) {
    try {
      rp::TokenStream::chat_template_for(lm, requested);
      ADD_FAILURE() << requested << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), lm.chat_template_error);
    }
  }
  EXPECT_EQ(rp::TokenStream::chat_template_for(lm, "chatml"), "chatml");
  fs::remove_all(d);
}

TEST(ChatFormat, ToolConversationsTrainThroughTheModelsTemplate) {
  const auto d = tmpdir();
  rp::LoadedModel lm = rp::load_model(tiny_model(d).string());
  lm.chat_template = kChatML;
  write(d / "tools.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"weather?\"}, {\"role\": \"assistant\", "
        "\"content\": "
        "\"call\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"w\", \"arguments\": "
        "{}}}]}, "
        "{\"role\": \"tool\", \"content\": \"sunny\"}, {\"role\": \"assistant\", \"content\": \"It is "
        "sunny.\"}], "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"w\"}}]}\n");
  rp::TokenStreamOptions o;
  o.seq_len = 512;
  rp::TokenStream jinja(lm, (d / "tools.jsonl").string(), o);
  EXPECT_EQ(jinja.stats().chat_template, "jinja");
  EXPECT_EQ(jinja.stats().examples, 1u);
  const rp::TokenBatch b = jinja.next(1);
  int64_t targets = 0;
  for (int32_t t : b.targets) targets += t != rp::kIgnoreIndex;
  // both assistant turns ("call<|im_end|>", "It is sunny.<|im_end|>", byte-level: one token a byte)
  EXPECT_EQ(targets, int64_t(std::string("call<|im_end|>It is sunny.<|im_end|>").size()));
  // a hand-written family refuses the tool role
  o.chat_template = "chatml";
  EXPECT_THROW(rp::TokenStream(lm, (d / "tools.jsonl").string(), o), std::runtime_error);
  fs::remove_all(d);
}

// Template errors name the file the template came from: tokenizer_config.json's key, or
// chat_template.jinja beside it.
TEST(JinjaTemplateFile, ErrorsNameTheFileTheTemplateCameFrom) {
  const auto d = tmpdir();
  const fs::path model = tiny_model(d);
  const std::string bad = std::string(kChatML) + "\n{% include 'extra.jinja' %}";
  nlohmann::json tc = nlohmann::json::parse(slurp(model / "tokenizer_config.json"));
  tc["chat_template"] = bad;
  write(model / "tokenizer_config.json", tc.dump());
  const std::string at = ":" + std::to_string(std::count(bad.begin(), bad.end(), '\n') + 1) + ": ";
  auto error_of = [&] {
    try {
      rp::TokenStream::chat_template_for(rp::load_model(model.string()), "jinja");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(
      error_of().find("tokenizer_config.json key 'chat_template'" + at + "unsupported statement 'include'"),
      std::string::npos)
      << error_of();
  tc.erase("chat_template");
  write(model / "tokenizer_config.json", tc.dump());
  write(model / "chat_template.jinja", bad);
  EXPECT_NE(error_of().find("chat_template.jinja" + at + "unsupported statement 'include'"),
            std::string::npos)
      << error_of();
  fs::remove_all(d);
}
