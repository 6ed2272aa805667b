// HostJobs: the worker's host job thread (jobs in order, drain waits for them, a throwing job
// does not end the thread) and parallel_add (every element, any thread split).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <stdexcept>
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

}  // namespace
}  // namespace rp
