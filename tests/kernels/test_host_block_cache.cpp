// The CPU backend's cache of large host blocks: freed blocks are reused by size without a
// system call, live + cached bytes stay under the capacity, the cache never holds more than
// the peak of live bytes, and stale sizes are given back first-in first-out.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/host_block_cache.hpp"
#include "kernels/device.hpp"

namespace rp {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

TEST(HostBlockCache, ReusesFreedBlocksBySizeWithoutMapping) {
  HostBlockCache c(64 * kMiB);
  std::vector<size_t> sizes = {3 * kMiB, 1 * kMiB + 5, 7 * kMiB, 3 * kMiB};
  std::vector<void*> first;
  for (size_t s : sizes) first.push_back(c.alloc(s));
  for (void* p : first) {
    std::memset(p, 1, 4096);
    EXPECT_TRUE(c.free(p));
  }
  const int64_t maps = c.maps();
  EXPECT_EQ(maps, 4);
  EXPECT_GE(c.cached_bytes(), 14 * kMiB);
  for (int pass = 0; pass < 50; ++pass) {  // the runtime's pattern: the same sizes every pass
    std::vector<void*> ps;
    for (size_t s : sizes) ps.push_back(c.alloc(s));
    for (void* p : ps) c.free(p);
  }
  EXPECT_EQ(c.maps(), maps);
  EXPECT_EQ(c.unmaps(), 0);
  EXPECT_EQ(c.live_bytes(), 0u);
  c.trim();
  EXPECT_EQ(c.cached_bytes(), 0u);
  EXPECT_EQ(c.unmaps(), 4);
}

TEST(HostBlockCache, LivePlusCachedStaysUnderTheCapacity) {
  HostBlockCache c(10 * kMiB);
  void* a = c.alloc(4 * kMiB);
  void* b = c.alloc(4 * kMiB);
  c.free(a);
  c.free(b);
  EXPECT_EQ(c.cached_bytes(), 8 * kMiB);
  void* d = c.alloc(6 * kMiB);  // no 6 MiB block cached: room is made by unmapping
  ASSERT_NE(d, nullptr);
  EXPECT_LE(c.live_bytes() + c.cached_bytes(), 10 * kMiB);
  EXPECT_GE(c.unmaps(), 1);
  EXPECT_FALSE(c.free(reinterpret_cast<void*>(0x1000)));  // not ours
  c.free(d);
}

TEST(HostBlockCache, CacheNeverExceedsThePeakOfLiveBytes) {
  HostBlockCache c(1024 * kMiB);
  // a re-plan: the sizes change and the old ones are never asked for again
  for (size_t s = 1; s <= 20; ++s) {
    void* p = c.alloc(s * kMiB);
    c.free(p);
    EXPECT_LE(c.cached_bytes(), s * kMiB) << s;  // peak live so far is s MiB
  }
}

TEST(CpuDevice, CapacityAccountingIsUnchangedByTheCache) {
  DeviceOptions o;
  o.capacity_bytes = 16 * kMiB;
  auto d = make_cpu_device(0, o);
  void* a = d->alloc(6 * kMiB);
  void* b = d->alloc(6 * kMiB);
  EXPECT_EQ(d->used_bytes(), 12 * kMiB);
  EXPECT_THROW(d->alloc(6 * kMiB), DeviceOutOfMemory);
  d->free(a);
  void* c = d->alloc(6 * kMiB);  // the freed block, reused
  EXPECT_EQ(c, a);
  void* small = d->alloc(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 256, 0u);
  d->free(small);
  d->free(b);
  d->free(c);
  EXPECT_EQ(d->used_bytes(), 0u);
  EXPECT_EQ(d->peak_bytes(), 12 * kMiB + 1024);  // with the small block (256-byte rounded)
}

}  // namespace
}  // namespace rp
