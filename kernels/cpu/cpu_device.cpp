// CPU backend of the device abstraction: a virtual GPU whose memory is a
// capacity-limited host arena and whose streams are in-order host threads.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "base/counted.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/host_block_cache.hpp"
#include "kernels/cpu/pcie_link.hpp"
#include "kernels/device.hpp"
#include "kernels/ops.hpp"

namespace rp {

const char* stream_name(StreamKind k) {
  switch (k) {
    case StreamKind::compute: return "compute";
    case StreamKind::act_up: return "act_up";
    case StreamKind::act_down: return "act_down";
    case StreamKind::param_up: return "param_up";
    case StreamKind::grad_down: return "grad_down";
  }
  return "?";
}

namespace {

/// A steady-clock reading taken when the stream reaches the mark.
class CpuTimingMark final : public TimingMark {
 public:
  struct State {
    std::chrono::steady_clock::time_point t;
    std::atomic<bool> done{false};
    void set() {
      t = std::chrono::steady_clock::now();
      done.store(true, std::memory_order_release);
    }
  };
  CpuTimingMark() : st_(std::make_shared<State>()) {}
  std::shared_ptr<State> state() const { return st_; }
  bool done() const override { return st_->done.load(std::memory_order_acquire); }
  double seconds_since(const TimingMark& earlier) const override {
    auto* e = dynamic_cast<const CpuTimingMark*>(&earlier);
    if (!e) throw DeviceError("TimingMark::seconds_since: the earlier mark is not a CPU-backend mark");
    if (!done() || !e->done())
      throw DeviceError("TimingMark::seconds_since: a mark was read before its stream reached it");
    return std::chrono::duration<double>(st_->t - e->st_->t).count();
  }

 private:
  std::shared_ptr<State> st_;
};

/// An in-order queue executed by one host thread.
class CpuStream final : public Stream {
 public:
  /// `link` (may be null: unthrottled) is shared by the device's copy streams; `priority`
  /// is this stream's rank on it (0 = activations).
  CpuStream(std::string name, PcieLink* link, int priority)
      : name_(std::move(name)), link_(link), prio_(priority) {
    thread_ = std::thread([this] { loop(); });
  }
  ~CpuStream() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void launch(std::function<void()> work) override { push(std::move(work)); }
  void copy_h2d(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes, 0); }
  void copy_d2h(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes, 1); }
  void then(std::function<void(const std::string&)> cb) override {
    if (std::this_thread::get_id() == thread_.get_id()) {
      // inside launch() work (as the CUDA stream's issuer thread records its event there):
      // everything issued before has run, and the work runs only while no error is kept
      std::string e;
      std::swap(e, error_);
      return cb(e);
    }
    push(
        [this, cb = std::move(cb)] {
          std::string e;
          std::swap(e, error_);
          cb(e);
        },
        /*always=*/true);
  }
  void synchronize() override {
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [this] { return q_.empty() && !busy_; });
  }
  std::unique_ptr<TimingMark> mark_time() override {
    auto m = std::make_unique<CpuTimingMark>();
    if (std::this_thread::get_id() == thread_.get_id()) {
      m->state()->set();  // inside launch() work: everything issued before has run
    } else {
      push([st = m->state()] { st->set(); }, /*always=*/true);
    }
    return m;
  }

 private:
  struct Item {
    std::function<void()> fn;
    bool always;
  };
  void copy(void* dst, const void* src, size_t bytes, int dir) {
    push([=, this] {
      if (!link_) {
        std::memcpy(dst, src, bytes);
        return;
      }
      link_->transfer(dir, bytes, prio_, [=](size_t off, size_t n) {
        std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, n);
      });
    });
  }
  void push(std::function<void()> fn, bool always = false) {
    {
      std::lock_guard lk(mu_);
      q_.push_back({std::move(fn), always});
    }
    cv_.notify_one();
  }
  void loop() {
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
      if (it.always || error_.empty()) {
        try {
          it.fn();
        } catch (const std::exception& e) {
          if (error_.empty()) error_ = fmt::format("{} stream: {}", name_, e.what());
        }
      }
      {
        std::lock_guard lk(mu_);
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
  }

  std::string name_;
  PcieLink* link_;
  int prio_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Item> q_;
  bool stop_ = false, busy_ = false;
  std::string error_;  // touched only by the stream thread
  std::thread thread_;
};

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, const DeviceOptions& opt)
      : index_(index), cap_(opt.capacity_bytes), blocks_(opt.capacity_bytes) {
    if (opt.pcie_bytes_per_s > 0)
      link_ = std::make_unique<PcieLink>(opt.pcie_bytes_per_s, std::max<size_t>(opt.pcie_chunk_bytes, 1),
                                         opt.pcie_priorities);
    for (int k = 0; k < kNumStreams; ++k) {
      const StreamKind kind = StreamKind(k);
      const bool copies = kind != StreamKind::compute;
      const int prio = kind == StreamKind::act_up || kind == StreamKind::act_down ? 0 : 1;
      streams_[k] = std::make_unique<CpuStream>(fmt::format("vgpu{}.{}", index, stream_name(kind)),
                                                copies ? link_.get() : nullptr, prio);
    }
    ops_ = std::make_unique<cpu::CpuOps>(1);
    ops_->set_f16_accumulation(opt.f16_accumulation);  // emulated (kernels/cpu/cpu_f16_accum.cpp)
    ops_->set_expert_gemm(opt.expert_gemm_bucketed ? ExpertGemm::bucketed : ExpertGemm::grouped);
  }
  ~CpuDevice() override {
    for (auto& s : streams_) s->synchronize();
  }
  void interrupt() override {
    if (link_) link_->interrupt();
    ops_->interrupt();  // a long attention ends with its current block
  }
  int index() const override { return index_; }
  std::string name() const override { return fmt::format("cpu:{} (virtual GPU)", index_); }
  DType compute_dtype() const override { return DType::f32; }
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
    const size_t sz = pool_allocation_bytes(bytes, 256);
    {
      std::lock_guard lk(mu_);
      if (used_ + sz > cap_)
        throw DeviceOutOfMemory(fmt::format("{}: cannot allocate {}: {} of its {} capacity ({} bytes) in use",
                                            name(), byte_text(double(sz)), byte_text(double(used_)),
                                            byte_text(double(cap_)), cap_));
      used_ += sz;
      peak_ = std::max(peak_, used_);
    }
    // stage buffers come back pass after pass: large ones are reused from the block cache
    void* p = sz >= kCachedBlockBytes ? blocks_.alloc(sz) : std::aligned_alloc(256, sz);
    if (!p) {
      std::lock_guard lk(mu_);
      used_ -= sz;
      throw DeviceOutOfMemory(fmt::format("{}: host allocation of {} bytes failed", name(), sz));
    }
    std::lock_guard lk(mu_);
    sizes_[p] = sz;
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    {
      std::lock_guard lk(mu_);
      auto it = sizes_.find(p);
      if (it == sizes_.end()) return;
      used_ -= it->second;
      sizes_.erase(it);
    }
    if (!blocks_.free(p)) std::free(p);
  }
  Stream& stream(StreamKind k) override { return *streams_[int(k)]; }
  Ops& ops() override { return *ops_; }

 private:
  /// Allocations from this size on are served by blocks_ (page-granular, reused by size).
  static constexpr size_t kCachedBlockBytes = size_t(64) << 10;
  int index_;
  size_t cap_;
  HostBlockCache blocks_;
  mutable std::mutex mu_;
  size_t used_ = 0, peak_ = 0;
  std::unordered_map<void*, size_t> sizes_;
  std::unique_ptr<PcieLink> link_;  // declared before the streams, which use it
  std::unique_ptr<Stream> streams_[kNumStreams];
  std::unique_ptr<cpu::CpuOps> ops_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index, const DeviceOptions& opt) {
  return std::make_unique<CpuDevice>(index, opt);
}

}  // namespace rp
