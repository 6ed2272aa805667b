// HostJobs: the worker's host job thread (jobs in order, drain waits for them, a throwing job
// does not end the thread), parallel_add (every element, any thread split) and GradientStaging (a
// group's buffer is kept, each addition lands in its own slot and reports once).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/host_jobs.hpp"

namespace rp {
namespace {

TEST(HostJobs, RunJobsInPostOrderOffTheCallersThread) {
  HostJobs jobs;
  std::vector<int> order;
  std::atomic<int> on_caller{0};
  const auto caller = std::this_thread::get_id();
  for (int i = 0; i < 50; ++i)
    jobs.post([&, i] {
      if (std::this_thread::get_id() == caller) on_caller++;
      order.push_back(i);
    });
  jobs.drain();
  std::vector<int> want(50);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(order, want);
  EXPECT_EQ(on_caller.load(), 0) << "a job ran on the posting thread";
}

TEST(HostJobs, PostReturnsBeforeASlowJobEndsAndDrainWaitsForIt) {
  HostJobs jobs;
  std::promise<void> go;
  auto gate = go.get_future().share();
  std::atomic<bool> ran{false};
  jobs.post([gate, &ran] {
    gate.wait();
    ran = true;
  });
  EXPECT_FALSE(ran.load()) << "post waited for the job";
  std::thread opener([&go] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    go.set_value();
  });
  jobs.drain();
  EXPECT_TRUE(ran.load()) << "drain returned before the job ran";
  opener.join();
}

TEST(HostJobs, AThrowingJobDoesNotStopTheLaterOnesAndPostAfterDrainRestarts) {
  HostJobs jobs;
  int after = 0;
  jobs.post([] { throw std::runtime_error("boom"); });
  jobs.post([&after] { after = 1; });
  jobs.drain();
  EXPECT_EQ(after, 1);
  jobs.post([&after] { after = 2; });
  jobs.drain();
  EXPECT_EQ(after, 2) << "a post after drain did not run";
}

TEST(ParallelAdd, AddsEveryElementOnceForSizesAroundTheThreadSplit) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), (int64_t(1) << 22) - 1, (int64_t(1) << 23) + 5}) {
    std::vector<float> dst(static_cast<size_t>(n)), src(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      dst[size_t(i)] = float(i % 1000);
      src[size_t(i)] = float((i * 7) % 13) - 6.f;
    }
    parallel_add(dst.data(), src.data(), n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += dst[size_t(i)] != float(i % 1000) + (float((i * 7) % 13) - 6.f);
    EXPECT_EQ(bad, 0) << "n = " << n;
  }
}

TEST(GradientStaging, KeepsAGroupsBufferAndAddsEachContributionIntoItsSlot) {
  GradientStaging st(nullptr);  // no device: nothing pinned
  const int64_t n = 1000;
  float* a = static_cast<float*>(st.buffer(3, n * sizeof(float)));
  EXPECT_EQ(st.buffer(3, n * sizeof(float)), a) << "a group's buffer is reused, not reallocated";
  float* b = static_cast<float*>(st.buffer(7, n * sizeof(float)));
  EXPECT_NE(a, b);
  std::vector<float> slot3(n), slot7(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = float(i), b[i] = float(2 * i);
    slot3[size_t(i)] = 1, slot7[size_t(i)] = -1;
  }
  std::vector<std::string> reports;
  std::mutex m;
  auto done = [&](std::string err) {
    std::lock_guard lk(m);
    reports.push_back(err);
  };
  st.add_into(3, slot3.data(), n, done);
  st.add_into(7, slot7.data(), n, done);
  st.clear();  // waits for both
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0], "");
  EXPECT_EQ(reports[1], "");
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(slot3[size_t(i)], 1 + float(i)) << i;
    ASSERT_EQ(slot7[size_t(i)], -1 + float(2 * i)) << i;
  }
}

}  // namespace
}  // namespace rp
