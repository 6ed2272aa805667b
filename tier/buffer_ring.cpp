#include "tier/buffer_ring.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>

#include <fmt/format.h>

namespace rp::tier {

HostAllocator aligned_host_allocator() {
  return {[](size_t bytes) -> void* {
            void* p = std::aligned_alloc(kDirectAlign, align_up(bytes));
            if (!p) throw std::bad_alloc();
            return p;
          },
          [](void* p, size_t) { std::free(p); }};
}

BufferRing::Lease& BufferRing::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    ring_ = o.ring_, index_ = o.index_, data_ = o.data_, bytes_ = o.bytes_;
    o.ring_ = nullptr, o.data_ = nullptr;
  }
  return *this;
}

void BufferRing::Lease::release() {
  if (ring_ && data_) ring_->give_back(index_);
  ring_ = nullptr, data_ = nullptr;
}

BufferRing::BufferRing(size_t count, size_t buffer_bytes, HostAllocator allocator)
    : allocator_(std::move(allocator)), bytes_(align_up(buffer_bytes)) {
  if (count == 0 || buffer_bytes == 0)
    throw std::invalid_argument(
        fmt::format("buffer ring: {} buffers of {} bytes; both must be at least 1", count, buffer_bytes));
  if (!allocator_.allocate || !allocator_.free)
    throw std::invalid_argument("buffer ring: the allocator needs both allocate and free");
  buffers_.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    std::string why;
    void* p = nullptr;
    try {
      p = allocator_.allocate(bytes_);
      if (!p) why = "the allocator returned null";
      else if (reinterpret_cast<uintptr_t>(p) % kDirectAlign != 0)
        why = fmt::format("the allocator returned {} , not {}-aligned", p, kDirectAlign);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      if (p) allocator_.free(p, bytes_);
      for (auto* b : buffers_) allocator_.free(b, bytes_);
      throw std::runtime_error(fmt::format("buffer ring: allocating buffer {} of {} ({} bytes) failed: {}", i,
                                           count, bytes_, why));
    }
    buffers_.push_back(static_cast<std::byte*>(p));
  }
  in_use_.assign(count, false);
  free_count_ = count;
}

BufferRing::~BufferRing() {
  {
    std::lock_guard l(m_);
    if (free_count_ != buffers_.size()) {
      std::fprintf(stderr, "buffer ring: destroyed with %zu of %zu buffers still leased\n",
                   buffers_.size() - free_count_, buffers_.size());
      std::abort();
    }
  }
  for (auto* b : buffers_) allocator_.free(b, bytes_);
}

std::optional<BufferRing::Lease> BufferRing::acquire(std::chrono::nanoseconds timeout, std::stop_token stop) {
  std::unique_lock l(m_);
  const auto ready = [&] { return stopped_ || free_count_ > 0; };
  if (timeout == std::chrono::nanoseconds::max()) {
    cv_.wait(l, stop, ready);
  } else {
    // a deadline far in the future overflows steady_clock: clamp
    const auto wait = std::min<std::chrono::nanoseconds>(timeout, std::chrono::hours(24 * 365));
    cv_.wait_for(l, stop, wait, ready);
  }
  if (stopped_ || free_count_ == 0 || stop.stop_requested()) return std::nullopt;
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (!in_use_[i]) {
      in_use_[i] = true;
      --free_count_;
      return Lease(this, i, buffers_[i], bytes_);
    }
  return std::nullopt;  // unreachable: free_count_ > 0
}

void BufferRing::give_back(size_t index) {
  {
    std::lock_guard l(m_);
    in_use_[index] = false;
    ++free_count_;
  }
  cv_.notify_one();
}

void BufferRing::stop() {
  {
    std::lock_guard l(m_);
    stopped_ = true;
  }
  cv_.notify_all();
}

size_t BufferRing::available() const {
  std::lock_guard l(m_);
  return free_count_;
}

}  // namespace rp::tier
