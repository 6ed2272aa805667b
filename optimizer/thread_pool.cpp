#include "optimizer/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

namespace rp {
namespace {

thread_local const ThreadPool* t_inside = nullptr;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

int read_int(const std::string& path, int dflt) {
  std::ifstream f(path);
  int x;
  if (f >> x) return x;
  return dflt;
}

}  // namespace

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    const int n = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) out.push_back(i);
  return out;
}

std::vector<int> numa_node_of(const std::vector<int>& cpus) {
  namespace fs = std::filesystem;
  std::vector<int> out;
  for (int c : cpus) {
    int node = 0;
    std::error_code ec;
    const fs::path dir = fmt::format("/sys/devices/system/cpu/cpu{}", c);
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("node", 0) == 0 && name.size() > 4 &&
          name.find_first_not_of("0123456789", 4) == std::string::npos) {
        node = std::stoi(name.substr(4));
        break;
      }
    }
    out.push_back(node);
  }
  return out;
}

std::vector<int> preferred_cpu_order() {
  const std::vector<int> cpus = allowed_cpus();
  const std::vector<int> node = numa_node_of(cpus);
  struct Key {
    int node, smt_rank, pkg, core, cpu;
  };
  std::vector<Key> keys;
  std::map<std::pair<int, int>, int> seen;  // (package, core) -> hardware threads so far
  for (size_t i = 0; i < cpus.size(); ++i) {
    const int c = cpus[i];
    const std::string topo = fmt::format("/sys/devices/system/cpu/cpu{}/topology/", c);
    const int pkg = read_int(topo + "physical_package_id", 0);
    const int core = read_int(topo + "core_id", c);
    const int rank = seen[{pkg, core}]++;
    keys.push_back({node[i], rank, pkg, core, c});
  }
  std::stable_sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    if (a.node != b.node) return a.node < b.node;
    if (a.smt_rank != b.smt_rank) return a.smt_rank < b.smt_rank;
    return a.cpu < b.cpu;
  });
  std::vector<int> out;
  for (auto& k : keys) out.push_back(k.cpu);
  return out;
}

std::vector<std::vector<int>> cpus_for_pools(int pools, int threads_total) {
  if (pools < 1) throw std::invalid_argument(fmt::format("cpus_for_pools: pools = {} (need >= 1)", pools));
  const std::vector<int> order = preferred_cpu_order();
  const int total = threads_total > 0 ? threads_total : int(order.size());
  std::vector<std::vector<int>> out(static_cast<size_t>(pools));
  // contiguous slices of the node-grouped order keep each pool on few nodes
  for (int p = 0; p < pools; ++p) {
    const int lo = total * p / pools, hi = total * (p + 1) / pools;
    for (int k = lo; k < std::max(hi, lo + 1); ++k) out[size_t(p)].push_back(order[size_t(k) % order.size()]);
  }
  return out;
}

ThreadPool::ThreadPool(Options o) : opt_(std::move(o)) {
  if (opt_.threads < 1 || opt_.threads >= 0xffff)
    throw std::invalid_argument(fmt::format("ThreadPool: threads = {} (need 1..65534)", opt_.threads));
  pinned_ = std::make_unique<std::atomic<int>[]>(size_t(opt_.threads));
  for (int i = 0; i < opt_.threads; ++i) {
    cpu_.push_back(opt_.cpus.empty() ? -1 : opt_.cpus[size_t(i) % opt_.cpus.size()]);
    pinned_[size_t(i)].store(0);
  }
  threads_.reserve(size_t(opt_.threads));
  for (int i = 0; i < opt_.threads; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(run_mu_);
    ++gen_;
    ctrl_.store((gen_ << 16) | 0xffffu, std::memory_order_release);
    ctrl_.notify_all();
  }
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int i) {
  t_inside = this;
  const int cpu = cpu_[size_t(i)];
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pinned_[size_t(i)].store(pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0 ? 1 : 0,
                             std::memory_order_release);
  }
  const std::string name = fmt::format("{}-{}", opt_.name, i).substr(0, 15);
  pthread_setname_np(pthread_self(), name.c_str());
  uint32_t seen = 0;
  for (;;) {
    // wait for a new job: spin a little (the next group's update usually follows at once),
    // then sleep on the futex
    uint32_t c = ctrl_.load(std::memory_order_acquire);
    if (c == seen) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto spin = std::chrono::microseconds(opt_.spin_us);
      for (int k = 0; c == seen; ++k) {
        cpu_relax();
        c = ctrl_.load(std::memory_order_acquire);
        if ((k & 63) == 63 && std::chrono::steady_clock::now() - t0 > spin) break;
      }
      while (c == seen) {
        ctrl_.wait(seen, std::memory_order_acquire);
        c = ctrl_.load(std::memory_order_acquire);
      }
    }
    seen = c;
    const uint32_t parts = c & 0xffffu;
    if (parts == 0xffffu) return;
    // A worker outside [0, parts) touches nothing of the job: the caller does not wait
    // for it, and may already be publishing the next one.
    if (uint32_t(i) >= parts) continue;
    try {
      (*job_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu_);
      if (!err_) err_ = std::current_exception();
    }
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_one();
  }
}

void ThreadPool::run(int parts, const std::function<void(int)>& fn) {
  if (parts < 0 || parts > size())
    throw std::invalid_argument(fmt::format("ThreadPool::run: parts = {} (pool has {})", parts, size()));
  if (parts == 0) return;
  if (t_inside == this) {  // nested: the workers are busy with the outer job
    for (int p = 0; p < parts; ++p) fn(p);
    return;
  }
  std::lock_guard<std::mutex> lk(run_mu_);
  job_ = &fn;
  err_ = nullptr;
  remaining_.store(parts, std::memory_order_relaxed);
  ++gen_;
  ctrl_.store((gen_ << 16) | uint32_t(parts), std::memory_order_release);
  ctrl_.notify_all();
  int r = remaining_.load(std::memory_order_acquire);
  for (int k = 0; r != 0 && k < 2000; ++k) {
    cpu_relax();
    r = remaining_.load(std::memory_order_acquire);
  }
  while (r != 0) {
    remaining_.wait(r, std::memory_order_acquire);
    r = remaining_.load(std::memory_order_acquire);
  }
  job_ = nullptr;
  if (err_) std::rethrow_exception(err_);
}

ThreadPool& shared_pool(int threads) {
  // per calling thread; a smaller pool is kept alive (a caller up the stack may hold it)
  thread_local std::vector<std::unique_ptr<ThreadPool>> pools;
  if (pools.empty() || pools.back()->size() < threads)
    pools.push_back(std::make_unique<ThreadPool>(std::max(threads, 1)));
  return *pools.back();
}

}  // namespace rp
