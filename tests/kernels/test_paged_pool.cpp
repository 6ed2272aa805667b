// PagedPool against a fake page backend that checks every driver call: allocations whose
// charged bytes fit the capacity always succeed whatever was freed before (no fragmentation),
// live allocations never overlap, a mapping never spans two reservations, steady-state reuse
// makes no driver call, and a device that runs out of pages makes the pool give back its
// cache before it reports DeviceOutOfMemory.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "kernels/device.hpp"
#include "kernels/paged_pool.hpp"

namespace rp {
namespace {

constexpr size_t kGran = size_t(2) << 20;

class FakePages final : public PageBackend {
 public:
  explicit FakePages(size_t physical) : physical_(physical) {}
  uintptr_t reserve(size_t bytes, size_t align) override {
    EXPECT_EQ(bytes % align, 0u);
    const uintptr_t base = next_va_;
    next_va_ += bytes + 64 * kGran;  // a gap: adjacent reservations must not be merged
    reservations_[base] = bytes;
    return base;
  }
  void unreserve(uintptr_t va, size_t) override { reservations_.erase(va); }
  uint64_t create(size_t bytes) override {
    EXPECT_EQ(bytes % kGran, 0u);
    if (in_use_ + bytes > physical_) throw DeviceOutOfMemory("fake device: no pages left");
    in_use_ += bytes;
    handles_[++next_handle_] = bytes;
    ++creates;
    return next_handle_;
  }
  void release(uint64_t h) override {
    ASSERT_TRUE(handles_.count(h));
    in_use_ -= handles_[h];
    handles_.erase(h);
  }
  void map(uintptr_t va, size_t bytes, uint64_t h) override {
    ASSERT_TRUE(handles_.count(h));
    EXPECT_EQ(handles_[h], bytes);
    // inside one reservation
    auto r = reservations_.upper_bound(va);
    ASSERT_NE(r, reservations_.begin());
    --r;
    EXPECT_GE(va, r->first);
    EXPECT_LE(va + bytes, r->first + r->second) << "a mapping spans two reservations";
    // overlapping no other mapping
    auto n = maps_.lower_bound(va);
    if (n != maps_.end()) {
      EXPECT_LE(va + bytes, n->first);
    }
    if (n != maps_.begin()) {
      EXPECT_LE(std::prev(n)->first + std::prev(n)->second, va);
    }
    maps_[va] = bytes;
    ++maps;
  }
  void unmap(uintptr_t va, size_t bytes) override {
    ASSERT_TRUE(maps_.count(va));
    EXPECT_EQ(maps_[va], bytes);
    maps_.erase(va);
  }
  size_t device_free_bytes() override { return physical_ - in_use_; }
  size_t in_use() const { return in_use_; }
  int64_t creates = 0, maps = 0;

 private:
  size_t physical_, in_use_ = 0;
  uintptr_t next_va_ = uintptr_t(1) << 40;
  uint64_t next_handle_ = 0;
  std::map<uintptr_t, size_t> reservations_, maps_;
  std::map<uint64_t, size_t> handles_;
};

size_t charged(size_t b) { return pool_allocation_bytes(b, kGran); }

TEST(PoolAllocationBytes, RoundsSmallTo256AndLargeToTheGranule) {
  EXPECT_EQ(pool_allocation_bytes(0, kGran), 256u);
  EXPECT_EQ(pool_allocation_bytes(1, kGran), 256u);
  EXPECT_EQ(pool_allocation_bytes(257, kGran), 512u);
  EXPECT_EQ(pool_allocation_bytes(kSmallAllocationBytes, kGran), kSmallAllocationBytes);
  EXPECT_EQ(pool_allocation_bytes(kSmallAllocationBytes + 1, kGran), kGran);
  EXPECT_EQ(pool_allocation_bytes(5 * kGran + 3, kGran), 6 * kGran);
  EXPECT_EQ(pool_allocation_bytes(5 * kGran + 3, 256), 5 * kGran + 256);  // the CPU backend's rule
}

// Random alloc/free sequences: every request whose charged bytes fit next to the live ones
// succeeds (the pattern that fragmented the best-fit segment pool: large blocks freed between
// live ones, then a larger request), and live allocations never overlap.
TEST(PagedPool, NeverFailsWhileTheChargedBytesFit) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const size_t cap = size_t(512) << 20;
    // the pool's small pages are charged only the bytes they hold: a few pages of slack
    FakePages pages(cap + (size_t(16) << 20));
    PagedPool pool(pages, cap, kGran, "fake", size_t(4) << 30);
    std::mt19937 rng(seed);
    std::map<uintptr_t, size_t> live;  // address -> requested bytes
    size_t used = 0;
    for (int op = 0; op < 600; ++op) {
      const bool grow = live.empty() || rng() % 100 < 55;
      if (grow) {
        size_t b =
            rng() % 4 == 0 ? 1 + rng() % (size_t(64) << 10) : (size_t(1) << 20) + rng() % (size_t(96) << 20);
        if (used + charged(b) > cap) {
          EXPECT_THROW(pool.alloc(b), DeviceOutOfMemory);
          continue;
        }
        void* p = nullptr;
        ASSERT_NO_THROW(p = pool.alloc(b)) << "seed " << seed << " op " << op << ": " << b << " bytes with "
                                           << used << " of " << cap << " charged";
        const auto a = reinterpret_cast<uintptr_t>(p);
        EXPECT_EQ(a % 256, 0u);
        auto n = live.lower_bound(a);
        if (n != live.end()) {
          EXPECT_LE(a + b, n->first);
        }
        if (n != live.begin()) {
          EXPECT_LE(std::prev(n)->first + std::prev(n)->second, a);
        }
        live[a] = b;
        used += charged(b);
      } else {
        auto it = live.begin();
        std::advance(it, long(rng() % live.size()));
        pool.free(reinterpret_cast<void*>(it->first));
        used -= charged(it->second);
        live.erase(it);
      }
      ASSERT_EQ(pool.used_bytes(), used);
      EXPECT_LE(pool.used_bytes() + pool.cached_bytes(), cap);
    }
    for (auto& [a, b] : live) pool.free(reinterpret_cast<void*>(a));
    EXPECT_EQ(pool.used_bytes(), 0u);
  }
}

// The runtime allocates the same stage buffers pass after pass: after the first pass no
// driver call is made.
TEST(PagedPool, RepeatedSizesReuseTheirPagesWithoutDriverCalls) {
  FakePages pages(size_t(8) << 30);
  PagedPool pool(pages, size_t(4) << 30, kGran, "fake");
  const std::vector<size_t> stage = {size_t(300) << 20, size_t(96) << 20, size_t(96) << 20, 4096,
                                     size_t(33) << 20};
  auto pass = [&] {
    std::vector<void*> ps;
    for (size_t b : stage) ps.push_back(pool.alloc(b));
    for (void* p : ps) pool.free(p);
  };
  pass();
  const int64_t calls = pool.driver_calls();
  for (int i = 0; i < 5; ++i) pass();
  EXPECT_EQ(pool.driver_calls(), calls);
  EXPECT_GT(pool.cached_bytes(), 0u);
  pool.trim();
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pages.in_use(), 0u);
}

// A request of a new size under a full cache: cached pages are given back first, so the cap
// holds and the request succeeds.
TEST(PagedPool, CachedPagesMakeRoomForANewSize) {
  FakePages pages(size_t(8) << 30);
  const size_t cap = size_t(100) << 20;
  PagedPool pool(pages, cap, kGran, "fake");
  void* a = pool.alloc(size_t(60) << 20);
  pool.free(a);
  EXPECT_EQ(pool.cached_bytes(), size_t(60) << 20);
  void* b = pool.alloc(size_t(80) << 20);  // 60 cached + 80 > 100: the cached 60 are released
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_LE(pages.in_use(), cap);
  pool.free(b);
}

TEST(PagedPool, OverTheCapacityIsTypedAndNamesIt) {
  FakePages pages(size_t(8) << 30);
  PagedPool pool(pages, size_t(10) << 20, kGran, "gpu7");
  try {
    pool.alloc(size_t(11) << 20);
    FAIL() << "no error";
  } catch (const DeviceOutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("gpu7: cannot allocate 12.0 MiB"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("10.0 MiB capacity"), std::string::npos) << e.what();
  }
}

// The device itself (another process, say) has fewer pages than the cap: the pool releases its
// cache and retries before giving up, and then says how much the GPU had free.
TEST(PagedPool, ADeviceOutOfPagesEmptiesTheCacheFirst) {
  FakePages pages(size_t(64) << 20);
  PagedPool pool(pages, size_t(1) << 30, kGran, "fake");
  void* a = pool.alloc(size_t(40) << 20);
  pool.free(a);                            // cached: 40 MiB of the device's 64 are mapped
  void* b = pool.alloc(size_t(50) << 20);  // needs the cache released
  EXPECT_NE(b, nullptr);
  try {
    pool.alloc(size_t(30) << 20);
    FAIL() << "no error";
  } catch (const DeviceOutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("the GPU itself has only"), std::string::npos) << e.what();
  }
  pool.free(b);
}

TEST(PagedPool, SmallAllocationsSharePagesAndAreChargedTheirOwnBytes) {
  FakePages pages(size_t(1) << 30);
  PagedPool pool(pages, size_t(1) << 30, kGran, "fake");
  std::vector<void*> ps;
  for (int i = 0; i < 100; ++i) ps.push_back(pool.alloc(1000));
  EXPECT_EQ(pool.used_bytes(), 100 * charged(1000));
  EXPECT_EQ(pages.creates, 1);  // one 2 MiB page holds them all
  for (void* p : ps) pool.free(p);
  EXPECT_EQ(pool.used_bytes(), 0u);
  pool.free(ps[0]);  // a double free is ignored
  EXPECT_EQ(pool.used_bytes(), 0u);
}

}  // namespace
}  // namespace rp
