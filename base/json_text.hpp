// Parsing a JSON file's text with errors that name the file: a syntax error its line and column,
// a number beyond a double's range (1e400, which nlohmann::json refuses apart from syntax errors)
// the key path it was read under and its line. Shared by the spec, config.json and tokenizer
// file readers.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rp {

/// Where the keys of a JSON text stand: the JSON pointer of each key ("/layers/3/forward/m") ->
/// its 1-based line.
using JsonKeyLines = std::map<std::string, size_t>;

/// The JSON pointer of `key` in the object at `pointer` ("/layers/3" + "m" -> "/layers/3/m"),
/// '~' and '/' escaped as RFC 6901 says.
std::string json_key_pointer(const std::string& pointer, const std::string& key);

/// How parse_json_text reads and names what it refuses.
struct JsonTextOptions {
  /// A key given twice in one object is refused ("<path>:<line>: key '<a.b>' given twice")
  /// instead of the last one winning.
  bool unique_keys = false;
  /// Put before the key paths the errors name ("lora" for the object a --set lora={...} gave).
  std::string key_prefix;
  /// Errors name the line (and column) in the text; false for a one-line value such as a flag's.
  bool lines = true;
  /// When set, filled with the line of every key of a text that parses (for errors about a
  /// value found valid JSON: "<path>:<line>: key ...").
  JsonKeyLines* key_lines = nullptr;
};

/// `text`, the contents of the file `path`, as JSON. Throws std::invalid_argument with one line:
/// "<path>:<line>:<column>: invalid JSON: <reason>" for a syntax error, "<path>:<line>: key
/// '<a.b>': expected a number within a double's range (about 1.8e308), got <number>" for a number
/// too large (the key left out where the number is not under one).
/// With opt.unique_keys a key given twice in one object is "<path>:<line>: key '<a.b>' given twice".
/// Objects and lists nested deeper than 512 levels are "<path>: invalid JSON: ... nested deeper than
/// 512 levels".
nlohmann::json parse_json_text(const std::string& text, const std::string& path,
                               const JsonTextOptions& opt = {});

/// The same for a value that may also be plain text (a --set VALUE): nullopt when `text` is not
/// JSON; a number beyond a double's range or a duplicate key (opt.unique_keys) throws
/// std::invalid_argument naming `place` and the key path.
std::optional<nlohmann::json> parse_json_value(const std::string& text, const std::string& place,
                                               const JsonTextOptions& opt);

/// The deepest nesting of objects and lists in `text` (brackets outside strings; 0 for a scalar),
/// counted without parsing, for readers that parse with the JSON library directly (records
/// keep their key order there) and must refuse what parse_json_text refuses before a recursive
/// copy or print of the value overflows the stack.
size_t json_nesting_depth(std::string_view text);
/// Why a JSON text with a raw NUL byte is refused, for every reader's message (nlohmann's lexer
/// takes a NUL for the end of the input and would drop what follows unseen).
inline constexpr const char* kJsonNulReason =
    "invalid JSON: a NUL byte (JSON text has none; in a string it is written \\u0000)";

/// The most nesting any JSON input may have (parse_json_text refuses deeper texts).
inline constexpr size_t kMaxJsonNesting = 512;

/// The JSON library's message without its "[json.exception.parse_error.101] parse error at line
/// L, column C: " prefix, for an error that names the place itself: "syntax error while parsing
/// object key - unexpected end of input; expected string literal".
std::string json_error_reason(const nlohmann::json::exception& e);

/// The one line for a number JSON cannot hold as a double: "<place>: key '<key>': expected a number
/// within a double's range (about 1.8e308), got <number>" (no key part when `key` is empty).
std::string number_out_of_range_text(const std::string& place, const std::string& key,
                                     const std::string& number);

/// The text of the JSON file `path`: read_input_file(path, "a JSON file") (base/input_file.hpp), a
/// folder ("<path>: is a folder, expected a JSON file"), a device, a socket and a named pipe that no
/// program writes to refused with one line naming it; a pipe with a writer is read as it sends.
/// Throws std::invalid_argument ("<path>: cannot open (<reason>)" among them).
std::string read_json_file(const std::string& path);

}  // namespace rp
