// Test-only failure injection (SessionInternals::faults in actors/session_testing.hpp): makes
// one operation of the runtime throw, so tests can check that a failure on any thread reaches
// every waiter (Session::wait, synchronize, Trainer::run) as an error naming it, and never
// hangs the run. Never set outside tests; the default injects nothing.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "actors/messages.hpp"

namespace rp {

struct FaultInjection {
  enum class Site : uint8_t {
    none,
    device_op,          ///< micro-batch `micro_batch` of the stage task's device work throws (the
                        ///< compute stream reports it to the worker)
    worker_handler,     ///< the worker's handler of that micro-batch's completion throws (the
                        ///< worker actor dies)
    transfer,           ///< the copy `copy` / `micro_batch` or `group` fails on its copy stream
    transfer_handler,   ///< the transfer actor's handler of that copy's request throws (the
                        ///< transfer actor dies)
    optimizer_job,      ///< the AdamW update of `group` for step `step` throws on the shard's
                        ///< job thread
    scheduler_handler,  ///< the scheduler's handler of the first StageDone throws (the
                        ///< scheduler dies: later waits see it go down)
  };
  Site site = Site::none;
  int worker = 0;                   ///< device_op, worker_handler, transfer, transfer_handler
  int stage_index = -1;             ///< device_op, worker_handler: the stage (-1: any)
  int64_t micro_batch = 0;          ///< device_op, worker_handler; transfer of an input or output
  CopyKind copy = CopyKind::input;  ///< transfer, transfer_handler
  int group = 0;                    ///< optimizer_job; transfer of weights or a gradient
  int64_t step = 0;                 ///< optimizer_job
  /// Fires once per session (copies of this struct share it).
  std::shared_ptr<std::atomic<bool>> armed = std::make_shared<std::atomic<bool>>(true);

  /// The message of the injected exception.
  static std::string what(const std::string& where) { return "injected failure: " + where; }

  /// True (once) for the device work or completion of micro-batch m of stage `stage_index`.
  bool fire_compute(Site s, int w, int stage, int64_t m) const {
    if (site != s || w != worker || m != micro_batch || (stage_index >= 0 && stage != stage_index))
      return false;
    return armed->exchange(false);
  }
  /// True (once) for a copy of worker w tagged `t`.
  bool fire_copy(Site s, int w, const CopyTag& t) const {
    if (site != s || w != worker || t.kind != copy) return false;
    const bool per_mb = t.kind == CopyKind::input || t.kind == CopyKind::output;
    if (per_mb ? t.micro_batch != micro_batch : t.group != group) return false;
    return armed->exchange(false);
  }
  /// True (once) for the scheduler's first StageDone.
  bool fire_scheduler() const { return site == Site::scheduler_handler && armed->exchange(false); }
  /// True (once) for the AdamW update of group g for step k.
  bool fire_update(int g, int64_t k) const {
    if (site != Site::optimizer_job || g != group || k != step) return false;
    return armed->exchange(false);
  }
};

}  // namespace rp
