// SessionOptions::frozen_tier at construction: which frozen groups stream (resident_gib, or
// host_budget_gib by the planner's rule), then the streamed groups' storage bytes go to the tier
// cache file (tier::ensure_cache; a valid file of the same weights is reused), each group's host
// copy (or the copy the frozen source made of it) is freed once it is on disk, and the session's
// FrozenTier (its ring of read buffers pinned through the first device) starts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <fmt/format.h>

#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "base/atomic_file.hpp"  // owner_marker_path
#include "base/checksum.hpp"
#include "base/counted.hpp"
#include "base/error_text.hpp"  // excerpt
#include "base/host_resources.hpp"
#include "base/output_folder.hpp"  // path_blocker_text
#include "kernels/weight_format.hpp"
#include "scheduler/disk_tier.hpp"
#include "tier/cache_file.hpp"  // cache_lock_path
#include "tier/direct_reader.hpp"

namespace rp {
namespace {

constexpr double kGiB = double(uint64_t(1) << 30);

/// Names the source, as fields "<what>: <value>" joined by "; " (the cache's stale reason names
/// the first field that differs, tier::CacheFile::open): the frozen groups' layout (the storage
/// formats with their tensor counts in words, names, bytes,
/// each tensor's format and place, held as its size and checksum: a 128-expert MoE's would pass
/// the cache's 1 MiB key limit), a checksum of the bytes of the groups handed over in memory, and
/// the frozen source's identity (a model's files with their sizes and times), so a cache of
/// another base or layout is stale. A group the caller did not hand over (its host copy still
/// empty) is made by the frozen source, so a reused cache needs no group made.
std::string source_key(const ModelLayout& layout, const ParamStore& store, const std::vector<int>& groups,
                       const FrozenSource* source, const std::vector<char>& from_source) {
  std::string desc, sums;
  uint64_t bytes = 0;
  size_t given = 0;
  std::map<std::string, size_t> formats;  // each storage format's tensors, by name
  for (int g : groups) {
    const ParamGroup& grp = layout.groups[size_t(g)];
    bytes += uint64_t(grp.storage_bytes);
    const bool made = source && size_t(g) < from_source.size() && from_source[size_t(g)];
    desc += fmt::format("\n{} {} bytes{}:", grp.name, grp.storage_bytes, made ? " from source" : "");
    for (const TensorSpec& t : grp.tensors) {
      desc += fmt::format(" {} {} @{}", t.name, weight_format_name(t.format), t.byte_offset);
      ++formats[weight_format_name(t.format)];
    }
    if (made) continue;
    const HostBytes& b = store.lowp[size_t(g)];
    sums += fmt::format("{:016x}", checksum64(b.data(), size_t(grp.storage_bytes)));
    ++given;
  }
  // the formats in words, before the bytes: a changed base_format is named as such
  std::string stored;
  for (const auto& [name, n] : formats)
    stored += fmt::format("{}{} ({})", stored.empty() ? "" : " + ", name, counted(n, "tensor"));
  std::string key = fmt::format(
      "roundpipe frozen tier 4; frozen groups: {} of {}, storage formats {}, {} bytes, tensor names formats "
      "and places xxh3 {:016x}",
      groups.size(), layout.groups.size(), stored.empty() ? "none" : stored, bytes,
      checksum64(desc.data(), desc.size()));
  if (given > 0)
    key += fmt::format("; weights given in memory: {}, xxh3 {:016x}", counted(given, "group"),
                       checksum64(sums.data(), sums.size()));
  if (source) key += "; source: " + source->identity;
  return key;
}

/// The folder of the file `path`, or its nearest ancestor that exists ("." when none of a
/// relative path's does): where the file system's limits and kind are asked before the folder
/// is made.
std::filesystem::path existing_folder_of(const std::string& path) {
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  std::error_code ec;
  while (!folder.empty() && !std::filesystem::exists(folder, ec)) folder = folder.parent_path();
  return folder.empty() ? std::filesystem::path(".") : folder;
}

/// Refuses a cache file name that leaves no room for the files the tier keeps beside it (its
/// builders' lock "<name>.lock", its temporary "<name>.tmp-<pid>" and that temporary's owner
/// marker, for the largest pid Linux hands out, 4194304): the build would fail on them with a
/// bare "File name too long".
void check_companion_names(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  const std::string longest = owner_marker_path(fmt::format(".tmp-{}", 4194304));
  const size_t more = std::max(longest.size(), tier::cache_lock_path("").size());
  const long limit = ::pathconf(existing_folder_of(path).c_str(), _PC_NAME_MAX);
  const size_t name_max = limit > 0 ? size_t(limit) : 255;
  if (name.size() + more <= name_max) return;
  throw std::invalid_argument(fmt::format(
      "frozen_tier.path: the file name '{}' has {} bytes; the tier keeps files beside it named up to {} "
      "bytes longer ('<name>{}'), and the file system allows {}: expected a name of at most {} bytes",
      excerpt(name), name.size(), more, longest, name_max, name_max > more ? name_max - more : 0));
}

constexpr double kBudgetMargin = kHostBudgetMargin;  // scheduler/disk_tier.hpp

/// A folder in memory (tmpfs, ramfs: /dev/shm, often /tmp) keeps the cache and spilled
/// activations in the host's RAM, which no budget counts: one line says so (the run goes on).
void warn_memory_folder(const std::string& path, const std::function<void(const std::string&)>& log) {
  struct statfs st {};
  if (::statfs(existing_folder_of(path).c_str(), &st) != 0) return;
  if (st.f_type == TMPFS_MAGIC || st.f_type == RAMFS_MAGIC)
    log(fmt::format(
        "frozen tier: {}: warning: the folder is in memory ({}), so the cache and any spilled "
        "activations take host RAM that host_budget_gib does not count; choose a folder on a disk",
        path, st.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs"));
}

/// Bytes in GiB rounded up to the hundredth printed ("expected at least" figures that suffice).
double gib_up(double bytes) { return std::ceil(bytes / kGiB * 100.0) / 100.0; }

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
/// verify_reused, under the builders' lock): a damaged entry builds it again, the mismatch being
/// the reason. I/O errors of the cache name the option; what `fill` throws passes as it is. A wait
/// for another run's build is logged first.
/// `spill_unallocated`: the activation spill's file bytes in the same folder not yet allocated.
tier::EnsureResult ensure_tier_cache(const FrozenTierOptions& o, const std::string& key,
                                     const std::vector<tier::CacheEntrySpec>& specs,
                                     const tier::CacheFill& fill, uint64_t spill_unallocated,
                                     const std::function<void(const std::string&)>& log) {
  tier::CacheBuildOptions bo;
  bo.reserved_bytes = spill_unallocated;
  bo.verify_reused = o.verify_reused;
  bo.on_wait = [&log](const std::string& line) { log("frozen tier: " + line); };
  // what reading the base throws (a model file cut or failing while read) names that file and
  // stays as it is: the cache's path is not what failed
  struct BaseReadFailed : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  const tier::CacheFill read_base = [&fill](size_t entry, uint64_t offset, std::span<std::byte> out) {
    try {
      fill(entry, offset, out);
    } catch (const std::runtime_error& e) {
      throw BaseReadFailed(e.what());
    }
  };
  try {
    return tier::ensure_cache(o.path, key, specs, read_base, bo);
  } catch (const BaseReadFailed& e) {
    throw std::runtime_error(e.what());
  } catch (const tier::PathRefused& e) {  // says what to do already: the file is there, not unwritable
    throw std::runtime_error(fmt::format("frozen_tier.path: {}", e.what()));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(
        fmt::format("frozen_tier.path: {} (expected a writable file on a local disk)", e.what()));
  }
}

/// The cache file's entries: every frozen group in layout order, the resident ones too (never
/// read while training), so that a run keeping more or less of the base resident (another
/// budget, another process size) reuses the file: entry i is groups[i]. The ring's buffers are
/// sized by the largest streamed group.
struct TierEntries {
  std::vector<int> groups;
  std::vector<tier::CacheEntrySpec> specs;
  uint64_t largest = 0;  ///< the largest streamed group's bytes, aligned for O_DIRECT
  std::string largest_name;
  size_t streamed_count = 0;
};

TierEntries tier_entries(const ModelLayout& layout, const std::vector<char>& streamed) {
  TierEntries e;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const ParamGroup& grp = layout.groups[g];
    if (!grp.frozen || grp.storage_bytes <= 0) continue;
    e.groups.push_back(int(g));
    e.specs.push_back({grp.name, uint64_t(grp.storage_bytes)});
    if (!streamed[g]) continue;
    ++e.streamed_count;
    if (tier::align_up(uint64_t(grp.storage_bytes)) > e.largest) {
      e.largest = tier::align_up(uint64_t(grp.storage_bytes));
      e.largest_name = grp.name;
    }
  }
  return e;
}

/// Nothing to stream: nothing frozen, or all of it resident.
void log_tier_not_used(const FrozenTierOptions& o, double resident,
                       const std::function<void(const std::string&)>& log) {
  if (resident > 0)
    log(fmt::format("frozen tier: {}: not used: the whole frozen base ({:.2f} GiB) fits frozen_tier.{}",
                    o.path, resident / kGiB, o.host_budget_gib > 0 ? "host_budget_gib" : "resident_gib"));
  else
    log(
        fmt::format("frozen tier: {}: not used: the model has no frozen weights (full fine-tuning; the tier "
                    "holds a LoRA base)",
                    o.path));
}

/// The cache build's fill: copies group by group, in order, and frees each streamed group once
/// its last byte is out. A streamed group the caller did not hand over is made by the source
/// when its first byte is asked for (a resident one was made at construction and stays).
class GroupFill {
 public:
  GroupFill(ParamStore& store, const FrozenSource* source, const TierEntries& e,
            const std::vector<char>& streamed)
      : store_(store), source_(source), e_(e), streamed_(streamed) {}
  void operator()(size_t entry, uint64_t offset, std::span<std::byte> out) {
    const int g = e_.groups[entry];
    HostBytes* b = &store_.lowp[size_t(g)];
    if (b->size() == 0) {
      if (made_entry_ != entry) {
        made_ = HostBytes();  // the previous group's, if its fill stopped early
        made_ = HostBytes(size_t(e_.specs[entry].bytes));
        const auto t0 = std::chrono::steady_clock::now();
        source_->fill(g, std::span<std::byte>(made_.as<std::byte>(), made_.size()));
        made_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        made_entry_ = entry;
      }
      b = &made_;
    }
    std::memcpy(out.data(), b->as<char>() + offset, out.size());
    if (offset + out.size() == b->size() && streamed_[size_t(g)]) *b = HostBytes();
  }
  double made_seconds = 0;  ///< in the source's fill (FrozenTierReport::source_seconds)

 private:
  ParamStore& store_;
  const FrozenSource* source_;
  const TierEntries& e_;
  const std::vector<char>& streamed_;
  HostBytes made_;
  size_t made_entry_ = SIZE_MAX;
};

/// "frozen tier: <path>: built|reused (N GiB, X s[ (Z s making the weights)], O_DIRECT|buffered: why,
/// engine); ring K x M MiB[; Y of the base resident (frozen_tier.key)][; reads G GB/s (probe; ...)][; rebuilt
/// because ...][; after waiting for another run's builders' lock]".
std::string opened_tier_line(const FrozenTierReport& r, const FrozenTierOptions& o) {
  const std::string made =
      r.source_seconds > 0 ? fmt::format(" ({:.1f} s making the weights)", r.source_seconds) : "";
  std::string line = fmt::format("frozen tier: {}: {} ({:.2f} GiB, {:.1f} s{}, {}, {}); ring {} x {:.1f} MiB",
                                 o.path, r.built ? "built" : "reused", double(r.bytes) / kGiB, r.seconds,
                                 made, r.direct ? "O_DIRECT" : "buffered: " + r.buffered_reason, r.engine,
                                 r.ring_buffers, double(r.buffer_bytes) / double(1 << 20));
  if (r.resident_bytes > 0)
    line += fmt::format("; {} of the base resident (frozen_tier.{})", byte_text(double(r.resident_bytes)),
                        o.host_budget_gib > 0 ? "host_budget_gib" : "resident_gib");
  if (r.probe_gbps > 0)
    line += fmt::format("; reads {:.2f} GB/s (probe; roundpipe plan --disk-gbps {:.2f})", r.probe_gbps,
                        r.probe_gbps);
  if (r.built && r.replaced && !r.rebuilt_because.empty()) line += "; rebuilt because " + r.rebuilt_because;
  if (r.waited) line += "; after waiting for another run's builders' lock";
  return line;
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

void Session::Impl::place_frozen_tier(size_t held, const SessionInternals& internals,
                                      const std::function<void(const std::string&)>& log) {
  if (!opt.frozen_tier) return;
  const FrozenTierOptions& o = *opt.frozen_tier;
  if (o.path.empty())
    throw std::invalid_argument("frozen_tier.path: expected the path of the tier's cache file, got \"\"");
  if (!(o.resident_gib >= 0) || !std::isfinite(o.resident_gib))
    throw std::invalid_argument(fmt::format(
        "frozen_tier.resident_gib: expected a number of GiB >= 0 (0: every frozen group streams), got {}",
        o.resident_gib));
  if (!(o.host_budget_gib >= 0) || !std::isfinite(o.host_budget_gib))
    throw std::invalid_argument(
        fmt::format("frozen_tier.host_budget_gib: expected a number of GiB >= 0 (0: no budget), got {}",
                    o.host_budget_gib));
  if (o.host_budget_gib > 0 && o.resident_gib > 0)
    throw std::invalid_argument(
        "frozen_tier.host_budget_gib: decides what stays resident itself; give it or resident_gib, not both");
  // refused here, in one line, rather than by the first file system call that trips on it
  if (const std::string blocked = path_blocker_text(o.path); !blocked.empty())
    throw std::runtime_error("frozen_tier.path: " + blocked);
  check_companion_names(o.path);
  warn_memory_folder(o.path, log);
  if (o.host_budget_gib == 0) {
    tier_place.streamed = streamed_groups(layout, o.resident_gib * kGiB, &tier_place.resident);
    return;
  }
  place_in_host_budget(held, internals);
}

void Session::Impl::refuse_budget(const BudgetPlacement& p, double reserve, double margin,
                                  size_t staging) const {
  const FrozenTierOptions& o = *opt.frozen_tier;
  // the least budget named below: found by placing, since the spill's staging and the saved
  // inputs no layer can spill both come on top of the trainable state and the ring
  const auto least_gib = [&] {
    const double least =
        least_host_room(layout, budget_run(), budget_ring(), staging, !opt.save_attention) + reserve;
    double g = gib_up(least);
    for (int i = 0; i < 100 && !place_budget(g * kGiB - reserve, staging).places(); ++i)
      g += 0.01;  // the rounded figure places too
    return g;
  };
  // a ring_gib above two buffers takes room a smaller one would leave to the rest: said when the
  // least ring (0: two buffers of the largest group) would place this run in the budget
  const auto ring_hint = [&]() -> std::string {
    const double ring = budget_ring(), least = 2.0 * largest_frozen_group(layout, nullptr);
    if (o.ring_gib == 0 || ring <= least ||
        !place_host_budget(layout, budget_run(), o.host_budget_gib * kGiB - reserve, least, staging,
                           !opt.save_attention)
             .places())
      return "";
    return fmt::format(
        "; or a smaller frozen_tier.ring_gib: {} holds a read ring of {}, and 0 (two buffers, {}) "
        "fits this budget",
        o.ring_gib, byte_text(ring), byte_text(least));
  };
  if (!p.disk.fits) {
    // what the least budget holds beyond the trainable state and the ring: the saved activations
    // no layer can spill, and the spill's staging buffers
    const double rest = least_host_room(layout, budget_run(), budget_ring(), staging, !opt.save_attention) -
                        double(p.disk.trainable_bytes) - double(p.disk.ring_bytes);
    throw std::invalid_argument(fmt::format(
        "frozen_tier.host_budget_gib: {} GiB cannot hold this run: the process holds {} before the session "
        "allocates (plus {} of margin), the trainable state needs {}, the read ring {}{}; expected at least "
        "{:.2f} GiB{}",
        o.host_budget_gib, byte_text(reserve - margin), byte_text(margin), byte_text(p.disk.trainable_bytes),
        byte_text(p.disk.ring_bytes),
        rest > 0 ? fmt::format(" and the saved activations no layer can spill, with the spill's staging, {}",
                               byte_text(rest))
                 : std::string(),
        least_gib(), ring_hint()));
  }
  if (p.spilled > p.most_spilled)
    throw std::invalid_argument(fmt::format(
        "frozen_tier.host_budget_gib: {} GiB leaves {} for the saved activations, which need {} even with "
        "every layer's saved input on the disk; expected at least {:.2f} GiB, or fewer tokens per pass "
        "(sequences per micro-batch, seq_len, micro-batches){}",
        o.host_budget_gib, byte_text(p.disk.activation_bytes),
        byte_text(p.activations - double(p.most_spilled) * p.per_layer), least_gib(), ring_hint()));
}

void Session::Impl::place_in_host_budget(size_t held, const SessionInternals& internals) {
  const FrozenTierOptions& o = *opt.frozen_tier;
  const size_t rss = process_resident_bytes();
  const double process = rss > held ? double(rss - held) : 0.0;
  const double margin = internals.host_budget_reserve ? 0.0 : kBudgetMargin;
  const double reserve = internals.host_budget_reserve.value_or(process + margin);
  const size_t staging = internals.spill_staging > 0 ? internals.spill_staging : kDefaultSpillStaging;
  const BudgetPlacement p = place_budget(o.host_budget_gib * kGiB - reserve, staging);
  refuse_budget(p, reserve, margin, staging);
  if (p.spilled > 0) opt.frozen_tier->spill_layers = std::max(opt.frozen_tier->spill_layers, p.spilled);
  tier_place.streamed = p.disk.streamed;
  tier_place.resident = p.disk.resident_bytes;
  if (p.disk.attention_dropped) tier_place.saved_attention = false;
  tier_report.attention_dropped = p.disk.attention_dropped;
  const char* why = p.dropped_for_base ? " (saved attention dropped to keep more of the base resident)"
                    : p.disk.attention_dropped ? " (saved attention dropped: backward recomputes it)"
                                               : "";
  const std::string spill_text =
      p.spilled > 0
          ? fmt::format(
                ", the saved inputs of {} spilled to the disk ({:.2f} GiB written and read back per "
                "iteration; staging {:.2f} GiB over all workers)",
                rp::counted(opt.frozen_tier->spill_layers, "layer"), p.disk.spill_bytes / kGiB,
                p.staging_bytes / kGiB)
          : std::string();
  tier_report.budget_line = fmt::format(
      "frozen tier: host budget {} GiB: process {:.2f} GiB + margin {:.2f}, trainable {:.2f}, read ring "
      "{:.2f}, "
      "saved activations {:.2f}{}{}; frozen base {:.2f} GiB of which {:.2f} resident",
      o.host_budget_gib, (reserve - margin) / kGiB, margin / kGiB, p.disk.trainable_bytes / kGiB,
      p.disk.ring_bytes / kGiB, p.disk.activation_bytes / kGiB, why, spill_text, p.disk.frozen_bytes / kGiB,
      p.disk.resident_bytes / kGiB);
}

void Session::Impl::log_budget_line(size_t device_arena_bytes,
                                    const std::function<void(const std::string&)>& log) {
  if (tier_report.budget_line.empty()) return;
  // the CPU backend's virtual GPUs are arenas in this process's memory, which the placement does
  // not count (a GPU's memory is not the host's): said, so a run's peak RSS above it is no surprise
  if (opt.backend == "cpu")
    tier_report.budget_line += fmt::format(
        "; the CPU backend's {} (up to {}: {}) are host memory outside this budget",
        rp::counted(devices.size(), "virtual GPU"),
        byte_text(device_arena_bytes > 0 ? double(device_arena_bytes)
                                         : double(devices.size()) * double(devices[0]->capacity_bytes())),
        device_arena_bytes > 0 ? "the plan's largest stage on each" : "their capacity");
  log(tier_report.budget_line);
}

HostRun Session::Impl::budget_run() const {
  HostRun run;
  run.seq_len = opt.micro.seq_len;
  run.sequences_per_micro = opt.micro.n_seq;
  run.micro_batches = opt.micro_batches;
  run.workers = opt.workers;
  run.pass_slots = opt.pass_slots;
  run.saved_attention = opt.save_attention.value_or(true);
  run.elem_bytes = int64_t(dtype_size(devices[0]->compute_dtype()));
  return run;
}

double Session::Impl::budget_ring() const {
  std::string largest_name;
  const double largest = largest_frozen_group(layout, &largest_name);
  size_t frozen_groups = 0;
  for (const ParamGroup& g : layout.groups) frozen_groups += g.frozen && g.storage_bytes > 0;
  if (largest == 0) return 0;
  return double(ring_count(*opt.frozen_tier, size_t(largest), largest_name,
                           std::max<size_t>(2, frozen_groups))) *
         largest;
}

BudgetPlacement Session::Impl::place_budget(double room, size_t staging) const {
  return place_host_budget(layout, budget_run(), room, budget_ring(), staging, !opt.save_attention);
}

void Session::Impl::open_frozen_tier(const SessionInternals& internals,
                                     const std::function<void(const std::string&)>& log) {
  if (!opt.frozen_tier) return;
  const FrozenTierOptions& o = *opt.frozen_tier;
  const std::vector<char>& streamed = tier_place.streamed;
  const TierEntries e = tier_entries(layout, streamed);
  if (e.streamed_count == 0) return log_tier_not_used(o, tier_place.resident, log);
  const size_t count = ring_count(o, size_t(e.largest), e.largest_name, e.streamed_count);
  const auto t0 = std::chrono::steady_clock::now();
  const FrozenSource* source = opt.frozen_source ? &*opt.frozen_source : nullptr;
  const std::string key = source_key(layout, *store, e.groups, source, tier_place.from_source);
  GroupFill fill{*store, source, e, streamed};
  // the spill's file, made just before in the same folder, holds its space even where the file
  // system left it sparse
  tier::EnsureResult er =
      ensure_tier_cache(o, key, e.specs, std::ref(fill), spill ? spill->unallocated_bytes() : 0, log);
  std::vector<int> entry_of(layout.groups.size(), -1);  // streamed groups only: the others stay
  for (size_t i = 0; i < e.groups.size(); ++i)
    if (streamed[size_t(e.groups[i])]) {
      entry_of[size_t(e.groups[i])] = int(i);
      store->lowp[size_t(e.groups[i])] = HostBytes();  // reused: the host copies go now
    }
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
  r.replaced = er.replaced;
  r.waited = er.waited;
  for (const auto& spec : e.specs) r.bytes += spec.bytes;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.source_seconds = fill.made_seconds;
  r.direct = frozen_tier->direct();
  r.buffered_reason = r.direct ? "" : (o.direct ? er.file->direct_refused() : "frozen_tier.direct is off");
  r.engine = frozen_tier->engine();
  r.ring_buffers = frozen_tier->ring_buffers();
  r.buffer_bytes = frozen_tier->buffer_bytes();
  // the disk's read rate, timed on the cache itself (up to 1 GiB; the planner's --disk-gbps)
  try {
    r.probe_gbps = tier::probe_read_bandwidth(o.path, uint64_t(1) << 30, 8, size_t(4) << 20).gb_per_s;
  } catch (const std::exception& ex) {
    log(fmt::format("frozen tier: {}: read probe failed ({}); training goes on", o.path, ex.what()));
  }
  r.resident_bytes = uint64_t(tier_place.resident);
  r.line = opened_tier_line(r, o);
  log(r.line);
}

size_t frozen_tier_host_credit(const ModelLayout& layout, const SessionOptions& opt,
                               const std::vector<char>& streamed) {
  if (!opt.frozen_tier || streamed.empty()) return 0;
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

FrozenTierReads Session::frozen_tier_reads() const {
  FrozenTierReads r;
  if (impl_->frozen_tier) {
    const FrozenTier::ReadTotals t = impl_->frozen_tier->read_totals();
    r.reads = t.reads, r.bytes = t.bytes, r.seconds = t.seconds;
  }
  if (const ActivationSpill* spill = impl_->spill.get()) {
    r.spill_written = spill->records_written() * spill->record_bytes();
    r.spill_read = spill->records_read() * spill->record_bytes();
  }
  return r;
}

}  // namespace rp
