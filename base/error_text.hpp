// What an error message may quote of user input (a key, a value, a token, a line of data):
// one line, and bounded, so a corrupted file's megabyte key or value never floods a terminal
// or a log.
//   excerpt(s)   one piece of input: at most kExcerptBytes of it, then "... (<n> bytes)"
//   one_line(s) a whole message: at most kMessageBytes, its middle elided when longer
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace rp {

/// The most bytes of user input one quote in an error message keeps.
inline constexpr size_t kExcerptBytes = 80;
/// The most bytes one_line keeps of a whole message.
inline constexpr size_t kMessageBytes = 1000;

namespace detail {
/// The longest prefix of s of at most n bytes that does not end inside a UTF-8 character.
inline size_t utf8_prefix(std::string_view s, size_t n) {
  if (n >= s.size()) return s.size();
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}
/// s with control characters escaped as \xNN.
inline std::string escaped(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f) o += fmt::format("\\x{:02x}", ch);
    else o.push_back(char(ch));
  }
  return o;
}
}  // namespace detail

/// One piece of user input as an error message quotes it: control characters escaped as
/// \xNN (one line); when longer than `max_bytes`, its first `max_bytes` bytes (cut at a
/// UTF-8 character boundary) followed by "... (<n> bytes)" with its whole length.
inline std::string excerpt(std::string_view s, size_t max_bytes = kExcerptBytes) {
  const size_t keep = detail::utf8_prefix(s, max_bytes);
  std::string o = detail::escaped(s.substr(0, keep));
  if (keep < s.size()) o += fmt::format("... ({} bytes)", s.size());
  return o;
}

/// A whole error message on one line: control characters escaped as \xNN; when longer than
/// kMessageBytes, its start and its end (what was expected) with "[... <n> bytes ...]" between.
inline std::string one_line(std::string_view s) {
  const std::string e = detail::escaped(s);
  if (e.size() <= kMessageBytes) return e;
  const std::string_view v(e);
  const size_t head = detail::utf8_prefix(v, kMessageBytes * 3 / 5);
  size_t tail = e.size() - kMessageBytes / 3;
  while (tail < e.size() && (static_cast<unsigned char>(e[tail]) & 0xC0) == 0x80) ++tail;
  return fmt::format("{}[... {} bytes ...]{}", v.substr(0, head), tail - head, v.substr(tail));
}

}  // namespace rp
