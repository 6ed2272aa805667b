// What an error message may quote of user input (a key, a value, a token, a line of data):
// one line of printable text (control characters and bytes that are not UTF-8 escaped as
// \xNN), and bounded, so a corrupted file's megabyte key or value never floods a terminal
// or a log.
//   excerpt(s)   one piece of input: at most kExcerptBytes of it, then "... (<n> bytes)"
//   one_line(s) a whole message: at most kMessageBytes, its middle elided when longer
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "base/utf8.hpp"

namespace rp {

/// The most bytes of user input one quote in an error message keeps.
inline constexpr size_t kExcerptBytes = 80;
/// The most bytes one_line keeps of a whole message.
inline constexpr size_t kMessageBytes = 1000;

namespace detail {
/// The longest prefix of s of at most n bytes that does not end inside a UTF-8 character (at
/// most 3 bytes shorter: a run of continuation bytes longer than that is no character).
inline size_t utf8_prefix(std::string_view s, size_t n) {
  if (n >= s.size()) return s.size();
  const size_t at = n;
  while (n > 0 && at - n < 3 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80 ? at : n;
}
/// s with what a terminal would not show as text escaped as \xNN, byte by byte: control
/// characters (C0, DEL and C1's U+0080-U+009F) and bytes that are not valid UTF-8 (a binary
/// file's, or a Latin-1 name's); valid UTF-8 text stays as it is.
inline std::string escaped(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_char_length(s.substr(i));
    const bool c1 = n == 2 && ch == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0;
    if (n == 0 || ch < 0x20 || ch == 0x7f || c1) {
      for (size_t k = 0; k < std::max<size_t>(n, 1); ++k)
        o += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i + k]));
      i += std::max<size_t>(n, 1);
    } else {
      o.append(s.substr(i, n));
      i += n;
    }
  }
  return o;
}
}  // namespace detail

/// One piece of user input as an error message quotes it: control characters and bytes that
/// are not UTF-8 escaped as \xNN (one line, printable); when longer than `max_bytes`, its first `max_bytes`
/// bytes (cut at a UTF-8 character boundary) followed by "... (<n> bytes)" with its whole length.
inline std::string excerpt(std::string_view s, size_t max_bytes = kExcerptBytes) {
  const size_t keep = detail::utf8_prefix(s, max_bytes);
  std::string o = detail::escaped(s.substr(0, keep));
  if (keep < s.size()) o += fmt::format("... ({} bytes)", s.size());
  return o;
}

/// A whole error message on one line: control characters and bytes that are not UTF-8 escaped
/// as \xNN; when longer than
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
