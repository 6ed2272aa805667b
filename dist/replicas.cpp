// rp::launched_by_mpi, launcher_rank, the failure line for signal handlers, and the stand-ins of a build without MPI (roundpipe/replicas.hpp).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

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

#ifndef RP_HAVE_MPI
bool mpi_available() { return false; }
std::shared_ptr<Replicas> mpi_replicas(double) {
  throw std::runtime_error(
      "this roundpipe was built without MPI: install libopenmpi-dev and openmpi-bin (scripts/setup.sh does) "
      "and configure again");
}
#endif

}  // namespace rp
