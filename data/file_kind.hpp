// What a data file holds, told by its first bytes rather than its name: text (JSON or plain
// text, which the data loaders read) or something else, which they refuse before reading it
// as text (a binary file read as text would train on its bytes).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace rp {

/// How many leading bytes binary_file_error looks at.
inline constexpr size_t kSniffBytes = 1024;

/// Up to `n` leading bytes of `path`. Throws std::runtime_error("<path>: cannot open").
std::string file_head(const std::string& path, size_t n);

/// "" when the first kSniffBytes of `head` look like UTF-8 text (no NUL byte, valid UTF-8 but
/// for a character cut at the end), else one line naming `path`, its first 16 bytes in hex and,
/// when the magic says so, what it is: `data.bin: not text: its first bytes are 1f 8b 08 00 ...
/// (a gzip archive); expected JSON lines, a JSON array, Parquet, Arrow IPC or UTF-8 text`.
std::string binary_file_error(const std::string& path, std::string_view head);

}  // namespace rp
