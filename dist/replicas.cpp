// rp::launched_by_mpi, launcher_rank, the failure line for signal handlers, and the stand-ins of a build
// without MPI (roundpipe/replicas.hpp).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "roundpipe/replicas.hpp"

namespace rp {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

namespace {
char g_failure[1024];
std::atomic<bool> g_failure_claimed{false};
std::atomic<const char*> g_failure_line{nullptr};
}  // namespace

void note_replica_failure(const std::string& line) {
  if (g_failure_claimed.exchange(true)) return;
  const size_t n = std::min(line.size(), sizeof g_failure - 1);
  std::memcpy(g_failure, line.data(), n);
  g_failure[n] = 0;
  g_failure_line.store(g_failure, std::memory_order_release);
}

const char* replica_failure_line() { return g_failure_line.load(std::memory_order_acquire); }

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return -1;
}

namespace {
std::string slurp_proc(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
/// Field 4 of /proc/<pid>/stat (the parent pid), or -1.
long parent_of(const std::string& pid) {
  const std::string stat = slurp_proc("/proc/" + pid + "/stat");
  const auto paren = stat.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos) return -1;
  char state = 0;
  long ppid = -1;
  return std::sscanf(stat.c_str() + paren + 1, " %c %ld", &state, &ppid) == 2 ? ppid : -1;
}
/// The launcher rank in the NUL-separated environment `env`, or -1.
int rank_in(const std::string& env) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK=", "PMI_RANK=", "PMIX_RANK="}) {
    const std::string key = std::string(1, '\0') + v;
    const std::string padded = std::string(1, '\0') + env;
    if (const auto at = padded.find(key); at != std::string::npos)
      return std::atoi(padded.c_str() + at + key.size());
  }
  return -1;
}
}  // namespace

std::vector<LocalReplica> local_replicas() {
  std::vector<LocalReplica> out;
  if (launcher_rank() < 0) return out;
  const std::string self = std::to_string(::getpid());
  const long parent = parent_of(self);
  if (parent <= 1) return out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == self || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (parent_of(name) != parent) continue;
    if (const int rank = rank_in(slurp_proc("/proc/" + name + "/environ")); rank >= 0)
      out.push_back({rank, std::atoi(name.c_str())});
  }
  std::sort(out.begin(), out.end(),
            [](const LocalReplica& a, const LocalReplica& b) { return a.rank < b.rank; });
  return out;
}

#ifndef RP_HAVE_MPI
bool mpi_available() { return false; }
std::shared_ptr<Replicas> mpi_replicas(double) {
  throw std::runtime_error(
      "this roundpipe was built without MPI: install libopenmpi-dev and openmpi-bin (scripts/setup.sh does) "
      "and configure again");
}
#endif

}  // namespace rp
