// rp::launched_by_mpi, and the stand-ins of a build without MPI (roundpipe/replicas.hpp).
#include <cstdlib>

#include "roundpipe/replicas.hpp"

namespace rp {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
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
