// Helpers for one-line error messages about file contents.
#pragma once
#include <string>

#include <fmt/format.h>

namespace rp {

/// `s` with control characters escaped as \xNN, so an error message quoting file contents
/// (a tensor name, a JSON value) stays on one line.
inline std::string one_line(const std::string& s) {
  std::string o;
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f)
      o += fmt::format("\\x{:02x}", ch);
    else
      o.push_back(char(ch));
  }
  return o;
}

}  // namespace rp
