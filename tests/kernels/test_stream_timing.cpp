// Stream timing marks (kernels/device.hpp: Stream::mark_time, TimingMark), the profiler's
// clock: a steady-clock reading on the CPU backend, a CUDA event on the GPU. Marks are
// recorded in stream order without blocking and read only after the stream reached them.
// The CUDA tests skip (visibly) without a GPU; on one they check that the event times of a
// known workload are positive, ordered, additive (N repetitions take about N times one)
// and never longer than the host's wall time around them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "tests/kernels/test_cuda_util.hpp"

namespace rp {
namespace {

using namespace std::chrono_literals;

/// Waits for a then() callback on `s` and returns what `read` computed inside it.
template <class F>
auto in_then(Stream& s, F read) {
  using R = decltype(read());
  auto pr = std::make_shared<std::promise<R>>();
  auto fut = pr->get_future();
  s.then([pr, read](const std::string& err) {
    if (!err.empty()) {
      pr->set_exception(std::make_exception_ptr(std::runtime_error(err)));
      return;
    }
    try {
      pr->set_value(read());
    } catch (...) {
      pr->set_exception(std::current_exception());
    }
  });
  if (fut.wait_for(120s) != std::future_status::ready) throw std::runtime_error("then() callback never ran");
  return fut.get();
}

TEST(CpuStreamTiming, MarksOutsideLaunchTimeTheWorkBetweenThem) {
  auto d = make_cpu_device(0, DeviceOptions{});
  Stream& s = d->stream(StreamKind::compute);
  auto a = s.mark_time();
  s.launch([] { std::this_thread::sleep_for(30ms); });
  auto b = s.mark_time();
  s.launch([] { std::this_thread::sleep_for(10ms); });
  auto c = s.mark_time();
  auto [ab, bc, ac] = in_then(s, [&] {
    return std::tuple{b->seconds_since(*a), c->seconds_since(*b), c->seconds_since(*a)};
  });
  EXPECT_GE(ab, 0.029);
  EXPECT_GE(bc, 0.009);
  EXPECT_LT(ab, 10.0);
  EXPECT_NEAR(ac, ab + bc, 1e-9);  // one clock: intervals add up exactly
}

TEST(CpuStreamTiming, MarksInsideLaunchSplitTheWork) {
  auto d = make_cpu_device(0, DeviceOptions{});
  Stream& s = d->stream(StreamKind::compute);
  std::unique_ptr<TimingMark> a, b, c;
  s.launch([&] {
    a = s.mark_time();
    std::this_thread::sleep_for(20ms);
    b = s.mark_time();
    std::this_thread::sleep_for(5ms);
    c = s.mark_time();
  });
  auto [ab, bc] = in_then(s, [&] { return std::pair{b->seconds_since(*a), c->seconds_since(*b)}; });
  EXPECT_GE(ab, 0.019);
  EXPECT_GE(bc, 0.004);
  // the inner marks are taken where the work reached them, not queued behind it
  EXPECT_LT(bc, ab);
}

TEST(CpuStreamTiming, ReadingBeforeTheStreamReachedAMarkThrows) {
  auto d = make_cpu_device(0, DeviceOptions{});
  Stream& s = d->stream(StreamKind::compute);
  auto a = s.mark_time();
  s.launch([] { std::this_thread::sleep_for(200ms); });
  auto b = s.mark_time();  // returns at once: the stream is still sleeping
  EXPECT_FALSE(b->done());
  EXPECT_THROW(b->seconds_since(*a), DeviceError);
  s.synchronize();
  EXPECT_TRUE(b->done());
  EXPECT_GE(b->seconds_since(*a), 0.199);
  EXPECT_EQ(b->seconds_since(*b), 0.0);
}

TEST(CpuStreamTiming, MarksAreRecordedEvenAfterAFailedLaunch) {
  auto d = make_cpu_device(0, DeviceOptions{});
  Stream& s = d->stream(StreamKind::compute);
  auto a = s.mark_time();
  s.launch([] { throw std::runtime_error("boom"); });
  auto b = s.mark_time();
  std::string err;
  auto pr = std::make_shared<std::promise<std::string>>();
  s.then([pr](const std::string& e) { pr->set_value(e); });
  err = pr->get_future().get();
  EXPECT_NE(err.find("boom"), std::string::npos) << err;
  EXPECT_TRUE(b->done());
  EXPECT_GE(b->seconds_since(*a), 0.0);
}

// ---- CUDA ------------------------------------------------------------------------------

class CudaStreamTiming : public cudatest::CudaTest {
 protected:
  static constexpr int64_t kN = int64_t(32) << 20;  // 32 Mi floats: 128 MiB per operand
  /// One unit of known work: 10 passes of x += 0 * x over kN floats (~4 GB of memory
  /// traffic, about a millisecond on an H200).
  void unit(const cudatest::DT& x) {
    for (int i = 0; i < 10; ++i) ops().add_into(DType::f32, x.get(), DType::f32, x.get(), kN, 0.f);
  }
};

TEST_F(CudaStreamTiming, RepetitionsAddUpAndMarksAreOrdered) {
  cudatest::DT x = alloc(kN, DType::f32);
  run([&](Ops& o) {
    o.fill(DType::f32, x.get(), kN, 1.f);
    for (int w = 0; w < 3; ++w) unit(x);  // warm-up: clocks, first-launch costs
  });
  constexpr int kReps = 8;
  std::vector<double> one, many;
  for (int trial = 0; trial < 5; ++trial) {
    std::unique_ptr<TimingMark> m0, m1, m2;
    const auto host0 = std::chrono::steady_clock::now();  // before any of the work is issued
    cs().launch([&] {
      m0 = cs().mark_time();
      unit(x);
      m1 = cs().mark_time();
      for (int r = 0; r < kReps; ++r) unit(x);
    });
    m2 = cs().mark_time();  // outside launch: after everything issued so far
    auto [t1, tn, total] = in_then(cs(), [&] {
      return std::tuple{m1->seconds_since(*m0), m2->seconds_since(*m1), m2->seconds_since(*m0)};
    });
    const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - host0).count();
    EXPECT_GT(t1, 0) << "trial " << trial;
    EXPECT_GT(tn, t1) << "trial " << trial;
    EXPECT_NEAR(total, t1 + tn, 1e-5 + 1e-3 * total) << "trial " << trial;
    // device time between the marks cannot exceed the host's wall time around them
    EXPECT_LE(tn, host + 1e-3) << "trial " << trial;
    one.push_back(t1);
    many.push_back(tn);
  }
  std::sort(one.begin(), one.end());
  std::sort(many.begin(), many.end());
  const double ratio = many[2] / one[2];  // medians
  std::printf("one unit %.3f ms, %d units %.3f ms (ratio %.2f)\n", one[2] * 1e3, kReps, many[2] * 1e3, ratio);
  EXPECT_GT(ratio, 0.7 * kReps);
  EXPECT_LT(ratio, 1.3 * kReps);
}

TEST_F(CudaStreamTiming, MarkReturnsAtOnceAndIsNotReadableEarly) {
  cudatest::DT x = alloc(kN, DType::f32);
  run([&](Ops& o) { o.fill(DType::f32, x.get(), kN, 1.f); });
  auto a = cs().mark_time();
  const auto t0 = std::chrono::steady_clock::now();
  cs().launch([&] {
    for (int r = 0; r < 40; ++r) unit(x);  // tens of milliseconds of device work, 400 launches
  });
  auto b = cs().mark_time();
  const double issue = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool early_done = b->done();
  bool threw = false;
  try {
    b->seconds_since(*a);
  } catch (const DeviceError&) {
    threw = true;
  }
  const double device = in_then(cs(), [&] { return b->seconds_since(*a); });
  std::printf("issued in %.3f ms, device time %.3f ms\n", issue * 1e3, device * 1e3);
  ASSERT_GT(device, 10 * issue) << "the workload was too short to test early reads";
  EXPECT_FALSE(early_done);
  EXPECT_TRUE(threw);
  EXPECT_TRUE(b->done());
}

}  // namespace
}  // namespace rp
