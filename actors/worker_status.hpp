// What a worker is doing and waiting for, in one line: its answer to GetStatus, which the
// scheduler's watchdog logs (actors/scheduler_actor.hpp).
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/stage_task.hpp"

namespace rp {

/// A read-only view of a worker's state.
struct WorkerSnapshot {
  int index = 0;
  bool failed = false;
  bool alloc_wait = false;  ///< its next start waits for a draining task's memory
  const Task* current = nullptr;
  std::vector<const Task*> prefetching;                   ///< next (and the one behind a weightless next)
  std::vector<const Task*> draining;                      ///< retired, outputs or gradients still going down
  size_t queued = 0;                                      ///< stage tasks not prepared yet
  const std::map<CopyTag, int>* outstanding = nullptr;    ///< copies issued, not completed
  std::function<bool(const Task&, int64_t)> input_ready;  ///< predecessor's output m is on the host
};

/// "worker 1: current forward stage 2 of pass 5 (step 2): 3/4 uploaded, ..., compute of
/// micro-batch 2 waits for ...; prefetching ...; draining ...; 3 stage task(s) queued; copies
/// outstanding: 2 x weights of group 4 (task 9), ...".
std::string describe(const WorkerSnapshot& w);

}  // namespace rp
