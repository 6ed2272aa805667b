#include "data/file_kind.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "base/utf8.hpp"

namespace rp {

std::string file_head(const std::string& path, size_t n) {
  refuse_non_data_file(path);  // a FIFO would block the open, /dev/zero never end a whole read
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  std::string head(n, '\0');
  f.read(head.data(), std::streamsize(n));
  head.resize(size_t(f.gcount()));
  return head;
}

namespace {
/// What a known magic says the file is, or "".
std::string_view known_kind(std::string_view h) {
  struct Magic {
    std::string_view bytes, kind;
  };
  static constexpr Magic magics[] = {
      {"\x1f\x8b", "a gzip archive: decompress it first"},
      {"\x28\xb5\x2f\xfd", "a zstd archive: decompress it first"},
      {"BZh91AY&SY", "a bzip2 archive: decompress it first"},
      {{"\xfd"
        "7zXZ\0",
        6},
       "an xz archive: decompress it first"},
      {"PK\x03\x04", "a zip archive: unpack it first"},
      {"\xff\xfe", "UTF-16 text: convert it to UTF-8"},
      {"\xfe\xff", "UTF-16 text: convert it to UTF-8"},
      {"GGUF", "a GGUF model file"},
  };
  for (const auto& m : magics)
    if (h.substr(0, m.bytes.size()) == m.bytes) return m.kind;
  return {};
}
}  // namespace

std::string binary_file_error(const std::string& path, std::string_view head) {
  head = head.substr(0, kSniffBytes);
  const std::string_view kind = known_kind(head);
  bool text = kind.empty() && head.find('\0') == std::string_view::npos;
  if (text) {
    const size_t valid = valid_utf8_prefix(head);
    // a multi-byte character the sniffed bytes cut is still text
    text = valid == head.size() || (head.size() == kSniffBytes && head.size() - valid < 4 &&
                                    (static_cast<unsigned char>(head[valid]) & 0xC0) == 0xC0);
  }
  if (text) return {};
  // text before the bad byte (16 bytes of it, or a whole line): a text file with one bad byte,
  // named by its line and column rather than a hex dump of the fine text before it
  if (const size_t valid = valid_utf8_prefix(head);
      kind.empty() && head.find('\0') == std::string_view::npos &&
      (valid >= 16 || head.substr(0, valid).find('\n') != std::string_view::npos))
    return utf8_error(path, head);
  // text up to a NUL byte (a line of a JSON lines file, say): the NUL's line, not a hex dump
  if (const size_t nul = head.find('\0'); kind.empty() && nul != std::string_view::npos && nul >= 16 &&
                                          valid_utf8_prefix(head.substr(0, nul)) == nul) {
    const size_t line_start = head.rfind('\n', nul);
    return fmt::format(
        "{}:{}:{}: a NUL byte in the text; expected UTF-8 text without NUL bytes (JSON lines, a "
        "JSON array or plain text)",
        path, 1 + std::count(head.begin(), head.begin() + std::ptrdiff_t(nul), '\n'),
        line_start == std::string_view::npos ? nul + 1 : nul - line_start);
  }
  std::string hex;
  for (size_t i = 0; i < std::min<size_t>(head.size(), 16); ++i)
    hex += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(head[i]));
  return fmt::format(
      "{}: not text: its first bytes are {}{}{}; expected JSON lines, a JSON array, Parquet, Arrow IPC "
      "or UTF-8 text",
      path, hex, head.size() > 16 ? " ..." : "", kind.empty() ? std::string() : fmt::format(" ({})", kind));
}

void refuse_non_data_file(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !exists(st) || is_regular_file(st) || is_directory(st)) return;
  throw std::runtime_error(
      path +
      ": not a regular file (a device, FIFO or socket); expected a data file or a folder of .txt files");
}

std::string text_file_error(const std::string& path, std::string_view text) {
  std::string e = binary_file_error(path, text);
  return e.empty() ? utf8_error(path, text) : e;
}

std::string utf8_error(const std::string& path, std::string_view text) {
  const size_t bad = valid_utf8_prefix(text);
  if (bad == text.size()) return {};
  const size_t line_start = text.rfind('\n', bad == 0 ? 0 : bad - 1);
  const size_t column = line_start == std::string_view::npos || bad == 0 ? bad + 1 : bad - line_start;
  const auto line = 1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(bad), '\n');
  return fmt::format(
      "{}:{}: not UTF-8: byte 0x{:02x} at column {} (offset {} of the file); expected UTF-8 text (convert "
      "it, e.g. iconv -f latin1 -t utf-8)",
      path, line, static_cast<unsigned char>(text[bad]), column, bad);
}

}  // namespace rp
