// Shared by the `roundpipe` subcommands that run from their CLI11 callback.
#pragma once
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "base/error_text.hpp"
#include "base/output_folder.hpp"

namespace rp {

/// A flag's value is out of its range (a usage error: exit code 2, as CLI11's own).
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// `text` read whole as a decimal number into `v` ("16", "-1.5", "2e9"; false when it does not
/// parse or has anything after the number). std::stod alone also reads hexadecimal ("0x10" as
/// 16), "inf" and "nan", which integer flags refuse: so do the real ones.
/// Whether `text` holds only what a decimal number is written with (digits, sign, point,
/// exponent): std::stod would also read "0x10", "inf" and "nan".
inline bool decimal_characters(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789+-.eE") == std::string_view::npos;
}

inline bool whole_number(const std::string& text, double& v) {
  if (!decimal_characters(text)) return false;
  size_t used = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size();
}

/// A CLI11 check with a short message ("expected a finite number > 0, got -1") instead of
/// CLI::PositiveNumber's range of 300 digits; `zero_ok` also accepts 0.
inline CLI::Validator finite_number_check(bool zero_ok, const std::string& unit = "") {
  const std::string what = fmt::format("a finite number{} {} 0", unit, zero_ok ? ">=" : ">");
  return CLI::Validator(
      [what, zero_ok](std::string& text) -> std::string {
        double v = 0;
        const bool whole = whole_number(text, v);
        const bool ok = whole && std::isfinite(v) && (zero_ok ? v >= 0 : v > 0);
        return ok ? std::string() : fmt::format("expected {}, got {}", what, text);
      },
      zero_ok ? "NONNEGATIVE" : "POSITIVE");
}

/// A CLI11 check of a real option in [lo, hi] ("expected a number from 0 to 100, got nan"):
/// CLI::Range lets a NaN through (no comparison with it is true) and prints its bounds in six
/// decimals.
inline CLI::Validator number_range_check(double lo, double hi) {
  const std::string what = fmt::format("a number from {} to {}", lo, hi);
  return CLI::Validator(
      [what, lo, hi](std::string& text) -> std::string {
        double v = 0;
        const bool whole = whole_number(text, v);
        const bool ok = whole && v >= lo && v <= hi;  // false for a NaN
        return ok ? std::string() : fmt::format("expected {}, got {}", what, text);
      },
      fmt::format("FLOAT in [{} - {}]", lo, hi));
}

/// A CLI11 check of a real option that is 0 (its default's meaning) or in [lo, hi], in the words
/// `what` ("expected 0 (estimate) or a rate from 0.001 to 1e6 GB/s, got 1e300"): past a bound the
/// numbers printed from it overflow ("inf GB/s") or round to nothing.
inline CLI::Validator zero_or_range_check(double lo, double hi, const std::string& what) {
  return CLI::Validator(
      [what, lo, hi](std::string& text) -> std::string {
        double v = 0;
        const bool ok = whole_number(text, v) && (v == 0 || (v >= lo && v <= hi));
        return ok ? std::string() : fmt::format("expected {}, got {}", what, text);
      },
      fmt::format("0 or FLOAT in [{} - {}]", lo, hi));
}

/// The words of integer_check's range ("an integer from 1 to 1024", "an integer >= 0 (0: all)"),
/// for the same flag's check of its text's kind (add_number_option's `expects`).
template <typename Int>
std::string integer_range_text(Int lo, Int hi = std::numeric_limits<Int>::max(),
                               const std::string& note = "") {
  return hi == std::numeric_limits<Int>::max() ? fmt::format("an integer >= {}{}", lo, note)
                                               : fmt::format("an integer from {} to {}{}", lo, hi, note);
}

/// A CLI11 check of an integer option with a short message ("expected an integer from 1 to
/// 1024, got two"; `note` follows the bound of an option without an upper one: "expected an
/// integer >= 0 (0: all), got -1") instead of CLI::NonNegativeNumber's range of 309 digits or
/// CLI::Range's "Value two not in range". The text must be a whole decimal integer.
template <typename Int>
CLI::Validator integer_check(Int lo, Int hi = std::numeric_limits<Int>::max(), const std::string& note = "") {
  const std::string what = integer_range_text(lo, hi, note);
  return CLI::Validator(
      [what, lo, hi](std::string& text) -> std::string {
        Int v{};
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        const bool ok = !text.empty() && ec == std::errc() && ptr == end && v >= lo && v <= hi;
        return ok ? std::string() : fmt::format("expected {}, got {}", what, text);
      },
      hi == std::numeric_limits<Int>::max() ? fmt::format("INT >= {}", lo)
                                            : fmt::format("INT in [{} - {}]", lo, hi));
}

/// A CLI11 check of a path option that refuses an empty one ("expected a path, got an empty
/// one (leave --base out for <what leaving it out means>)"): an empty value would read as the
/// option left out, e.g. `--base "$UNSET_VARIABLE"` silently meaning the adapter's own base.
inline CLI::Validator non_empty_path_check(const std::string& flag, const std::string& left_out) {
  return CLI::Validator(
      [flag, left_out](std::string& text) -> std::string {
        return text.empty()
                   ? fmt::format("expected a path, got an empty one (leave {} out for {})", flag, left_out)
                   : std::string();
      },
      "PATH");
}

/// Registers option `flag` for the number `v` (an integer type or double) with a check that
/// its text reads whole as one ("expected <expects>, got two") instead of CLI11's "Could not
/// convert: --flag = two"; `expects` should be the words of the value's own range check, which
/// runs after parsing.
template <typename T>
CLI::Option* add_number_option(CLI::App& app, const std::string& flag, T& v, const std::string& help,
                               const std::string& expects) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
  CLI::Validator check(
      [expects](std::string& text) -> std::string {
        bool ok = false;
        if constexpr (std::is_floating_point_v<T>) {
          double x = 0;
          ok = whole_number(text, x);
        } else {
          T x{};
          const char* end = text.data() + text.size();
          const auto [ptr, ec] = std::from_chars(text.data(), end, x);
          ok = !text.empty() && ec == std::errc() && ptr == end;
        }
        return ok ? std::string() : fmt::format("expected {}, got {}", expects, text);
      },
      "");
  return app.add_option(flag, v, help)->check(check);
}

/// CLI11's parse error `e` in the words of roundpipe's other usage errors, for every subcommand:
/// a flag given more than once is "--seq given twice" (CLI11: "--seq: At Most 1 required but
/// received 2") and a flag without its value "--seq: expected an integer after it, got nothing"
/// (CLI11: "--seq: 1 required INT missing"); any other error as CLI11 words it.
inline std::string parse_error_text(const CLI::ParseError& e) {
  const std::string what = e.what();
  if (!dynamic_cast<const CLI::ArgumentMismatch*>(&e)) return what;
  const std::string at_most = ": At Most 1 required but received ";
  if (const auto at = what.find(at_most); at != std::string::npos) {
    const std::string times = what.substr(at + at_most.size());
    return fmt::format("{} given {}; give it once", what.substr(0, at),
                       times == "2" ? std::string("twice") : times + " times");
  }
  // "<flag>: <n> required <type>[:<check>] missing", the type INT, UINT, FLOAT, TEXT, ...
  const std::string required = ": 1 required ", missing = " missing";
  const auto at = what.find(required);
  if (at == std::string::npos || what.size() < missing.size() ||
      what.compare(what.size() - missing.size(), missing.size(), missing) != 0)
    return what;
  const size_t from = at + required.size();
  const std::string type = what.substr(from, what.find_first_of(": ", from) - from);
  const std::string value = type == "INT" || type == "UINT" ? "an integer"
                            : type == "FLOAT"               ? "a number"
                                                            : "a value";
  return fmt::format("{}: expected {} after it, got nothing", what.substr(0, at), value);
}

/// What an output flag writes: its kind in words ("a trace written by roundpipe") and the test
/// that recognizes such a file.
struct OwnOutput {
  std::string kind;
  std::function<bool(const std::string&)> recognizes;
};

/// An output file a flag names (`flag` "--trace") may replace a file already at `path` only
/// when `force` is set, so that a mistyped name never destroys a file of the user's: throws
/// UsageError "<flag> <path>: a file is already there; choose another name or add --force to
/// replace it" ("... is a folder" for a folder). With `ours`, --force replaces only a file it
/// recognizes, and refuses any other with "<flag> <path>: the file there is not <kind>; --force
/// replaces only such a file (choose another name)": --force never destroys a file of the user's
/// either. Nothing there, or a file force may replace: returns.
inline void check_new_output_file(const std::string& path, const std::string& flag, bool force,
                                  const OwnOutput& ours = {}) {
  if (const std::string why = output_file_problem(path, force); !why.empty())
    throw UsageError(fmt::format("{} {}: {}", flag, path, why));
  std::error_code ec;
  if (force && ours.recognizes && std::filesystem::is_regular_file(path, ec) && !ours.recognizes(path))
    throw UsageError(fmt::format(
        "{} {}: the file there is not {}; --force replaces only such a file (choose another name)", flag,
        path, ours.kind));
}

/// A subcommand callback running `body`: an exception it throws becomes one bounded line
/// (one_line) "roundpipe: error: <what>" on stderr (after what was printed so far on stdout) and exit
/// code 1 (CLI::RuntimeError, which main returns); a UsageError exits 2 and ends "(see roundpipe
/// --help)", as every usage error does (CLI11's and train's).
inline std::function<void()> reporting_errors(std::function<void()> body) {
  return [body = std::move(body)] {
    try {
      body();
    } catch (const UsageError& e) {
      std::fflush(stdout);
      fmt::print(stderr, "roundpipe: error: {} (see roundpipe --help)\n", one_line(e.what()));
      throw CLI::RuntimeError(2);
    } catch (const std::exception& e) {
      std::fflush(stdout);
      fmt::print(stderr, "roundpipe: error: {}\n", one_line(e.what()));
      throw CLI::RuntimeError(1);
    }
  };
}

}  // namespace rp
