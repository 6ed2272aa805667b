// Text in, text out around rp::Generator: a prompt (plain text, or chat messages rendered
// with the model's chat template and its generation prompt) tokenised with the model's
// tokenizer, generated until eos / the template's end of turn / a stop string, decoded.
// `roundpipe generate` and the trainer's samples before and after fine-tuning use it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "data/chat_template.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/generate.hpp"

namespace rp {

struct SampleRequest {
  std::vector<ChatMessage> messages;  ///< chat: rendered with the chat template (+ generation prompt)
  std::string text;                   ///< or plain text (used when messages is empty), with the
                                      ///< post-processor's special tokens (BOS) like HF tokenizer(text)
  std::string chat_template =
      "auto";                     ///< auto (the model's) | chatml | qwen3 | qwen3-no-think | smollm2 | llama3
  bool enable_thinking = true;    ///< qwen3: false ends the generation prompt with an empty think block
  GenerateOptions generate;       ///< stop_ids are added to: eos and the template's end-of-turn token
  std::vector<std::string> stop;  ///< also stop once the text contains one of these (cut before it)
  /// Where `messages` came from (a --messages file), or "": an error of their rendering (a role the
  /// template does not know, the template's raise_exception) begins with it, as a data file's line.
  std::string messages_origin;
  /// Asked before the prompt is run and after each generated token: true ends the generation
  /// there, with the text so far (SampleResult::interrupted). A stop request, e.g. a Ctrl-C.
  std::function<bool()> interrupt;
};

struct SampleResult {
  std::string text;                      ///< the generated text (stop strings and end tokens cut)
  std::vector<int32_t> prompt_ids, ids;  ///< the prompt and the generated tokens
  double seconds = 0;
  bool interrupted = false;  ///< SampleRequest::interrupt ended it before its end
};

/// Runs `r` on `gen` for `model` (its tokenizer and chat template). `on_text` (optional)
/// receives the text as it grows (new bytes only). Throws std::runtime_error for a model
/// without a tokenizer, std::invalid_argument for an unknown chat template.
SampleResult sample(Generator& gen, const LoadedModel& model, const SampleRequest& r,
                    const std::function<void(const std::string&)>& on_text = {});

}  // namespace rp
