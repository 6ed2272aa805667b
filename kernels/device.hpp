// The device abstraction both backends implement (CPU and CUDA, one runtime).
//
// A Device is one GPU or one virtual GPU of the CPU backend. It owns
//  - a memory pool with a byte capacity (alloc throws DeviceOutOfMemory past it),
//  - five in-order streams: compute, activation upload, activation download,
//    parameter upload, gradient download (one copy stream per kind of traffic),
//  - the numeric ops (Ops) bound to its compute stream.
// Work is *issued* on a stream with launch(): on the CPU backend the function runs
// on the stream's own thread, in issue order; on the CUDA backend the compute stream's
// work runs on that stream's own issuing thread too, in issue order, and enqueues kernels
// there (an op that waits for the device, as moe_sort's host round trip, holds that
// thread, not the caller), while the copy streams' work runs at once on the caller's
// thread. Either way the work of one stream completes in issue order, and then(cb) runs
// cb on a host thread once everything issued before it has completed. No caller ever
// blocks on a device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/dtype.hpp"
#include "roundpipe/device.hpp"  // DeviceOptions, cuda_device_count
#include "roundpipe/errors.hpp"  // DeviceOutOfMemory, DeviceError

namespace rp {

class Ops;

/// Allocation granule of the CUDA pool: allocations above kSmallAllocationBytes are backed by
/// their own physical memory in multiples of it (the GPU's 2 MiB pages), so free memory never
/// fragments; smaller ones share pages.
constexpr size_t kCudaPoolGranule = size_t(2) << 20;
/// Allocations up to this size are sub-allocated (256-byte aligned) on both backends.
constexpr size_t kSmallAllocationBytes = size_t(1) << 20;

/// Bytes a device pool charges against its capacity for an allocation of `bytes`: 256-byte
/// rounding up to kSmallAllocationBytes, above that a multiple of `granule` (256 on the CPU
/// backend, kCudaPoolGranule on a GPU). A zero-byte request is charged as one byte. The
/// planner's memory model (scheduler/partition.hpp) charges buffers the same way.
inline size_t pool_allocation_bytes(size_t bytes, size_t granule) {
  const size_t b = bytes == 0 ? 1 : bytes;
  const size_t g = b <= kSmallAllocationBytes || granule < 256 ? 256 : granule;
  return (b + g - 1) / g * g;
}

enum class StreamKind : uint8_t { compute = 0, act_up = 1, act_down = 2, param_up = 3, grad_down = 4 };
constexpr int kNumStreams = 5;
const char* stream_name(StreamKind k);

/// A point in a stream's order (Stream::mark_time) whose time becomes readable once
/// the stream has reached it. Marks of one device measure the device-side time between
/// them: a steady-clock reading on the CPU backend, a CUDA event with timing on the GPU.
/// A mark must not outlive the device that recorded it.
class TimingMark {
 public:
  virtual ~TimingMark() = default;
  /// True once the stream reached the mark (never blocks).
  virtual bool done() const = 0;
  /// Seconds from `earlier` to this mark (both recorded on streams of the same device).
  /// Read it only after both completed, e.g. in a then() callback issued after them; a
  /// mark not yet reached, or a mark of another backend, throws DeviceError. Negative
  /// when `earlier` was in fact reached later (marks of two different streams).
  virtual double seconds_since(const TimingMark& earlier) const = 0;
};

/// One in-order queue of device work.
class Stream {
 public:
  virtual ~Stream() = default;
  /// Issues `work` on this stream (see file comment). Exceptions thrown by work on
  /// the CPU backend are kept and rethrown by the next then() callback's `error`.
  virtual void launch(std::function<void()> work) = 0;
  /// Copies `bytes` from host memory to device memory, in stream order.
  virtual void copy_h2d(void* dst_dev, const void* src_host, size_t bytes) = 0;
  /// Copies `bytes` from device memory to host memory, in stream order.
  virtual void copy_d2h(void* dst_host, const void* src_dev, size_t bytes) = 0;
  /// Runs `cb(error)` on a host thread once all work issued before it has completed;
  /// `error` is empty on success, else the text of the first failure since the
  /// previous then(). cb must not block and must not issue work on this stream. Called
  /// inside launch() work it marks the point between the ops issued before and after it (as
  /// mark_time does): cb runs once those before it completed (on the CPU backend at once, on
  /// the calling stream thread).
  virtual void then(std::function<void(const std::string& error)> cb) = 0;
  /// Blocks the caller until all issued work completed (tests and shutdown only).
  virtual void synchronize() = 0;
  /// Records a timing mark in stream order and returns at once (never blocks, never
  /// waits for the device). Called inside launch() work it marks the point between the
  /// ops issued before and after it (like an op); called outside, it marks the point after
  /// everything issued so far. Read it after completion (TimingMark::seconds_since).
  /// Throws DeviceError when the backend cannot record one.
  virtual std::unique_ptr<TimingMark> mark_time() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual int index() const = 0;
  virtual std::string name() const = 0;
  /// Storage type of weights and activations on this device (f32 on the CPU backend).
  virtual DType compute_dtype() const = 0;
  virtual size_t capacity_bytes() const = 0;
  /// Granule of pool_allocation_bytes for this device's pool (256 or kCudaPoolGranule).
  virtual size_t allocation_granule() const { return 256; }
  virtual size_t used_bytes() const = 0;
  virtual size_t peak_bytes() const = 0;
  /// Allocates `bytes` (256-byte aligned), charging pool_allocation_bytes(bytes,
  /// allocation_granule()) against the capacity. Never fails while the charged bytes in use
  /// plus this request fit the capacity (the pools do not fragment). Throws DeviceOutOfMemory
  /// naming the request, the capacity and the bytes in use.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual Stream& stream(StreamKind k) = 0;
  /// Pins host memory [p, p+bytes) that this device's streams copy from or to, so copies
  /// run asynchronously at full bandwidth (CUDA: cudaHostRegister, exact size; give
  /// page-aligned blocks). Idempotent per block; no-op on the CPU backend.
  virtual void pin_host(void* /*p*/, size_t /*bytes*/) {}
  /// Undoes pin_host(p, ...) (once per pin_host call). No-op on the CPU backend.
  virtual void unpin_host(void* /*p*/) {}
  /// Numeric ops bound to the compute stream; call them only inside compute launch().
  virtual Ops& ops() = 0;
  /// Makes the work already issued finish as soon as it can, for a teardown with work in
  /// flight (a failed or stopped run): the CPU backend's emulated PCIe link stops delaying
  /// copies, in flight and later (the bytes are still copied), and its attention ops stop after
  /// their current block (outputs undefined). Irreversible; any thread.
  /// No-op on CUDA (copies there take real link time, which is bounded).
  virtual void interrupt() {}
};

/// Creates virtual GPU `index` of the CPU backend.
std::unique_ptr<Device> make_cpu_device(int index, const DeviceOptions& opt);
/// Creates CUDA device `index` (of those CUDA_VISIBLE_DEVICES exposes). Throws
/// DeviceError when the build has no CUDA backend or the device cannot be used.
std::unique_ptr<Device> make_cuda_device(int index, const DeviceOptions& opt);

/// RAII device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& d, size_t bytes) : dev_(&d), p_(d.alloc(bytes)), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    reset();
    swap(o);
    return *this;
  }
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (p_) dev_->free(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void swap(DeviceBuffer& o) {
    std::swap(dev_, o.dev_);
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
  }
  Device* dev_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace rp
