// probe_read_bandwidth: the disk's sequential O_DIRECT read rate for the planner.
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "tier/direct_reader.hpp"
#include "tier/file_io.hpp"

namespace rp::tier {

BandwidthProbe probe_read_bandwidth(const std::string& path, uint64_t max_bytes, unsigned queue_depth,
                                    size_t block_bytes, IoEngineKind kind) {
  if (block_bytes < kDirectAlign || block_bytes % kDirectAlign != 0 || block_bytes > (1u << 30))
    throw std::invalid_argument(
        fmt::format("{}: probe block of {} bytes, expected a multiple of {} up to 1 GiB", path, block_bytes,
                    kDirectAlign));
  BandwidthProbe out;
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
  out.direct = fd.get() >= 0;
  if (!out.direct && errno == EINVAL) fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0)
    throw std::runtime_error(fmt::format("{}: cannot open to time reads ({})", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw std::runtime_error(fmt::format("{}: cannot stat ({})", path, std::strerror(errno)));
  const uint64_t limit = std::min<uint64_t>(max_bytes, uint64_t(st.st_size));
  if (!out.direct) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  auto engine = make_io_engine(kind, queue_depth);
  out.engine = engine->name();
  // one buffer per read in flight; slot i serves reads i, i + depth, ...
  const unsigned depth = engine->depth();
  std::unique_ptr<std::byte, decltype(&std::free)> mem(
      static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, size_t(depth) * block_bytes)), &std::free);
  if (!mem) throw std::bad_alloc();
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < depth; ++i) free_slots.push_back(i);
  uint64_t next = 0;
  bool eof = false;
  std::string failure;
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    while (!eof && failure.empty() && next < limit && !free_slots.empty()) {
      const unsigned slot = free_slots.back();
      free_slots.pop_back();
      const size_t n = size_t(std::min<uint64_t>(block_bytes, align_up(limit - next)));
      engine->submit({slot, fd.get(), mem.get() + size_t(slot) * block_bytes, n, next});
      next += n;
    }
    if (engine->in_flight() == 0) break;
    const IoCompletion c = engine->wait();
    free_slots.push_back(unsigned(c.id));
    if (c.result < 0 && failure.empty()) failure = std::strerror(int(-c.result));
    if (c.result == 0) eof = true;
    if (c.result > 0) out.bytes += uint64_t(c.result);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!failure.empty())
    throw std::runtime_error(fmt::format("{}: a read failed while timing reads: {}", path, failure));
  out.bytes = std::min(out.bytes, limit);
  out.gb_per_s = out.seconds > 0 ? double(out.bytes) / out.seconds / 1e9 : 0.0;
  return out;
}

}  // namespace rp::tier
