#include "actors/host_jobs.hpp"

#include <algorithm>
#include <exception>
#include <vector>

#include "kernels/device.hpp"

namespace rp {

void parallel_add(float* dst, const float* src, int64_t n) {
  const int nt = int(std::clamp<int64_t>(n >> 22, 1, std::max(1u, std::thread::hardware_concurrency() / 2)));
  auto work = [=](int i) {
    const int64_t a = n * i / nt, b = n * (i + 1) / nt;
    for (int64_t j = a; j < b; ++j) dst[j] += src[j];
  };
  std::vector<std::thread> ts;
  for (int i = 1; i < nt; ++i) ts.emplace_back(work, i);
  work(0);
  for (auto& th : ts) th.join();
}

void HostJobs::post(std::function<void()> job) {
  std::lock_guard lk(m_);
  jobs_.push_back(std::move(job));
  if (!thread_.joinable()) {
    stop_ = false;
    thread_ = std::thread([this] { run(); });
  }
  cv_.notify_one();
}

void HostJobs::drain() {
  std::thread t;
  {
    std::lock_guard lk(m_);
    stop_ = true;
    t = std::move(thread_);
  }
  cv_.notify_one();
  if (t.joinable()) t.join();
}

void HostJobs::run() {
  std::unique_lock lk(m_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and everything posted ran
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    try {
      job();
    } catch (...) {  // a job reports its own errors; never let one end the thread
    }
    lk.lock();
  }
}

void* GradientStaging::buffer(int g, size_t bytes) {
  auto [it, fresh] = staging_.try_emplace(g, bytes);
  if (fresh && device_) device_->pin_host(it->second.data(), it->second.size());
  return it->second.data();
}

void GradientStaging::add_into(int g, float* slot, int64_t n, std::function<void(std::string)> done) {
  const float* src = staging_.at(g).as<float>();
  jobs_.post([slot, src, n, done = std::move(done)] {
    std::string err;
    try {
      parallel_add(slot, src, n);
    } catch (const std::exception& e) {
      err = std::string("adding a gradient contribution on the host: ") + e.what();
    }
    done(std::move(err));
  });
}

void GradientStaging::clear() {
  jobs_.drain();  // an addition may still read a staging buffer
  if (device_)
    for (auto& [g, b] : staging_) device_->unpin_host(b.data());
  staging_.clear();
}

}  // namespace rp
