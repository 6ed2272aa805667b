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
//  - alloc() charges pool_allocation_bytes (kernels/device.hpp) against the capacity; memory
//    comes from a PagedPool (kernels/paged_pool.hpp) over the driver's virtual memory
//    management: each large allocation gets its own physical pages at a fresh virtual range,
//    so free memory never fragments, and freed allocations stay mapped for reuse, so the
//    steady state makes no driver call and alloc/free never synchronise the device.
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

#include "kernels/cuda/cuda_arch.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device.hpp"
#include "kernels/device_arch.hpp"
#include "kernels/ops.hpp"
#include "kernels/paged_pool.hpp"

#include <cuda.h>

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

void check_launch(const char* name, const char* file, int line) {
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw_cuda_error(e, fmt::format("launch of kernel {}", name).c_str(), file, line);
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

// ---- streams ----------------------------------------------------------------------------

class CudaStream final : public Stream {
 public:
  /// issuer: launch() work runs on the stream's own issuing thread, in issue order (the
  /// compute stream: an op that waits for the device, as moe_sort's host round trip, then
  /// holds that thread, not the actor that issued the work); else at once on the caller's.
  CudaStream(int dev, std::string name, int priority, volatile unsigned* err_words, bool issuer = false)
      : dev_(dev), name_(std::move(name)), err_words_(err_words) {
    set_device(dev_);
    RP_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
    timing_ = std::make_shared<TimingEventPool>(dev_);
    poller_ = std::thread([this] { poll_loop(); });
    if (issuer) issuer_ = std::thread([this] { issue_loop(); });
  }
  ~CudaStream() override {
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
  cudaStream_t handle() const { return s_; }

  void launch(std::function<void()> work) override {
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
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    issue([=, this] { copy(dst, src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync host->device"); });
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    issue([=, this] { copy(dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync device->host"); });
  }
  void then(std::function<void(const std::string&)> cb) override {
    issue([this, cb = std::move(cb)]() mutable { then_now(std::move(cb)); });
  }

 private:
  // Runs f now on a stream without an issuing thread (or on that thread itself), else queues
  // it there behind the work issued before.
  void issue(std::function<void()> f) {
    if (!issuer_.joinable() || std::this_thread::get_id() == issuer_.get_id()) return f();
    {
      std::lock_guard lk(imu_);
      iq_.push_back(std::move(f));
    }
    icv_.notify_all();
  }
  void issue_loop() {
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
  // Waits until everything queued for the issuing thread has been issued to the device.
  void wait_issued() {
    if (!issuer_.joinable() || std::this_thread::get_id() == issuer_.get_id()) return;
    std::unique_lock lk(imu_);
    iidle_cv_.wait(lk, [this] { return iq_.empty() && !ibusy_; });
  }
  void then_now(std::function<void(const std::string&)> cb) {
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

 public:
  void synchronize() override {
    wait_issued();
    cudaSetDevice(dev_);
    cudaStreamSynchronize(s_);  // errors reach then() callbacks; shutdown must not throw
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [this] { return q_.empty() && !busy_; });
  }
  std::unique_ptr<TimingMark> mark_time() override {
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

// ---- device ------------------------------------------------------------------------------

// The driver functions of virtual memory management, looked up through the runtime (so the
// programs do not link libcuda and start on machines without a driver).
struct DriverApi {
  decltype(&cuGetErrorName) get_error_name = nullptr;
  decltype(&cuGetErrorString) get_error_string = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
};

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    auto get = [](const char* sym, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      const cudaError_t e = cudaGetDriverEntryPointByVersion(sym, &p, 12000, cudaEnableDefault, &q);
      if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
        cudaGetLastError();
        throw DeviceError(fmt::format("the CUDA driver has no {} ({})", sym, cudaGetErrorString(e)));
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuGetErrorName", a.get_error_name);
    get("cuGetErrorString", a.get_error_string);
    get("cuDeviceGet", a.device_get);
    get("cuDeviceGetAttribute", a.device_get_attribute);
    get("cuMemGetAllocationGranularity", a.granularity);
    get("cuMemAddressReserve", a.address_reserve);
    get("cuMemAddressFree", a.address_free);
    get("cuMemCreate", a.create);
    get("cuMemRelease", a.release);
    get("cuMemMap", a.map);
    get("cuMemUnmap", a.unmap);
    get("cuMemSetAccess", a.set_access);
    return a;
  }();
  return api;
}

void check_cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  driver().get_error_name(r, &name);
  driver().get_error_string(r, &text);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    throw DeviceOutOfMemory(
        fmt::format("CUDA driver error {} ({}) in {}", name ? name : "?", text ? text : "?", what));
  throw DeviceError(
      fmt::format("CUDA driver error {} ({}) in {}", name ? name : "?", text ? text : "?", what));
}

/// Physical pages and address ranges of one GPU through the driver's virtual memory management.
class CudaPages final : public PageBackend {
 public:
  explicit CudaPages(int index) : index_(index) {
    set_device(index_);
    RP_CUDA_CHECK(cudaFree(nullptr));  // the primary context exists and is current
    CUdevice dev = 0;
    check_cu(driver().device_get(&dev, index_), "cuDeviceGet");
    int vmm = 0;
    check_cu(
        driver().device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
        "cuDeviceGetAttribute");
    if (!vmm)
      throw DeviceError(
          fmt::format("cuda:{}: the driver does not support virtual memory management", index_));
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = dev;
    size_t g = 0;
    check_cu(driver().granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             "cuMemGetAllocationGranularity");
    if (g == 0 || kCudaPoolGranule % g != 0)
      throw DeviceError(
          fmt::format("cuda:{}: allocation granularity {} does not divide {}", index_, g, kCudaPoolGranule));
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  uintptr_t reserve(size_t bytes, size_t align) override {
    set_device(index_);
    CUdeviceptr p = 0;
    check_cu(driver().address_reserve(&p, bytes, align, 0, 0), "cuMemAddressReserve");
    return uintptr_t(p);
  }
  void unreserve(uintptr_t va, size_t bytes) override { driver().address_free(CUdeviceptr(va), bytes); }
  uint64_t create(size_t bytes) override {
    set_device(index_);
    CUmemGenericAllocationHandle h = 0;
    check_cu(driver().create(&h, bytes, &prop_, 0), "cuMemCreate");
    return uint64_t(h);
  }
  void release(uint64_t h) override {
    check_cu(driver().release(CUmemGenericAllocationHandle(h)), "cuMemRelease");
  }
  void map(uintptr_t va, size_t bytes, uint64_t h) override {
    set_device(index_);
    check_cu(driver().map(CUdeviceptr(va), bytes, 0, CUmemGenericAllocationHandle(h), 0), "cuMemMap");
    const CUresult r = driver().set_access(CUdeviceptr(va), bytes, &access_, 1);
    if (r != CUDA_SUCCESS) {
      driver().unmap(CUdeviceptr(va), bytes);
      check_cu(r, "cuMemSetAccess");
    }
  }
  void unmap(uintptr_t va, size_t bytes) override {
    set_device(index_);
    check_cu(driver().unmap(CUdeviceptr(va), bytes), "cuMemUnmap");
  }
  size_t device_free_bytes() override {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    return fr;
  }

 private:
  int index_;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const DeviceOptions& opt) : index_(index), cap_(opt.capacity_bytes) {
    set_device(index_);
    RP_CUDA_CHECK(cudaGetDeviceProperties(&prop_, index_));
    void* h = nullptr;
    RP_CUDA_CHECK(
        cudaHostAlloc(&h, kErrSlots * sizeof(unsigned), cudaHostAllocMapped | cudaHostAllocPortable));
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
      const bool compute = sk == StreamKind::compute;
      streams_[k] = std::make_unique<CudaStream>(index_, fmt::format("cuda{}.{}", index_, stream_name(sk)),
                                                 prio, compute ? err_host_ : nullptr, /*issuer=*/compute);
    }
    ops_ = std::make_unique<CudaOps>(index_, streams_[0]->handle(), opt.dtype, static_cast<unsigned*>(d));
    ops_->set_f16_accumulation(opt.f16_accumulation);
    ops_->set_expert_gemm(opt.expert_gemm_bucketed ? ExpertGemm::bucketed : ExpertGemm::grouped);
    pages_ = std::make_unique<CudaPages>(index_);
    pool_ = std::make_unique<PagedPool>(*pages_, cap_, kCudaPoolGranule, name());
  }
  ~CudaDevice() override {
    for (auto& s : streams_) s->synchronize();
    ops_.reset();
    for (auto& s : streams_) s.reset();
    cudaSetDevice(index_);
    pool_.reset();
    pages_.reset();
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
  size_t allocation_granule() const override { return kCudaPoolGranule; }
  size_t used_bytes() const override { return pool_->used_bytes(); }
  size_t peak_bytes() const override { return pool_->peak_bytes(); }
  void* alloc(size_t bytes) override { return pool_->alloc(bytes); }
  void free(void* p) override { pool_->free(p); }

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
  int index_;
  size_t cap_;
  cudaDeviceProp prop_{};
  unsigned* err_host_ = nullptr;
  mutable std::mutex mu_;  // pinned_here_
  std::unique_ptr<CudaPages> pages_;
  std::unique_ptr<PagedPool> pool_;
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
    throw DeviceError(fmt::format("no CUDA device {}: {} visible (CUDA_VISIBLE_DEVICES={})", index, n,
                                  vis ? vis : "<unset>"));
  }
  if (opt.f16_accumulation && opt.dtype != DType::f16)
    throw std::invalid_argument("fp16 accumulation needs the f16 compute dtype (DeviceOptions::dtype)");
  cuda::check_device_arch(index);  // one line when this build has no kernels for the GPU
  if (opt.fp8) {
    if (opt.dtype != DType::bf16)
      throw std::invalid_argument("FP8 linears need the bf16 compute dtype (DeviceOptions::dtype)");
    cudaDeviceProp prop{};
    RP_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    const std::string no =
        fp8_refusal_line(fmt::format("cuda:{} ({})", index, prop.name), prop.major, prop.minor);
    if (!no.empty()) throw DeviceError(no);
  }
  return std::make_unique<cuda::CudaDevice>(index, opt);
}

}  // namespace rp
