// Stubs for builds without MPI (-DINGOT_MPI=OFF): an mpirun start is reported, not silently misread.
#include "distributed/bootstrap.h"

namespace ingot::distributed::mpi {

bool available() { return false; }
WorldInfo world() { INGOT_FAIL("MPI bootstrap: ingot was built without MPI (rebuild with -DINGOT_MPI=ON)"); }
std::string broadcast(const std::string&, int) {
  INGOT_FAIL("MPI broadcast: ingot was built without MPI (rebuild with -DINGOT_MPI=ON)");
}

}  // namespace ingot::distributed::mpi
