#include "actors/link_arbiter.hpp"

#include <algorithm>
#include <stdexcept>

namespace rp {

void LinkArbiter::activation_enqueued() {
  std::lock_guard lk(mu_);
  ++act_;
}

void LinkArbiter::activation_completed() {
  std::function<void()> wake;
  {
    std::lock_guard lk(mu_);
    if (act_ <= 0)
      throw std::logic_error("LinkArbiter: an activation copy completed that was never enqueued");
    if (--act_ == 0) std::swap(wake, wake_);
  }
  if (wake) wake();
}

bool LinkArbiter::try_bulk(std::function<void()> wake) {
  std::lock_guard lk(mu_);
  if (act_ == 0) {
    max_bulk_ = std::max(max_bulk_, ++bulk_);
    return true;
  }
  wake_ = std::move(wake);
  return false;
}

void LinkArbiter::bulk_issued() {
  std::lock_guard lk(mu_);
  if (act_ > 0) ++overlaps_;
  max_bulk_ = std::max(max_bulk_, ++bulk_);
}

void LinkArbiter::bulk_completed() {
  std::lock_guard lk(mu_);
  if (bulk_ > 0) --bulk_;
}

int LinkArbiter::activations() const {
  std::lock_guard lk(mu_);
  return act_;
}
int64_t LinkArbiter::bulk_overlaps() const {
  std::lock_guard lk(mu_);
  return overlaps_;
}
int LinkArbiter::max_bulk_inflight() const {
  std::lock_guard lk(mu_);
  return max_bulk_;
}

}  // namespace rp
