// Pre-tokenisation for byte-level BPE: cutting text into the "words" that BPE merges
// within. Mirrors the Hugging Face `tokenizers` pre-tokenizers Split, ByteLevel, Digits
// and Sequence. Used by Tokenizer; exposed for tests and tools.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace rp {

/// The GPT-2 regex ByteLevel(use_regex=true) splits with.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// Thrown by Regex::find_all when matching needs more work than its bound (a pattern that
/// backtracks catastrophically on this text). The tokenizer adds its file to the message, the
/// data set reader the data file and line.
struct RegexWorkExceeded : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A PCRE2 regex compiled once (UTF + Unicode properties, JIT when available).
class Regex {
 public:
  /// Compiles `pattern`; literal=true matches the string verbatim. Throws
  /// std::runtime_error with PCRE2's message and the error offset.
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  /// Appends to `out` the [begin, end) byte ranges of all non-overlapping, non-empty
  /// matches in `text`, scanning left to right. `text` must be valid UTF-8 (not checked).
  /// Throws std::runtime_error on a PCRE2 matching error (e.g. JIT stack exhausted).
  /// The work is bounded: each match runs under PCRE2's match and depth limits, raised from
  /// kFirstMatchLimit by 16x while a match hits them, and the limits tried on one call add
  /// up to at most kWorkBase + kWorkPerByte * text.size(); past that it throws
  /// RegexWorkExceeded (ordinary patterns spend under 20 steps per match; `(a+)+b|.` on a
  /// line of 'a' runs spends millions on each).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  static constexpr uint64_t kFirstMatchLimit = 64;
  static constexpr uint64_t kWorkBase = 200'000;
  static constexpr uint64_t kWorkPerByte = 256;

 private:
  void* code_;  // pcre2_code_8*
  std::string pattern_;
};

/// One pre-tokenised piece: a byte range of the text being encoded.
struct Piece {
  size_t off = 0, len = 0;
  bool prefix_space = false;  ///< ByteLevel(add_prefix_space): a ' ' goes before the bytes
};

/// How a Split step treats matches (HF SplitDelimiterBehavior).
enum class SplitBehavior : uint8_t { isolated, removed, merged_with_previous, merged_with_next, contiguous };

/// A pre-tokenizer pipeline: a list of split steps applied in order, each refining the
/// pieces produced by the previous one.
class PreTokenizer {
 public:
  /// Parses the `pre_tokenizer` object of tokenizer.json (Sequence, Split, ByteLevel,
  /// Digits). Throws std::runtime_error "<where>: unsupported pre_tokenizer ..." for other
  /// types, or when no ByteLevel step is present (the model would not be byte-level).
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);
  PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  /// Cuts `text` (byte offset `base` in the caller's string) into pieces appended to
  /// `out` with offsets relative to the caller's string. Invalid UTF-8 bytes each become
  /// a piece of their own; valid runs between them go through the regex steps.
  void split(std::string_view text, size_t base, std::vector<Piece>& out) const;

 private:
  struct Step;
  std::vector<Step> steps_;
};

/// The GPT-2 byte -> printable-unicode table: the UTF-8 text of the char for byte b.
const std::string& byte_to_unicode(uint8_t b);
/// Inverse of byte_to_unicode on code points: the byte, or -1 when `cp` is not in the table.
int unicode_to_byte(uint32_t cp);

}  // namespace rp
