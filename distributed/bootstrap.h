// Bootstrap: who am I in the job, where is the store, and the default process group.
// Two ways a job starts:
//   env://  `ingot launch` (or torchrun-style tools) export RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//           MASTER_ADDR, MASTER_PORT. The store is at MASTER_ADDR:MASTER_PORT; it is hosted by the launcher
//           when INGOT_USE_AGENT_STORE=1, otherwise rank 0 starts it.
//   MPI     mpirun / srun (OMPI_COMM_WORLD_*, PMIX_RANK, PMI_RANK or SLURM_PROCID set, RANK not set): ranks come
//           from MPI; rank 0 starts a store and its address is broadcast over MPI, as is NCCL's unique id.
// Keys are namespaced by INGOT_RUN_ID and INGOT_RESTART_COUNT, so a restarted group never reads the keys of the
// attempt before it from a store that outlived it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "distributed/process_group.h"
#include "distributed/store.h"

namespace ingot::distributed {

struct WorldInfo {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string source = "single";  // "env", "mpi" or "single"
  std::string run_id = "none";
  int restart_count = 0;
  bool agent_store = false;       // the launcher hosts the store
};

// Reads the env:// variables. Returns nullopt when RANK and WORLD_SIZE are both unset; throws naming the
// variable when one is missing, malformed or out of range.
std::optional<WorldInfo> world_from_env();
// True when this process was started by mpirun or srun (and not also given RANK).
bool started_by_mpi();

namespace mpi {
bool available();  // built with MPI
// Initializes MPI if needed (finalized at exit) and returns the ranks it gives.
WorldInfo world();
// Collective over MPI_COMM_WORLD: returns root's `bytes` on every rank.
std::string broadcast(const std::string& bytes, int root);
}  // namespace mpi

struct InitOptions {
  std::string backend = "auto";     // "gloo", "nccl", or "auto" (nccl when a GPU is usable, else gloo)
  Millis timeout{600000};           // collective timeout of the default group
  Millis store_timeout{300000};     // store get/wait/barrier
  Millis connect_timeout{60000};    // waiting for the store to come up
  std::string trace_dir;            // see ProcessGroupOptions
  Millis report_grace{2000};        // see ProcessGroupOptions
};

// What a rank holds after init: its place in the job, the store (and the server, when this rank hosts it),
// and the default process group over all ranks.
struct DistributedContext {
  WorldInfo info;
  std::shared_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store;  // namespaced by run id and restart count
  std::shared_ptr<ProcessGroup> group;
};

// Bootstraps from MPI or the environment (a single-process world when neither is present), connects the
// store, checks in every rank (a barrier that names the ranks that never came) and creates the default group.
DistributedContext init_distributed(const InitOptions& options = {});

}  // namespace ingot::distributed
