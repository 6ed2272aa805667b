// The CUDA device's streams (cuda_device_impl.hpp): completion callbacks delivered on host
// threads (one event-poller thread per stream) and timing marks from a pool of reused events.
//
// Semantics copied from the CPU backend (kernels/cpu/cpu_device.cpp):
//  - launch(fn) runs fn at once on the caller's thread (its ops enqueue on the stream);
//    an exception from fn is kept, later launches/copies are skipped, and the next
//    then() callback receives the error text; then() clears it.
//  - then(cb): an event recorded on the stream; the stream's poller thread waits for it
//    (blocking-sync event, no spinning) and runs cb(error) there, so cb may call CUDA
//    (unlike a cudaLaunchHostFunc callback) and a slow cb delays only later callbacks of
//    the same stream. Asynchronous failures (faults, bad ids or targets flagged by
//    kernels) reach the callback as error text.
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_device_impl.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/device.hpp"

namespace rp {
namespace cuda {

// ---- timing marks -------------------------------------------------------------------------

/// Timing-enabled events of one device, reused (creating one per mark would cost a driver
/// call per layer and micro-batch). Shared by a stream and its live marks.
class TimingEventPool {
 public:
  explicit TimingEventPool(int dev) : dev_(dev) {}
  ~TimingEventPool() {
    cudaSetDevice(dev_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t get() {
    {
      std::lock_guard lk(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    RP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));  // timing on, no blocking sync
    return e;
  }
  void put(cudaEvent_t e) {
    std::lock_guard lk(mu_);
    free_.push_back(e);
  }

 private:
  int dev_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

namespace {

class CudaTimingMark final : public TimingMark {
 public:
  CudaTimingMark(std::shared_ptr<TimingEventPool> pool, cudaEvent_t ev) : pool_(std::move(pool)), ev_(ev) {}
  ~CudaTimingMark() override { pool_->put(ev_); }
  bool done() const override { return cudaEventQuery(ev_) == cudaSuccess; }
  double seconds_since(const TimingMark& earlier) const override {
    auto* e = dynamic_cast<const CudaTimingMark*>(&earlier);
    if (!e) throw DeviceError("TimingMark::seconds_since: the earlier mark is not a CUDA mark");
    float ms = 0;
    const cudaError_t r = cudaEventElapsedTime(&ms, e->ev_, ev_);
    if (r != cudaSuccess) {
      cudaGetLastError();
      throw DeviceError(
          r == cudaErrorNotReady
              ? std::string("TimingMark::seconds_since: a mark was read before its stream reached it")
              : "TimingMark::seconds_since: " + err_text(r, "cudaEventElapsedTime"));
    }
    return double(ms) * 1e-3;
  }

 private:
  std::shared_ptr<TimingEventPool> pool_;
  cudaEvent_t ev_;
};

}  // namespace

// ---- streams ----------------------------------------------------------------------------

CudaStream::CudaStream(int dev, std::string name, int priority, volatile unsigned* err_words, bool issuer)
    : dev_(dev), name_(std::move(name)), err_words_(err_words) {
  set_device(dev_);
  RP_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  timing_ = std::make_shared<TimingEventPool>(dev_);
  poller_ = std::thread([this] { poll_loop(); });
  if (issuer) issuer_ = std::thread([this] { issue_loop(); });
}

CudaStream::~CudaStream() {
  synchronize();
  if (issuer_.joinable()) {
    {
      std::lock_guard lk(imu_);
      istop_ = true;
    }
    icv_.notify_all();
    issuer_.join();
  }
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  poller_.join();
  cudaSetDevice(dev_);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  cudaStreamDestroy(s_);
}

void CudaStream::launch(std::function<void()> work) {
  issue([this, work = std::move(work)] {
    if (has_error()) return;
    try {
      set_device(dev_);
      work();
    } catch (const std::exception& e) {
      note_error(e.what());
    }
  });
}

void CudaStream::copy_h2d(void* dst, const void* src, size_t bytes) {
  issue([=, this] { copy(dst, src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync host->device"); });
}

void CudaStream::copy_d2h(void* dst, const void* src, size_t bytes) {
  issue([=, this] { copy(dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync device->host"); });
}

void CudaStream::then(std::function<void(const std::string&)> cb) {
  issue([this, cb = std::move(cb)]() mutable { then_now(std::move(cb)); });
}

void CudaStream::issue(std::function<void()> f) {
  if (!issuer_.joinable() || std::this_thread::get_id() == issuer_.get_id()) return f();
  {
    std::lock_guard lk(imu_);
    iq_.push_back(std::move(f));
  }
  icv_.notify_all();
}

void CudaStream::issue_loop() {
  cudaSetDevice(dev_);
  for (;;) {
    std::function<void()> f;
    {
      std::unique_lock lk(imu_);
      icv_.wait(lk, [this] { return istop_ || !iq_.empty(); });
      if (iq_.empty()) return;  // istop_ and drained
      f = std::move(iq_.front());
      iq_.pop_front();
      ibusy_ = true;
    }
    f();  // launch() and then() keep their exceptions (the stream's error)
    {
      std::lock_guard lk(imu_);
      ibusy_ = false;
    }
    iidle_cv_.notify_all();
  }
}

void CudaStream::wait_issued() {
  if (!issuer_.joinable() || std::this_thread::get_id() == issuer_.get_id()) return;
  std::unique_lock lk(imu_);
  iidle_cv_.wait(lk, [this] { return iq_.empty() && !ibusy_; });
}

void CudaStream::then_now(std::function<void(const std::string&)> cb) {
  Item it;
  it.cb = std::move(cb);
  {
    std::lock_guard lk(mu_);
    std::swap(it.error, error_);
  }
  try {
    set_device(dev_);
    it.ev = get_event();
    RP_CUDA_CHECK(cudaEventRecord(it.ev, s_));
  } catch (const std::exception& e) {
    if (it.ev) put_event(it.ev);
    it.ev = nullptr;
    it.error += (it.error.empty() ? "" : "; ") + fmt::format("{} stream: {}", name_, e.what());
  }
  {
    std::lock_guard lk(mu_);
    q_.push_back(std::move(it));
  }
  cv_.notify_all();
}

void CudaStream::synchronize() {
  wait_issued();
  cudaSetDevice(dev_);
  cudaStreamSynchronize(s_);  // errors reach then() callbacks; shutdown must not throw
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [this] { return q_.empty() && !busy_; });
}

std::unique_ptr<TimingMark> CudaStream::mark_time() {
  wait_issued();  // outside launch() work: the mark goes after everything issued so far
  set_device(dev_);
  cudaEvent_t e = timing_->get();
  auto m = std::make_unique<CudaTimingMark>(timing_, e);  // returns e to the pool on failure
  const cudaError_t r = cudaEventRecord(e, s_);
  if (r != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(fmt::format("{} stream: {}", name_, err_text(r, "cudaEventRecord (timing mark)")));
  }
  return m;
}

bool CudaStream::has_error() {
  std::lock_guard lk(mu_);
  return !error_.empty();
}

void CudaStream::note_error(const std::string& what) {
  std::lock_guard lk(mu_);
  if (error_.empty()) error_ = fmt::format("{} stream: {}", name_, what);
}

void CudaStream::copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
  if (has_error() || bytes == 0) return;
  cudaError_t e = cudaSetDevice(dev_);
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, s_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    note_error(err_text(e, what) + fmt::format(" ({} bytes)", bytes));
  }
}

cudaEvent_t CudaStream::get_event() {
  {
    std::lock_guard lk(ev_mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  RP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventBlockingSync | cudaEventDisableTiming));
  return e;
}

void CudaStream::put_event(cudaEvent_t e) {
  std::lock_guard lk(ev_mu_);
  free_events_.push_back(e);
}

void CudaStream::poll_loop() {
  cudaSetDevice(dev_);
  for (;;) {
    Item it;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop_ and drained
      it = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
    }
    std::string err = std::move(it.error);
    auto add = [&](const std::string& s) { err += (err.empty() ? "" : "; ") + s; };
    if (it.ev) {
      cudaError_t e = cudaEventSynchronize(it.ev);
      if (e != cudaSuccess) add(fmt::format("{} stream: {}", name_, err_text(e, "device work")));
      put_event(it.ev);
    }
    if (err_words_) {  // compute stream: inputs the kernels rejected
      if (err_words_[kErrEmbeddingId]) {
        err_words_[kErrEmbeddingId] = 0;
        add(fmt::format("{} stream: embedding: token id outside [0, vocab)", name_));
      }
      if (err_words_[kErrTarget]) {
        err_words_[kErrTarget] = 0;
        add(fmt::format("{} stream: lm_head_cross_entropy: target >= vocab", name_));
      }
      if (err_words_[kErrMoeExpert]) {
        err_words_[kErrMoeExpert] = 0;
        add(fmt::format("{} stream: moe_sort: expert index outside [0, E)", name_));
      }
    }
    try {
      it.cb(err);
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}: then() callback threw: {}\n", name_, e.what());
    }
    {
      std::lock_guard lk(mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace cuda
}  // namespace rp
