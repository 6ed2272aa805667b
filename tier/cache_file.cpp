#include "tier/cache_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/checksum.hpp"
#include "base/error_text.hpp"
#include "tier/cache_format.hpp"
#include "tier/file_io.hpp"

namespace rp::tier {

const char* to_string(CacheState s) {
  switch (s) {
    case CacheState::valid: return "valid";
    case CacheState::missing: return "missing";
    case CacheState::stale: return "stale";
    case CacheState::damaged: return "damaged";
  }
  return "?";
}

namespace {

/// `s` cut at each `sep`.
std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  for (size_t at = 0;;) {
    const size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) return out;
    at = next + sep.size();
  }
}

/// Two keys of fields "<what>: <part>, <part>, ..." joined by "; " (cache_file.hpp): the first
/// field that differs, named, with the first of its parts that differs ("model.gguf: modified
/// <time> when built, modified <time> now"); "" when the keys are not made of such fields.
std::string field_difference(const std::string& built, const std::string& wanted) {
  const std::vector<std::string_view> a = split(built, "; "), b = split(wanted, "; ");
  if (a.size() < 2 && b.size() < 2) return "";
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const auto quoted = [](std::string_view f) { return "'" + excerpt(f) + "'"; };
  if (i == a.size() || i == b.size())
    return i == a.size() ? fmt::format("built without {}, which the source has now", quoted(b[i]))
                         : fmt::format("built with {}, which the source lacks now", quoted(a[i]));
  const size_t ca = a[i].find(": "), cb = b[i].find(": ");
  if (ca != std::string_view::npos && ca == cb && a[i].substr(0, ca) == b[i].substr(0, cb)) {
    const std::vector<std::string_view> pa = split(a[i].substr(ca + 2), ", "),
                                        pb = split(b[i].substr(cb + 2), ", ");
    size_t j = 0;
    while (j < pa.size() && j < pb.size() && pa[j] == pb[j]) ++j;
    if (pa.size() == pb.size() && j < pa.size())
      return fmt::format("{}: {} when built, {} now", excerpt(a[i].substr(0, ca)), excerpt(pa[j]),
                         excerpt(pb[j]));
  }
  return fmt::format("{} when built, {} now", quoted(a[i]), quoted(b[i]));
}

/// Why a cache's source key is not the one wanted, in one line. Keys short enough are shown
/// whole; keys of fields (see field_difference) by the field that differs; other long keys
/// from the part where they first differ, so the line says what changed rather than two
/// equal-looking prefixes.
std::string key_difference(const std::string& built, const std::string& wanted) {
  if (built.size() <= kExcerptBytes && wanted.size() <= kExcerptBytes)
    return fmt::format("built for source key '{}', wanted '{}'", built, wanted);
  if (std::string fields = field_difference(built, wanted); !fields.empty())
    return "built for another source: " + fields;
  size_t at = 0;
  while (at < built.size() && at < wanted.size() && built[at] == wanted[at]) ++at;
  // back to the start of the word that differs (after the last space, at most 48 bytes back)
  size_t from = at;
  while (from > 0 && at - from < 48 && !(built[from - 1] == ' ')) --from;
  const auto part = [&](const std::string& k) {
    return (from > 0 ? "..." : "") + excerpt(std::string_view(k).substr(std::min(from, k.size())), 64);
  };
  return fmt::format("built for another source (its key differs from byte {}: '{}' where '{}' is wanted)", at,
                     part(built), part(wanted));
}

/// The header checks of open once the file is open: "" and `f` filled, or the state and
/// the reason (without the path).
CacheState check_header(int fd, uint64_t size, const std::string& key, format::Parsed& f, std::string& why,
                        bool& foreign) {
  auto damaged = [&](std::string w) {
    why = std::move(w);
    return CacheState::damaged;
  };
  {  // ours at all? the whole magic: a shorter file (a user's "R", say) is not provably ours
    char head[sizeof(format::kMagic)] = {};
    foreign = size < sizeof(head) || pread_full(fd, head, sizeof(head), 0) != int64_t(sizeof(head)) ||
              std::memcmp(head, format::kMagic, sizeof(head)) != 0;
    if (foreign)
      return damaged(size == 0 ? "empty, not a roundpipe tier cache"
                               : "not a roundpipe tier cache (no RPTIERC magic at its start)");
  }
  if (size < format::kPreambleBytes)
    return damaged(fmt::format("truncated: {} bytes, a tier cache header has at least {}", size,
                               format::kPreambleBytes));
  std::vector<std::byte> pre_bytes(format::kPreambleBytes);
  if (const int64_t n = pread_full(fd, pre_bytes.data(), pre_bytes.size(), 0); n != int64_t(pre_bytes.size()))
    return damaged(n < 0 ? fmt::format("cannot read the header ({})", std::strerror(int(-n)))
                         : std::string("truncated while reading the header"));
  format::Preamble pre;
  format::decode_preamble(pre_bytes.data(), pre);  // the magic was checked above
  if (pre.version != kCacheFormatVersion) {
    why = fmt::format("format version {}, this build reads version {}", pre.version, kCacheFormatVersion);
    return CacheState::stale;
  }
  if (pre.header_bytes % kDirectAlign != 0 || pre.header_used < format::kPreambleBytes + 8 ||
      pre.header_used > pre.header_bytes || pre.header_bytes > format::kMaxHeaderBytes)
    return damaged(
        fmt::format("bad header sizes (header used {}, padded to {})", pre.header_used, pre.header_bytes));
  if (size < pre.header_bytes)
    return damaged(fmt::format("truncated: {} bytes, the header alone has {}", size, pre.header_bytes));
  std::vector<std::byte> h(pre.header_used);
  if (pread_full(fd, h.data(), h.size(), 0) != int64_t(h.size())) return damaged("cannot read the header");
  uint64_t stored;
  std::memcpy(&stored, h.data() + h.size() - 8, 8);
  if (const uint64_t got = checksum64(h.data(), h.size() - 8); got != stored)
    return damaged(fmt::format("header checksum mismatch (stored {:016x}, computed {:016x})", stored, got));
  if (auto bad = format::decode_entries(h.data(), pre, f.key, f.entries); !bad.empty())
    return damaged("header: " + bad);
  if (size != pre.file_bytes)
    return damaged(size < pre.file_bytes
                       ? fmt::format("truncated: {} bytes, the header says {}", size, pre.file_bytes)
                       : fmt::format("{} bytes, the header says {}", size, pre.file_bytes));
  f.file_bytes = pre.file_bytes;
  f.header_bytes = pre.header_bytes;
  f.block_bytes = pre.block_bytes;
  if (f.key != key) {
    why = key_difference(f.key, key);
    return CacheState::stale;
  }
  return CacheState::valid;
}

/// The inode of `fd` opened again with O_DIRECT (through /proc/self/fd, so a rename over
/// `path` since cannot change what is read; without /proc, `path` itself when it is still the
/// same inode), or -1 with `why` set.
int reopen_direct(const std::string& path, int fd, const struct stat& st, std::string& why) {
  int d = ::open(fmt::format("/proc/self/fd/{}", fd).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (d < 0 && errno == ENOENT) {  // no /proc
    d = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct stat again {};
    if (d >= 0 && (::fstat(d, &again) != 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino)) {
      ::close(d);
      why = "O_DIRECT: the file was replaced while it was opened";
      return -1;
    }
  }
  if (d < 0) why = fmt::format("O_DIRECT: {}", std::strerror(errno));
  return d;
}

}  // namespace

CacheOpenResult CacheFile::open(const std::string& path, const std::string& source_key) {
  CacheOpenResult r;
  // O_NONBLOCK: a FIFO (or a device) at the path must not block the open; fstat below refuses
  // anything but a regular file, and reads of a regular file ignore the flag
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    r.state = err == ENOENT ? CacheState::missing : CacheState::damaged;
    r.foreign = r.unreadable = err != ENOENT;  // unreadable: nothing says it is ours
    r.reason =
        fmt::format("{}: {}", path,
                    err == ENOENT ? "no cache file" : fmt::format("cannot be read ({})", std::strerror(err)));
    return r;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    r.state = CacheState::damaged;
    r.foreign = true;
    r.reason = fmt::format("{}: not a regular file", path);
    return r;
  }
  format::Parsed parts;
  std::string why;
  r.state = check_header(fd.get(), uint64_t(st.st_size), source_key, parts, why, r.foreign);
  if (r.state != CacheState::valid) {
    r.reason = fmt::format("{}: {}", path, why);
    return r;
  }
  std::shared_ptr<CacheFile> f(new CacheFile());
  f->path_ = path;
  f->key_ = std::move(parts.key);
  f->entries_ = std::move(parts.entries);
  f->file_bytes_ = parts.file_bytes;
  f->header_bytes_ = parts.header_bytes;
  f->block_bytes_ = parts.block_bytes;
  f->fd_ = fd.release();
  f->direct_fd_ = reopen_direct(path, f->fd_, st, f->direct_refused_);
  r.file = std::move(f);
  return r;
}

CacheFile::~CacheFile() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

const CacheEntry& CacheFile::entry(size_t i) const {
  if (i >= entries_.size())
    throw std::out_of_range(
        fmt::format("{}: entry {} asked for, the cache has {}", path_, i, entries_.size()));
  return entries_[i];
}

std::optional<size_t> CacheFile::find(std::string_view name) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].name == name) return i;
  return std::nullopt;
}

bool CacheFile::matches(const std::vector<CacheEntrySpec>& specs) const {
  if (specs.size() != entries_.size()) return false;
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name != entries_[i].name || specs[i].bytes != entries_[i].bytes) return false;
  return true;
}

std::string CacheFile::checksum_mismatch(size_t i, uint64_t got) const {
  const auto& e = entry(i);
  return fmt::format(
      "{}: entry '{}' at offset {} ({} bytes): checksum mismatch (stored {:016x}, read {:016x})", path_,
      excerpt(e.name), e.offset, e.bytes, e.checksum, got);
}

void CacheFile::read_entry(size_t i, std::span<std::byte> dst) const {
  const auto& e = entry(i);
  if (dst.size() < e.bytes)
    throw std::invalid_argument(fmt::format("{}: entry '{}' has {} bytes, the buffer {}", path_,
                                            excerpt(e.name), e.bytes, dst.size()));
  const int64_t n = pread_full(fd_, dst.data(), e.bytes, e.offset);
  if (n != int64_t(e.bytes))
    throw std::runtime_error(
        fmt::format("{}: entry '{}' at offset {}: {}", path_, excerpt(e.name), e.offset,
                    n < 0 ? fmt::format("read failed ({})", std::strerror(int(-n)))
                          : fmt::format("short read ({} of {} bytes; truncated?)", n, e.bytes)));
  if (const uint64_t got = checksum64(dst.data(), e.bytes); got != e.checksum)
    throw std::runtime_error(checksum_mismatch(i, got));
}

void CacheFile::verify_all() const {
  std::vector<std::byte> buf(size_t(8) << 20);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const auto& e = entries_[i];
    format::EntryChecksums sums(block_bytes_);
    for (uint64_t done = 0; done < e.bytes;) {
      const size_t want = size_t(std::min<uint64_t>(buf.size(), e.bytes - done));
      const int64_t n = pread_full(fd_, buf.data(), want, e.offset + done);
      if (n != int64_t(want))
        throw std::runtime_error(fmt::format("{}: entry '{}' at offset {}: {}", path_, excerpt(e.name),
                                             e.offset,
                                             n < 0 ? fmt::format("read failed ({})", std::strerror(int(-n)))
                                                   : std::string("short read (truncated?)")));
      sums.update(buf.data(), want);
      // read once: as a build does, leave the page cache to the run (the base may be larger)
      ::posix_fadvise(fd_, off_t(e.offset + done), off_t(want), POSIX_FADV_DONTNEED);
      done += want;
    }
    std::vector<uint64_t> blocks;
    if (const uint64_t got = sums.finish(blocks); got != e.checksum)
      throw std::runtime_error(checksum_mismatch(i, got));
    for (uint64_t k = 0; k < blocks.size(); ++k)
      if (blocks[k] != e.block_checksums[k]) throw std::runtime_error(block_mismatch(i, k, blocks[k]));
  }
}

std::string CacheFile::block_mismatch(size_t i, uint64_t block, uint64_t got) const {
  const auto& e = entry(i);
  const uint64_t from = block * block_bytes_, to = std::min(e.bytes, from + block_bytes_);
  const uint64_t stored = block < e.block_checksums.size() ? e.block_checksums[block] : 0;
  return fmt::format(
      "{}: entry '{}' at offset {}: block {} (bytes {}..{} of the entry): checksum mismatch (stored {:016x}, "
      "read "
      "{:016x})",
      path_, excerpt(e.name), e.offset, block, from, to, stored, got);
}

std::string CacheFile::check_blocks(size_t i, uint64_t offset, const std::byte* data, uint64_t bytes) const {
  const auto& e = entry(i);
  if (offset % block_bytes_ != 0 || bytes > e.bytes - offset ||
      ((offset + bytes) % block_bytes_ != 0 && offset + bytes != e.bytes))
    throw std::invalid_argument(
        fmt::format("{}: entry '{}': bytes {}..{} are not whole checksum blocks of {}", path_,
                    excerpt(e.name), offset, offset + bytes, block_bytes_));
  for (uint64_t at = 0; at < bytes; at += block_bytes_) {
    const uint64_t k = (offset + at) / block_bytes_;
    const uint64_t got = checksum64(data + at, size_t(std::min(block_bytes_, bytes - at)));
    if (got != e.block_checksums[k]) return block_mismatch(i, k, got);
  }
  return "";
}

}  // namespace rp::tier
