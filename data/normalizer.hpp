// Unicode normalisation form C for the tokenizer's `normalizer` (tokenizer.json "NFC"),
// through utf8proc (Unicode 15 in Debian 12's libutf8proc 2.8), with a map from offsets in
// the normalised text back to the input (the chat templates' loss masks need input offsets).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

/// A stretch of the normalised text and the input bytes it came from.
struct NormalizedRun {
  size_t norm_begin = 0, orig_begin = 0;
  bool same = true;  ///< the run is unchanged: offsets inside it map one to one
};

/// NFC of `in`. Returns false (and leaves `out`, `runs` untouched) when `in` is already in
/// NFC, the usual case, which is checked without allocating for ASCII. Invalid UTF-8 bytes
/// are kept as they are (utf8proc normalises the valid stretches between them); HF
/// tokenizers only ever sees valid UTF-8. `runs` (sorted by norm_begin) cover `out`: the
/// text is normalised in pieces cut before code points that start a new composition
/// (canonical combining class 0, not a Hangul vowel or final jamo); the pieces'
/// concatenation is checked against the NFC of the whole, and when they differ (a starter
/// that composes with the one before it, e.g. some Indic vowel signs) one run covers it all.
bool nfc_normalize(std::string_view in, std::string& out, std::vector<NormalizedRun>& runs);

/// The input offset of normalised offset `pos` (a run's start for a changed run).
size_t original_offset(const std::vector<NormalizedRun>& runs, size_t pos);

}  // namespace rp
