// What the host has left: memory for new allocations and free space on a file system. Read
// before anything large is allocated or written, so an impossible request is refused with one
// line naming what asked for it instead of being OOM-killed or failing half-way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/counted.hpp"  // byte_text: byte counts in messages

namespace rp {

/// Bytes of host memory available for new allocations (/proc/meminfo MemAvailable, further
/// limited by a cgroup v2 memory.max when one is set), or 0 when unknown.
size_t host_available_bytes();

/// Bytes of host memory in all (/proc/meminfo MemTotal, or a lower cgroup v2 memory.max), or 0
/// when unknown.
size_t host_total_bytes();

/// Bytes of host memory this process has resident now (/proc/self/status VmRSS), or 0 when
/// unknown.
size_t process_resident_bytes();

/// Bytes available to an unprivileged writer on the file system holding `path` (statvfs
/// f_bavail * f_frsize). A path that does not exist yet is looked up through its nearest
/// existing parent folder. Returns UINT64_MAX when it cannot be determined.
uint64_t free_disk_bytes(const std::string& path);

/// Before writing about `need` bytes at `path`: throws std::runtime_error("<path>: <what> needs
/// about <need>, the file system has <free> free; <remedy>") when free_disk_bytes(path) is less
/// (nothing when it cannot be determined), so a full disk is one line before anything is written.
void require_free_disk(const std::string& path, uint64_t need, const std::string& what,
                       const std::string& remedy);

}  // namespace rp
