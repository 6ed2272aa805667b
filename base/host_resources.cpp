#include "base/host_resources.hpp"

#include <sys/statvfs.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <fmt/format.h>

namespace rp {

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

}  // namespace

size_t host_total_bytes() {
  size_t total = meminfo_bytes("MemTotal: %zu kB");
  std::ifstream max("/sys/fs/cgroup/memory.max");
  std::string m;
  if (max >> m && m != "max") {
    try {
      const size_t limit = std::stoull(m);
      if (total == 0 || limit < total) total = limit;
    } catch (const std::exception&) {}
  }
  return total;
}

size_t host_available_bytes() {
  size_t avail = meminfo_bytes("MemAvailable: %zu kB");
  // a container's memory limit (cgroup v2) is what the OOM killer enforces
  std::ifstream max("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  std::string m;
  size_t used = 0;
  if (max >> m && m != "max" && cur >> used) {
    try {
      const size_t limit = std::stoull(m);
      const size_t left = limit > used ? limit - used : 0;
      if (avail == 0 || left < avail) avail = left;
    } catch (const std::exception&) {}
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

std::string byte_text(double b) {
  if (b >= double(1ull << 30)) return fmt::format("{:.1f} GiB", b / double(1ull << 30));
  if (b >= double(1ull << 20)) return fmt::format("{:.1f} MiB", b / double(1ull << 20));
  return fmt::format("{:.0f} bytes", b);
}

}  // namespace rp
