// A Jinja interpreter for Hugging Face chat templates: the subset of Jinja 3.1 that chat
// templates use, rendering byte for byte what transformers' apply_chat_template renders
// (trim_blocks, lstrip_blocks, the loopcontrols extension, transformers' tojson /
// raise_exception / strftime_now / namespace globals). docs/spec.md ("Chat templates")
// lists what is supported; anything else is refused with one line naming the template, the
// line and the construct, e.g. `chat_template.jinja:12: unsupported filter 'xyz'`.
//
// Rendering is bounded: a template that loops, recurses or writes past RenderLimits fails
// with an error instead of hanging or exhausting memory.
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "data/jinja/value.hpp"

namespace rp::jinja {

/// Any failure to parse or render: "<template name>:<line>: <what>".
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The template called raise_exception(message); what() is "<name>:<line>: <message>".
struct RaisedException : TemplateError {
  RaisedException(const std::string& where, std::string message)
      : TemplateError(where + message), message(std::move(message)) {}
  std::string message;  ///< the template's own text
};

struct RenderLimits {
  size_t max_output_bytes = size_t(64) << 20;  ///< rendered text
  uint64_t max_steps = 2'000'000;  ///< statements run + loop iterations + calls (a long chat needs ~100k)
  int max_call_depth = 64;         ///< nested macro calls
  /// Bytes of strings, lists and dicts the template builds, all of them added up (operators,
  /// filters, calls, literals, captured blocks; text the template outputs counts under
  /// max_output_bytes, held by every open capture together): a template that keeps building,
  /// each value within the size limit of one value (64 MiB), fails instead of exhausting memory.
  uint64_t max_built_bytes = uint64_t(1) << 30;
};

struct RenderOptions {
  RenderLimits limits;
  /// What strftime_now() formats (local time); unset: the current time.
  std::optional<std::tm> now;
};

class Template {
 public:
  /// Parses `source`; `name` is the file name errors start with. Throws TemplateError for a
  /// syntax error or an unsupported statement.
  explicit Template(const std::string& source, std::string name = "chat_template.jinja");

  /// Renders with `variables` as the template's globals (messages, tools,
  /// add_generation_prompt, bos_token, ...), next to the builtins range, namespace, dict,
  /// raise_exception and strftime_now. Throws TemplateError (RaisedException for
  /// raise_exception) naming the line.
  std::string render(const Dict& variables, const RenderOptions& options = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const void> body_;  // the parsed Body (ast.hpp), shared by copies
};

}  // namespace rp::jinja
