// SessionOptions::frozen_tier at construction: the frozen groups' storage bytes go to the
// tier cache file (tier::ensure_cache; a valid file of the same weights is reused), each
// group's host copy is freed once it is on disk, and the session's FrozenTier (its ring of
// read buffers pinned through the first device) starts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "base/checksum.hpp"
#include "kernels/weight_format.hpp"
#include "scheduler/disk_tier.hpp"

namespace rp {
namespace {

constexpr double kGiB = double(uint64_t(1) << 30);

/// Names the source: the model's frozen groups (name, bytes, each tensor's format and place)
/// and a checksum of each group's bytes, so a cache of another base or layout is stale. The
/// description itself grows with the tensors (a 128-expert MoE's passes the cache's 1 MiB key
/// limit), so the key holds its size and checksum, with the counts readable in front.
std::string source_key(const ModelLayout& layout, const ParamStore& store, const std::vector<int>& groups) {
  std::string desc;
  uint64_t bytes = 0;
  for (int g : groups) {
    const ParamGroup& grp = layout.groups[size_t(g)];
    bytes += uint64_t(grp.storage_bytes);
    desc += fmt::format("\n{} {} bytes xxh3 {:016x}:", grp.name, grp.storage_bytes,
                        checksum64(store.lowp[size_t(g)].data(), size_t(grp.storage_bytes)));
    for (const TensorSpec& t : grp.tensors)
      desc += fmt::format(" {} {} @{}", t.name, weight_format_name(t.format), t.byte_offset);
  }
  return fmt::format(
      "roundpipe frozen tier 2; {} groups, {} frozen, {} bytes; description of {} bytes, xxh3 {:016x}",
      layout.groups.size(), groups.size(), bytes, desc.size(), checksum64(desc.data(), desc.size()));
}

/// Buffers of `buffer_bytes` the budget holds (0: the minimum, 2), at most one per tiered group
/// (`groups`, at least 2); refuses a budget below 2.
size_t ring_count(const FrozenTierOptions& o, size_t buffer_bytes, const std::string& largest,
                  size_t groups) {
  if (!(o.ring_gib >= 0) || !std::isfinite(o.ring_gib))
    throw std::invalid_argument(fmt::format(
        "frozen_tier.ring_gib: expected a number of GiB >= 0 (0: two buffers), got {}", o.ring_gib));
  if (o.ring_gib == 0) return 2;
  const double budget = o.ring_gib * kGiB;
  const size_t n = size_t(budget / double(buffer_bytes));
  if (n < 2)
    throw std::invalid_argument(fmt::format(
        "frozen_tier.ring_gib: {} GiB holds fewer than 2 read buffers of the largest frozen "
        "group ('{}', {:.1f} MiB); expected at least {:.3f} GiB",
        o.ring_gib, largest, double(buffer_bytes) / double(1 << 20), 2.0 * double(buffer_bytes) / kGiB));
  return std::max<size_t>(2, std::min(n, groups));
}

/// The valid cache (tier::ensure_cache). A reused one is read whole and checked first (with
/// verify_reused): a damaged entry removes the file and builds it again, the mismatch being
/// the reason. I/O errors name the option. A wait for another run's build is logged first.
tier::EnsureResult ensure_tier_cache(const FrozenTierOptions& o, const std::string& key,
                                     const std::vector<tier::CacheEntrySpec>& specs,
                                     const tier::CacheFill& fill,
                                     const std::function<void(const std::string&)>& log) {
  tier::CacheBuildOptions bo;
  bo.on_wait = [&log](const std::string& line) { log("frozen tier: " + line); };
  try {
    tier::EnsureResult er = tier::ensure_cache(o.path, key, specs, fill, bo);
    if (er.built || !o.verify_reused) return er;
    try {
      er.file->verify_all();
      return er;
    } catch (const std::runtime_error& bad) {
      const std::string why = bad.what();
      er.file.reset();
      std::filesystem::remove(o.path);
      er = tier::ensure_cache(o.path, key, specs, fill, bo);
      er.rebuilt_because = why;
      return er;
    }
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(
        fmt::format("frozen_tier.path: {} (expected a writable file on a local disk)", e.what()));
  }
}

}  // namespace

tier::HostAllocator pinned_allocator(Device& dev) {
  tier::HostAllocator a;
  a.allocate = [&dev](size_t bytes) -> void* {
    void* p = std::aligned_alloc(tier::kDirectAlign, tier::align_up(bytes));
    if (!p) return nullptr;
    try {
      dev.pin_host(p, bytes);
    } catch (const std::exception&) {  // left pageable
    }
    return p;
  };
  a.free = [&dev](void* p, size_t) {
    dev.unpin_host(p);
    std::free(p);
  };
  return a;
}

void Session::Impl::open_frozen_tier(const SessionInternals& internals,
                                     const std::function<void(const std::string&)>& log) {
  if (!opt.frozen_tier) return;
  const FrozenTierOptions& o = *opt.frozen_tier;
  if (o.path.empty())
    throw std::invalid_argument("frozen_tier.path: expected the path of the tier's cache file, got \"\"");
  if (!(o.resident_gib >= 0) || !std::isfinite(o.resident_gib))
    throw std::invalid_argument(fmt::format(
        "frozen_tier.resident_gib: expected a number of GiB >= 0 (0: every frozen group streams), got {}",
        o.resident_gib));
  double resident = 0;
  const std::vector<char> streamed = streamed_groups(layout, o.resident_gib * kGiB, &resident);
  std::vector<int> groups;  // the tiered groups, in layout order: entry i is groups[i]
  std::vector<tier::CacheEntrySpec> specs;
  uint64_t largest = 0;
  std::string largest_name;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const ParamGroup& grp = layout.groups[g];
    if (!grp.frozen || grp.storage_bytes <= 0 || !streamed[g]) continue;
    groups.push_back(int(g));
    specs.push_back({grp.name, uint64_t(grp.storage_bytes)});
    if (tier::align_up(uint64_t(grp.storage_bytes)) > largest) {
      largest = tier::align_up(uint64_t(grp.storage_bytes));
      largest_name = grp.name;
    }
  }
  if (groups.empty()) {  // nothing frozen, or all of it resident: nothing to stream
    if (resident > 0)
      log(fmt::format(
          "frozen tier: {}: not used: the whole frozen base ({:.2f} GiB) fits frozen_tier.resident_gib",
          o.path, resident / kGiB));
    else
      log(
          fmt::format("frozen tier: {}: not used: the model has no frozen weights (full fine-tuning; the "
                      "tier holds a LoRA base)",
                      o.path));
    return;
  }
  const size_t count = ring_count(o, size_t(largest), largest_name, groups.size());
  const auto t0 = std::chrono::steady_clock::now();
  const std::string key = source_key(layout, *store, groups);
  // the fill copies group by group, in order, and frees each group once its last byte is out
  auto fill = [&](size_t entry, uint64_t offset, std::span<std::byte> out) {
    HostBytes& b = store->lowp[size_t(groups[entry])];
    std::memcpy(out.data(), b.as<char>() + offset, out.size());
    if (offset + out.size() == b.size()) b = HostBytes();
  };
  const bool existed = std::filesystem::exists(o.path);
  tier::EnsureResult er = ensure_tier_cache(o, key, specs, fill, log);
  for (int g : groups) store->lowp[size_t(g)] = HostBytes();  // reused: the host copies go now
  std::vector<int> entry_of(layout.groups.size(), -1);
  for (size_t i = 0; i < groups.size(); ++i) entry_of[size_t(groups[i])] = int(i);
  tier::DirectReaderOptions ro;
  ro.direct = o.direct;
  ro.fault = internals.frozen_tier_fault;
  frozen_tier =
      std::make_unique<FrozenTier>(er.file, std::move(entry_of), count, pinned_allocator(*devices[0]), ro);
  FrozenTierReport& r = tier_report;
  r.enabled = true;
  r.path = o.path;
  r.built = er.built;
  r.rebuilt_because = er.rebuilt_because;
  for (const auto& s : specs) r.bytes += s.bytes;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.direct = frozen_tier->direct();
  r.buffered_reason = r.direct ? "" : (o.direct ? er.file->direct_refused() : "frozen_tier.direct is off");
  r.engine = frozen_tier->engine();
  r.ring_buffers = frozen_tier->ring_buffers();
  r.buffer_bytes = frozen_tier->buffer_bytes();
  r.line = fmt::format("frozen tier: {}: {} ({:.2f} GiB, {:.1f} s, {}, {}); ring {} x {:.1f} MiB", o.path,
                       r.built ? "built" : "reused", double(r.bytes) / kGiB, r.seconds,
                       r.direct ? "O_DIRECT" : "buffered: " + r.buffered_reason, r.engine, r.ring_buffers,
                       double(r.buffer_bytes) / double(1 << 20));
  if (resident > 0)
    r.line += fmt::format("; {:.2f} GiB of the base resident (frozen_tier.resident_gib)", resident / kGiB);
  if (r.built && existed && !r.rebuilt_because.empty()) r.line += "; rebuilt because " + r.rebuilt_because;
  log(r.line);
}

size_t frozen_tier_host_credit(const ModelLayout& layout, const SessionOptions& opt) {
  if (!opt.frozen_tier || opt.frozen_tier->path.empty()) return 0;
  const double resident_gib = opt.frozen_tier->resident_gib;
  if (!(resident_gib >= 0) || !std::isfinite(resident_gib)) return 0;  // refused when the tier opens
  const std::vector<char> streamed = streamed_groups(layout, resident_gib * kGiB);
  uint64_t frozen = 0, largest = 0;
  size_t groups = 0;
  std::string largest_name;
  for (size_t i = 0; i < layout.groups.size(); ++i)
    if (const ParamGroup& g = layout.groups[i]; g.frozen && g.storage_bytes > 0 && streamed[i]) {
      frozen += uint64_t(g.storage_bytes);
      largest = std::max(largest, tier::align_up(uint64_t(g.storage_bytes)));
      ++groups;
    }
  if (groups == 0) return 0;
  try {
    const uint64_t ring = ring_count(*opt.frozen_tier, size_t(largest), largest_name, groups) * largest;
    return frozen > ring ? size_t(frozen - ring) : 0;
  } catch (const std::invalid_argument&) {
    return 0;  // refused when the tier opens, with its own line
  }
}

const FrozenTierReport& Session::frozen_tier() const { return impl_->tier_report; }

}  // namespace rp
