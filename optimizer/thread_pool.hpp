// Persistent, optionally core-pinned worker threads for the optimizer (no thread is created
// per step), and the CPU topology helpers that choose the cores.
//
// NUMA placement is by first touch: a kernel that runs on a pool splits every tensor the
// same way on every call (split_range below depends only on n and the pool size), so the
// thread that zero-fills a page of the AdamW moments (adamw_update does that on the first
// step) is the thread that reads and writes it on every later step, and Linux places the
// page on that thread's NUMA node. Pin a pool to the cores of one node
// (cpus_for_pools) so that node is the right one.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rp {

/// CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

/// NUMA node of each CPU in `cpus` (from /sys/devices/system/cpu/cpuN/nodeM; 0 when the
/// kernel does not say).
std::vector<int> numa_node_of(const std::vector<int>& cpus);

/// Orders the allowed CPUs for optimizer work: grouped by NUMA node (ascending), and within a
/// node one hardware thread per physical core first, SMT siblings after (memory-bound work
/// gains little from a core's second hardware thread).
std::vector<int> preferred_cpu_order();

/// Splits `threads_total` CPUs of preferred_cpu_order() into `pools` disjoint lists of
/// about equal size, keeping each list on as few NUMA nodes as possible; threads_total <= 0
/// means every allowed CPU. When fewer CPUs exist than asked, lists share CPUs (round robin).
std::vector<std::vector<int>> cpus_for_pools(int pools, int threads_total = 0);

class ThreadPool {
 public:
  struct Options {
    int threads = 1;              ///< worker threads, 1..65534
    std::vector<int> cpus;        ///< worker i is pinned to cpus[i % cpus.size()]; empty: not pinned
    int spin_us = 50;             ///< busy-wait this long for the next job before sleeping (futex)
    std::string name = "rp-opt";  ///< thread name prefix (pthread_setname_np, 15 chars max)
  };

  explicit ThreadPool(Options o);
  /// `threads` unpinned workers.
  explicit ThreadPool(int threads) : ThreadPool(Options{threads, {}, 50, "rp-opt"}) {}
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  int size() const { return int(threads_.size()); }
  /// CPU each worker was asked to run on (-1: not pinned).
  const std::vector<int>& cpu_of_worker() const { return cpu_; }
  /// Whether pinning worker i succeeded (false when not pinned or refused by the OS).
  bool pinned(int i) const { return pinned_[size_t(i)].load(std::memory_order_acquire) == 1; }

  /// Runs fn(i) on worker i for every i in [0, parts) (parts <= size()), and returns when all
  /// have finished; the calling thread only waits. One job at a time: concurrent callers are
  /// serialised. The first exception thrown by fn is rethrown here after all parts finished.
  /// Called from inside a worker of this pool (nested), the parts run inline, in order.
  void run(int parts, const std::function<void(int)>& fn);

 private:
  void worker(int i);

  Options opt_;
  std::vector<std::thread> threads_;
  std::vector<int> cpu_;
  std::unique_ptr<std::atomic<int>[]> pinned_;
  std::mutex run_mu_;
  // (generation << 16) | parts of the current job, read by a worker in one load so it never
  // mixes one job's part count with another's; 0xffff parts means "stop".
  alignas(64) std::atomic<uint32_t> ctrl_{0};
  alignas(64) std::atomic<int> remaining_{0};
  const std::function<void(int)>* job_ = nullptr;
  uint32_t gen_ = 0;
  std::mutex err_mu_;
  std::exception_ptr err_;
};

/// Piece p of `parts` contiguous pieces of [0, n), boundaries on multiples of `grain`
/// (the last piece ends at n). Depends only on (n, parts, grain, p).
inline void split_range(int64_t n, int parts, int64_t grain, int p, int64_t& lo, int64_t& hi) {
  const int64_t blocks = (n + grain - 1) / grain;
  lo = blocks * p / parts * grain;
  hi = blocks * (p + 1) / parts * grain;
  if (lo > n) lo = n;
  if (hi > n) hi = n;
}

/// The calling thread's own pool of unpinned workers, with at least `threads` workers
/// (created on the thread's first use, grown when a larger one is asked for, joined when the
/// thread exits). Used by the `int threads` overloads: callers on different threads (several
/// shards) never wait for each other, and no thread is created per call.
ThreadPool& shared_pool(int threads);

}  // namespace rp
