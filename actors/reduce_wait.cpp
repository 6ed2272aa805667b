#include "actors/reduce_wait.hpp"

#include <algorithm>

namespace rp {

void ReduceWaitMeter::started(int group, int64_t step, Clock::time_point t) {
  std::lock_guard lk(mu_);
  running_[{step, group}] = Sum{t};
}

void ReduceWaitMeter::blocked(int group, int64_t step, Clock::time_point t) {
  std::lock_guard lk(mu_);
  auto it = running_.find({step, group});
  if (it == running_.end()) return;  // no sum of it runs: the request waits for something else
  it->second.blocked = std::min(it->second.blocked, std::max(t, it->second.start));
}

void ReduceWaitMeter::done(int group, int64_t step, Clock::time_point t) {
  std::lock_guard lk(mu_);
  auto it = running_.find({step, group});
  if (it == running_.end()) return;
  const Clock::time_point from = it->second.blocked;
  running_.erase(it);
  if (from >= t) return;  // hidden: nothing waited for it
  auto& iv = exposed_[step];
  auto [at, fresh] = iv.emplace(from, t);
  if (!fresh) at->second = std::max(at->second, t);
}

double ReduceWaitMeter::seconds(int64_t step) {
  std::lock_guard lk(mu_);
  exposed_.erase(exposed_.begin(), exposed_.lower_bound(step - 16));
  auto it = exposed_.find(step);
  if (it == exposed_.end()) return 0;
  double total = 0;
  Clock::time_point end = Clock::time_point::min();  // intervals by start: merge the overlaps
  for (const auto& [from, to] : it->second) {
    const Clock::time_point a = std::max(from, end);
    if (to > a) total += std::chrono::duration<double>(to - a).count();
    end = std::max(end, to);
  }
  return total;
}

}  // namespace rp
