// PagedPool (kernels/paged_pool.hpp).
#include "kernels/paged_pool.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "base/counted.hpp"
#include "kernels/device.hpp"

namespace rp {

PagedPool::PagedPool(PageBackend& backend, size_t capacity, size_t granule, std::string name, size_t va_bytes)
    : be_(backend), cap_(capacity), gran_(granule), name_(std::move(name)) {
  if (gran_ < 256 || (gran_ & (gran_ - 1)) != 0)
    throw std::invalid_argument(
        fmt::format("{}: page granule {} is not a power of two >= 256", name_, gran_));
  va_chunk_ = std::max(va_bytes / gran_ * gran_, gran_);
}

PagedPool::~PagedPool() {
  std::lock_guard lk(mu_);
  auto quietly = [](auto&& f) {
    try {
      f();
    } catch (...) {}
  };
  for (auto& [va, m] : live_)
    quietly([&] {
      be_.unmap(va, m.bytes);
      be_.release(m.handle);
    });
  for (auto& [size, e] : cache_)
    quietly([&] {
      be_.unmap(e.first, size);
      be_.release(e.second);
    });
  for (auto& [va, m] : pages_)
    quietly([&] {
      be_.unmap(va, m.bytes);
      be_.release(m.handle);
    });
  for (auto& [va, n] : reservations_) quietly([&] { be_.unreserve(va, n); });
}

size_t PagedPool::used_bytes() const {
  std::lock_guard lk(mu_);
  return used_;
}
size_t PagedPool::peak_bytes() const {
  std::lock_guard lk(mu_);
  return peak_;
}
size_t PagedPool::cached_bytes() const {
  std::lock_guard lk(mu_);
  return cached_;
}
int64_t PagedPool::driver_calls() const {
  std::lock_guard lk(mu_);
  return calls_;
}

void PagedPool::out_of_memory(size_t sz, size_t requested, const std::string& why) const {
  throw DeviceOutOfMemory(fmt::format("{}: cannot allocate {} ({} requested): {} of its {} capacity in use{}",
                                      name_, byte_text(double(sz)), byte_text(double(requested)),
                                      byte_text(double(used_)), byte_text(double(cap_)), why));
}

void* PagedPool::alloc(size_t bytes) {
  const size_t sz = pool_allocation_bytes(bytes, gran_);
  std::lock_guard lk(mu_);
  if (used_ + sz > cap_) out_of_memory(sz, bytes, "");
  void* p = nullptr;
  if (sz <= kSmallAllocationBytes) {
    make_room(sz);
    p = alloc_small(sz);
  } else {
    auto hit = cache_.find(sz);
    if (hit != cache_.end()) {  // same size as a freed one: reuse its pages, no driver call
      const auto [va, h] = hit->second;
      cache_.erase(hit);
      cached_ -= sz;
      live_[va] = Mapping{sz, h};
      p = reinterpret_cast<void*>(va);
    } else {
      make_room(sz);
      uintptr_t va = 0;
      uint64_t h = 0;
      try {
        h = be_.create(sz);
      } catch (
          const DeviceOutOfMemory&) {  // the device itself is full: give back every cached page and retry
        for (auto& [size, e] : cache_) unmap_release(e.first, Mapping{size, e.second});
        cache_.clear();
        cached_ = 0;
        drop_empty_pages();
        try {
          h = be_.create(sz);
        } catch (const DeviceOutOfMemory&) {
          out_of_memory(sz, bytes,
                        fmt::format(", and the GPU itself has only {:.1f} MiB free",
                                    double(be_.device_free_bytes()) / 1048576.0));
        }
      }
      ++calls_;
      try {
        va = take_va(sz);
        be_.map(va, sz, h);
        ++calls_;
      } catch (...) {
        be_.release(h);
        if (va) give_va(va, sz);
        throw;
      }
      live_[va] = Mapping{sz, h};
      p = reinterpret_cast<void*>(va);
    }
  }
  used_ += sz;
  peak_ = std::max(peak_, used_);
  return p;
}

void PagedPool::free(void* vp) {
  if (!vp) return;
  const auto va = reinterpret_cast<uintptr_t>(vp);
  std::lock_guard lk(mu_);
  if (auto it = live_.find(va); it != live_.end()) {
    // stays mapped: the next request of this size takes it without a driver call
    cache_.emplace(it->second.bytes, std::make_pair(va, it->second.handle));
    cached_ += it->second.bytes;
    used_ -= it->second.bytes;
    live_.erase(it);
    return;
  }
  auto it = blocks_.find(va);
  if (it == blocks_.end() || it->second.free) return;
  used_ -= it->second.size;
  free_small(it);
}

void PagedPool::trim() {
  std::lock_guard lk(mu_);
  for (auto& [size, e] : cache_) unmap_release(e.first, Mapping{size, e.second});
  cache_.clear();
  cached_ = 0;
  drop_empty_pages();
}

void PagedPool::make_room(size_t bytes) {
  while (used_ + cached_ + bytes > cap_ && !cache_.empty()) {
    auto it = std::prev(cache_.end());  // the largest cached allocation first
    unmap_release(it->second.first, Mapping{it->first, it->second.second});
    cached_ -= it->first;
    cache_.erase(it);
  }
}

void PagedPool::unmap_release(uintptr_t va, const Mapping& m) {
  be_.unmap(va, m.bytes);
  be_.release(m.handle);
  calls_ += 2;
  give_va(va, m.bytes);
}

uintptr_t PagedPool::take_va(size_t bytes) {
  auto it = va_by_size_.lower_bound({bytes, 0});
  if (it == va_by_size_.end()) {
    const size_t n = std::max(va_chunk_, (bytes + gran_ - 1) / gran_ * gran_);
    const uintptr_t base = be_.reserve(n, gran_);
    reservations_.push_back({base, n});
    std::sort(reservations_.begin(), reservations_.end());
    va_free_[base] = n;
    it = va_by_size_.insert({n, base}).first;
  }
  const auto [size, start] = *it;
  va_by_size_.erase(it);
  va_free_.erase(start);
  if (size > bytes) {
    va_free_[start + bytes] = size - bytes;
    va_by_size_.insert({size - bytes, start + bytes});
  }
  return start;
}

void PagedPool::give_va(uintptr_t va, size_t bytes) {
  // coalesce with free neighbours inside the same reservation (a mapping never spans two)
  auto res = std::upper_bound(reservations_.begin(), reservations_.end(), std::make_pair(va, ~size_t(0)));
  const uintptr_t lo = res == reservations_.begin() ? va : std::prev(res)->first;
  const uintptr_t hi =
      res == reservations_.begin() ? va + bytes : std::prev(res)->first + std::prev(res)->second;
  uintptr_t start = va;
  size_t size = bytes;
  auto next = va_free_.lower_bound(va);
  if (next != va_free_.end() && next->first == va + bytes && next->first + next->second <= hi) {
    va_by_size_.erase({next->second, next->first});
    size += next->second;
    next = va_free_.erase(next);
  }
  if (next != va_free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == va && prev->first >= lo) {
      va_by_size_.erase({prev->second, prev->first});
      start = prev->first;
      size += prev->second;
      va_free_.erase(prev);
    }
  }
  va_free_[start] = size;
  va_by_size_.insert({size, start});
}

void* PagedPool::alloc_small(size_t sz) {
  auto it = small_free_.lower_bound({sz, 0});
  if (it == small_free_.end()) {
    uint64_t h = be_.create(gran_);
    ++calls_;
    uintptr_t va = 0;
    try {
      va = take_va(gran_);
      be_.map(va, gran_, h);
      ++calls_;
    } catch (...) {
      be_.release(h);
      if (va) give_va(va, gran_);
      throw;
    }
    pages_[va] = Mapping{gran_, h};
    blocks_[va] = Block{gran_, true, va};
    it = small_free_.insert({gran_, va}).first;
  }
  const uintptr_t p = it->second;
  small_free_.erase(it);
  Block& b = blocks_.at(p);
  if (b.size > sz) {  // split: the tail stays free
    blocks_[p + sz] = Block{b.size - sz, true, b.page};
    small_free_.insert({b.size - sz, p + sz});
    b.size = sz;
  }
  b.free = false;
  return reinterpret_cast<void*>(p);
}

void PagedPool::free_small(std::map<uintptr_t, Block>::iterator it) {
  it->second.free = true;
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free && next->second.page == it->second.page &&
      it->first + it->second.size == next->first) {
    small_free_.erase({next->second.size, next->first});
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.page == it->second.page &&
        prev->first + prev->second.size == it->first) {
      small_free_.erase({prev->second.size, prev->first});
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  small_free_.insert({it->second.size, it->first});
}

void PagedPool::drop_empty_pages() {
  for (auto it = pages_.begin(); it != pages_.end();) {
    auto b = blocks_.find(it->first);
    if (b != blocks_.end() && b->second.free && b->second.size == it->second.bytes) {
      small_free_.erase({b->second.size, b->first});
      blocks_.erase(b);
      unmap_release(it->first, it->second);
      it = pages_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace rp
