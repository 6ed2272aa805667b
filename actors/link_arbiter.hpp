// Cross-stream priority for one direction of one worker's host<->device link.
//
// Two transfer actors share a direction: activation upload + parameter upload (host to
// device), activation download + gradient download (device to host). Copy engines do not
// honour stream priorities (and the CPU backend's link may be first come, first served), so
// the order is decided here, above the streams: a bulk chunk (parameter or gradient
// traffic) is issued only while no activation copy of the direction is queued or in
// flight, and the bulk actor keeps at most one chunk in flight. An activation copy that
// arrives therefore waits behind at most one bulk chunk.
//
// A small thread-safe object shared by the two actors (and the stream callbacks that
// complete activation copies); nobody ever blocks on it: a refused bulk actor leaves a
// wake-up callback, which runs once the last activation copy completes.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>

namespace rp {

class LinkArbiter {
 public:
  /// An activation copy entered the activation actor's queue (call before it is issued).
  void activation_enqueued();
  /// An activation copy completed (any thread). When none is left queued or in flight and
  /// a bulk actor was refused, runs its wake-up callback (on this thread, outside the lock).
  /// Throws std::logic_error when more copies complete than were enqueued.
  void activation_completed();
  /// Asks whether a bulk chunk may be issued now: true when no activation copy is queued or
  /// in flight, and then the chunk counts as issued (call bulk_completed when it is done).
  /// Otherwise `wake` is kept (replacing an earlier one) and called once that becomes true;
  /// the bulk actor then asks again. `wake` must not block.
  bool try_bulk(std::function<void()> wake);
  /// A bulk chunk was issued without asking (priorities off): counted, never refused.
  void bulk_issued();
  /// A bulk chunk issued by try_bulk or bulk_issued completed.
  void bulk_completed();

  /// Activation copies queued or in flight now.
  int activations() const;
  /// Bulk chunks issued while an activation copy was queued or in flight (only bulk_issued
  /// can do that: 0 when the bulk actor always asks try_bulk).
  int64_t bulk_overlaps() const;
  /// Largest number of bulk chunks in flight at once.
  int max_bulk_inflight() const;

 private:
  mutable std::mutex mu_;
  int act_ = 0;
  int bulk_ = 0, max_bulk_ = 0;
  int64_t overlaps_ = 0;
  std::function<void()> wake_;
};

}  // namespace rp
