#include "trainer/progress_clock.hpp"

#include <algorithm>
#include <vector>

namespace rp {

void ProgressClock::evaluation(double seconds) {
  if (!(seconds >= 0)) return;
  eval_sum_ += seconds;
  ++evals_;
}

double ProgressClock::steps(int64_t step, int64_t nsteps, double seconds) {
  const double per = nsteps > 0 && seconds >= 0 ? seconds / double(nsteps) : 0;
  if (first_ < 0 || step - nsteps <= start_) {
    if (first_ < 0) first_ = per;
    return per;
  }
  recent_.push_back(per);
  if (recent_.size() > kWindow) recent_.pop_front();
  return per;
}

double ProgressClock::steady_step_seconds() const {
  if (recent_.empty()) return std::max(first_, 0.0);
  std::vector<double> v(recent_.begin(), recent_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double hi = v[mid];
  return (*std::max_element(v.begin(), v.begin() + long(mid)) + hi) / 2;
}

double ProgressClock::eta(int64_t step, int64_t evals_left) const {
  const double left = double(std::max<int64_t>(total_ - step, 0));
  const double eval = evals_ > 0 ? eval_sum_ / double(evals_) : 0;
  return left * steady_step_seconds() + double(std::max<int64_t>(evals_left, 0)) * eval;
}

}  // namespace rp
