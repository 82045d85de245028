// MPI bootstrap: ranks from MPI_COMM_WORLD, the local rank from a shared-memory split, and a byte broadcast
// (the store address and NCCL's unique id travel over MPI when the job was started by mpirun or srun).
// The C API only: OpenMPI's and MPICH's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdlib>
#include <cstring>

#include "distributed/bootstrap.h"

namespace ingot::distributed::mpi {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  INGOT_FAIL("MPI: ", what, " failed: ", msg);
}

void finalize_at_exit() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  // mpirun reports a rank that exits without MPI_Finalize as a failure.
  if (init && !fin) MPI_Finalize();
}

}  // namespace

bool available() { return true; }

WorldInfo world() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  }
  WorldInfo w;
  w.source = "mpi";
  check(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &w.world_size), "MPI_Comm_size");
  MPI_Comm local;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  MPI_Comm_rank(local, &w.local_rank);
  MPI_Comm_size(local, &w.local_world_size);
  MPI_Comm_free(&local);
  if (const char* id = std::getenv("INGOT_RUN_ID"); id && *id) w.run_id = id;
  return w;
}

std::string broadcast(const std::string& bytes, int root) {
  int rank = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  long long n = rank == root ? static_cast<long long>(bytes.size()) : 0;
  check(MPI_Bcast(&n, 1, MPI_LONG_LONG, root, MPI_COMM_WORLD), "MPI_Bcast (length)");
  std::string out = rank == root ? bytes : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) check(MPI_Bcast(out.data(), static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  return out;
}

}  // namespace ingot::distributed::mpi
