// Asynchronous reads of a tier cache file's entries (or 4096-aligned byte ranges of them)
// into caller-provided 4096-aligned host buffers: O_DIRECT through io_uring (tier/io_engine.hpp)
// with a bounded number of reads in flight; results come back in submission order.
//
//   DirectReader r(file);                               // file: CacheFile::open(...).file
//   auto lease = ring.acquire();                        // tier/buffer_ring.hpp
//   r.submit({.entry = i, .dst = lease->data(), .capacity = lease->bytes()});
//   ReadResult res = *r.next();                         // blocks; res.ok() or res.error
//
// A request is split into reads of at most max_io_bytes; at most queue_depth of them are in
// flight over all requests. Each completed whole-entry request is checked against the entry's
// checksum, and a range of whole checksum blocks (CacheFile::checksum_block_bytes(); the last
// block may end at the entry's end) against its block checksums (Options::verify); other
// ranges are returned unverified. Failures are results, not exceptions: a read error (EIO), a short
// read (the file was truncated after it was opened) or a checksum mismatch ends that request
// with error set to one line naming the file, the entry and its offset; the request's buffer is
// no longer written to once its result is returned, and the reader stays usable.
//
// Fallbacks: when io_uring cannot be set up (EPERM under a seccomp profile, ENOSYS), a pool of
// pread threads (logged once per process, fallback_reason() says why); when the file system
// refused O_DIRECT (CacheFile::direct_fd() is -1), buffered reads followed by
// posix_fadvise(DONTNEED), so streaming the cache does not fill the page cache.
//
// Thread-safety: one DirectReader is driven by one thread at a time (submit, next, try_next,
// shutdown); different readers of one CacheFile are independent. The destructor calls
// shutdown(): reads not yet started are dropped, reads in flight are waited for (never
// abandoned while the kernel may still write into a buffer), results not taken are discarded.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "tier/cache_file.hpp"
#include "tier/io_engine.hpp"

namespace rp::tier {

/// ReadRequest::bytes meaning "from offset to the entry's end".
inline constexpr uint64_t kToEntryEnd = std::numeric_limits<uint64_t>::max();

struct ReadRequest {
  size_t entry = 0;              ///< index into CacheFile::entries()
  uint64_t offset = 0;           ///< bytes into the entry, a multiple of 4096
  uint64_t bytes = kToEntryEnd;  ///< from offset; offset + bytes <= the entry's bytes
  std::byte* dst = nullptr;      ///< 4096-aligned
  size_t capacity = 0;           ///< dst's size: at least align_up(bytes) (reads cover the padding)
  uint64_t tag = 0;              ///< the caller's, returned in the result
};

struct ReadResult {
  uint64_t ticket = 0;  ///< what submit returned
  uint64_t tag = 0;
  size_t entry = 0;
  uint64_t offset = 0, bytes = 0;  ///< the range read (bytes resolved from kToEntryEnd)
  std::byte* dst = nullptr;
  bool verified = false;  ///< a whole entry or whole checksum blocks whose checksums matched
  int error_code = 0;  ///< errno of a failed read, EBADMSG for a checksum mismatch, ENODATA for a short read
  std::string error;   ///< one line; empty when ok
  bool ok() const { return error.empty(); }
};

/// Test hook: called before each read is started with its index (0, 1, ... over the reader's
/// life), file offset and length; a non-zero return fails that read with that errno instead.
using ReadFault = std::function<int(uint64_t read_index, uint64_t file_offset, size_t bytes)>;
/// A ReadFault that fails read `n` (0-based) with `err`.
ReadFault fail_nth_read(uint64_t n, int err);

struct DirectReaderOptions {
  unsigned queue_depth = 8;               ///< reads in flight at most (1..4096)
  size_t max_io_bytes = size_t(1) << 20;  ///< one read's size at most (a multiple of 4096)
  bool verify = true;                     ///< check whole entries and whole blocks against their checksums
  IoEngineKind engine = IoEngineKind::automatic;  ///< pread_pool forces the fallback
  unsigned pread_threads = 4;
  bool direct = true;  ///< false: buffered reads even where O_DIRECT works
  ReadFault fault;
};

class DirectReader {
 public:
  /// Throws std::invalid_argument for bad options, std::runtime_error when an explicitly asked
  /// io_uring cannot be set up.
  explicit DirectReader(std::shared_ptr<const CacheFile> file, DirectReaderOptions options = {});
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  /// Queues a read and starts what the queue depth allows; returns its ticket (1, 2, ...).
  /// Never blocks. Throws std::out_of_range for an entry past the table, std::invalid_argument
  /// for a bad request (an unaligned offset or buffer, a range past the entry, a buffer too
  /// small; one line naming the file and the entry) and std::logic_error after shutdown().
  uint64_t submit(const ReadRequest& request);
  /// The oldest request's result, waiting for it; nullopt when none is outstanding. Throws
  /// std::runtime_error only when the engine itself fails (io_uring_wait_cqe returning an
  /// error), not for a failed read.
  std::optional<ReadResult> next();
  /// The oldest request's result if it is done, else nullopt (never waits).
  std::optional<ReadResult> try_next();
  /// Requests submitted and not yet returned by next / try_next.
  size_t outstanding() const { return requests_.size(); }
  /// Drops the reads not started, waits for those in flight, discards every result. Idempotent.
  void shutdown();

  const CacheFile& file() const { return *file_; }
  bool direct() const { return direct_; }
  /// "io_uring" or "pread pool (N threads)".
  std::string engine_name() const { return engine_name_; }
  /// Why the engine is not io_uring although it could have been ("" when it is, or when the
  /// pread pool was asked for).
  const std::string& fallback_reason() const { return fallback_reason_; }

 private:
  struct Request {
    ReadRequest req;
    uint64_t ticket = 0, file_offset = 0, length = 0;  ///< length: align_up(bytes)
    uint64_t started = 0, done = 0;                    ///< bytes started / completed
    size_t in_flight = 0;
    int error_code = 0;
    std::string error;
    bool finished() const { return in_flight == 0 && (error_code != 0 || done == length); }
  };
  struct Piece {
    uint64_t ticket = 0, offset = 0;  ///< offset: bytes into the request
    size_t bytes = 0;
  };
  void pump();
  void complete(const IoCompletion& c);
  void fail(Request& r, int code, std::string what);
  ReadResult pop_front();
  Request& request(uint64_t ticket) { return requests_[size_t(ticket - requests_.front().ticket)]; }

  std::shared_ptr<const CacheFile> file_;
  DirectReaderOptions opt_;
  std::unique_ptr<IoEngine> engine_;
  int fd_ = -1;
  bool direct_ = false, stopped_ = false;
  std::string engine_name_, fallback_reason_;
  std::deque<Request> requests_;
  std::unordered_map<uint64_t, Piece> pieces_;
  uint64_t next_ticket_ = 1, next_piece_ = 1, reads_started_ = 0;
};

/// What probe_read_bandwidth measured.
struct BandwidthProbe {
  uint64_t bytes = 0;   ///< bytes read
  double seconds = 0;   ///< wall time of the reads
  double gb_per_s = 0;  ///< bytes / seconds / 1e9
  bool direct = false;  ///< O_DIRECT (false: buffered after posix_fadvise(DONTNEED); may read the page cache)
  std::string engine;   ///< "io_uring" or "pread pool (N threads)"
};

/// Times reading the first min(max_bytes, file size) bytes of `path` sequentially with
/// O_DIRECT, `queue_depth` reads of `block_bytes` (a multiple of 4096) in flight: the disk's
/// read bandwidth for the planner. Throws std::runtime_error ("<path>: ...") when the file
/// cannot be opened or a read fails, std::invalid_argument for a bad block size or depth.
BandwidthProbe probe_read_bandwidth(const std::string& path, uint64_t max_bytes, unsigned queue_depth = 8,
                                    size_t block_bytes = size_t(4) << 20,
                                    IoEngineKind engine = IoEngineKind::automatic);

}  // namespace rp::tier
