// Progress of a session's runtime, counted by its actors: the scheduler's watchdog tells a
// slow run (the count moves) from a stalled one (it does not).
#pragma once
#include <atomic>
#include <cstdint>

namespace rp {

struct RunProgress {
  /// Completed copies, micro-batches, optimizer jobs and stage tasks so far (any thread).
  std::atomic<uint64_t> events{0};
  void tick() { events.fetch_add(1, std::memory_order_relaxed); }
  uint64_t count() const { return events.load(std::memory_order_relaxed); }
};

}  // namespace rp
