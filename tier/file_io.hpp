// Small POSIX helpers of tier/: an owning file descriptor and whole-length pread / pwrite.
// Internal to tier/.
#pragma once
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace rp::tier {

/// Owns a file descriptor (closed by the destructor); -1 when none.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

/// Reads `bytes` bytes at `offset` (retrying short reads and EINTR): the bytes read (fewer
/// only at the end of the file) or -errno.
inline int64_t pread_full(int fd, void* dst, size_t bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, static_cast<char*>(dst) + done, bytes - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -int64_t(errno);
    if (n == 0) break;
    done += size_t(n);
  }
  return int64_t(done);
}

/// Writes `bytes` bytes at `offset` (retrying short writes and EINTR): 0 or an errno
/// (ENOSPC for a write that made no progress).
inline int pwrite_full(int fd, const void* src, size_t bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd, static_cast<const char*>(src) + done, bytes - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    done += size_t(n);
  }
  return 0;
}

}  // namespace rp::tier
