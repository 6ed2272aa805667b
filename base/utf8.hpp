// UTF-8 validation by RFC 3629's rules (section 4's byte ranges): a character is 1-4 bytes, never
// an overlong form, never a surrogate (U+D800-U+DFFF), never above U+10FFFF. One validator for the
// whole runtime: the tokenizer's pre-split, the data readers' file sniffing, the CLI's refusals
// and the error-text escaping all agree on what is text.
#pragma once
#include <cstddef>
#include <string_view>

namespace rp {

/// The length in bytes (1-4) of the valid UTF-8 character at the start of `s`; 0 when `s` is
/// empty or does not start with one (a stray continuation byte, an overlong form, a surrogate,
/// a code point above U+10FFFF, or a character cut off by the end of `s`).
inline size_t utf8_char_length(std::string_view s) {
  if (s.empty()) return 0;
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  // RFC 3629 section 4: the lead byte fixes the length and the range of the second byte, which is
  // narrower than 80..BF after E0 (no overlong), ED (no surrogate), F0 (no overlong), F4 (<= 10FFFF).
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  if (s.size() < n || at(1) < lo || at(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if ((at(i) & 0xC0) != 0x80) return 0;
  return n;
}

/// The length in bytes of the longest prefix of `s` that is valid UTF-8 (s.size() when all of it
/// is); ASCII runs cost one comparison a byte.
inline size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_char_length(s.substr(i));
    if (n == 0) return i;
    i += n;
  }
  return s.size();
}

}  // namespace rp
