#include "data/jinja/chat_context.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace rp::jinja {

namespace {

Value message_value(const nlohmann::ordered_json& given) {
  // apply_chat_template drops a message's null keys (OpenAI's "content": null beside
  // tool_calls): templates see them undefined, not None
  nlohmann::ordered_json m = nlohmann::ordered_json::object();
  for (const auto& [k, v] : given.items())
    if (!v.is_null()) m[k] = v;
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    auto it = m.find(key);
    if (it != m.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  if (!reasoning) return from_json(m);
  Dict d;
  d.set("thinking", from_json(*reasoning));
  for (const auto& [k, v] : m.items()) d.set(k, from_json(v));
  d.set("thinking", from_json(*reasoning));
  d.set("reasoning_content", from_json(*reasoning));
  return Value(std::move(d));
}

}  // namespace

Dict chat_variables(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                    bool add_generation_prompt, const nlohmann::ordered_json& extra) {
  if (!messages.is_array()) throw std::invalid_argument("messages: expected an array");
  List msgs;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object())
      throw std::invalid_argument(fmt::format("messages[{}]: expected an object", i));
    msgs.push_back(message_value(messages[i]));
  }
  if (!extra.is_null() && !extra.is_object())
    throw std::invalid_argument("template variables: expected an object");
  Dict vars;
  vars.set("messages", Value(std::move(msgs)));
  vars.set("tools", from_json(tools));
  vars.set("documents", Value(None{}));
  vars.set("add_generation_prompt", Value(add_generation_prompt));
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) vars.set(k, from_json(v));
  return vars;
}

}  // namespace rp::jinja
