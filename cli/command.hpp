// Shared by the `roundpipe` subcommands that run from their CLI11 callback.
#pragma once
#include <cstdio>
#include <exception>
#include <functional>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace rp {

/// A subcommand callback running `body`: an exception it throws becomes one line
/// "roundpipe: error: <what>" on stderr (after what was printed so far on stdout) and exit
/// code 1 (CLI::RuntimeError, which main returns).
inline std::function<void()> reporting_errors(std::function<void()> body) {
  return [body = std::move(body)] {
    try {
      body();
    } catch (const std::exception& e) {
      std::fflush(stdout);
      fmt::print(stderr, "roundpipe: error: {}\n", e.what());
      throw CLI::RuntimeError(1);
    }
  };
}

}  // namespace rp
