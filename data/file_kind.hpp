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

/// Up to `n` leading bytes of `path`. Throws std::runtime_error("<path>: cannot open"), or
/// refuse_non_data_file's error first.
std::string file_head(const std::string& path, size_t n);

/// "" when the first kSniffBytes of `head` look like UTF-8 text (no NUL byte, valid UTF-8 but
/// for a character cut at the end), else one line naming `path`, its first 16 bytes in hex and,
/// when the magic says so, what it is: `data.bin: not text: its first bytes are 1f 8b 08 00 ...
/// (a gzip archive); expected JSON lines, a JSON array, Parquet, Arrow IPC or UTF-8 text`.
/// A head whose first invalid UTF-8 byte lies past its first 16 (text the hex would show as
/// fine) gets utf8_error's line instead.
std::string binary_file_error(const std::string& path, std::string_view head);

/// Throws std::runtime_error("<path>: not a regular file ...") when `path` exists and is neither
/// a regular file nor a folder (a device, FIFO or socket: /dev/zero was read without end, a named
/// pipe blocked the open); a missing path is left to the reader's own error.
void refuse_non_data_file(const std::string& path);

/// binary_file_error(path, text), else utf8_error(path, text): for a whole text file (past the
/// sniffed head, invalid UTF-8 reached the tokenizer, whose error named neither file nor line).
std::string text_file_error(const std::string& path, std::string_view text);

/// "" when `text` (all of `path`, or its start) is valid UTF-8, else one line naming the line,
/// the column and the offset of the first invalid byte: `corpus.txt:61: not UTF-8: byte 0xff at
/// column 19 (offset 3519 of the file); expected UTF-8 text (convert it, e.g. iconv -f latin1
/// -t utf-8)`.
std::string utf8_error(const std::string& path, std::string_view text);

}  // namespace rp
