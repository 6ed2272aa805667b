#include "data/normalizer.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include <utf8proc.h>

namespace rp {
namespace {

/// NFC of a valid UTF-8 string (utf8proc_map with COMPOSE | STABLE, as utf8proc_NFC).
std::string nfc_valid(std::string_view s) {
  utf8proc_uint8_t* res = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &res,
                   utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // cannot happen for valid input; keep the text
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> own(res, &std::free);
  return std::string(reinterpret_cast<const char*>(res), size_t(n));
}

/// Code point `cp` begins a new piece: nothing before it composes with it or reorders past it.
bool starts_piece(utf8proc_int32_t cp) {
  if (cp < 0x80) return true;
  if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return false;  // Hangul V, T jamo
  return utf8proc_get_property(cp)->combining_class == 0;
}

}  // namespace

bool nfc_normalize(std::string_view in, std::string& out, std::vector<NormalizedRun>& runs) {
  if (std::all_of(in.begin(), in.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return false;
  // Cut `in` into pieces: valid stretches split before starters, and single invalid bytes.
  struct Cut {
    size_t begin, end;
    bool valid;
  };
  std::vector<Cut> cuts;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(in.data());
  size_t i = 0;
  while (i < in.size()) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t len = utf8proc_iterate(p + i, utf8proc_ssize_t(in.size() - i), &cp);
    if (len < 1) {
      cuts.push_back({i, i + 1, false});
      ++i;
      continue;
    }
    if (cuts.empty() || !cuts.back().valid || starts_piece(cp)) cuts.push_back({i, i, true});
    i += size_t(len);
    cuts.back().end = i;
  }
  std::string norm;
  std::vector<NormalizedRun> r;
  bool changed = false;
  // valid stretches between invalid bytes, each normalised whole and piece by piece
  for (size_t a = 0; a < cuts.size();) {
    if (!cuts[a].valid) {
      r.push_back({norm.size(), cuts[a].begin, true});
      norm += in[cuts[a].begin];
      ++a;
      continue;
    }
    size_t b = a;
    while (b < cuts.size() && cuts[b].valid) ++b;
    const std::string_view stretch = in.substr(cuts[a].begin, cuts[b - 1].end - cuts[a].begin);
    const std::string whole = nfc_valid(stretch);
    if (whole == stretch) {
      r.push_back({norm.size(), cuts[a].begin, true});
      norm += whole;
      a = b;
      continue;
    }
    changed = true;
    std::string joined;
    std::vector<NormalizedRun> pieces;
    for (size_t c = a; c < b; ++c) {
      const std::string_view piece = in.substr(cuts[c].begin, cuts[c].end - cuts[c].begin);
      const std::string n = nfc_valid(piece);
      pieces.push_back({norm.size() + joined.size(), cuts[c].begin, n == piece});
      joined += n;
    }
    if (joined == whole) {
      r.insert(r.end(), pieces.begin(), pieces.end());
    } else {
      r.push_back({norm.size(), cuts[a].begin, false});
    }
    norm += whole;
    a = b;
  }
  if (!changed) return false;
  out = std::move(norm);
  runs = std::move(r);
  return true;
}

size_t original_offset(const std::vector<NormalizedRun>& runs, size_t pos) {
  auto it = std::upper_bound(runs.begin(), runs.end(), pos,
                             [](size_t p, const NormalizedRun& r) { return p < r.norm_begin; });
  if (it == runs.begin()) return pos;
  --it;
  return it->same ? it->orig_begin + (pos - it->norm_begin) : it->orig_begin;
}

}  // namespace rp
