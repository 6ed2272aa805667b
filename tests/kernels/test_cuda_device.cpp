// CUDA backend device layer: pool capacity and accounting, stream ordering, then()
// callbacks on host threads (after the work, allowed to issue CUDA work elsewhere),
// error propagation, pinned host memory. Skipped when no CUDA device is visible.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "tests/kernels/test_cuda_util.hpp"

namespace rp {
namespace {

using namespace rp::cudatest;

TEST(CudaDeviceCount, NeverThrows) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_THROW(make_cuda_device(n, DeviceOptions{}), DeviceError);  // one past the last
  EXPECT_THROW(make_cuda_device(-1, DeviceOptions{}), DeviceError);
}

class CudaDeviceTest : public CudaTest {
 protected:
  size_t capacity() const override { return size_t(64) << 20; }  // 64 MiB
};

TEST_F(CudaDeviceTest, CapacityAndAccounting) {
  EXPECT_EQ(dev().capacity_bytes(), size_t(64) << 20);
  EXPECT_EQ(dev().used_bytes(), 0u);
  void* a = dev().alloc(40 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(dev().used_bytes(), size_t(40) << 20);
  try {
    dev().alloc(30 << 20);
    FAIL() << "allocation past the capacity succeeded";
  } catch (const DeviceOutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("30.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("40.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("64.0 MiB"), std::string::npos) << m;
  }
  void* b = dev().alloc(1);  // rounded to 256 bytes
  EXPECT_EQ(dev().used_bytes(), (size_t(40) << 20) + 256);
  dev().free(a);
  dev().free(b);
  EXPECT_EQ(dev().used_bytes(), 0u);
  EXPECT_EQ(dev().peak_bytes(), (size_t(40) << 20) + 256);
  // after freeing, the whole capacity is usable again (blocks coalesce)
  void* c = dev().alloc(64 << 20);
  EXPECT_EQ(dev().used_bytes(), size_t(64) << 20);
  dev().free(c);
  // many small blocks, freed in a scattered order, coalesce back
  std::vector<void*> ps;
  for (int i = 0; i < 200; ++i) ps.push_back(dev().alloc(size_t(1000 + 37 * i)));
  for (int i = 0; i < 200; i += 2) dev().free(ps[size_t(i)]);
  for (int i = 1; i < 200; i += 2) dev().free(ps[size_t(i)]);
  EXPECT_EQ(dev().used_bytes(), 0u);
  void* d = dev().alloc(64 << 20);
  dev().free(d);
  dev().free(nullptr);
}

TEST_F(CudaDeviceTest, StreamOrderAndCallbacks) {
  const int64_t n = 4 << 20;  // 16 MiB of f32: each op takes measurable time
  DT x = alloc(n, DType::f32), y = alloc(n, DType::f32);
  std::vector<float> host(size_t(n), -1.f);
  const auto main_id = std::this_thread::get_id();
  std::atomic<int> order{0};
  auto pr = std::make_shared<std::promise<std::string>>();
  auto fut = pr->get_future();
  cs().launch([&] {
    ops().fill(DType::f32, x.get(), n, 1.f);
    for (int i = 0; i < 20; ++i) ops().add_into(DType::f32, x.get(), DType::f32, x.get(), n, 1.f);  // x *= 2
    ops().cast(DType::f32, y.get(), DType::f32, x.get(), n);
  });
  cs().copy_d2h(host.data(), y.get(), size_t(n) * 4);
  std::thread::id cb_id;
  cs().then([&, pr](const std::string& e) {
    cb_id = std::this_thread::get_id();
    order = 1;
    pr->set_value(e);
  });
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(fut.get(), "");
  EXPECT_EQ(order.load(), 1);
  EXPECT_NE(cb_id, main_id);
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(host[size_t(i)], 1048576.f) << i;
  EXPECT_EQ(host[size_t(n - 1)], 1048576.f);
}

TEST_F(CudaDeviceTest, CallbackMayIssueWorkOnAnotherStream) {
  const int64_t n = 1 << 20;  // page-aligned blocks, as the runtime's host buffers
  std::unique_ptr<float, void (*)(void*)> srcp(static_cast<float*>(std::aligned_alloc(4096, size_t(n) * 4)),
                                               std::free);
  std::unique_ptr<float, void (*)(void*)> dstp(static_cast<float*>(std::aligned_alloc(4096, size_t(n) * 4)),
                                               std::free);
  float* src = srcp.get();
  float* dst = dstp.get();
  for (int64_t i = 0; i < n; ++i) {
    src[i] = float(i % 1000);
    dst[i] = 0.f;
  }
  dev().pin_host(src, size_t(n) * 4);
  dev().pin_host(dst, size_t(n) * 4);
  dev().pin_host(dst, size_t(n) * 4);  // idempotent
  DT x = alloc(n, DType::f32);
  auto pr = std::make_shared<std::promise<std::string>>();
  auto fut = pr->get_future();
  Stream& up = dev().stream(StreamKind::act_up);
  up.copy_h2d(x.get(), src, size_t(n) * 4);
  up.then([&, pr](const std::string& e1) {
    // on the act_up poller thread: issue compute work and a download, as a worker would
    cs().launch([&] { ops().add_into(DType::f32, x.get(), DType::f32, x.get(), n, 2.f); });  // x *= 3
    Stream& down = dev().stream(StreamKind::act_down);
    cs().then([&, pr, e1](const std::string& e2) {
      down.copy_d2h(dst, x.get(), size_t(n) * 4);
      down.then([pr, e1, e2](const std::string& e3) { pr->set_value(e1 + e2 + e3); });
    });
  });
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(fut.get(), "");
  for (int64_t i = 0; i < n; i += 777) ASSERT_EQ(dst[i], 3.f * float(i % 1000)) << i;
  dev().unpin_host(src);
  dev().unpin_host(dst);
  dev().unpin_host(dst);
  dev().unpin_host(dst);  // one too many: ignored
}

TEST_F(CudaDeviceTest, LaunchErrorReachesNextThenOnly) {
  DT x = alloc(16, DType::f32);
  bool ran_after_error = false;
  cs().launch([] { throw std::invalid_argument("boom"); });
  cs().launch([&] { ran_after_error = true; });  // skipped, like the CPU backend
  std::string e = sync_err();
  EXPECT_NE(e.find("boom"), std::string::npos) << e;
  EXPECT_NE(e.find("compute"), std::string::npos) << e;
  EXPECT_FALSE(ran_after_error);
  // invalid arguments of an op are thrown before anything is enqueued
  cs().launch([&] { ops().rmsnorm_fwd(x.get(), x.get(), x.get(), 1, 0, 1e-6f); });
  e = sync_err();
  EXPECT_NE(e.find("rmsnorm_fwd"), std::string::npos) << e;
  EXPECT_TRUE(sync_err().empty());
  cs().launch([&] { ops().fill(DType::f32, x.get(), 16, 2.f); });
  EXPECT_TRUE(sync_err().empty());
}

TEST_F(CudaDeviceTest, AllStreamsWork) {
  for (int k = 0; k < kNumStreams; ++k) {
    Stream& s = dev().stream(StreamKind(k));
    DT x = alloc(1000, DType::f32);
    std::vector<float> a(1000, 7.f), b(1000, 0.f);
    s.copy_h2d(x.get(), a.data(), 4000);
    s.copy_d2h(b.data(), x.get(), 4000);
    s.synchronize();
    EXPECT_EQ(b, a) << stream_name(StreamKind(k));
  }
}

}  // namespace
}  // namespace rp
