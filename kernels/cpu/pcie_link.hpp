// A shared host<->device link for the CPU backend's virtual GPUs.
//
// A real PCIe link is one full-duplex pipe that all of a GPU's copy streams share, so an
// activation copy issued behind a parameter upload waits unless the runtime orders them.
// This model gives each direction one channel of `bytes_per_s`; a copy crosses it in chunks
// of `chunk_bytes`, and after every chunk the channel goes to the most urgent waiting copy
// (lowest priority value; FIFO among equals) — or strictly first come, first served when
// priorities are off. A copy therefore waits behind at most one chunk of less urgent traffic.
// interrupt() ends every delay at once (in flight and later), for a teardown with copies
// still on a slow link.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

namespace rp {

class PcieLink {
 public:
  /// bytes_per_s > 0 per direction; chunk_bytes > 0; priorities false = FIFO arbitration.
  PcieLink(double bytes_per_s, size_t chunk_bytes, bool priorities)
      : bw_(bytes_per_s), chunk_(chunk_bytes), prio_(priorities) {}

  /// Blocks the calling (stream) thread until `bytes` crossed channel `dir` (0 = host to
  /// device, 1 = device to host), competing with other callers at `priority` (0 = urgent).
  /// `move(offset, n)`, when given, moves the bytes [offset, offset + n) while their chunk
  /// holds the channel, so data lands chunk by chunk as it would over a real link (and a
  /// copy whose first bytes landed is known to be on the link). After interrupt() the
  /// delays end at once; every remaining byte is still moved.
  void transfer(int dir, size_t bytes, int priority, const std::function<void(size_t, size_t)>& move = {}) {
    Channel& ch = ch_[dir & 1];
    size_t left = bytes;
    std::unique_lock lk(ch.mu);
    const Waiter me{prio_ ? priority : 0, ch.ticket++};
    while (left > 0 && !interrupted_.load()) {
      ch.waiting.insert(me);
      ch.cv.wait(lk, [&] { return interrupted_.load() || (!ch.busy && *ch.waiting.begin() == me); });
      ch.waiting.erase(me);
      if (interrupted_.load()) break;
      ch.busy = true;
      const size_t n = std::min(left, chunk_);
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                 std::chrono::duration<double>(double(n) / bw_));
      if (move) {  // the channel stays ours (busy) while the lock is released for the copy
        lk.unlock();
        move(bytes - left, n);
        lk.lock();
      }
      ch.cv.wait_until(lk, until, [&] { return interrupted_.load(); });  // the chunk crosses the link
      ch.busy = false;
      left -= n;
      ch.cv.notify_all();
    }
    if (move && left > 0) move(bytes - left, left);  // interrupted: the data still lands
  }

  /// Ends every delay now and makes later transfers instant (any thread; irreversible).
  void interrupt() {
    interrupted_.store(true);
    for (Channel& ch : ch_) {
      std::lock_guard lk(ch.mu);
      ch.cv.notify_all();
    }
  }

 private:
  struct Waiter {
    int priority;
    uint64_t ticket;
    bool operator<(const Waiter& o) const {
      return priority != o.priority ? priority < o.priority : ticket < o.ticket;
    }
    bool operator==(const Waiter& o) const { return ticket == o.ticket; }
  };
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::set<Waiter> waiting;
    bool busy = false;
    uint64_t ticket = 0;
  };
  double bw_;
  size_t chunk_;
  bool prio_;
  std::atomic<bool> interrupted_{false};
  Channel ch_[2];
};

}  // namespace rp
