#include "base/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

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

void check_mapped_file_holds(int fd, uint64_t end, uint64_t size_when_opened, const std::string& path,
                             const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw std::runtime_error(
        fmt::format("{}: {}: cannot check the file ({})", path, what, std::strerror(errno)));
  if (uint64_t(st.st_size) < end)
    throw std::runtime_error(
        fmt::format("{}: {}: the file is now {} bytes, shorter than the {} it had when opened (it changed "
                    "while being read)",
                    path, what, uint64_t(st.st_size), size_when_opened));
}

}  // namespace rp
