// Writing the tier cache file (build_cache) and the builders' lock (ensure_cache).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/counted.hpp"        // byte_text
#include "base/output_folder.hpp"  // dangling_link_text, path_blocker_text
#include "tier/cache_file.hpp"
#include "tier/cache_format.hpp"
#include "tier/file_io.hpp"

namespace fs = std::filesystem;

namespace rp::tier {
namespace {

/// Bytes written buffered between two fdatasync + posix_fadvise(DONTNEED).
constexpr uint64_t kBufferedFlushBytes = uint64_t(64) << 20;

std::string folder_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

uint64_t statvfs_free_bytes(const std::string& dir) {
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0)
    throw std::runtime_error(
        fmt::format("{}: cannot ask for its free space ({})", dir, std::strerror(errno)));
  return uint64_t(v.f_bavail) * uint64_t(v.f_frsize);
}

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

AlignedBuffer aligned_buffer(size_t bytes) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, align_up(bytes)));
  if (!p) throw std::bad_alloc();
  return AlignedBuffer(p);
}

/// The temporary being written: O_DIRECT when the file system takes it, else buffered with
/// the page cache dropped behind the writes.
class CacheWriter {
 public:
  CacheWriter(const std::string& tmp, const std::string& path, const CacheBuildOptions& opt,
              CacheBuildReport& rep)
      : path_(path), opt_(opt), rep_(rep) {
    const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    if (opt.direct) {
      fd_.reset(::open(tmp.c_str(), flags | O_DIRECT, 0644));
      if (fd_.get() < 0 && errno != EINVAL) fail_open();
      if (fd_.get() < 0) rep_.buffered_reason = "O_DIRECT: Invalid argument";
    } else {
      rep_.buffered_reason = "O_DIRECT not asked for";
    }
    if (fd_.get() < 0) fd_.reset(::open(tmp.c_str(), flags, 0644));
    if (fd_.get() < 0) fail_open();
    rep_.direct = rep_.buffered_reason.empty();
  }

  /// Reserves the whole file up front where the file system can (a full disk fails here).
  void reserve(uint64_t bytes) {
    if (bytes == 0) return;
    // fallocate, not posix_fallocate: glibc's emulation would write every block through the page cache
    const int rc = ::fallocate(fd_.get(), 0, 0, off_t(bytes)) == 0 ? 0 : errno;
    if (rc == ENOSPC || rc == EDQUOT || rc == EFBIG)
      throw std::runtime_error(
          fmt::format("{}: cannot reserve {} bytes for the tier cache: {}", path_, bytes, std::strerror(rc)));
    // EOPNOTSUPP / EINVAL: the file system does not reserve; the writes find out
  }

  /// Writes `bytes` (a multiple of 4096) from the aligned `src` at `offset`.
  void write(const std::byte* src, size_t bytes, uint64_t offset) {
    int err = opt_.write_fault ? opt_.write_fault(offset, bytes) : 0;
    if (err == 0) err = pwrite_full(fd_.get(), src, bytes, offset);
    if (err == EINVAL && rep_.direct) {  // O_DIRECT accepted at open, refused at write
      ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) & ~O_DIRECT);
      rep_.direct = false;
      rep_.buffered_reason = "O_DIRECT write: Invalid argument";
      err = pwrite_full(fd_.get(), src, bytes, offset);
    }
    if (err != 0)
      throw std::runtime_error(fmt::format("{}: writing {} bytes at offset {} failed: {}{}", path_, bytes,
                                           offset, std::strerror(err), err == ENOSPC ? " (disk full)" : ""));
    if (!rep_.direct && (unflushed_ += bytes) >= kBufferedFlushBytes) flush();
  }

  void finish() {
    if (!rep_.direct) flush();
    if (::close(fd_.release()) != 0)
      throw std::runtime_error(
          fmt::format("{}: closing the tier cache failed: {}", path_, std::strerror(errno)));
  }

 private:
  [[noreturn]] void fail_open() {
    throw std::runtime_error(
        fmt::format("{}: cannot create the tier cache ({})", path_, std::strerror(errno)));
  }
  /// Buffered writes: make them durable, then drop them from the page cache.
  void flush() {
    if (::fdatasync(fd_.get()) != 0)
      throw std::runtime_error(fmt::format("{}: fdatasync failed: {}", path_, std::strerror(errno)));
    ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_DONTNEED);
    unflushed_ = 0;
  }
  Fd fd_;
  const std::string& path_;
  const CacheBuildOptions& opt_;
  CacheBuildReport& rep_;
  uint64_t unflushed_ = 0;
};

/// Fills and writes every entry (their checksums into `l`), then the header.
void write_cache(CacheWriter& w, const std::string& key, format::Layout& l, const CacheFill& fill,
                 size_t chunk) {
  AlignedBuffer buf = aligned_buffer(chunk);
  for (size_t i = 0; i < l.entries.size(); ++i) {
    auto& e = l.entries[i];
    format::EntryChecksums sum(l.block_bytes);
    for (uint64_t off = 0; off < e.bytes; off += chunk) {
      const size_t n = size_t(std::min<uint64_t>(chunk, e.bytes - off));
      fill(i, off, std::span<std::byte>(buf.get(), n));
      sum.update(buf.get(), n);
      std::memset(buf.get() + n, 0, align_up(n) - n);
      w.write(buf.get(), align_up(n), e.offset + off);
    }
    e.checksum = sum.finish(e.block_checksums);
  }
  const std::vector<std::byte> header = format::encode_header(key, l);
  AlignedBuffer h = aligned_buffer(header.size());
  std::memcpy(h.get(), header.data(), header.size());
  w.write(h.get(), header.size(), 0);  // last: a file cut short has no valid header
}

}  // namespace

uint64_t cache_file_bytes(const std::string& source_key, const std::vector<CacheEntrySpec>& specs,
                          uint64_t checksum_block_bytes) {
  return format::plan_layout(source_key, specs, checksum_block_bytes).file_bytes;
}

std::string cache_lock_path(const std::string& path) { return path + ".lock"; }

namespace {

/// The builders' lock file cannot be opened or made (a read-only file system or folder).
struct LockUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The builders' lock: <path>.lock, flock'ed for the whole check-and-build. The run that created
// the file removes it when it is done, still holding it; a run that waited on it then finds its
// file gone from the path (or another in its place) and takes the lock anew, so no two runs
// hold the path's lock at once. A lock file this run did not create (another run's, or one a
// killed run left) is never removed; one it created goes on a stop signal too
// (remove_unfinished_temporaries).
class BuilderLock {
 public:
  BuilderLock(const std::string& lock_path, const std::string& path, const CacheBuildOptions& options)
      : lock_path_(lock_path) {
    for (;;) {
      created_ = false;
      int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      std::string why;
      if (fd >= 0) {
        created_ = true;  // a stop signal from here on removes it (as the last step below would)
        signal_slot_ = record_unfinished_file(lock_path);
      } else if (errno == EEXIST) {
        fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
        struct stat link {};
        if (fd < 0 && errno == ENOENT && ::lstat(lock_path.c_str(), &link) != 0)
          continue;  // its creator removed it between the two opens
        if (fd < 0 && errno == ENOENT) why = "a symbolic link to a missing file";  // retrying would spin
      }
      // ENOENT from the first open (a folder that is gone or takes no new files) is no race either.
      // The error names the cache path the user gave first, then the lock beside it.
      if (fd < 0)
        throw LockUnavailable(fmt::format("{}: cannot open the builders' lock {} ({})", path, lock_path,
                                          why.empty() ? std::strerror(errno) : why));
      fd_.reset(fd);
      int rc = ::flock(fd, LOCK_EX | LOCK_NB);
      if (rc != 0 && errno == EWOULDBLOCK) {  // another run builds this cache: say so, then wait for it
        if (options.on_wait && !waited_)
          options.on_wait(
              fmt::format("{}: another run holds the builders' lock ({}): waiting for it", path, lock_path));
        waited_ = true;
        do rc = ::flock(fd, LOCK_EX);
        while (rc != 0 && errno == EINTR);
      }
      if (rc != 0)
        throw std::runtime_error(
            fmt::format("{}: cannot take the builders' lock {} ({})", path, lock_path, std::strerror(errno)));
      struct stat held {
      }, named{};
      if (::fstat(fd, &held) == 0 && ::stat(lock_path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
          held.st_dev == named.st_dev) {
        return;  // still the file at the path: the lock is ours (a stop signal removes the one we made)
      }
      forget_unfinished_file(signal_slot_);  // another file is at the path now: not ours to remove
      signal_slot_ = -1;
      fd_.reset();
    }
  }
  ~BuilderLock() {
    forget_unfinished_file(signal_slot_);        // first: a signal from here on leaves it (as a kill)
    if (created_) ::unlink(lock_path_.c_str());  // before the descriptor closes (fd_, after this body)
  }
  BuilderLock(const BuilderLock&) = delete;
  BuilderLock& operator=(const BuilderLock&) = delete;
  /// Whether another run held the lock first (what the path holds now may be its work).
  bool waited() const { return waited_; }

 private:
  std::string lock_path_;
  Fd fd_;
  bool created_ = false;
  bool waited_ = false;
  int signal_slot_ = -1;  ///< record_unfinished_file's handle for a lock we created
};

}  // namespace

CacheBuildReport build_cache(const std::string& path, const std::string& source_key,
                             const std::vector<CacheEntrySpec>& specs, const CacheFill& fill,
                             const CacheBuildOptions& options) {
  format::Layout l = format::plan_layout(source_key, specs, options.checksum_block_bytes);
  if (!fill) throw std::invalid_argument(fmt::format("{}: build_cache without a fill", path));
  if (options.chunk_bytes < kDirectAlign || options.chunk_bytes % kDirectAlign != 0)
    throw std::invalid_argument(fmt::format("{}: chunk of {} bytes, expected a multiple of {}", path,
                                            options.chunk_bytes, kDirectAlign));
  const std::string dir = folder_of(path);
  const uint64_t avail = options.free_bytes ? options.free_bytes(dir) : statvfs_free_bytes(dir);
  const uint64_t reserved = options.reserved_bytes;
  if (avail < reserved || avail - reserved < l.file_bytes)
    throw std::runtime_error(fmt::format(
        "{}: not enough disk space for the tier cache: needs {} bytes ({}), {} has {} bytes ({}) free{}",
        path, l.file_bytes, byte_text(double(l.file_bytes)), dir, avail, byte_text(double(avail)),
        reserved > 0 ? fmt::format(", {} bytes ({}) of them promised to {}", reserved,
                                   byte_text(double(reserved)), options.reserved_for)
                     : std::string()));
  CacheBuildReport rep;
  rep.bytes = l.file_bytes;
  replace_file(path, [&](const std::string& tmp) {
    CacheWriter w(tmp, path, options, rep);
    w.reserve(l.file_bytes);
    write_cache(w, source_key, l, fill, options.chunk_bytes);
    w.finish();
  });
  return rep;
}

namespace {

/// `line` without the "<path>: " it starts with (a reason that goes after the path already said).
std::string after_path(const std::string& path, const std::string& line) {
  return line.rfind(path + ": ", 0) == 0 ? line.substr(path.size() + 2) : line;
}

/// Refuses (PathRefused) what no build may replace: a file that cannot be read, or one that is
/// not a tier cache.
void refuse_unusable(const std::string& path, const CacheOpenResult& found) {
  if (found.unreadable)
    throw PathRefused(
        fmt::format("{}; make it readable, or move it away or choose another cache path (nothing "
                    "was written)",
                    found.reason));
  if (!found.foreign) return;
  // the reason without the path this line starts with, nor the words it says already
  std::string why = after_path(path, found.reason);
  if (const std::string said = "not a roundpipe tier cache ("; why.rfind(said, 0) == 0)
    why = why.substr(said.size(), why.size() - said.size() - 1);
  if (const std::string tail = ", not a roundpipe tier cache"; why.ends_with(tail))
    why.resize(why.size() - tail.size());  // "empty, not a roundpipe tier cache": the line says the rest
  throw PathRefused(
      fmt::format("{}: exists and is not a roundpipe tier cache ({}); move it away or choose another cache "
                  "path (nothing was written)",
                  path, why));
}

/// The cache as it is where no builders' lock can be made (a cache shared on a read-only file
/// system): a valid one is read as it is, as builders only ever rename a complete file over it;
/// anything else would need a build, which needs the lock: the line says both.
EnsureResult reuse_without_lock(const std::string& path, const std::string& source_key,
                                const std::vector<CacheEntrySpec>& specs, const CacheBuildOptions& options,
                                const LockUnavailable& no_lock) {
  CacheOpenResult found = CacheFile::open(path, source_key);
  refuse_unusable(path, found);
  std::string why = found.reason;
  if (found.state == CacheState::valid && !found.file->matches(specs))
    why = fmt::format("{}: its entries are not the ones asked for", path);
  else if (found.state == CacheState::valid) {
    if (!options.verify_reused) return {found.file, false, ""};
    try {
      found.file->verify_all();
      return {found.file, false, ""};
    } catch (const std::runtime_error& bad) {
      why = bad.what();
    }
  }
  throw std::runtime_error(fmt::format(
      "{}: {} {}, and it cannot be {} here: {}", path,
      found.state == CacheState::missing ? "needs a build" : "needs a rebuild",
      fmt::format("({})", after_path(path, why)), found.state == CacheState::missing ? "built" : "rebuilt",
      after_path(path, no_lock.what())));
}

/// ensure_cache once the folder `dir` exists.
EnsureResult ensure_in_folder(const std::string& path, const std::string& dir, const std::string& source_key,
                              const std::vector<CacheEntrySpec>& specs, const CacheFill& fill,
                              const CacheBuildOptions& options) {
  std::error_code ec;
  std::optional<BuilderLock> lock;  // held until it goes, on return or on a throw
  try {
    lock.emplace(cache_lock_path(path), path, options);
  } catch (const LockUnavailable& no_lock) {
    return reuse_without_lock(path, source_key, specs, options, no_lock);
  }
  const bool waited = lock->waited();
  CacheOpenResult found = CacheFile::open(path, source_key);
  if (found.state == CacheState::valid && found.file->matches(specs)) {
    if (!options.verify_reused) return {found.file, false, "", false, waited};
    try {  // under the lock: no other run replaces the file between this check and the rebuild
      found.file->verify_all();
      return {found.file, false, "", false, waited};
    } catch (const std::runtime_error& bad) {
      found = {CacheState::damaged, bad.what(), nullptr, false};
    }
  }
  refuse_unusable(path, found);
  if (fs::is_symlink(path, ec))
    throw PathRefused(
        fmt::format("{}: is a symbolic link, which a rebuild of the tier cache would replace with a file "
                    "({}); point the cache "
                    "path at its target (nothing was written)",
                    path, found.reason));
  const bool replaced = found.state != CacheState::missing;  // seen under the lock, not before it
  std::string why = found.state == CacheState::valid
                        ? fmt::format("{}: its entries are not the ones asked for", path)
                        : found.reason;
  const uint64_t old_bytes = replaced ? uint64_t(fs::file_size(path, ec)) : 0;
  found = {};  // let go of the old file before writing the new one
  clean_stale_temporaries(dir, fs::path(path).filename().string());
  try {
    build_cache(path, source_key, specs, fill, options);
  } catch (const std::runtime_error& e) {
    // the old file stays until the new one is complete, so its bytes count against the build
    if (old_bytes > 0 && std::string(e.what()).find("not enough disk space") != std::string::npos)
      throw std::runtime_error(
          fmt::format("{}; the old cache at this path ({}, {}) is replaced only once the new one is "
                      "complete: remove it to make room",
                      e.what(), byte_text(double(old_bytes)), why));
    throw;
  }
  CacheOpenResult built = CacheFile::open(path, source_key);
  if (built.state != CacheState::valid)
    throw std::runtime_error(fmt::format("{} (right after it was built)", built.reason));
  return {built.file, true, std::move(why), replaced, waited};
}

}  // namespace

EnsureResult ensure_cache(const std::string& path, const std::string& source_key,
                          const std::vector<CacheEntrySpec>& specs, const CacheFill& fill,
                          const CacheBuildOptions& options) {
  const std::string dir = folder_of(path);
  std::error_code ec;
  const RecordedFolders folders(dir, ec);  // a stop signal mid-build takes them back too
  const std::vector<std::string>& made = folders.made();
  try {
    if (ec) {
      // "File exists" would not say why: a link to nothing, or a file where a folder goes
      std::string why = dangling_link_text(dir);
      if (why.empty()) why = path_blocker_text(dir, true);
      throw std::runtime_error(why.empty()
                                   ? fmt::format("{}: cannot create the folder ({})", dir, ec.message())
                                   : fmt::format("cannot create the cache's folder: {}", why));
    }
    return ensure_in_folder(path, dir, source_key, specs, fill, options);
  } catch (...) {
    remove_empty_folders(made);  // a failed build leaves no folder it made (the lock is gone by now)
    throw;
  }
}

}  // namespace rp::tier
