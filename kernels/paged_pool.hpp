// A device memory pool that does not fragment: every allocation above kSmallAllocationBytes
// gets its own physical pages (a multiple of the granule) mapped at a fresh, contiguous range
// of a large virtual address reservation, so "the charged bytes in use plus this request fit
// the capacity" is enough for an allocation to succeed, whatever was freed before. The CUDA
// backend drives it with the driver's virtual memory management (cuMemCreate / cuMemMap);
// tests drive it with a fake page backend (no memory is ever touched by the pool itself).
//
// Freed large allocations stay mapped in a cache keyed by size and are reused by the next
// request of the same size without any driver call (the runtime allocates the same stage
// buffers pass after pass); a request that would push charged-plus-cached bytes over the
// capacity first unmaps cached pages. Small allocations (<= kSmallAllocationBytes) are
// sub-allocated best-fit from shared pages of one granule; their pages are not charged
// beyond the 256-byte-rounded bytes of the allocations they hold.
//
// Accounting: pool_allocation_bytes(bytes, granule) per allocation (kernels/device.hpp).
// Thread-safe. Errors: DeviceOutOfMemory when the capacity (or the page backend) refuses;
// whatever the page backend throws for a failed driver call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace rp {

/// Physical pages and virtual address ranges, as a GPU driver provides them.
class PageBackend {
 public:
  virtual ~PageBackend() = default;
  /// Reserves `bytes` of virtual addresses aligned to `align`; returns the start.
  virtual uintptr_t reserve(size_t bytes, size_t align) = 0;
  virtual void unreserve(uintptr_t va, size_t bytes) = 0;
  /// Creates `bytes` of physical memory (a multiple of the granule); returns a handle.
  /// Throws DeviceOutOfMemory when the device has no such memory left.
  virtual uint64_t create(size_t bytes) = 0;
  virtual void release(uint64_t handle) = 0;
  /// Maps handle's memory at [va, va + bytes) readable and writable by the device.
  virtual void map(uintptr_t va, size_t bytes, uint64_t handle) = 0;
  virtual void unmap(uintptr_t va, size_t bytes) = 0;
  /// Free physical bytes of the device (for error messages).
  virtual size_t device_free_bytes() { return 0; }
};

class PagedPool {
 public:
  /// `granule`: page size of `backend` (a power of two >= 256, e.g. kCudaPoolGranule);
  /// `name` prefixes error messages; `va_bytes`: virtual addresses reserved at a time.
  PagedPool(PageBackend& backend, size_t capacity, size_t granule, std::string name,
            size_t va_bytes = size_t(1) << 40);
  ~PagedPool();
  PagedPool(const PagedPool&) = delete;
  PagedPool& operator=(const PagedPool&) = delete;

  void* alloc(size_t bytes);
  /// Frees what alloc returned (null and unknown pointers are ignored).
  void free(void* p);

  size_t capacity() const { return cap_; }
  size_t granule() const { return gran_; }
  size_t used_bytes() const;    ///< charged bytes of live allocations
  size_t peak_bytes() const;    ///< maximum of used_bytes() so far
  size_t cached_bytes() const;  ///< freed large allocations still mapped for reuse
  /// Driver calls made so far (creates + maps + unmaps); steady-state reuse makes none.
  int64_t driver_calls() const;
  /// Unmaps and releases every cached allocation and every empty small page.
  void trim();

 private:
  struct Mapping {
    size_t bytes;
    uint64_t handle;
  };
  struct Block {  // inside a small page
    size_t size;
    bool free;
    uintptr_t page;
  };
  uintptr_t map_new(size_t bytes);  // physical + virtual, mapped (mu_ held)
  void unmap_release(uintptr_t va, const Mapping& m);
  void make_room(size_t bytes);  // unmaps cached allocations until bytes fit (mu_ held)
  uintptr_t take_va(size_t bytes);
  void give_va(uintptr_t va, size_t bytes);
  void* alloc_small(size_t sz);
  void free_small(std::map<uintptr_t, Block>::iterator it);
  void drop_empty_pages();
  [[noreturn]] void out_of_memory(size_t sz, size_t requested, const std::string& why) const;

  PageBackend& be_;
  size_t cap_, gran_;
  std::string name_;
  size_t va_chunk_;
  mutable std::mutex mu_;
  size_t used_ = 0, peak_ = 0, cached_ = 0;
  int64_t calls_ = 0;
  std::vector<std::pair<uintptr_t, size_t>> reservations_;
  std::map<uintptr_t, size_t> va_free_;  // start -> size
  std::set<std::pair<size_t, uintptr_t>> va_by_size_;
  std::map<uintptr_t, Mapping> live_;                            // large allocations in use
  std::multimap<size_t, std::pair<uintptr_t, uint64_t>> cache_;  // size -> (va, handle)
  std::map<uintptr_t, Mapping> pages_;                           // small pages
  std::map<uintptr_t, Block> blocks_;                            // small blocks by address
  std::set<std::pair<size_t, uintptr_t>> small_free_;
};

}  // namespace rp
