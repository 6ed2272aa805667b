#include "actors/frozen_tier.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {
namespace {

size_t largest_entry(const tier::CacheFile& f, const std::vector<int>& entry_of_group) {
  uint64_t most = 0;
  for (int e : entry_of_group)
    if (e >= 0) most = std::max(most, f.entry(size_t(e)).padded_bytes());
  return size_t(std::max<uint64_t>(most, tier::kDirectAlign));
}

}  // namespace

FrozenTier::FrozenTier(std::shared_ptr<const tier::CacheFile> file, std::vector<int> entry_of_group,
                       size_t ring_buffers, tier::HostAllocator allocator, tier::DirectReaderOptions reader)
    : file_(std::move(file)),
      entry_(std::move(entry_of_group)),
      ring_(ring_buffers, largest_entry(*file_, entry_), std::move(allocator)),
      reader_(file_, std::move(reader)) {
  if (ring_buffers < 2)
    throw std::invalid_argument(
        fmt::format("frozen tier: the ring needs at least 2 buffers, got {}", ring_buffers));
  thread_ = std::jthread([this](std::stop_token st) { serve(st); });
}

FrozenTier::~FrozenTier() { stop(); }

uint64_t FrozenTier::fetch(int g, Done done) {
  if (!tiered(g)) throw std::logic_error(fmt::format("frozen tier: group {} is not in the tier", g));
  std::lock_guard lk(m_);
  const uint64_t ticket = next_ticket_++;
  if (stopped_) return ticket;
  queue_.push_back(Request{ticket, g, std::move(done)});
  cv_.notify_one();
  return ticket;
}

const std::byte* FrozenTier::data(uint64_t ticket) const {
  std::lock_guard lk(m_);
  auto it = leases_.find(ticket);
  return it == leases_.end() ? nullptr : it->second.data();
}

void FrozenTier::release(uint64_t ticket) {
  tier::BufferRing::Lease gone;
  {
    std::lock_guard lk(m_);
    auto it = leases_.find(ticket);
    if (it == leases_.end()) return;
    gone = std::move(it->second);
    leases_.erase(it);
  }
  // released outside the lock: it wakes the tier's thread waiting in acquire
}

size_t FrozenTier::leased() const {
  std::lock_guard lk(m_);
  return leases_.size();
}

void FrozenTier::stop() {
  std::deque<Request> dropped;
  {
    std::lock_guard lk(m_);
    if (stopped_ && !thread_.joinable()) return;
    stopped_ = true;
    dropped.swap(queue_);
  }
  thread_.request_stop();
  ring_.stop();  // a read waiting for a buffer gives up
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  dropped.clear();  // the callbacks (and the actor handles they hold) go here
  std::map<uint64_t, tier::BufferRing::Lease> held;
  {
    std::lock_guard lk(m_);
    held.swap(leases_);
  }
}

void FrozenTier::serve(std::stop_token st) {
  while (!st.stop_requested()) {
    Request r;
    {
      std::unique_lock lk(m_);
      if (!cv_.wait(lk, st, [&] { return !queue_.empty(); })) return;
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    read_one(r, st);
  }
}

// One request: a buffer (waiting while all are leased), the whole entry into it, the callback.
void FrozenTier::read_one(Request& r, std::stop_token st) {
  std::optional<tier::BufferRing::Lease> lease = ring_.acquire(std::chrono::nanoseconds::max(), st);
  if (!lease) return;  // stopping
  const size_t e = size_t(entry_[size_t(r.group)]);
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    tier::ReadRequest rq;
    rq.entry = e;
    rq.dst = lease->data();
    rq.capacity = lease->bytes();
    rq.tag = r.ticket;
    reader_.submit(rq);
    std::optional<tier::ReadResult> res = reader_.next();
    if (!res)
      error =
          fmt::format("{}: entry '{}': the reader returned no result", file_->path(), file_->entry(e).name);
    else error = res->error;
  } catch (const std::exception& x) {
    error = fmt::format("{}: entry '{}': {}", file_->path(), file_->entry(e).name, x.what());
  }
  if (error.empty()) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lk(m_);
    leases_.emplace(r.ticket, std::move(*lease));
    totals_.reads += 1, totals_.bytes += uint64_t(file_->entry(e).bytes), totals_.seconds += seconds;
  } else {
    lease->release();
  }
  r.done(r.ticket, error);
}

FrozenTier::ReadTotals FrozenTier::read_totals() const {
  std::lock_guard lk(m_);
  return totals_;
}

std::vector<uint8_t> FrozenTier::read_group(int g) const {
  if (!tiered(g)) throw std::logic_error(fmt::format("frozen tier: group {} is not in the tier", g));
  const size_t e = size_t(entry_[size_t(g)]);
  std::vector<uint8_t> out(size_t(file_->entry(e).bytes));
  file_->read_entry(e, std::as_writable_bytes(std::span(out)));
  return out;
}

}  // namespace rp
