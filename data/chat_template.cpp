#include "data/chat_template.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include <fmt/format.h>

#include "data/tokenizer.hpp"

namespace rp {

namespace {
constexpr const char* kSmolSystem = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}
}  // namespace

ChatTemplate parse_chat_template_name(const std::string& name) {
  std::string n = lower(name);
  if (n == "chatml" || n == "qwen2" || n == "qwen3-no-think") return ChatTemplate::chatml;
  if (n == "qwen3") return ChatTemplate::qwen3;
  if (n == "smollm2" || n == "smollm") return ChatTemplate::smollm2;
  if (n == "llama3" || n == "llama-3" || n == "llama3.1") return ChatTemplate::llama3;
  throw std::invalid_argument(
      fmt::format("unknown chat template \"{}\" (valid: {})", name, kChatTemplateNames));
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::chatml: return "chatml";
    case ChatTemplate::smollm2: return "smollm2";
    case ChatTemplate::llama3: return "llama3";
    case ChatTemplate::qwen3: return "qwen3";
  }
  return "?";
}

ChatTemplate detect_chat_template(const std::string& jinja) {
  if (jinja.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::llama3;
  if (jinja.find("<|im_start|>") != std::string::npos) {
    if (jinja.find("SmolLM") != std::string::npos) return ChatTemplate::smollm2;
    return jinja.find("<think>") != std::string::npos ? ChatTemplate::qwen3 : ChatTemplate::chatml;
  }
  throw std::invalid_argument(
      "unrecognised chat template: expected ChatML (<|im_start|>) or Llama 3 (<|start_header_id|>) markers; "
      "name one explicitly (chatml, smollm2, llama3)");
}

namespace {

std::string strip_newlines(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e && s[b] == '\n') ++b;
  while (right && e > b && s[e - 1] == '\n') --e;
  return s.substr(b, e - b);
}

/// Qwen3's assistant turn body (after "<|im_start|>assistant\n"), as its Jinja template.
std::string qwen3_assistant(const ChatMessage& m, bool after_last_query, bool last) {
  std::string content = m.content, reasoning = m.reasoning;
  const size_t close = content.find("</think>");
  if (reasoning.empty() && close != std::string::npos) {
    std::string before = strip_newlines(content.substr(0, close), false, true);
    const size_t open = before.rfind("<think>");
    if (open != std::string::npos) before = before.substr(open + 7);
    reasoning = strip_newlines(before, true, false);
    content = strip_newlines(content.substr(content.rfind("</think>") + 8), true, false);
  }
  if (after_last_query && (last || !reasoning.empty()))
    return "<think>\n" + strip_newlines(reasoning, true, true) + "\n</think>\n\n" +
           strip_newlines(content, true, false);
  return content;
}

}  // namespace

std::string render_chat_text(ChatTemplate t, const std::vector<ChatMessage>& messages,
                             std::vector<std::pair<size_t, size_t>>* spans, bool add_generation_prompt,
                             bool enable_thinking) {
  std::string out;
  if (spans) spans->clear();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      throw std::invalid_argument(
          fmt::format("messages[{}]: unknown role \"{}\" (expected system, user or assistant)", i, r));
  }
  const bool llama = t == ChatTemplate::llama3;
  const char* end = llama ? "<|eot_id|>" : "<|im_end|>";
  auto header = [&](const std::string& role) {
    if (llama) out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
    else out += "<|im_start|>" + role + "\n";
  };
  if (llama) out += "<|begin_of_text|>";
  if (t == ChatTemplate::smollm2 && (messages.empty() || messages[0].role != "system")) {
    header("system");
    out += kSmolSystem;
    out += "<|im_end|>\n";
  }
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;  // Qwen3: the last user message
  for (size_t i = messages.size(); i-- > 0;)
    if (messages[i].role == "user") {
      last_query = i;
      break;
    }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    header(m.role);
    size_t begin = out.size();
    if (llama) out += trim(m.content);
    else if (t == ChatTemplate::qwen3 && m.role == "assistant")
      out += qwen3_assistant(m, i > last_query, i + 1 == messages.size());
    else out += m.content;
    out += end;
    if (spans && m.role == "assistant") spans->emplace_back(begin, out.size());
    if (!llama) out += "\n";
  }
  if (add_generation_prompt) {
    header("assistant");
    if (t == ChatTemplate::qwen3 && !enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

RenderedChat render_chat(const Tokenizer& tok, ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::vector<std::pair<size_t, size_t>> spans;
  std::string text = render_chat_text(t, messages, &spans);
  return tokenize_chat(tok, text, spans);
}

RenderedChat tokenize_chat(const Tokenizer& tok, const std::string& text,
                           const std::vector<std::pair<size_t, size_t>>& spans) {
  RenderedChat r;
  std::vector<size_t> offsets;
  r.ids = tok.encode_with_offsets(text, offsets, /*allow_special=*/true);
  r.loss_mask.assign(r.ids.size(), 0);
  size_t s = 0;  // spans and offsets are both increasing
  for (size_t i = 0; i < r.ids.size(); ++i) {
    while (s < spans.size() && offsets[i] >= spans[s].second) ++s;
    if (s < spans.size() && offsets[i] >= spans[s].first) r.loss_mask[i] = 1;
  }
  return r;
}

}  // namespace rp
