// The runtime side of the disk tier (SessionOptions::frozen_tier): a session's frozen groups
// live in a tier cache file (tier/cache_file.hpp) instead of host memory, and one FrozenTier
// per session streams them back through a small ring of host buffers for the workers.
//
//   worker prepare(task)      fetch(g, done)        request queued (FIFO over all workers)
//   FrozenTier's thread       ring.acquire()        waits while every buffer is leased
//                             DirectReader read     the whole entry, checksums verified
//                             done(ticket, "")      the worker gets FrozenFetched (a message)
//   worker                    send_pieces from data(ticket), FrozenLease held by the task
//   worker weights_landed     the group's last chunk landed: the lease goes (release(ticket))
//
// A failed read calls done(ticket, error) with the reader's one line (the file, the entry and
// its offset) and holds no buffer. A fetch whose task is gone by the time it is delivered is
// released by the worker at once; a task that dies releases its leases with it (FrozenLease).
// Leases never wait on one another: a leased buffer is released once its chunks land, so
// requests are served in order however small the ring (two buffers at least).
//
// Thread-safety: fetch, data, release, leased may be called from any threads. stop() drops
// the queued requests (their callbacks never run, and the callbacks they hold are destroyed),
// waits for the thread, and frees the leases still held: call it once no worker can touch a
// buffer any more (the session does, after its actors are done).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tier/buffer_ring.hpp"
#include "tier/cache_file.hpp"
#include "tier/direct_reader.hpp"

namespace rp {

class FrozenTier {
 public:
  /// Called on the tier's thread with the fetch's ticket and "" (data(ticket) holds the group's
  /// storage bytes until release(ticket)) or the read's one-line error (nothing to release).
  using Done = std::function<void(uint64_t ticket, const std::string& error)>;

  /// `entry_of_group[g]`: group g's entry in `file`, -1 for a group not in the tier.
  /// `ring_buffers` (>= 2) buffers of the largest entry's padded bytes from `allocator`.
  /// Throws as BufferRing and DirectReader do.
  FrozenTier(std::shared_ptr<const tier::CacheFile> file, std::vector<int> entry_of_group,
             size_t ring_buffers, tier::HostAllocator allocator, tier::DirectReaderOptions reader = {});
  ~FrozenTier();
  FrozenTier(const FrozenTier&) = delete;
  FrozenTier& operator=(const FrozenTier&) = delete;

  /// Whether group g streams from the tier.
  bool tiered(int g) const { return g >= 0 && size_t(g) < entry_.size() && entry_[size_t(g)] >= 0; }
  /// Queues a read of group g (tiered(g)); `done` runs once it is read or failed. Returns the
  /// ticket. After stop(): the ticket of a request that is never served.
  uint64_t fetch(int g, Done done);
  /// The buffer of a delivered fetch (nullptr for an unknown or released ticket).
  const std::byte* data(uint64_t ticket) const;
  /// Gives a delivered fetch's buffer back to the ring; unknown tickets: nothing.
  void release(uint64_t ticket);
  /// Delivered fetches not released yet.
  size_t leased() const;
  void stop();

  /// Group g's storage bytes, read with buffered reads and verified (group_weights_f32).
  std::vector<uint8_t> read_group(int g) const;

  const tier::CacheFile& file() const { return *file_; }
  size_t ring_buffers() const { return ring_.count(); }
  size_t buffer_bytes() const { return ring_.buffer_bytes(); }
  bool direct() const { return reader_.direct(); }
  std::string engine() const { return reader_.engine_name(); }
  /// The reads served so far (failed ones not counted): how many, their storage bytes, and the
  /// seconds the reader spent on them, from submitting a read to its result (the waits for a
  /// free ring buffer left out, so bytes / seconds is the disk's rate while it was read).
  struct ReadTotals {
    uint64_t reads = 0, bytes = 0;
    double seconds = 0;
  };
  ReadTotals read_totals() const;

 private:
  struct Request {
    uint64_t ticket = 0;
    int group = -1;
    Done done;
  };
  void serve(std::stop_token st);
  void read_one(Request& r, std::stop_token st);

  std::shared_ptr<const tier::CacheFile> file_;
  std::vector<int> entry_;
  tier::BufferRing ring_;
  tier::DirectReader reader_;  ///< driven by the thread only
  mutable std::mutex m_;
  std::condition_variable_any cv_;
  std::deque<Request> queue_;
  std::map<uint64_t, tier::BufferRing::Lease> leases_;  ///< delivered, not released
  uint64_t next_ticket_ = 1;
  bool stopped_ = false;
  ReadTotals totals_;    ///< under m_
  std::jthread thread_;  ///< last: stopped and joined first
};

/// A task's hold on a delivered fetch: releases it when destroyed. Move-only.
class FrozenLease {
 public:
  FrozenLease() = default;
  FrozenLease(FrozenTier* tier, uint64_t ticket) : tier_(tier), ticket_(ticket) {}
  FrozenLease(FrozenLease&& o) noexcept { *this = std::move(o); }
  FrozenLease& operator=(FrozenLease&& o) noexcept {
    if (this != &o) {
      reset();
      tier_ = o.tier_;
      ticket_ = o.ticket_;
      o.tier_ = nullptr;
    }
    return *this;
  }
  FrozenLease(const FrozenLease&) = delete;
  FrozenLease& operator=(const FrozenLease&) = delete;
  ~FrozenLease() { reset(); }
  const std::byte* data() const { return tier_ ? tier_->data(ticket_) : nullptr; }
  void reset() {
    if (tier_) tier_->release(ticket_);
    tier_ = nullptr;
  }

 private:
  FrozenTier* tier_ = nullptr;
  uint64_t ticket_ = 0;
};

}  // namespace rp
