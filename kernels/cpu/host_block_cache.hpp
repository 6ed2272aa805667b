// Large host blocks for the CPU backend's virtual-GPU memory, mapped straight from the kernel
// (mmap) and kept after free() in a cache keyed by size: the runtime allocates the same stage
// buffers (weights, gradients, activations, scratch) pass after pass, so after the first pass
// every allocation is served from the cache without a system call or a page fault.
//
// Why not malloc: blocks of 64 KiB - 32 MiB freed by one thread and reallocated by another
// land in glibc's per-thread arenas (the mmap threshold rises to the largest size freed), which
// keep the freed memory: the default job's resident memory grew by ~50 MB per step. Forcing
// every block through mmap (MALLOC_MMAP_THRESHOLD_) keeps memory flat but faults in and zeroes
// every page again each pass (the run is 75% slower). The cache does neither.
//
// Bound: live plus cached bytes never exceed `capacity` (a request that would exceed it first
// unmaps cached blocks), and the cached bytes alone never exceed the peak of live bytes seen so
// far (blocks of sizes no longer requested, e.g. after a re-plan, are unmapped first-in first-out
// once newer ones arrive). Thread-safe. Sizes are rounded up to whole pages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

namespace rp {

class HostBlockCache {
 public:
  /// `capacity`: bytes live + cached may reach (the device's capacity).
  explicit HostBlockCache(size_t capacity);
  ~HostBlockCache();
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  /// A page-aligned block of at least `bytes` (its content is unspecified: a reused block
  /// keeps what it held). Returns nullptr when the system refuses the mapping.
  void* alloc(size_t bytes);
  /// Returns a block of alloc() to the cache; false (and nothing done) for a pointer the
  /// cache did not hand out.
  bool free(void* p);
  /// Unmaps every cached block.
  void trim();

  size_t live_bytes() const;    ///< page-rounded bytes of blocks handed out
  size_t cached_bytes() const;  ///< page-rounded bytes of freed blocks kept for reuse
  int64_t maps() const;         ///< mmap calls so far (steady-state reuse makes none)
  int64_t unmaps() const;       ///< munmap calls so far

 private:
  using Order = std::list<std::pair<size_t, void*>>;  // cached blocks, oldest first
  void unmap_oldest();                                // mu_ held
  size_t cap_;
  mutable std::mutex mu_;
  size_t live_ = 0, cached_ = 0, peak_live_ = 0;
  int64_t maps_ = 0, unmaps_ = 0;
  std::unordered_map<void*, size_t> sizes_;         // live blocks
  std::multimap<size_t, Order::iterator> by_size_;  // cached blocks by size
  Order order_;
};

}  // namespace rp
