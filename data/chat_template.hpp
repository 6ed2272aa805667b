// Chat templates for supervised fine-tuning, without a Jinja engine: the template family
// is recognised (from its name or from the tokenizer_config.json `chat_template` text)
// and rendered by hand.
//
//   chatml  (Qwen2; Qwen3 without think blocks): <|im_start|>{role}\n{content}<|im_end|>\n
//           per message, content as given.
//   qwen3   : Qwen3's own template (what HF apply_chat_template renders for Qwen3): ChatML,
//           where an assistant turn after the last user message renders as
//           "<think>\n{reasoning}\n</think>\n\n{content}" when it is the last message or has
//           reasoning (an empty think block "<think>\n\n</think>\n\n" without), and every
//           assistant turn drops its reasoning otherwise. Reasoning is the message's
//           `reasoning` field or, when content holds "</think>", the text between <think> and
//           </think> (content is then what follows). The think block is trained on with the
//           answer. A generation prompt with enable_thinking = false ends in the empty block.
//           Use chatml (alias qwen3-no-think) to train Qwen3 without any think block.
//   smollm2 : chatml, preceded by the default system message
//           "You are a helpful AI assistant named SmolLM, trained by Hugging Face" when
//           the first message is not a system message (as SmolLM2-Instruct's template).
//   llama3  : <|begin_of_text|> then
//           <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> per message,
//           with content trimmed of leading/trailing whitespace (as Llama 3's template);
//           the Llama 3.1 "Cutting Knowledge Date" system preamble is not added.
//
// The loss mask covers exactly the tokens of each assistant message's content plus its
// end-of-turn token (<|im_end|> / <|eot_id|>); role headers, the newline after
// <|im_end|>, system and user turns are not trained on. The whole conversation is
// tokenised as one string (as HF apply_chat_template does) and a token is assigned to an
// assistant span by the byte offset at which it starts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rp {

class Tokenizer;

enum class ChatTemplate { chatml, smollm2, llama3, qwen3 };

struct ChatMessage {
  std::string role;       ///< "system", "user" or "assistant"
  std::string content;    ///< UTF-8
  std::string reasoning;  ///< assistant only, qwen3 template: the think block's text ("" = none)
};

/// A tokenised conversation: ids[i] and loss_mask[i] (1 = token i is a training target).
struct RenderedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  ///< same length as ids
};

/// The hand-written templates' names as error messages list them (aliases left out).
inline constexpr const char* kChatTemplateNames = "chatml, qwen3, qwen3-no-think, smollm2, llama3";

/// "chatml" (alias "qwen2", "qwen3-no-think"), "qwen3", "smollm2" (alias "smollm"), "llama3"
/// (alias "llama-3", "llama3.1"). Throws std::invalid_argument listing the valid names.
ChatTemplate parse_chat_template_name(const std::string& name);

/// Canonical name of `t` ("chatml", "smollm2", "llama3", "qwen3").
const char* chat_template_name(ChatTemplate t);

/// Recognises the family of a Jinja chat template: <|start_header_id|> => llama3;
/// <|im_start|> and "SmolLM" => smollm2; <|im_start|> and <think> => qwen3; <|im_start|> =>
/// chatml. Throws
/// std::invalid_argument when none matches (including an empty string).
ChatTemplate detect_chat_template(const std::string& jinja_text);

/// Renders `messages` to text. When `assistant_spans` is given, it receives for each
/// assistant message the byte range [begin, end) of its content plus end-of-turn token.
/// add_generation_prompt appends the header of a new assistant turn (for inference); with
/// the qwen3 template and enable_thinking false it is followed by an empty think block.
/// Throws std::invalid_argument for a role other than system/user/assistant (the message
/// names the role and its index).
std::string render_chat_text(ChatTemplate t, const std::vector<ChatMessage>& messages,
                             std::vector<std::pair<size_t, size_t>>* assistant_spans = nullptr,
                             bool add_generation_prompt = false, bool enable_thinking = true);

/// Renders and tokenises `messages` (special tokens matched), with the loss mask described
/// in the file comment. Throws std::invalid_argument as render_chat_text().
RenderedChat render_chat(const Tokenizer& tok, ChatTemplate t, const std::vector<ChatMessage>& messages);

/// Tokenises a rendered conversation (special tokens matched) and sets the loss mask of each
/// token that starts inside one of `spans` (byte ranges, increasing and disjoint).
RenderedChat tokenize_chat(const Tokenizer& tok, const std::string& text,
                           const std::vector<std::pair<size_t, size_t>>& spans);

}  // namespace rp
