// What every benchmark program shares at its edges: its options parsed by CLI11 with a bad one
// refused in one line (exit 2), and its body run so that an exception is one line and exit 1,
// never an abort.
#pragma once
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace bench {

/// Parses argv into `app`. nullopt when parsed; else the exit code to return: 0 after --help
/// (printed), 2 after one line "<program>: <CLI11's message>" on stderr (CLI11's own codes would
/// differ per error).
inline std::optional<int> parse_options(CLI::App& app, int argc, char** argv, const char* program) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::fprintf(stderr, "%s: %s\n", program, what.c_str());
    return 2;
  }
}

/// Runs a program's body: its exit code, or 1 after one line "<program>: error: <what>" when it
/// throws.
inline int guarded_main(const char* program, const std::function<int()>& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace bench
