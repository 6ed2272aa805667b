// Counts in messages: "1 sequence", "3 sequences", never "1 sequences" or "sequence(s)"; and byte
// sizes in the unit that shows them ("512 KiB", "3.25 GiB", never "0.00 GiB").
#pragma once
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace rp {

/// `n` and the noun, in the singular when n is 1 and else in the plural: `plural`, or the
/// singular with an "s" ("sequence" -> "sequences", "pass" needs "passes" given).
template <class N>
std::string counted(N n, std::string_view singular, std::string_view plural = {}) {
  if (n == N(1)) return fmt::format("{} {}", n, singular);
  return plural.empty() ? fmt::format("{} {}s", n, singular) : fmt::format("{} {}", n, plural);
}

/// `bytes` in the largest binary unit (B, KiB, MiB, GiB, TiB) in which it is at least 1, with
/// three significant digits past B ("17 B", "4.00 KiB", "12.5 MiB", "1.50 GiB", "320 GiB").
inline std::string byte_text(double bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (!(bytes >= 1024)) return fmt::format("{:.0f} B", bytes > 0 ? bytes : 0.0);
  int u = 0;
  while (u < 4 && bytes >= 1024) bytes /= 1024, ++u;
  const int decimals = bytes >= 100 ? 0 : bytes >= 10 ? 1 : 2;
  return fmt::format("{:.{}f} {}", bytes, decimals, units[u]);
}

}  // namespace rp
