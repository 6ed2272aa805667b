#include "kernels/cpu/host_block_cache.hpp"

#include <sys/mman.h>
#include <unistd.h>

namespace rp {
namespace {
size_t page_round(size_t bytes) {
  static const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t b = bytes == 0 ? 1 : bytes;
  return (b + page - 1) / page * page;
}
}  // namespace

HostBlockCache::HostBlockCache(size_t capacity) : cap_(capacity) {}

HostBlockCache::~HostBlockCache() {
  trim();
  for (auto& [p, sz] : sizes_) ::munmap(p, sz);  // blocks never freed (a failed run)
}

void HostBlockCache::unmap_oldest() {
  auto [sz, p] = order_.front();
  auto range = by_size_.equal_range(sz);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == order_.begin()) {
      by_size_.erase(it);
      break;
    }
  order_.pop_front();
  cached_ -= sz;
  ::munmap(p, sz);
  ++unmaps_;
}

void* HostBlockCache::alloc(size_t bytes) {
  const size_t sz = page_round(bytes);
  std::lock_guard lk(mu_);
  void* p = nullptr;
  if (auto it = by_size_.find(sz); it != by_size_.end()) {
    p = it->second->second;
    order_.erase(it->second);
    by_size_.erase(it);
    cached_ -= sz;
  } else {
    while (!order_.empty() && live_ + cached_ + sz > cap_) unmap_oldest();
    void* m = ::mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED && !order_.empty()) {  // the system is short: give the cache back, retry
      while (!order_.empty()) unmap_oldest();
      m = ::mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (m == MAP_FAILED) return nullptr;
    ++maps_;
    p = m;
  }
  sizes_[p] = sz;
  live_ += sz;
  if (live_ > peak_live_) peak_live_ = live_;
  return p;
}

bool HostBlockCache::free(void* p) {
  std::lock_guard lk(mu_);
  auto it = sizes_.find(p);
  if (it == sizes_.end()) return false;
  const size_t sz = it->second;
  sizes_.erase(it);
  live_ -= sz;
  if (sz > peak_live_) {  // cannot happen (peak >= every live block); keep the bound anyway
    ::munmap(p, sz);
    ++unmaps_;
    return true;
  }
  while (!order_.empty() && cached_ + sz > peak_live_) unmap_oldest();
  order_.emplace_back(sz, p);
  by_size_.emplace(sz, std::prev(order_.end()));
  cached_ += sz;
  return true;
}

void HostBlockCache::trim() {
  std::lock_guard lk(mu_);
  while (!order_.empty()) unmap_oldest();
}

size_t HostBlockCache::live_bytes() const {
  std::lock_guard lk(mu_);
  return live_;
}
size_t HostBlockCache::cached_bytes() const {
  std::lock_guard lk(mu_);
  return cached_;
}
int64_t HostBlockCache::maps() const {
  std::lock_guard lk(mu_);
  return maps_;
}
int64_t HostBlockCache::unmaps() const {
  std::lock_guard lk(mu_);
  return unmaps_;
}

}  // namespace rp
