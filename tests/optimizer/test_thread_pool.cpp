// The persistent optimizer thread pool and the CPU topology helpers.
#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "optimizer/thread_pool.hpp"

namespace {

TEST(ThreadPool, RunsEveryPartOnceAndReusesThreads) {
  rp::ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  std::vector<std::thread::id> ids(4);
  for (int round = 0; round < 2000; ++round) {
    const int parts = 1 + round % 4;
    std::vector<std::atomic<int>> hits(4);
    pool.run(parts, [&](int p) {
      hits[size_t(p)].fetch_add(1);
      if (round == 0 || parts == 4) {
        if (round == 0 || ids[size_t(p)] == std::thread::id{}) ids[size_t(p)] = std::this_thread::get_id();
        ASSERT_EQ(ids[size_t(p)], std::this_thread::get_id()) << "part " << p << " moved thread";
      }
    });
    for (int p = 0; p < 4; ++p) ASSERT_EQ(hits[size_t(p)].load(), p < parts ? 1 : 0) << "round " << round;
  }
  std::set<std::thread::id> distinct;
  for (auto id : ids) distinct.insert(id);
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u);  // the caller only waits
}

TEST(ThreadPool, PropagatesExceptionsAndStaysUsable) {
  rp::ThreadPool pool(3);
  EXPECT_THROW(pool.run(3,
                        [](int p) {
                          if (p == 1) throw std::runtime_error("boom");
                        }),
               std::runtime_error);
  std::atomic<int> n{0};
  pool.run(3, [&](int) { n++; });
  EXPECT_EQ(n.load(), 3);
  EXPECT_THROW(pool.run(4, [](int) {}), std::invalid_argument);
  EXPECT_THROW(rp::ThreadPool(0), std::invalid_argument);
  pool.run(0, [](int) { FAIL(); });
}

TEST(ThreadPool, NestedRunIsInline) {
  rp::ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.run(2, [&](int) { pool.run(2, [&](int) { inner++; }); });
  EXPECT_EQ(inner.load(), 4);
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  rp::ThreadPool pool(2);
  std::atomic<int> active{0}, total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 200; ++r)
        pool.run(2, [&](int) {
          const int a = ++active;
          EXPECT_LE(a, 2);
          total++;
          --active;
        });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 200 * 2);
}

TEST(ThreadPool, PinsWorkersToTheGivenCpus) {
  const std::vector<int> cpus = rp::allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  rp::ThreadPool pool(rp::ThreadPool::Options{int(cpus.size()), cpus, 10, "rp-test"});
  std::vector<int> seen(cpus.size(), -1);
  pool.run(pool.size(), [&](int p) {
    cpu_set_t set;
    CPU_ZERO(&set);
    pthread_getaffinity_np(pthread_self(), sizeof set, &set);
    int count = 0, which = -1;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) ++count, which = c;
    seen[size_t(p)] = count == 1 ? which : -1;
  });
  for (size_t i = 0; i < cpus.size(); ++i) {
    EXPECT_TRUE(pool.pinned(int(i)));
    EXPECT_EQ(seen[i], cpus[i]);
    EXPECT_EQ(pool.cpu_of_worker()[i], cpus[i]);
  }
}

TEST(CpuTopology, PreferredOrderAndPoolsCoverTheAllowedCpus) {
  auto allowed = rp::allowed_cpus();
  auto order = rp::preferred_cpu_order();
  auto sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, allowed);
  EXPECT_EQ(rp::numa_node_of(allowed).size(), allowed.size());
  for (int pools : {1, 2, 3}) {
    auto lists = rp::cpus_for_pools(pools);
    ASSERT_EQ(lists.size(), size_t(pools));
    std::vector<int> all;
    for (auto& l : lists) {
      EXPECT_FALSE(l.empty());
      all.insert(all.end(), l.begin(), l.end());
    }
    if (pools <= int(allowed.size())) {
      std::sort(all.begin(), all.end());
      EXPECT_EQ(all, allowed) << pools << " pools";
    }
  }
  EXPECT_THROW(rp::cpus_for_pools(0), std::invalid_argument);
}

TEST(SplitRange, ContiguousGrainAlignedPieces) {
  for (int64_t n : {0, 1, 1023, 1024, 1025, 100000, 1 << 20})
    for (int parts : {1, 2, 3, 7, 16}) {
      int64_t prev = 0;
      for (int p = 0; p < parts; ++p) {
        int64_t lo, hi;
        rp::split_range(n, parts, 1024, p, lo, hi);
        EXPECT_EQ(lo, prev);
        EXPECT_LE(lo, hi);
        if (hi < n) {
          EXPECT_EQ(hi % 1024, 0);
        }
        prev = hi;
      }
      EXPECT_EQ(prev, n);
    }
}

}  // namespace

namespace {
TEST(SharedPool, PerCallingThreadPersistentAndGrowing) {
  rp::ThreadPool& a = rp::shared_pool(2);
  EXPECT_EQ(&a, &rp::shared_pool(2));  // persistent: the same pool on every call
  EXPECT_EQ(&a, &rp::shared_pool(1));
  rp::ThreadPool& b = rp::shared_pool(3);
  EXPECT_GE(b.size(), 3);
  rp::ThreadPool* other = nullptr;
  std::thread([&] { other = &rp::shared_pool(2); }).join();
  EXPECT_NE(other, &b);  // another caller thread has its own
}
}  // namespace
