// Helpers of the CUDA backend tests: a device fixture that skips cleanly without a GPU,
// uploads in the device dtype (returning the rounded fp32 values for the CPU twin),
// downloads, NaN poisoning, and running work on the compute stream with error checks.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/ops.hpp"
#include "roundpipe/errors.hpp"
#include "tests/kernels/ref_ops.hpp"

namespace rp::cudatest {

using VecF = std::vector<float>;

inline float round_to(DType t, float v) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(f32_to_bf16(v));
    case DType::f16: return f16_to_f32(f32_to_f16(v));
    case DType::i32: return float(int32_t(v));
    default: return v;
  }
}
inline VecF rounded(DType t, VecF v) {
  for (auto& x : v) x = round_to(t, x);
  return v;
}

/// A device tensor of n elements of type t.
struct DT {
  DeviceBuffer buf;
  int64_t n = 0;
  DType t = DType::f32;
  void* get() const { return buf.get(); }
  template <class T>
  T* as() const {
    return buf.as<T>();
  }
};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
    DeviceOptions o;
    o.capacity_bytes = capacity();
    o.dtype = dtype();
    dev_ = make_cuda_device(0, o);
  }
  virtual size_t capacity() const { return size_t(24) << 30; }
  virtual DType dtype() const { return DType::bf16; }

  Device& dev() { return *dev_; }
  Ops& ops() { return dev_->ops(); }
  DType ct() { return dev_->compute_dtype(); }
  Stream& cs() { return dev_->stream(StreamKind::compute); }

  /// Waits for everything issued on the compute stream; fails on any reported error.
  void sync_ok() {
    std::string err = sync_err();
    ASSERT_TRUE(err.empty()) << err;
  }
  /// Same, returning the error text of the compute stream's then() callback.
  std::string sync_err() {
    auto pr = std::make_shared<std::promise<std::string>>();
    auto fut = pr->get_future();
    cs().then([pr](const std::string& e) { pr->set_value(e); });
    if (fut.wait_for(std::chrono::seconds(300)) != std::future_status::ready)
      return "timed out waiting for the compute stream";
    return fut.get();
  }
  /// Runs fn(ops) inside a compute launch and waits; fails on errors.
  void run(const std::function<void(Ops&)>& fn) {
    cs().launch([&] { fn(ops()); });
    sync_ok();
  }

  DT alloc(int64_t n, DType t) {
    DT d;
    d.buf = DeviceBuffer(dev(), size_t(std::max<int64_t>(n, 1)) * dtype_size(t));
    d.n = n;
    d.t = t;
    return d;
  }
  /// Uploads v converted to t; v is replaced by the values the device holds.
  DT upload(VecF& v, DType t) {
    DT d = alloc(int64_t(v.size()), t);
    std::vector<char> host(v.size() * dtype_size(t) + 1);
    cast_f32_to(v.data(), host.data(), int64_t(v.size()), t);
    v = rounded(t, v);
    cs().copy_h2d(d.get(), host.data(), v.size() * dtype_size(t));
    cs().synchronize();
    return d;
  }
  DT upload_i32(const std::vector<int32_t>& v) {
    DT d = alloc(int64_t(v.size()), DType::i32);
    cs().copy_h2d(d.get(), v.data(), v.size() * 4);
    cs().synchronize();
    return d;
  }
  /// n NaN-poisoned elements of t (of the compute dtype by default).
  DT poisoned(int64_t n, DType t) {
    DT d = alloc(n, t);
    std::vector<char> host(size_t(n) * dtype_size(t) + 1, char(0x7f));  // i32: 0x7f7f7f7f
    if (t != DType::i32) {
      VecF nan(size_t(n), std::numeric_limits<float>::quiet_NaN());
      cast_f32_to(nan.data(), host.data(), n, t);
    }
    cs().copy_h2d(d.get(), host.data(), size_t(n) * dtype_size(t));
    cs().synchronize();
    return d;
  }
  VecF download(const DT& d) {
    std::vector<char> host(size_t(d.n) * dtype_size(d.t) + 1);
    cs().copy_d2h(host.data(), d.get(), size_t(d.n) * dtype_size(d.t));
    cs().synchronize();
    VecF out(size_t(d.n));
    for (int64_t i = 0; i < d.n; ++i) {
      const char* p = host.data() + size_t(i) * dtype_size(d.t);
      uint16_t h;
      switch (d.t) {
        case DType::f32: std::memcpy(&out[size_t(i)], p, 4); break;
        case DType::i32: {
          int32_t x;
          std::memcpy(&x, p, 4);
          out[size_t(i)] = float(x);
          break;
        }
        case DType::bf16:
          std::memcpy(&h, p, 2);
          out[size_t(i)] = bf16_to_f32(h);
          break;
        case DType::f16:
          std::memcpy(&h, p, 2);
          out[size_t(i)] = f16_to_f32(h);
          break;
      }
    }
    return out;
  }

  std::unique_ptr<Device> dev_;
};

/// The device a run with "fp8": true opens (bf16, FP8 linears): skips without a GPU, and with
/// opening's one line on a GPU without FP8 tensor cores (compute capability below 8.9).
class CudaFp8DeviceTest : public CudaTest {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
    DeviceOptions o;
    o.dtype = DType::bf16;
    o.fp8 = true;
    try {
      dev_ = make_cuda_device(0, o);
    } catch (const DeviceError& e) {
      GTEST_SKIP() << e.what();
    }
  }
};

/// Relative error with a readable failure (NaN counts as infinite error).
inline ::testing::AssertionResult close(const VecF& got, const VecF& ref, double tol, const char* what = "") {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  size_t nan = 0;
  for (float x : got) nan += std::isnan(x) ? 1 : 0;
  const double e = ref::rel_err(got, ref);
  if (nan == 0 && e <= tol) return ::testing::AssertionSuccess() << what << " rel err " << e;
  return ::testing::AssertionFailure()
         << what << ": rel err " << e << " > " << tol << " (" << nan << " NaN of " << got.size() << ")";
}

}  // namespace rp::cudatest
