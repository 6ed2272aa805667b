// The exposed part of data-parallel gradient sums: how long the pipeline actually waited for
// them (roundpipe/replicas.hpp). A group's sum of step k starts at the moment its update would
// otherwise start (its gradient of step k is complete), and runs on the communication thread
// while backward and the next step go on. It is hidden until something needs the group's
// version k: the next step's gradient slot of the group, or an upload of version k's weights.
// From the moment such a request waits (at the earliest when the sum starts) until the sum
// completes, the pipeline waits for it: that interval is exposed. A step's exposed time is
// the union of its groups' exposed intervals (wall time with at least one request waiting on
// one of the step's sums), so sums exposed at once are not counted twice.
//
// The optimizer shards feed it (any thread); Session::wait_for reads a step's total once the
// step is applied (every sum of it has completed by then). A sum the pipeline never waited
// for (the last step's, waited for by the caller at the end of a run) counts 0.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace rp {

class ReduceWaitMeter {
 public:
  using Clock = std::chrono::steady_clock;
  /// The sum of group `group`'s gradient of step `step` started at `t`.
  void started(int group, int64_t step, Clock::time_point t);
  /// A request for `group` waits, at `t`, while its sum of `step` runs (the earliest such
  /// moment counts; one before the sum started counts from the start).
  void blocked(int group, int64_t step, Clock::time_point t);
  /// The sum of `group` of `step` completed at `t`.
  void done(int group, int64_t step, Clock::time_point t);
  /// Seconds the pipeline waited for step `step`'s sums (the union of their exposed
  /// intervals); 0 for a step it knows nothing of. Forgets steps before step - 16.
  double seconds(int64_t step);

 private:
  struct Sum {
    Clock::time_point start, blocked = Clock::time_point::max();
  };
  std::mutex mu_;
  std::map<std::pair<int64_t, int>, Sum> running_;                             // (step, group)
  std::map<int64_t, std::map<Clock::time_point, Clock::time_point>> exposed_;  // step -> [from, to)
};

}  // namespace rp
