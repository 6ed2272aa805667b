#include "base/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace rp {

namespace {

[[noreturn]] void refuse(const std::string& path, std::string_view what, std::string_view expected) {
  throw std::invalid_argument(fmt::format("{}: {}, expected {}", path, what, expected));
}

/// Closes the descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

namespace {
std::string read_opened(const std::string& path, std::string_view expected, std::string_view opening);
}

std::string read_input_file(const std::string& path, std::string_view expected, std::string_view opening) {
  try {
    return read_opened(path, expected, opening);
  } catch (const std::bad_alloc&) {  // std::bad_alloc's own text names nothing
    struct stat st {};
    const bool sized = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    throw std::invalid_argument(does_not_fit_message(path, sized ? int64_t(st.st_size) : -1));
  }
}

std::string does_not_fit_message(const std::string& where, int64_t bytes) {
  return bytes < 0 ? fmt::format("{}: cannot read (it does not fit in memory)", where)
                   : fmt::format("{}: cannot read ({} bytes do not fit in memory)", where, bytes);
}

namespace {
std::string read_opened(const std::string& path, std::string_view expected, std::string_view opening) {
  // a socket cannot be opened at all ("No such device or address" named no socket)
  if (struct stat st{}; ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode))
    refuse(path, "is a socket", expected);
  // O_NONBLOCK: the open of a named pipe returns at once instead of waiting for a writer
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0)
    throw std::invalid_argument(fmt::format("{}: cannot open{} ({})", path, opening, std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0)
    throw std::invalid_argument(fmt::format("{}: cannot open{} ({})", path, opening, std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) refuse(path, "is a folder", expected);
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) refuse(path, "is a device", expected);
  std::string text;
  if (S_ISREG(st.st_mode)) text.reserve(size_t(st.st_size));  // a file larger than memory fails here
  char buf[1 << 16];
  if (S_ISFIFO(st.st_mode)) {
    // without a writer a read says end of file at once; with one it has data or would wait
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n == 0)
      refuse(path, "is a named pipe that no program writes to (reading it would wait forever)", expected);
    if (n < 0 && errno != EAGAIN)
      throw std::invalid_argument(fmt::format("{}: cannot read ({})", path, std::strerror(errno)));
    if (n > 0) text.append(buf, size_t(n));
  }
  // the rest as it comes: the writer of a pipe may take its time
  if (::fcntl(f.fd, F_SETFL, ::fcntl(f.fd, F_GETFL) & ~O_NONBLOCK) != 0)
    throw std::invalid_argument(fmt::format("{}: cannot read ({})", path, std::strerror(errno)));
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n == 0) return text;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::invalid_argument(fmt::format("{}: cannot read ({})", path, std::strerror(errno)));
    text.append(buf, size_t(n));
  }
}

}  // namespace

namespace {
int64_t mtime_ns(const struct stat& st) {
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}
}  // namespace

PositionalFile::PositionalFile(int fd, uint64_t size, std::string path)
    : fd_(fd), size_(size), path_(std::move(path)) {
  // a failed fstat leaves 0, which the check after the first read reports as a change
  if (struct stat st{}; ::fstat(fd_, &st) == 0) mtime_ns_ = mtime_ns(st);
}

PositionalFile::~PositionalFile() {
  if (fd_ >= 0) ::close(fd_);
}

PositionalFile::PositionalFile(PositionalFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), size_(o.size_), mtime_ns_(o.mtime_ns_), path_(std::move(o.path_)) {}

PositionalFile& PositionalFile::operator=(PositionalFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
    mtime_ns_ = o.mtime_ns_;
    path_ = std::move(o.path_);
  }
  return *this;
}

void PositionalFile::read(uint64_t offset, uint64_t n, void* dst, std::string_view what) const {
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < n) {
    // at most 1 GiB a call: Linux moves no more than ~2 GiB per read
    const size_t ask = size_t(std::min<uint64_t>(n - done, uint64_t(1) << 30));
    const ssize_t got = ::pread(fd_, out + done, ask, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw std::runtime_error(fmt::format("{}: {}: cannot read ({})", path_, what, std::strerror(errno)));
    if (got == 0) break;  // end of file before the bytes the header promised: the file shrank
    done += uint64_t(got);
  }
  // bytes another program wrote while (or before) they were read would mix two files' contents
  check_unchanged(what);
  if (done < n)  // the file is as it was yet ends early: a size that was never true
    throw std::runtime_error(
        fmt::format("{}: {}: cannot read (the file ends at byte {})", path_, what, offset + done));
}

void PositionalFile::check_unchanged(std::string_view what) const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    throw std::runtime_error(fmt::format("{}: {}: cannot read ({})", path_, what, std::strerror(errno)));
  if (uint64_t(st.st_size) != size_)
    throw std::runtime_error(
        fmt::format("{}: {}: the file changed while being read: it is now {} bytes, it had {} when opened",
                    path_, what, uint64_t(st.st_size), size_));
  if (mtime_ns(st) != mtime_ns_)
    throw std::runtime_error(
        fmt::format("{}: {}: the file changed while being read (modified after it was opened)", path_, what));
}

void PositionalFile::read_chunks(uint64_t offset, uint64_t n, uint64_t unit, std::string_view what,
                                 const std::function<void(const uint8_t*, uint64_t, uint64_t)>& fn) const {
  if (unit == 0 || n % unit != 0)
    throw std::logic_error(fmt::format("{}: {}: {} bytes are not whole {}-byte units", path_, what, n, unit));
  const uint64_t per = std::max<uint64_t>(1, (uint64_t(8) << 20) / unit);  // units a piece
  std::vector<uint8_t> buf(size_t(std::min(n / unit, per) * unit));
  for (uint64_t u = 0; u < n / unit; u += per) {
    const uint64_t k = std::min(per, n / unit - u);
    read(offset + u * unit, k * unit, buf.data(), what);
    fn(buf.data(), u, k);
  }
}

}  // namespace rp
