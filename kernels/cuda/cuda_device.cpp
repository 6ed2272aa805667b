// CUDA backend of the device abstraction (kernels/device.hpp): one GPU with a
// capacity-limited pool, a compute stream and four copy streams (cuda_stream.cpp: their
// callbacks and timing marks), and host memory pinned through a process-wide registry.
// The errors thrown by cuda_check.hpp's checked calls are made here too.
//
// alloc() charges pool_allocation_bytes (kernels/device.hpp) against the capacity; memory
// comes from a PagedPool (kernels/paged_pool.hpp) over the driver's virtual memory
// management (cuda_pages.cpp): each large allocation gets its own physical pages at a fresh
// virtual range, so free memory never fragments, and freed allocations stay mapped for
// reuse, so the steady state makes no driver call and alloc/free never synchronise the device.
#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kernels/cuda/cuda_arch.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_device_impl.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device.hpp"
#include "kernels/device_arch.hpp"
#include "kernels/ops.hpp"
#include "kernels/paged_pool.hpp"

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

std::string err_text(cudaError_t e, const char* what) {
  return fmt::format("CUDA error {} ({}) in {}", cudaGetErrorName(e), cudaGetErrorString(e), what);
}

namespace {

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

// ---- device ------------------------------------------------------------------------------

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
    pages_ = make_cuda_pages(index_);
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
  std::unique_ptr<PageBackend> pages_;
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