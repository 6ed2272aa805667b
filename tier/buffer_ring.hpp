// A bounded ring of equally sized host buffers for the disk tier: a reader fills one, the
// uploader empties it, and when all are in use the next acquire waits (backpressure), so the
// host memory a streamed stage needs is count x buffer_bytes whatever the model's size.
//
// The buffers come from an injected allocator (std::function pair): the default is
// 4096-aligned pageable memory; the CUDA backend can hand pinned memory instead. Every buffer
// must be 4096-aligned (O_DIRECT reads land in it) and is rounded up to a multiple of 4096.
//
// Thread-safety: acquire, release (through a Lease), stop, available are safe from any
// threads. The ring must outlive its leases; its destructor frees every buffer, so every
// lease must have been released (destroyed) before: a lease still held aborts with a message,
// as a buffer the kernel or a GPU copy may still use cannot be freed safely.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <stop_token>
#include <vector>

namespace rp::tier {

/// The alignment of every tier buffer and of every offset and length of an O_DIRECT read.
inline constexpr size_t kDirectAlign = 4096;

/// `n` rounded up to a multiple of kDirectAlign.
constexpr uint64_t align_up(uint64_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

/// Where the ring's buffers come from: `allocate(bytes)` returns a 4096-aligned buffer of at
/// least `bytes` bytes (or throws; nullptr counts as failure), `free(ptr, bytes)` gives it back.
struct HostAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* ptr, size_t bytes)> free;
};

/// 4096-aligned pageable host memory (std::aligned_alloc / std::free).
HostAllocator aligned_host_allocator();

class BufferRing {
 public:
  /// One buffer in use, returned to the ring by release() or the destructor. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }
    /// The buffer (4096-aligned, bytes() long); nullptr once released.
    std::byte* data() const { return data_; }
    size_t bytes() const { return bytes_; }
    /// Which of the ring's buffers (0..count-1): stable for the ring's lifetime.
    size_t index() const { return index_; }
    explicit operator bool() const { return data_ != nullptr; }
    /// Returns the buffer to the ring (waking one waiter); a second call does nothing.
    void release();

   private:
    friend class BufferRing;
    Lease(BufferRing* ring, size_t index, std::byte* data, size_t bytes)
        : ring_(ring), index_(index), data_(data), bytes_(bytes) {}
    BufferRing* ring_ = nullptr;
    size_t index_ = 0;
    std::byte* data_ = nullptr;
    size_t bytes_ = 0;
  };

  /// `count` buffers (>= 1) of align_up(buffer_bytes) bytes (buffer_bytes >= 1), all allocated
  /// now. Throws std::invalid_argument for a zero count or size and std::runtime_error
  /// ("buffer ring: allocating buffer i of N (B bytes) failed: ...") when the allocator fails
  /// or returns a buffer that is not 4096-aligned (what was allocated is freed).
  BufferRing(size_t count, size_t buffer_bytes, HostAllocator allocator = aligned_host_allocator());
  ~BufferRing();
  BufferRing(const BufferRing&) = delete;
  BufferRing& operator=(const BufferRing&) = delete;

  /// A free buffer, waiting while all are in use. nullopt when `timeout` passes, when `stop`
  /// is requested, or once stop() was called (then at once, also for waiters already blocked).
  /// Buffers are handed out lowest free index first.
  std::optional<Lease> acquire(std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max(),
                               std::stop_token stop = {});
  /// A free buffer if one is free now, else nullopt (never waits).
  std::optional<Lease> try_acquire() { return acquire(std::chrono::nanoseconds::zero()); }
  /// Wakes every waiter with nullopt and refuses later acquires; leases out stay valid and
  /// are still released normally. For shutdown.
  void stop();
  /// Buffers free now.
  size_t available() const;
  size_t count() const { return buffers_.size(); }
  size_t buffer_bytes() const { return bytes_; }

 private:
  void give_back(size_t index);
  HostAllocator allocator_;
  size_t bytes_;
  std::vector<std::byte*> buffers_;
  std::vector<bool> in_use_;
  size_t free_count_ = 0;
  bool stopped_ = false;
  mutable std::mutex m_;
  std::condition_variable_any cv_;
};

}  // namespace rp::tier
