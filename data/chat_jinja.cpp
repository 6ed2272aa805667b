#include "data/chat_jinja.hpp"

#include <algorithm>
#include <stdexcept>

#include "data/jinja/chat_context.hpp"
#include "data/tokenizer.hpp"

namespace rp {

namespace {

using ojson = nlohmann::ordered_json;

size_t common_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

ojson head(const ojson& messages, size_t n) {
  ojson out = ojson::array();
  for (size_t i = 0; i < n && i < messages.size(); ++i) out.push_back(messages[i]);
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

std::pair<std::string, std::string> template_special_tokens(const Tokenizer& tok) {
  const auto& pre = tok.prefix_tokens();
  std::string bos = pre.empty() || !tok.has_token(pre.front()) ? std::string() : tok.token_text(pre.front());
  std::string eos =
      tok.eos_id() >= 0 && tok.has_token(tok.eos_id()) ? tok.token_text(tok.eos_id()) : std::string();
  return {bos, eos};
}

JinjaChat::JinjaChat(const std::string& source, std::string bos_token, std::string eos_token,
                     std::string name)
    : template_(source, std::move(name)), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {}

std::string JinjaChat::render(const ojson& messages, const ojson& tools, bool add_generation_prompt,
                              const ojson& extra) const {
  ojson vars = extra.is_object() ? extra : ojson::object();
  if (!bos_.empty() && !vars.contains("bos_token")) vars["bos_token"] = bos_;
  if (!eos_.empty() && !vars.contains("eos_token")) vars["eos_token"] = eos_;
  const jinja::Dict d = jinja::chat_variables(messages, tools, add_generation_prompt, vars);
  return template_.render(d);
}

std::vector<std::pair<size_t, size_t>> JinjaChat::assistant_spans(const ojson& messages, const ojson& tools,
                                                                  const std::string& full) const {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t floor = 0;  // spans do not overlap and are in order
  // `messages` with message i's content marked ("\x01" before or after it): where the
  // rendering changes is where the content is
  auto marked = [&](size_t i, bool before) {
    ojson m = messages;
    const std::string c = m[i]["content"].get<std::string>();
    m[i]["content"] = before ? "\x01" + c : c + "\x01";
    return m;
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object() || m.value("role", "") != "assistant") continue;
    const bool has_content = m.contains("content") && m["content"].is_string();
    size_t start = floor;
    bool prompt_is_prefix = false;  // the conversation so far plus the generation prompt starts `full`
    try {
      const std::string prompt = render(head(messages, i), tools, true);
      start = std::max(floor, common_prefix(full, prompt));
      // the prompt starts `full`, or at least the turns before it do (a generation prompt
      // that opens a think block full does not have)
      const std::string before = render(head(messages, i), tools, false);
      prompt_is_prefix =
          start == prompt.size() || (common_prefix(full, before) == before.size() && start >= before.size());
    } catch (const jinja::TemplateError&) {
      // a template may refuse a conversation that does not start with a user turn
    }
    // never start inside the content (a header may share its first characters); when the
    // earlier turns render differently (Mistral puts the system prompt into the last user turn)
    // or the generation prompt is not in `full` (a think opener), start at the content
    bool located = prompt_is_prefix;
    try {
      if (has_content) {
        const size_t content_start =
            std::max(floor, common_prefix(full, render(marked(i, true), tools, false)));
        // (a template that cuts the content, e.g. at </think>, may drop the marker: nothing learnt)
        if (content_start < full.size()) {
          start = prompt_is_prefix ? std::min(start, content_start) : content_start;
          located = true;
        }
      }
    } catch (const jinja::TemplateError&) {}
    if (!located) continue;  // rather untrained than trained on the turns before it
    std::string last;
    try {
      last = render(head(messages, i + 1), tools, false);
    } catch (const jinja::TemplateError&) {
      continue;  // the template refuses the conversation cut after this turn: it cannot be located
    }
    size_t end = common_prefix(full, last);
    if (end < last.size() && has_content) {
      // the turn renders differently once it is not the last: its content ends where the
      // marked rendering departs, then comes the text the last-message rendering puts after it
      try {
        const ojson after = marked(i, false);
        const size_t content_end = common_prefix(full, render(after, tools, false));
        const size_t last_content_end = common_prefix(last, render(head(after, i + 1), tools, false));
        end = content_end + common_prefix(full.substr(content_end), last.substr(last_content_end));
      } catch (const jinja::TemplateError&) {}
    }
    while (end > start && is_space(full[end - 1])) --end;
    if (end <= start) continue;
    spans.emplace_back(start, end);
    floor = end;
  }
  return spans;
}

RenderedChat JinjaChat::render_chat(const Tokenizer& tok, const ojson& messages, const ojson& tools) const {
  const std::string text = render(messages, tools, false);
  const auto spans = assistant_spans(messages, tools, text);
  if (spans.empty())
    throw std::invalid_argument(name() +
                                ": no assistant turn of the conversation could be located in its rendering");
  return tokenize_chat(tok, text, spans);
}

}  // namespace rp
