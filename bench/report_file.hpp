// A benchmark's --out report: refused when the file exists and --force was not given (an earlier
// result is never overwritten by accident), else written atomically with the command, the commit
// of the build, the machine and the date above the program's table.
#pragma once
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <ostream>
#include <string>

#include "base/atomic_file.hpp"
#include "roundpipe_version.hpp"

namespace bench {

/// True (after one line on stderr: "<program>: --out <file>: the file exists (...)") when `out`
/// is given, exists and `force` is off: the program should exit 2 before measuring.
inline bool out_is_taken(const char* program, const std::string& out, bool force) {
  if (out.empty() || force || !std::filesystem::exists(out)) return false;
  std::fprintf(stderr, "%s: --out %s: the file exists (remove it, choose another name or pass --force)\n",
               program, out.c_str());
  return true;
}

/// The program's command line as typed: argv joined by spaces.
inline std::string command_line(int argc, char** argv) {
  std::string command = argc > 0 ? argv[0] : "";
  if (const size_t slash = command.rfind('/'); slash != std::string::npos) command.erase(0, slash + 1);
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return command;
}

/// Writes "# <program>", the command, commit, machine and date, then `table`, to `out` atomically
/// (nothing when `out` or `table` is empty). Throws what write_file_atomically throws.
inline void write_report(const std::string& out, const char* program, const std::string& command,
                         const std::string& machine, const std::string& table) {
  if (out.empty() || table.empty()) return;
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  rp::write_file_atomically(out, [&](std::ostream& os) {
    os << "# " << program << "\n\n- command: `" << command << "`\n- commit: " << rp::kGitCommit
       << "\n- machine: " << machine << "\n- date: " << date << "\n\n"
       << table;
  });
}

}  // namespace bench
