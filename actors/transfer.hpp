// Transfer actors: one per (worker, copy stream). Each owns its copy stream and a
// strict priority queue (CAF's mailbox priority is only a weighting, so the queue is
// kept here): the most urgent request (lowest priority, then lowest order, then
// arrival) is issued next. At most `max_inflight` copies are issued on the stream at
// once, so an urgent request that arrives later waits behind at most that many.
#pragma once
#include <string>

#include <caf/all.hpp>

#include "kernels/device.hpp"

namespace rp {

class Tracer;

/// Spawns the transfer actor for `stream` (owned by the worker's Device, which must
/// outlive the actor). Handles CopyRequest; answers CopyDone to request.reply_to.
caf::actor spawn_transfer_actor(caf::actor_system& sys, Stream& stream, std::string name,
                                int max_inflight = 2, Tracer* tracer = nullptr);

}  // namespace rp
