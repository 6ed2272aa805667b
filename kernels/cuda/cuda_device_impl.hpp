// Private: the parts of the CUDA device (cuda_device.cpp) that live in their own files: its
// streams, with their callback pollers and timing marks (cuda_stream.cpp), and the physical
// pages under its pool (cuda_pages.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/paged_pool.hpp"

namespace rp::cuda {

/// The text of a CUDA error that is reported rather than thrown: name, description and `what`.
std::string err_text(cudaError_t e, const char* what);

class TimingEventPool;  // cuda_stream.cpp

class CudaStream final : public Stream {
 public:
  /// issuer: launch() work runs on the stream's own issuing thread, in issue order (the
  /// compute stream: an op that waits for the device, as moe_sort's host round trip, then
  /// holds that thread, not the actor that issued the work); else at once on the caller's.
  CudaStream(int dev, std::string name, int priority, volatile unsigned* err_words, bool issuer = false);
  ~CudaStream() override;
  cudaStream_t handle() const { return s_; }

  void launch(std::function<void()> work) override;
  void copy_h2d(void* dst, const void* src, size_t bytes) override;
  void copy_d2h(void* dst, const void* src, size_t bytes) override;
  void then(std::function<void(const std::string&)> cb) override;
  void synchronize() override;
  std::unique_ptr<TimingMark> mark_time() override;

 private:
  struct Item {
    cudaEvent_t ev = nullptr;
    std::function<void(const std::string&)> cb;
    std::string error;
  };

  // Runs f now on a stream without an issuing thread (or on that thread itself), else queues
  // it there behind the work issued before.
  void issue(std::function<void()> f);
  void issue_loop();
  // Waits until everything queued for the issuing thread has been issued to the device.
  void wait_issued();
  void then_now(std::function<void(const std::string&)> cb);
  bool has_error();
  void note_error(const std::string& what);
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what);
  cudaEvent_t get_event();
  void put_event(cudaEvent_t e);
  void poll_loop();

  int dev_;
  std::string name_;
  volatile unsigned* err_words_;
  cudaStream_t s_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Item> q_;
  bool stop_ = false, busy_ = false;
  std::string error_;
  std::mutex ev_mu_;
  std::vector<cudaEvent_t> free_events_;
  std::shared_ptr<TimingEventPool> timing_;
  std::thread poller_;
  // the issuing thread (issuer_ joinable only for a stream made with `issuer`) and its queue
  std::mutex imu_;
  std::condition_variable icv_, iidle_cv_;
  std::deque<std::function<void()>> iq_;
  bool istop_ = false, ibusy_ = false;
  std::thread issuer_;
};

/// The physical pages and address ranges of GPU `index` through the driver's virtual memory
/// management (DeviceError when the driver has none, or pages that kCudaPoolGranule is not a
/// multiple of).
std::unique_ptr<PageBackend> make_cuda_pages(int index);

}  // namespace rp::cuda
