// Transfer actors: one per (worker, copy stream). Each owns its copy stream and a strict
// priority queue (CAF's mailbox priority is only a weighting, so the queue is kept here):
// the most urgent request (lowest priority, then lowest order, then arrival) goes next.
//
// Cross-stream priority (activations first, bulk copies in the gaps). The two actors of one direction share a
// LinkArbiter: activation up + parameter up (host to device), activation down + gradient
// down (device to host). Activation actors issue up to `max_inflight` copies at once and
// report each one to the arbiter. Bulk actors (parameters, gradients) cut copies above
// `chunk_bytes` into chunks; with priorities on they issue a chunk only when the arbiter
// says no activation copy of the direction is queued or in flight, one chunk at a time, so
// an activation copy waits behind at most one chunk, on either backend (copy engines do not
// honour CUDA stream priorities). With priorities off bulk copies go first come, first
// served (`max_inflight` whole copies at once, each one's chunks back to back).
//
// Every copy (every chunk) is traced when a Tracer is given: a slice from issue to
// completion on the actor's track, with args "bytes" and "queued_us" (microseconds between
// entering the queue — or, for a later chunk, its predecessor's completion — and issue).
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "actors/fault_injection.hpp"
#include "actors/messages.hpp"
#include "kernels/device.hpp"

namespace rp {

class LinkArbiter;
class Tracer;

/// Shared by a worker and its transfer actors. The worker closes it before it frees its
/// buffers (on exit); a copy is issued only while it is open, under its lock, so after
/// closing, a synchronize of the copy streams covers every copy that may touch the buffers
/// (a request still queued in an actor is dropped, never issued).
struct CopyGate {
  std::mutex m;
  bool closed = false;
  void close() {
    std::lock_guard<std::mutex> lk(m);
    closed = true;
  }
};

struct TransferOptions {
  /// Activation actors, and bulk actors with priorities off: copies issued on the stream at once.
  int max_inflight = 2;
  /// true: parameter upload or gradient download (chunked, yields to activations).
  bool bulk = false;
  /// Shared with the other actor of the direction; null: no cross-stream arbitration.
  std::shared_ptr<LinkArbiter> arbiter;
  /// Bulk: yield to activation copies, one chunk in flight (false: first come, first served).
  bool priorities = true;
  /// Bulk: copies above this many bytes are cut into chunks of it (0: no chunking).
  size_t chunk_bytes = 0;
  /// Bulk with priorities: chunks in flight at once (1: an activation copy waits behind at
  /// most one chunk; more hide the completion round trip between chunks).
  int bulk_inflight = 1;
  Tracer* tracer = nullptr;
  /// Null: copies are always issued.
  std::shared_ptr<CopyGate> gate;
  /// Testing only: the worker this actor serves and what to make fail (fault_injection.hpp).
  int worker = 0;
  FaultInjection faults;
};

/// Spawns the transfer actor for `stream` (owned by the worker's Device, which must
/// outlive the actor), tracing on track `name`. Handles CopyRequest; answers CopyDone (with
/// the request's tag) to request.reply_to once the whole copy completed (CopyDone::error
/// names the stream error). The completion callbacks do no host work of their own, so one
/// copy's completion never waits for another's consumer.
/// An exception in one of its handlers ends the actor with that error (its monitor, the
/// worker, fails the run).
TransferActor spawn_transfer_actor(caf::actor_system& sys, Stream& stream, std::string name,
                                   TransferOptions opt);

}  // namespace rp

namespace rp {

/// Transfer settings of a worker (SessionOptions::transfer_priorities / transfer_chunk_bytes).
struct TransferSettings {
  bool priorities = true;                 ///< cross-stream priority and window-packed prefetch
  size_t chunk_bytes = size_t(32) << 20;  ///< bulk copies are cut into chunks of this (0: none)
  int bulk_inflight = 1;                  ///< bulk chunks in flight at once (priorities on)
};

/// The four transfer actors of one worker and the two arbiters they share.
struct WorkerTransfers {
  TransferActor act_up, act_down, param_up, grad_down;
  std::shared_ptr<LinkArbiter> h2d, d2h;
  std::shared_ptr<CopyGate> gate;  ///< shared by the four actors; the worker closes it on exit
};

/// Spawns the four transfer actors of worker `index` on `device`'s copy streams, tracing on
/// tracks "worker<index>.<stream>": activation actors 2 copies in flight, bulk actors chunked
/// and arbitrated per direction as `s` says. `faults`: testing only.
WorkerTransfers spawn_worker_transfers(caf::actor_system& sys, Device& device, int index,
                                       const TransferSettings& s, Tracer* tracer,
                                       const FaultInjection& faults = {});

}  // namespace rp
