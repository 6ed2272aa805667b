// A model's own chat template (tokenizer_config.json `chat_template` or chat_template.jinja),
// rendered by the Jinja interpreter (data/jinja/) as transformers' apply_chat_template renders
// it, with the loss mask over the assistant turns.
//
// Loss mask: for assistant message i, the span starts where the rendering of messages[0..i)
// with add_generation_prompt (the conversation up to the new turn's header) stops agreeing
// with the full rendering, but never inside the turn's content (found by marking its start);
// it ends with the rendering of messages[0..i] (the turn as the last message) when that is a
// prefix of the full rendering, less trailing whitespace: the turn's content, tool calls and
// end-of-turn token (e.g. `<think>...</think>\n\nanswer<|im_end|>`, `answer<|eot_id|>`,
// `[TOOL_CALLS][...]</s>`). When a template renders a turn differently once it is no longer
// the last (Qwen3 drops the think block of earlier turns), the content's end is found by
// marking it, and the span takes the text the last-message rendering puts after the content
// as far as the full rendering agrees. A token is trained on when it starts inside a span.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat_template.hpp"
#include "data/jinja/template.hpp"

namespace rp {

class Tokenizer;

class JinjaChat {
 public:
  /// `source` is the template text, `name` the file errors name. bos_token / eos_token are the
  /// strings the template sees (empty: undefined). Throws jinja::TemplateError for a syntax
  /// error or an unsupported statement.
  JinjaChat(const std::string& source, std::string bos_token, std::string eos_token,
            std::string name = "chat_template.jinja");

  /// The text for `messages` (a JSON array of message objects, passed as they are: role,
  /// content, tool_calls, reasoning_content, ...), `tools` (an array, or null), with or
  /// without the generation prompt; `extra` (an object or null) adds template variables such
  /// as enable_thinking. Throws jinja::TemplateError (jinja::RaisedException when the
  /// template refuses the conversation), std::invalid_argument for a non-array `messages`.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& extra = nullptr) const;

  /// Byte ranges [begin, end) in `full` = render(messages, tools, false) of each assistant
  /// message, as the file comment describes (a turn that cannot be located has none).
  std::vector<std::pair<size_t, size_t>> assistant_spans(const nlohmann::ordered_json& messages,
                                                         const nlohmann::ordered_json& tools,
                                                         const std::string& full) const;

  /// Renders, tokenises (special tokens matched, nothing added: the template writes its own
  /// BOS) and masks. Throws as render(), and std::invalid_argument when no assistant turn
  /// could be located.
  RenderedChat render_chat(const Tokenizer& tok, const nlohmann::ordered_json& messages,
                           const nlohmann::ordered_json& tools) const;

  const std::string& name() const { return template_.name(); }

 private:
  jinja::Template template_;
  std::string bos_, eos_;
};

/// The strings a tokenizer passes to its chat template as bos_token / eos_token: the
/// post-processor's first prefix token (LLaMA-3's <|begin_of_text|>, Mistral's <s>; "" when it
/// adds none) and the eos token ("" without one).
std::pair<std::string, std::string> template_special_tokens(const Tokenizer& tok);

/// How conversations become tokens: the model's own template (`jinja` set), or a
/// hand-written family (chat_template.hpp) when the model has none or one is named.
struct ChatFormat {
  ChatTemplate family = ChatTemplate::chatml;
  std::shared_ptr<const JinjaChat> jinja;
  ChatFormat(ChatTemplate f = ChatTemplate::chatml) : family(f) {}  // NOLINT: a family is a format
  explicit ChatFormat(std::shared_ptr<const JinjaChat> j) : jinja(std::move(j)) {}
  /// "jinja" or the family's name.
  std::string name() const { return jinja ? std::string("jinja") : std::string(chat_template_name(family)); }
};

}  // namespace rp
