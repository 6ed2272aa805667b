#include "base/json_text.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "base/error_text.hpp"
#include "base/input_file.hpp"

namespace rp {

using nlohmann::json;

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::string json_error_reason(const json::exception& e) {
  std::string w = e.what();
  if (const size_t p = w.find("] "); p != std::string::npos) w = w.substr(p + 2);
  if (w.rfind("parse error", 0) == 0)
    if (const size_t p = w.find(": "); p != std::string::npos) w = w.substr(p + 2);
  return w;
}

namespace {

/// The 1-based line and column of the 0-based offset `pos` in `text`.
std::pair<size_t, size_t> line_column(const std::string& text, size_t pos) {
  pos = std::min(pos, text.size());
  const size_t line = 1 + size_t(std::count(text.begin(), text.begin() + long(pos), '\n'));
  const size_t nl = pos == 0 ? std::string::npos : text.rfind('\n', pos - 1);
  return {line, pos - (nl == std::string::npos ? 0 : nl + 1) + 1};
}

/// A key given twice in one object: its dotted path and which key of the text it is (0-based,
/// in reading order).
// Nesting a parse accepts: no file we read nests past a few levels, and printing a value nested
// tens of thousands deep (an error message quoting it) overflowed the stack.
constexpr size_t kMaxJsonDepth = kMaxJsonNesting;
struct TooDeep {};

struct DuplicateKey {
  std::string key;
  size_t index = 0;
};

/// The offsets of the first `count` keys in the JSON text `text`, which is valid up to them: a
/// string followed by ':' (fewer when the text has fewer).
std::vector<size_t> key_offsets(const std::string& text, size_t count) {
  std::vector<size_t> out;
  for (size_t i = 0; i < text.size() && out.size() < count; ++i) {
    if (text[i] != '"') continue;
    const size_t from = i;
    for (++i; i < text.size() && text[i] != '"'; ++i)
      if (text[i] == '\\') ++i;
    const size_t next = text.find_first_not_of(" \t\r\n", i + 1);
    if (next != std::string::npos && text[next] == ':') out.push_back(from);
  }
  return out;
}

/// The offset of the `index`-th key (0-based) in `text`; npos when there are fewer keys.
size_t offset_of_key(const std::string& text, size_t index) {
  const std::vector<size_t> at = key_offsets(text, index + 1);
  return at.size() > index ? at[index] : std::string::npos;
}

/// The line of each key whose pointer `pointers` holds, in reading order.
void fill_key_lines(const std::string& text, const std::vector<std::string>& pointers, JsonKeyLines& out) {
  const std::vector<size_t> at = key_offsets(text, pointers.size());
  size_t line = 1, from = 0;
  for (size_t k = 0; k < at.size(); ++k) {
    line += size_t(std::count(text.begin() + long(from), text.begin() + long(at[k]), '\n'));
    from = at[k];
    out.emplace(pointers[k], line);  // a key given twice keeps its first line
  }
}

/// The offset of the first occurrence of the token `value` in `text` outside a string that
/// stands as a value (first in the text, or after ':', '[' or ','); npos when there is none.
size_t offset_of_value(const std::string& text, const std::string& value) {
  bool in_string = false;
  size_t before = std::string::npos;  // the last character outside strings that is not whitespace
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false, before = i;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (text.compare(i, value.size(), value) == 0 &&
        (before == std::string::npos || text[before] == ':' || text[before] == '[' || text[before] == ','))
      return i;
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') before = i;
  }
  return std::string::npos;
}

/// The dotted key path of the value being read: each open object's key, each open list's index
/// ("data[1].weight", as the spec's other errors name list items).
std::string joined(const std::string& prefix, const std::vector<std::string>& keys,
                   const std::vector<long>& element) {
  std::string key = prefix;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i < element.size() && element[i] >= 0) {
      key += fmt::format("[{}]", element[i]);
    } else if (!keys[i].empty()) {
      key += (key.empty() ? "" : ".") + keys[i];
    }
  }
  return key;
}

/// What parsing has read so far, from the parser's events: the open objects and lists, the key
/// being read in each, the keys given twice (opt.unique_keys) and each key's JSON pointer
/// (opt.key_lines).
struct ParseTrack {
  const JsonTextOptions& opt;
  std::vector<std::string> keys;            // per open object or list: the key being read ("" in a list)
  std::vector<std::set<std::string>> seen;  // per open object or list: the keys read so far
  std::vector<long> element;                // per open object or list: the list's element read (-1: object)
  std::vector<std::string> pointers;        // with opt.key_lines: each key's JSON pointer, in reading order
  size_t key_count = 0;

  explicit ParseTrack(const JsonTextOptions& o) : opt(o) {}

  void element_read() {
    if (!element.empty() && element.back() >= 0) ++element.back();
  }
  std::string pointer_of_key() const {
    std::string p;
    for (size_t i = 0; i + 1 < keys.size(); ++i)
      p = json_key_pointer(p, element[i] >= 0 ? std::to_string(element[i]) : keys[i]);
    return json_key_pointer(p, keys.back());
  }
  void open(bool list) {
    if (keys.size() >= kMaxJsonDepth) throw TooDeep{};
    keys.emplace_back();
    seen.emplace_back();
    element.push_back(list ? 0 : -1);
  }
  void close() {
    if (keys.empty()) return;
    keys.pop_back();
    seen.pop_back();
    element.pop_back();
    element_read();
  }
  void key(const std::string& k) {
    if (keys.empty()) return;
    keys.back() = k;
    if (opt.unique_keys && !seen.back().insert(keys.back()).second)
      throw DuplicateKey{joined(opt.key_prefix, keys, element), key_count};
    if (opt.key_lines) pointers.push_back(pointer_of_key());
    ++key_count;
  }
};

/// nlohmann's DOM builder with ParseTrack beside it, as a SAX handler: the same value as
/// json::parse, in time linear in the text (3.11.2's callback parser scans the enclosing list at
/// every object's end, which made a trace of 300,000 events take most of a minute).
class TrackingParser {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  TrackingParser(json& out, ParseTrack& t) : dom_(out, true), t_(t) {}
  bool null() { return t_.element_read(), dom_.null(); }
  bool boolean(bool v) { return t_.element_read(), dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return t_.element_read(), dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return t_.element_read(), dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) {
    return t_.element_read(), dom_.number_float(v, s);
  }
  bool string(string_t& v) { return t_.element_read(), dom_.string(v); }
  bool binary(binary_t& v) { return t_.element_read(), dom_.binary(v); }
  bool start_object(std::size_t n) { return t_.open(false), dom_.start_object(n); }
  bool key(string_t& k) { return t_.key(k), dom_.key(k); }
  bool end_object() { return t_.close(), dom_.end_object(); }
  bool start_array(std::size_t n) { return t_.open(true), dom_.start_array(n); }
  bool end_array() { return t_.close(), dom_.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t at, const std::string& token, const Exception& e) {
    return dom_.parse_error(at, token, e);
  }

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  ParseTrack& t_;
};

/// `text` with every number outside strings written 0: what the JSON library's syntax check
/// (json::accept) takes whatever the numbers' range (it refuses 1e400 as a syntax error).
std::string with_numbers_zeroed(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      // (no NUL reaches here: parse_text refuses it first, and strchr would match one)
      while (i + 1 < text.size() && std::strchr("0123456789.eE+-", text[i + 1]) != nullptr) ++i;
      out += '0';
    } else {
      out += c;
      in_string = c == '"';
    }
  }
  return out;
}

/// parse_json_text and parse_json_value: nullopt for a syntax error when `syntax_is_not_json`.
std::optional<json> parse_text(const std::string& text, const std::string& path, const JsonTextOptions& opt,
                               bool syntax_is_not_json) {
  ParseTrack t(opt);
  const auto place = [&](size_t line) {
    return opt.lines && line > 0 ? fmt::format("{}:{}", path, line) : path;
  };
  // nlohmann's lexer takes a NUL byte for the end of the input, so a text "{...}\0<anything>" would
  // parse as its first part; no JSON text holds a raw NUL (in a string it is written \u0000)
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    if (syntax_is_not_json) return std::nullopt;
    const auto [line, col] = line_column(text, nul);
    const std::string what = kJsonNulReason;
    if (!opt.lines) throw std::invalid_argument(fmt::format("{}: {}", path, what));
    throw std::invalid_argument(fmt::format("{}:{}:{}: {}", path, line, col, what));
  }
  // a text that is not JSON at all is plain text, whatever a part of it would be refused for
  // ("[1e400" is the string, not a list whose number is too large)
  if (syntax_is_not_json && !json::accept(with_numbers_zeroed(text))) return std::nullopt;
  try {
    json j;
    TrackingParser sax(j, t);
    json::sax_parse(text, &sax);
    if (opt.key_lines) fill_key_lines(text, t.pointers, *opt.key_lines);
    return j;
  } catch (const std::bad_alloc&) {  // its own text names nothing
    throw std::invalid_argument(
        fmt::format("{}: the JSON text ({} bytes) does not fit in memory once parsed", path, text.size()));
  } catch (const TooDeep&) {
    throw std::invalid_argument(
        fmt::format("{}: invalid JSON: objects and lists nested deeper than {} levels", path, kMaxJsonDepth));
  } catch (const DuplicateKey& d) {
    const size_t at = offset_of_key(text, d.index);
    throw std::invalid_argument(fmt::format("{}: key '{}' given twice",
                                            place(at == std::string::npos ? 0 : line_column(text, at).first),
                                            excerpt(d.key)));
  } catch (const json::parse_error& e) {
    if (syntax_is_not_json) return std::nullopt;
    const auto [line, col] = line_column(text, e.byte ? e.byte - 1 : 0);
    if (!opt.lines)
      throw std::invalid_argument(fmt::format("{}: invalid JSON: {}", path, json_error_reason(e)));
    throw std::invalid_argument(
        fmt::format("{}:{}:{}: invalid JSON: {}", path, line, col, json_error_reason(e)));
  } catch (const json::out_of_range& e) {
    // the number is the one just read: nlohmann names it ("number overflow parsing '1e400'")
    const std::string what = e.what();
    const auto from = what.find("parsing '"), to = what.rfind('\'');
    const std::string number =
        from == std::string::npos || to <= from + 9 ? std::string() : what.substr(from + 9, to - from - 9);
    // its line: parsing stopped at the first such number, the first occurrence outside a string
    // that stands as a value (first in the text, or after ':', '[' or ',')
    const size_t at = number.empty() ? std::string::npos : offset_of_value(text, number);
    const size_t line = at == std::string::npos ? 0 : line_column(text, at).first;
    if (number.empty())
      throw std::invalid_argument(fmt::format("{}: invalid JSON: {}", place(line), json_error_reason(e)));
    throw std::invalid_argument(
        number_out_of_range_text(place(line), joined(opt.key_prefix, t.keys, t.element), number));
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("{}: invalid JSON: {}", path, json_error_reason(e)));
  }
}

}  // namespace

std::string json_key_pointer(const std::string& pointer, const std::string& key) {
  std::string out = pointer + "/";
  for (const char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

json parse_json_text(const std::string& text, const std::string& path, const JsonTextOptions& opt) {
  return *parse_text(text, path, opt, false);
}

std::optional<json> parse_json_value(const std::string& text, const std::string& place,
                                     const JsonTextOptions& opt) {
  return parse_text(text, place, opt, true);
}

std::string number_out_of_range_text(const std::string& place, const std::string& key,
                                     const std::string& number) {
  return fmt::format("{}: {}expected a number within a double's range (about 1.8e308), got {}", place,
                     key.empty() ? std::string() : fmt::format("key '{}': ", key), excerpt(number));
}

std::string read_json_file(const std::string& path) { return read_input_file(path, "a JSON file"); }

}  // namespace rp
