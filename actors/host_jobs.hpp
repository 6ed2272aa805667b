// Host work a worker runs off its own thread and off the copy streams' callback threads: today
// the addition of a later gradient contribution of one step (tied embeddings: the LM head's
// gradient added to the embedding's) from its staging buffer into the host gradient slot.
//
// Why a thread of its own: the addition of a ~1 GiB slot takes tens of milliseconds. Run on a
// copy stream's callback thread it held back the completions of every later copy of that
// stream; run in the worker actor it would hold back its launches. A HostJobs runs its jobs
// one at a time in the order posted, on one thread (a job may itself use more threads).
//
// Thread-safety: post and drain may be called from any thread; the destructor drains.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "actors/pass_buffers.hpp"

namespace rp {

/// dst[i] += src[i] for i < n, over up to half the host's hardware threads (one per 4M floats).
void parallel_add(float* dst, const float* src, int64_t n);

class HostJobs {
 public:
  HostJobs() = default;
  ~HostJobs() { drain(); }
  HostJobs(const HostJobs&) = delete;
  HostJobs& operator=(const HostJobs&) = delete;

  /// Queues `job`; it runs after every job posted before it. A job must not throw (catch and
  /// report inside it): one that does is caught and ignored.
  void post(std::function<void()> job);
  /// Waits until every job posted so far ran and stops the thread (a later post starts it again).
  void drain();

 private:
  void run();
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

class Device;

/// A worker's later gradient contributions of one step (tied embeddings): a pinned host staging
/// buffer per parameter group that a contribution downloads into, and its addition into the
/// group's host slot on a HostJobs thread. One writer per group at a time (the shards grant the
/// next writer only after the addition reported) makes reusing a group's buffer safe.
/// Used by its worker's thread only.
class GradientStaging {
 public:
  explicit GradientStaging(Device* device) : device_(device) {}
  ~GradientStaging() { clear(); }
  GradientStaging(const GradientStaging&) = delete;
  GradientStaging& operator=(const GradientStaging&) = delete;

  /// Group g's staging buffer of `bytes` (allocated and pinned on first use).
  void* buffer(int g, size_t bytes);
  /// On the job thread: slot[i] += the staged contribution of group g for i < n, then
  /// done("") or done(one line saying what failed). buffer(g, ...) must have been called.
  void add_into(int g, float* slot, int64_t n, std::function<void(std::string)> done);
  /// Waits for every addition posted, then unpins and frees the buffers.
  void clear();

 private:
  Device* device_;
  std::map<int, HostBytes> staging_;
  HostJobs jobs_;  ///< declared after staging_: destroyed (drained) before the buffers go
};

}  // namespace rp
