// tier/buffer_ring: a bounded ring of aligned host buffers from an injected allocator, with
// backpressure (acquire waits), timeouts, stop tokens and a stop for shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tier/buffer_ring.hpp"

using namespace std::chrono_literals;
using rp::tier::BufferRing;
using rp::tier::HostAllocator;

namespace {

/// An allocator that records what it hands out and gets back.
struct CountingAllocator {
  std::vector<std::pair<void*, size_t>> allocated, freed;
  int fail_at = -1;           ///< throw on this call (0-based)
  bool misalign_all = false;  ///< return 4096-aligned + 64
  HostAllocator get() {
    return {[this](size_t bytes) -> void* {
              if (int(allocated.size()) == fail_at) throw std::runtime_error("out of pinned memory");
              auto* p = static_cast<char*>(std::aligned_alloc(4096, bytes + 4096));
              allocated.push_back({p, bytes});
              return misalign_all ? p + 64 : p;
            },
            [this](void* p, size_t bytes) {
              auto* base = misalign_all ? static_cast<char*>(p) - 64 : static_cast<char*>(p);
              freed.push_back({base, bytes});
              std::free(base);
            }};
  }
};

TEST(BufferRing, BuffersAreAlignedDistinctRoundedAndFreed) {
  CountingAllocator a;
  {
    BufferRing ring(3, 5000, a.get());
    EXPECT_EQ(ring.buffer_bytes(), 8192u);  // 5000 rounded up to 4096's multiple
    ASSERT_EQ(a.allocated.size(), 3u);
    for (const auto& [p, bytes] : a.allocated) EXPECT_EQ(bytes, 8192u);
    std::vector<BufferRing::Lease> leases;
    std::set<void*> seen;
    for (int i = 0; i < 3; ++i) {
      auto l = ring.try_acquire();
      ASSERT_TRUE(l);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(l->data()) % 4096, 0u);
      EXPECT_EQ(l->bytes(), 8192u);
      EXPECT_EQ(l->index(), size_t(i));  // lowest free index first
      seen.insert(l->data());
      leases.push_back(std::move(*l));
    }
    EXPECT_EQ(seen.size(), 3u);
    EXPECT_FALSE(ring.try_acquire());
    EXPECT_EQ(ring.available(), 0u);
    EXPECT_TRUE(a.freed.empty());
  }
  ASSERT_EQ(a.freed.size(), 3u);  // every buffer freed once the ring goes, with its size
  std::set<void*> allocated, freed;
  for (auto& [p, b] : a.allocated) allocated.insert(p);
  for (auto& [p, b] : a.freed) {
    freed.insert(p);
    EXPECT_EQ(b, 8192u);
  }
  EXPECT_EQ(allocated, freed);
}

TEST(BufferRing, LeasesMoveAndReleaseOnce) {
  BufferRing ring(2, 4096);
  auto a = ring.try_acquire();
  ASSERT_TRUE(a);
  BufferRing::Lease moved = std::move(*a);
  EXPECT_FALSE(*a);  // the moved-from lease holds nothing
  EXPECT_EQ(ring.available(), 1u);
  moved.release();
  moved.release();  // a second release does nothing
  EXPECT_EQ(ring.available(), 2u);
  {
    auto b = ring.try_acquire();
    EXPECT_EQ(ring.available(), 1u);
  }  // the destructor releases
  EXPECT_EQ(ring.available(), 2u);
}

TEST(BufferRing, AcquireWaitsWhileAllAreInUse) {
  BufferRing ring(2, 4096);
  auto a = ring.acquire();
  auto b = ring.acquire();
  ASSERT_TRUE(a && b);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(ring.acquire(30ms));  // times out
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);

  std::atomic<bool> got{false};
  auto waiter = std::async(std::launch::async, [&] {
    auto l = ring.acquire();  // no timeout: waits for a release
    got = true;
    return l ? l->index() : size_t(99);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(got.load());  // backpressure: still waiting
  b->release();
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(waiter.get(), 1u);  // the buffer released
}

TEST(BufferRing, StopWakesEveryWaiterAndRefusesLaterAcquires) {
  BufferRing ring(1, 4096);
  auto held = ring.acquire();
  ASSERT_TRUE(held);
  auto w1 = std::async(std::launch::async, [&] { return bool(ring.acquire()); });
  auto w2 = std::async(std::launch::async, [&] { return bool(ring.acquire(std::chrono::hours(1))); });
  std::this_thread::sleep_for(30ms);
  ring.stop();
  ASSERT_EQ(w1.wait_for(5s), std::future_status::ready);
  ASSERT_EQ(w2.wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(w1.get());
  EXPECT_FALSE(w2.get());
  held->release();  // a lease out at stop is still released normally
  EXPECT_EQ(ring.available(), 1u);
  EXPECT_FALSE(ring.acquire());  // stopped: at once, although a buffer is free
}

TEST(BufferRing, AStopTokenCancelsOneWait) {
  BufferRing ring(1, 4096);
  auto held = ring.acquire();
  std::stop_source stop;
  auto w = std::async(std::launch::async,
                      [&] { return bool(ring.acquire(std::chrono::hours(1), stop.get_token())); });
  std::this_thread::sleep_for(30ms);
  stop.request_stop();
  ASSERT_EQ(w.wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(w.get());
  held->release();
  EXPECT_TRUE(ring.acquire(1s));  // the ring itself was not stopped
}

TEST(BufferRing, AllocatorFailureFreesWhatWasAllocated) {
  CountingAllocator a;
  a.fail_at = 2;
  try {
    BufferRing ring(4, 4096, a.get());
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("allocating buffer 2 of 4 (4096 bytes) failed: out of pinned memory"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(a.allocated.size(), 2u);
  EXPECT_EQ(a.freed.size(), 2u);

  CountingAllocator m;
  m.misalign_all = true;
  try {
    BufferRing ring(2, 4096, m.get());
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not 4096-aligned"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.freed.size(), m.allocated.size());
  EXPECT_THROW(BufferRing(0, 4096), std::invalid_argument);
  EXPECT_THROW(BufferRing(1, 0), std::invalid_argument);
}

TEST(BufferRingDeathTest, DestroyedWithALeaseOutAborts) {
  EXPECT_DEATH(
      {
        auto* ring = new BufferRing(2, 4096);
        auto l = ring->acquire();
        delete ring;  // a lease is still out
      },
      "destroyed with 1 of 2 buffers still leased");
}

}  // namespace
