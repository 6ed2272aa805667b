// CUDA backend of the device abstraction (kernels/device.hpp): one GPU with a
// capacity-limited cudaMalloc'd pool, a compute stream and four copy streams, and
// completion callbacks delivered on host threads (one event-poller thread per stream).
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
//  - alloc() accounts 256-byte-rounded sizes against the capacity exactly like the CPU
//    arena; memory comes from segments cudaMalloc'd on demand (never more than the
//    capacity in total) and is sub-allocated best-fit with coalescing, so alloc/free
//    never synchronise the device.
#include <fmt/format.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device.hpp"
#include "kernels/ops.hpp"

namespace rp {
namespace cuda {

void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  throw DeviceError(fmt::format("CUDA error {} ({}) in `{}` at {}:{}", cudaGetErrorName(e),
                                cudaGetErrorString(e), what, file, line));
}

void throw_cublas_error(cublasStatus_t s, const char* what, const char* file, int line) {
  throw DeviceError(fmt::format("cuBLAS error {} ({}) in `{}` at {}:{}", cublasLtGetStatusName(s),
                                cublasLtGetStatusString(s), what, file, line));
}

void set_device(int dev) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != dev) RP_CUDA_CHECK(cudaSetDevice(dev));
}

namespace {

std::string err_text(cudaError_t e, const char* what) {
  return fmt::format("CUDA error {} ({}) in {}", cudaGetErrorName(e), cudaGetErrorString(e), what);
}

// ---- pinned host memory: a process-wide registry (pins are shared by all devices) -----

struct PinRegistry {
  std::mutex mu;
  struct Entry {
    size_t bytes;
    int refs;
    bool ours;  // false: someone else registered it (or it is cudaHostAlloc'd memory)
  };
  std::unordered_map<void*, Entry> pins;
};
PinRegistry& pin_registry() {
  static PinRegistry r;
  return r;
}

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
      throw DeviceError(r == cudaErrorNotReady
                            ? std::string("TimingMark::seconds_since: a mark was read before its stream reached it")
                            : "TimingMark::seconds_since: " + err_text(r, "cudaEventElapsedTime"));
    }
    return double(ms) * 1e-3;
  }

 private:
  std::shared_ptr<TimingEventPool> pool_;
  cudaEvent_t ev_;
};

// ---- streams ----------------------------------------------------------------------------

class CudaStream final : public Stream {
 public:
  CudaStream(int dev, std::string name, int priority, volatile unsigned* err_words)
      : dev_(dev), name_(std::move(name)), err_words_(err_words) {
    set_device(dev_);
    RP_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
    timing_ = std::make_shared<TimingEventPool>(dev_);
    poller_ = std::thread([this] { poll_loop(); });
  }
  ~CudaStream() override {
    synchronize();
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
  cudaStream_t handle() const { return s_; }

  void launch(std::function<void()> work) override {
    if (has_error()) return;
    try {
      set_device(dev_);
      work();
    } catch (const std::exception& e) {
      note_error(e.what());
    }
  }
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    copy(dst, src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync host->device");
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    copy(dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync device->host");
  }
  void then(std::function<void(const std::string&)> cb) override {
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
  void synchronize() override {
    cudaSetDevice(dev_);
    cudaStreamSynchronize(s_);  // errors reach then() callbacks; shutdown must not throw
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [this] { return q_.empty() && !busy_; });
  }
  std::unique_ptr<TimingMark> mark_time() override {
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

 private:
  struct Item {
    cudaEvent_t ev = nullptr;
    std::function<void(const std::string&)> cb;
    std::string error;
  };

  bool has_error() {
    std::lock_guard lk(mu_);
    return !error_.empty();
  }
  void note_error(const std::string& what) {
    std::lock_guard lk(mu_);
    if (error_.empty()) error_ = fmt::format("{} stream: {}", name_, what);
  }
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (has_error() || bytes == 0) return;
    cudaError_t e = cudaSetDevice(dev_);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, s_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      note_error(err_text(e, what) + fmt::format(" ({} bytes)", bytes));
    }
  }
  cudaEvent_t get_event() {
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
  void put_event(cudaEvent_t e) {
    std::lock_guard lk(ev_mu_);
    free_events_.push_back(e);
  }
  void poll_loop() {
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
};

// ---- device ------------------------------------------------------------------------------

constexpr size_t kAlign = 256;
constexpr size_t kSegGranule = size_t(2) << 20;
constexpr size_t kSegMin = size_t(512) << 20;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const DeviceOptions& opt) : index_(index), cap_(opt.capacity_bytes) {
    set_device(index_);
    RP_CUDA_CHECK(cudaGetDeviceProperties(&prop_, index_));
    void* h = nullptr;
    RP_CUDA_CHECK(cudaHostAlloc(&h, kErrSlots * sizeof(unsigned), cudaHostAllocMapped | cudaHostAllocPortable));
    err_host_ = static_cast<unsigned*>(h);
    for (int i = 0; i < kErrSlots; ++i) err_host_[i] = 0;
    void* d = nullptr;
    RP_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
    int least = 0, greatest = 0;
    RP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int k = 0; k < kNumStreams; ++k) {
      const StreamKind sk = StreamKind(k);
      // activations are on the critical path: their copy streams get the top priority
      const int prio = (sk == StreamKind::act_up || sk == StreamKind::act_down) ? greatest : least;
      streams_[k] = std::make_unique<CudaStream>(
          index_, fmt::format("cuda{}.{}", index_, stream_name(sk)), prio,
          sk == StreamKind::compute ? err_host_ : nullptr);
    }
    ops_ = std::make_unique<CudaOps>(index_, streams_[0]->handle(), opt.dtype, static_cast<unsigned*>(d));
  }
  ~CudaDevice() override {
    for (auto& s : streams_) s->synchronize();
    ops_.reset();
    for (auto& s : streams_) s.reset();
    cudaSetDevice(index_);
    for (auto& sg : segs_) cudaFree(sg.base);
    const auto pins = pinned_here_;  // unpin_host edits pinned_here_
    for (auto& [p, e] : pins)
      for (int i = 0; i < e; ++i) unpin_host(p);
    cudaFreeHost(err_host_);
  }

  int index() const override { return index_; }
  std::string name() const override {
    return fmt::format("cuda:{} ({}, sm_{}{})", index_, prop_.name, prop_.major, prop_.minor);
  }
  DType compute_dtype() const override { return ops_->dtype(); }
  size_t capacity_bytes() const override { return cap_; }
  size_t used_bytes() const override {
    std::lock_guard lk(mu_);
    return used_;
  }
  size_t peak_bytes() const override {
    std::lock_guard lk(mu_);
    return peak_;
  }

  void* alloc(size_t bytes) override {
    const size_t sz = round_up(std::max<size_t>(bytes, 1), kAlign);
    std::lock_guard lk(mu_);
    if (used_ + sz > cap_)
      throw DeviceOutOfMemory(fmt::format(
          "{}: cannot allocate {:.1f} MiB ({} bytes): {:.1f} MiB of {:.1f} MiB capacity in use",
          name(), sz / 1048576.0, bytes, used_ / 1048576.0, cap_ / 1048576.0));
    auto it = free_.lower_bound({sz, nullptr});
    if (it == free_.end()) {
      grow(sz, bytes);
      it = free_.lower_bound({sz, nullptr});
    }
    char* p = it->second;
    free_.erase(it);
    Block& b = blocks_.at(p);
    if (b.size > sz) {  // split: the tail stays free
      Block rest{b.size - sz, true, b.seg};
      b.size = sz;
      blocks_.emplace(p + sz, rest);
      free_.insert({rest.size, p + sz});
    }
    b.free = false;
    used_ += sz;
    peak_ = std::max(peak_, used_);
    return p;
  }

  void free(void* vp) override {
    if (!vp) return;
    std::lock_guard lk(mu_);
    char* p = static_cast<char*>(vp);
    auto it = blocks_.find(p);
    if (it == blocks_.end() || it->second.free) return;
    used_ -= it->second.size;
    it->second.free = true;
    // coalesce with the next and previous blocks of the same segment
    auto next = std::next(it);
    if (next != blocks_.end() && next->second.free && next->second.seg == it->second.seg &&
        it->first + it->second.size == next->first) {
      free_.erase({next->second.size, next->first});
      it->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (it != blocks_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.free && prev->second.seg == it->second.seg &&
          prev->first + prev->second.size == it->first) {
        free_.erase({prev->second.size, prev->first});
        prev->second.size += it->second.size;
        blocks_.erase(it);
        it = prev;
      }
    }
    free_.insert({it->second.size, it->first});
  }

  Stream& stream(StreamKind k) override { return *streams_[int(k)]; }
  Ops& ops() override { return *ops_; }

  void pin_host(void* p, size_t bytes) override {
    if (!p || bytes == 0) return;
    auto& r = pin_registry();
    std::lock_guard lk(r.mu);
    auto it = r.pins.find(p);
    if (it != r.pins.end()) {
      it->second.refs++;
    } else {
      set_device(index_);
      cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
      bool ours = true;
      if (e == cudaErrorHostMemoryAlreadyRegistered) {
        cudaGetLastError();
        ours = false;
      } else if (e != cudaSuccess) {
        cudaGetLastError();
        throw DeviceError(fmt::format("{}: pin_host({} bytes at {}): {}", name(), bytes, p,
                                      err_text(e, "cudaHostRegister")));
      }
      r.pins.emplace(p, PinRegistry::Entry{bytes, 1, ours});
    }
    std::lock_guard lk2(mu_);
    pinned_here_[p]++;
  }

  void unpin_host(void* p) override {
    {
      std::lock_guard lk2(mu_);
      auto h = pinned_here_.find(p);
      if (h == pinned_here_.end()) return;
      if (--h->second == 0) pinned_here_.erase(h);
    }
    auto& r = pin_registry();
    std::lock_guard lk(r.mu);
    auto it = r.pins.find(p);
    if (it == r.pins.end()) return;
    if (--it->second.refs > 0) return;
    if (it->second.ours) {
      cudaSetDevice(index_);
      if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
    }
    r.pins.erase(it);
  }

 private:
  struct Block {
    size_t size;
    bool free;
    int seg;
  };
  struct Segment {
    char* base;
    size_t size;
  };

  // Adds a segment that can hold sz bytes (mu_ held).
  void grow(size_t sz, size_t requested) {
    const size_t need = round_up(sz, kSegGranule);
    if (reserved_ + need > cap_) release_empty_segments();
    if (reserved_ + need > cap_)
      throw DeviceOutOfMemory(fmt::format(
          "{}: cannot allocate {:.1f} MiB ({} bytes): {:.1f} MiB of {:.1f} MiB capacity in use, "
          "and the free space is fragmented (largest free block smaller than the request)",
          name(), sz / 1048576.0, requested, used_ / 1048576.0, cap_ / 1048576.0));
    size_t segsz = std::min(std::max(need, kSegMin), round_up(cap_ - reserved_, kSegGranule));
    if (reserved_ + segsz > cap_) segsz = need;
    set_device(index_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, segsz);
    if (e != cudaSuccess && segsz > need) {
      cudaGetLastError();
      segsz = need;
      e = cudaMalloc(&p, segsz);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      release_empty_segments();
      e = cudaMalloc(&p, segsz);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t fr = 0, tot = 0;
      cudaMemGetInfo(&fr, &tot);
      throw DeviceOutOfMemory(fmt::format(
          "{}: cannot allocate {:.1f} MiB ({} bytes): {:.1f} MiB of {:.1f} MiB capacity in use, "
          "and the GPU itself has only {:.1f} MiB free ({})",
          name(), sz / 1048576.0, requested, used_ / 1048576.0, cap_ / 1048576.0,
          fr / 1048576.0, err_text(e, "cudaMalloc")));
    }
    const int id = next_seg_++;
    segs_.push_back({static_cast<char*>(p), segsz});
    seg_ids_.push_back(id);
    reserved_ += segsz;
    blocks_.emplace(static_cast<char*>(p), Block{segsz, true, id});
    free_.insert({segsz, static_cast<char*>(p)});
  }

  // cudaFree's every segment that is one free block (synchronises the device; rare).
  void release_empty_segments() {
    for (size_t i = 0; i < segs_.size();) {
      auto it = blocks_.find(segs_[i].base);
      if (it != blocks_.end() && it->second.free && it->second.size == segs_[i].size) {
        free_.erase({it->second.size, it->first});
        blocks_.erase(it);
        cudaSetDevice(index_);
        cudaFree(segs_[i].base);
        reserved_ -= segs_[i].size;
        segs_.erase(segs_.begin() + long(i));
        seg_ids_.erase(seg_ids_.begin() + long(i));
      } else {
        ++i;
      }
    }
  }

  int index_;
  size_t cap_;
  cudaDeviceProp prop_{};
  unsigned* err_host_ = nullptr;
  mutable std::mutex mu_;
  size_t used_ = 0, peak_ = 0, reserved_ = 0;
  std::vector<Segment> segs_;
  std::vector<int> seg_ids_;
  int next_seg_ = 0;
  std::map<char*, Block> blocks_;
  std::set<std::pair<size_t, char*>> free_;
  std::unordered_map<void*, int> pinned_here_;
  std::unique_ptr<CudaStream> streams_[kNumStreams];
  std::unique_ptr<CudaOps> ops_;
};

}  // namespace
}  // namespace cuda

int cuda_device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Device> make_cuda_device(int index, const DeviceOptions& opt) {
  const int n = cuda_device_count();
  if (index < 0 || index >= n) {
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    throw DeviceError(fmt::format("no CUDA device {}: {} visible (CUDA_VISIBLE_DEVICES={})", index,
                                  n, vis ? vis : "<unset>"));
  }
  return std::make_unique<cuda::CudaDevice>(index, opt);
}

}  // namespace rp
