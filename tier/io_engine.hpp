// The asynchronous read engine under the disk tier: reads of (fd, offset, length) into host
// buffers, submitted up to a bounded depth and completed in any order. Two implementations:
// io_uring (liburing's basic API: queue_init, get_sqe, prep_read, submit, wait_cqe / peek_cqe,
// cqe_seen, queue_exit) and, where io_uring cannot be set up (EPERM under a seccomp profile,
// ENOSYS on an old kernel) or is not wanted, a small pool of threads calling pread.
//
// Thread-safety: one IoEngine is driven by one thread at a time (submit / wait / poll); the
// pread pool's own threads are internal. The destructor waits for every read in flight (the
// kernel or a pool thread may still write into a caller's buffer until then).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace rp::tier {

/// One read: `bytes` bytes of `fd` at byte `offset` into `dst`. `id` is the caller's tag.
struct IoRead {
  uint64_t id = 0;
  int fd = -1;
  void* dst = nullptr;
  size_t bytes = 0;
  uint64_t offset = 0;
};

/// A finished read: `result` is the bytes read (0 at end of file, fewer than asked on a
/// short read) or -errno.
struct IoCompletion {
  uint64_t id = 0;
  int64_t result = 0;
};

/// Which engine to use: `automatic` is io_uring when it can be set up, else the pread pool.
enum class IoEngineKind { automatic, io_uring, pread_pool };

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  /// Queues one read. At most depth() reads may be in flight (submitted, not yet returned by
  /// wait / poll); one more throws std::logic_error.
  virtual void submit(const IoRead& r) = 0;
  /// Blocks until a read completes and returns it; std::logic_error when none is in flight.
  virtual IoCompletion wait() = 0;
  /// A completed read if one is ready, without blocking.
  virtual std::optional<IoCompletion> poll() = 0;
  virtual size_t in_flight() const = 0;
  virtual unsigned depth() const = 0;
  /// "io_uring" or "pread pool (N threads)".
  virtual std::string name() const = 0;
};

/// The engine `kind` asks for, `depth` reads in flight at most (1..4096). automatic: io_uring,
/// or when io_uring_queue_init fails the pread pool with `fallback_reason` set to one line
/// saying why ("io_uring_queue_init: Operation not permitted"; logged once per process as a
/// warning). io_uring asked for explicitly and failing throws std::runtime_error with that
/// line. `pread_threads` sizes the pool (at most `depth`).
std::unique_ptr<IoEngine> make_io_engine(IoEngineKind kind, unsigned depth, unsigned pread_threads = 4,
                                         std::string* fallback_reason = nullptr);

/// Test hook: when set (non-zero), io_uring_queue_init is not called and fails with this errno,
/// as under a seccomp profile that refuses io_uring. Not thread-safe: set it while no engine
/// is being made.
void set_io_uring_init_failure_for_testing(int err);

}  // namespace rp::tier
