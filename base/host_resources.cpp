#include "base/host_resources.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace rp {

size_t process_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) {
      unsigned long long kib = 0;
      if (std::sscanf(line.c_str() + 6, "%llu", &kib) == 1) return size_t(kib) * 1024;
    }
  return 0;
}

namespace {

/// One "<key> N kB" line of /proc/meminfo in bytes (0 when absent or unreadable).
size_t meminfo_bytes(const char* format) {
  size_t bytes = 0;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    size_t kb = 0;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, format, &kb) == 1) {
        bytes = kb * 1024;
        break;
      }
    std::fclose(f);
  }
  return bytes;
}

/// A container's memory limit (cgroup v2 memory.max), what the OOM killer enforces; 0 when
/// there is none or it cannot be read.
size_t cgroup_memory_limit() {
  std::ifstream max("/sys/fs/cgroup/memory.max");
  std::string m;
  if (!(max >> m) || m == "max") return 0;
  try {
    return std::stoull(m);
  } catch (const std::exception&) {
    return 0;
  }
}

/// The smaller of two byte counts where 0 means unknown.
size_t known_min(size_t a, size_t b) { return a == 0 ? b : b == 0 ? a : std::min(a, b); }

}  // namespace

size_t host_total_bytes() { return known_min(meminfo_bytes("MemTotal: %zu kB"), cgroup_memory_limit()); }

size_t host_available_bytes() {
  size_t avail = meminfo_bytes("MemAvailable: %zu kB");
  std::ifstream cur("/sys/fs/cgroup/memory.current");
  size_t used = 0;
  if (const size_t limit = cgroup_memory_limit(); limit > 0 && cur >> used) {
    const size_t left = limit > used ? limit - used : 0;
    if (avail == 0 || left < avail) avail = left;
  }
  return avail;
}

uint64_t free_disk_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path.empty() ? fs::path(".") : fs::path(path), ec);
  if (ec) return std::numeric_limits<uint64_t>::max();
  while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) return std::numeric_limits<uint64_t>::max();
  return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
}

void require_free_disk(const std::string& path, uint64_t need, const std::string& what,
                       const std::string& remedy) {
  const uint64_t free = free_disk_bytes(path);
  if (free < need)
    throw std::runtime_error(fmt::format("{}: {} needs about {}, the file system has {} free; {}", path, what,
                                         byte_text(double(need)), byte_text(double(free)), remedy));
}

}  // namespace rp
