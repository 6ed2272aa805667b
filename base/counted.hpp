// Counts in messages: "1 sequence", "3 sequences", never "1 sequences" or "sequence(s)".
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

}  // namespace rp
