// The one UTF-8 validator (base/utf8.hpp) against an oracle built another way: a byte sequence is
// one valid character exactly when a naive decoder reads a code point from it that is no
// surrogate, at most U+10FFFF, and whose shortest encoding is those same bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include "base/error_text.hpp"
#include "base/utf8.hpp"

namespace rp {
namespace {

std::string encode(uint32_t cp) {  // the shortest encoding of cp
  std::string o;
  if (cp < 0x80) {
    o += char(cp);
  } else if (cp < 0x800) {
    o += char(0xC0 | (cp >> 6)), o += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    o += char(0xE0 | (cp >> 12)), o += char(0x80 | ((cp >> 6) & 0x3F)), o += char(0x80 | (cp & 0x3F));
  } else {
    o += char(0xF0 | (cp >> 18)), o += char(0x80 | ((cp >> 12) & 0x3F));
    o += char(0x80 | ((cp >> 6) & 0x3F)), o += char(0x80 | (cp & 0x3F));
  }
  return o;
}

// Is all of s exactly one character? Decode by the lead byte's bit pattern alone, then demand the
// canonical re-encoding and the code point rules.
bool one_character(const std::string& s) {
  const auto b = [&](size_t i) { return uint32_t(static_cast<unsigned char>(s[i])); };
  size_t n;
  uint32_t cp;
  if (b(0) < 0x80) n = 1, cp = b(0);
  else if ((b(0) >> 5) == 0x6) n = 2, cp = b(0) & 0x1F;
  else if ((b(0) >> 4) == 0xE) n = 3, cp = b(0) & 0x0F;
  else if ((b(0) >> 3) == 0x1E) n = 4, cp = b(0) & 0x07;
  else return false;
  if (s.size() != n) return false;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) >> 6) != 0x2) return false;
    cp = cp << 6 | (b(i) & 0x3F);
  }
  return cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) && encode(cp) == s;
}

// The length of the character s starts with by the oracle (the lead byte's pattern fixes at most
// one candidate length); 0 when none.
size_t first_character(const std::string& s) {
  for (size_t k = 1; k <= 4 && k <= s.size(); ++k)
    if (one_character(s.substr(0, k))) return k;
  return 0;
}

// Is s valid text by the oracle: a run of whole characters?
bool valid_text(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t k = first_character(s.substr(i));
    if (k == 0) return false;
    i += k;
  }
  return true;
}

TEST(Utf8, EveryOneTwoAndThreeByteSequenceAgreesWithTheOracle) {
  for (uint32_t v = 0; v < (1u << 24); ++v) {
    for (size_t n = 1; n <= 3; ++n) {
      if (n < 3 && v >= (1u << (8 * n))) continue;
      std::string s;
      for (size_t i = 0; i < n; ++i) s += char(v >> (8 * (n - 1 - i)));
      ASSERT_EQ(utf8_char_length(s), first_character(s)) << std::hex << v << " n=" << n;
      ASSERT_EQ(valid_utf8_prefix(s) == n, valid_text(s)) << std::hex << v << " n=" << n;
    }
  }
}

TEST(Utf8, EveryCodePointIsValidExactlyWhenItIsNoSurrogate) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const std::string s = encode(cp);
    const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    ASSERT_EQ(utf8_char_length(s), surrogate ? 0 : s.size()) << std::hex << cp;
  }
  EXPECT_EQ(utf8_char_length("\xF4\x90\x80\x80"), 0u);  // U+110000: past the last code point
}

TEST(Utf8, RandomFourByteSequencesAgreeWithTheOracle) {
  std::mt19937 rng(7);
  for (int k = 0; k < 2000000; ++k) {
    const uint32_t v = rng() | 0x80000000u;  // lead byte >= 0x80: not an ASCII run
    const std::string s{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
    if (one_character(s)) ASSERT_EQ(utf8_char_length(s), 4u) << std::hex << v;
    else ASSERT_NE(utf8_char_length(s), 4u) << std::hex << v;
  }
}

TEST(Utf8, ThePrefixStopsAtTheFirstBadByteAndAtACutCharacter) {
  EXPECT_EQ(valid_utf8_prefix(""), 0u);
  EXPECT_EQ(utf8_char_length(""), 0u);
  EXPECT_EQ(valid_utf8_prefix("abc"), 3u);
  EXPECT_EQ(valid_utf8_prefix("a\xc3\xa9z"), 4u);
  EXPECT_EQ(valid_utf8_prefix("a\xc0\xafz"), 1u);         // overlong '/'
  EXPECT_EQ(valid_utf8_prefix("a\xed\xa0\x80"), 1u);      // a surrogate
  EXPECT_EQ(valid_utf8_prefix("\xf0\x9f\x9a\x80!"), 5u);  // a rocket
  EXPECT_EQ(valid_utf8_prefix("ab\xf0\x9f\x9a"), 2u);     // a rocket cut short
  EXPECT_EQ(valid_utf8_prefix("ab\x80"), 2u);             // a stray continuation byte
}

TEST(ErrorText, BytesThatAreNotTextAreEscapedAndTextStays) {
  EXPECT_EQ(excerpt("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(excerpt("a\xc0\xafz"), "a\\xc0\\xafz");
  EXPECT_EQ(excerpt("a\xed\xa0\x80"), "a\\xed\\xa0\\x80");
  EXPECT_EQ(excerpt("tab\there"), "tab\\x09here");
  EXPECT_EQ(excerpt("c1\xc2\x85"), "c1\\xc2\\x85");  // U+0085 (NEL) is a C1 control character
  const std::string long_text(200, 'x');
  EXPECT_EQ(excerpt(long_text), std::string(kExcerptBytes, 'x') + "... (200 bytes)");
}

}  // namespace
}  // namespace rp
