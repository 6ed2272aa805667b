// Shared by the `roundpipe` subcommands that run from their CLI11 callback.
#pragma once
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace rp {

/// A flag's value is out of its range (a usage error: exit code 2, as CLI11's own).
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// A CLI11 check with a short message ("expected a finite number > 0, got -1") instead of
/// CLI::PositiveNumber's range of 300 digits; `zero_ok` also accepts 0.
inline CLI::Validator finite_number_check(bool zero_ok, const std::string& unit = "") {
  const std::string what = fmt::format("a finite number{} {} 0", unit, zero_ok ? ">=" : ">");
  return CLI::Validator(
      [what, zero_ok](std::string& text) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool ok = used == text.size() && std::isfinite(v) && (zero_ok ? v >= 0 : v > 0);
        return ok ? std::string() : fmt::format("expected {}, got {}", what, text);
      },
      zero_ok ? "NONNEGATIVE" : "POSITIVE");
}

/// A subcommand callback running `body`: an exception it throws becomes one line
/// "roundpipe: error: <what>" on stderr (after what was printed so far on stdout) and exit
/// code 1 (CLI::RuntimeError, which main returns); a UsageError exits 2.
inline std::function<void()> reporting_errors(std::function<void()> body) {
  return [body = std::move(body)] {
    try {
      body();
    } catch (const UsageError& e) {
      std::fflush(stdout);
      fmt::print(stderr, "roundpipe: error: {}\n", e.what());
      throw CLI::RuntimeError(2);
    } catch (const std::exception& e) {
      std::fflush(stdout);
      fmt::print(stderr, "roundpipe: error: {}\n", e.what());
      throw CLI::RuntimeError(1);
    }
  };
}

}  // namespace rp
