// Python's str methods on UTF-8 strings (Unicode case mapping through utf8proc; whitespace is
// ASCII whitespace). Internal to data/jinja.
#pragma once
#include <string>
#include <vector>

#include "data/jinja/value.hpp"

namespace rp::jinja {

std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);
/// str.lower() / str.upper() (simple case mapping per code point).
std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
/// str.title(): a letter after a non-letter is upper-cased, every other letter lower-cased.
std::string py_title(const std::string& s);
/// str.capitalize(): first character upper-cased, the rest lower-cased.
std::string py_capitalize(const std::string& s);
/// str.strip / lstrip / rstrip: `chars` empty strips whitespace, else the code points it holds.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
/// str.split(sep, maxsplit): sep none/undefined splits on whitespace runs.
std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit);
/// str.replace(old, new, count) (count < 0: all).
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
/// Python's float(s) of a number literal's digits: "1e999" is inf and "1e-999" 0.0, as Python
/// reads them (std::stod throws there). `s` must be digits as the lexer reads a number.
double py_float(const std::string& s);
/// The int64 of the digits `s` (an index: "x.0", "a.b.3"), or INT64_MAX when they are past it,
/// an index no list reaches, so the item is undefined as Python's would be.
int64_t index_of_digits(const std::string& s);

/// A string method called from a template: `s.name(args)`. Throws std::invalid_argument for
/// bad arguments.
Value call_string_method(const std::string& s, const std::string& name, const Args& args);

}  // namespace rp::jinja
