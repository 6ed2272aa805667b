// The error every reader and writer of this folder throws for a bad file or folder.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "base/error_text.hpp"  // one_line

namespace rp {

/// Throws std::runtime_error("<where>: <what>"), made one line (base/error_text.hpp, one_line).
/// `where` names the file, tensor or key; `what` says what was found and what was expected.
[[noreturn]] inline void format_fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(one_line(fmt::format("{}: {}", where, what)));
}

}  // namespace rp
