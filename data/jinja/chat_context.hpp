// The variables transformers gives a chat template (apply_chat_template ->
// render_jinja_template), built from JSON messages. Internal to data/.
#pragma once
#include <nlohmann/json.hpp>

#include "data/jinja/value.hpp"

namespace rp::jinja {

/// messages: a JSON array of message objects, each passed as it is (less its null-valued
/// keys, which apply_chat_template drops) except that a message
/// with reasoning (the first non-null of `reasoning_content`, `thinking`, `reasoning`) gets it
/// under `thinking` (first key) and `reasoning_content` too, as transformers 5 does (Qwen3
/// reads reasoning_content, GPT-OSS thinking). tools: an array, or null for none (the
/// template sees None). documents is None. add_generation_prompt as given. `extra` (an
/// object: bos_token, eos_token, enable_thinking, ...) is added last. Throws
/// std::invalid_argument when messages is not an array of objects or extra not an object.
Dict chat_variables(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                    bool add_generation_prompt, const nlohmann::ordered_json& extra);

}  // namespace rp::jinja
