// env:// bootstrap, store hosting and init_distributed (the MPI half is in mpi_bootstrap.cpp).
#include "distributed/bootstrap.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <string>

#include "runtime/cuda_runtime.h"
#include "runtime/device.h"

namespace ingot::distributed {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// Parses an integer environment variable in [lo, hi]; `fallback` when unset (required if fallback is empty).
int env_int(const char* name, std::optional<int> fallback, int lo, int hi) {
  const char* v = env(name);
  if (!v) {
    INGOT_CHECK(fallback.has_value(), "distributed bootstrap: environment variable ", name,
                " is not set (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must all be set; `ingot launch` "
                "sets them)");
    return *fallback;
  }
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  INGOT_CHECK(errno == 0 && end && *end == '\0', "distributed bootstrap: ", name, "='", v,
              "' is not an integer");
  INGOT_CHECK(x >= lo && x <= hi, "distributed bootstrap: ", name, "=", x, " is out of range [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) == 0 && buf[0]) return buf;
  return "127.0.0.1";
}

}  // namespace

bool started_by_mpi() {
  if (env("RANK")) return false;
  return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK") || env("SLURM_PROCID");
}

std::optional<WorldInfo> world_from_env() {
  if (!env("RANK") && !env("WORLD_SIZE")) return std::nullopt;
  WorldInfo w;
  w.source = "env";
  w.world_size = env_int("WORLD_SIZE", std::nullopt, 1, 1 << 20);
  w.rank = env_int("RANK", std::nullopt, 0, w.world_size - 1);
  w.local_world_size = env_int("LOCAL_WORLD_SIZE", w.world_size, 1, w.world_size);
  w.local_rank = env_int("LOCAL_RANK", w.rank % w.local_world_size, 0, w.local_world_size - 1);
  const char* addr = env("MASTER_ADDR");
  INGOT_CHECK(addr, "distributed bootstrap: environment variable MASTER_ADDR is not set (RANK=", w.rank,
              ", WORLD_SIZE=", w.world_size, " are)");
  w.master_addr = addr;
  w.master_port = env_int("MASTER_PORT", std::nullopt, 1, 65535);
  if (const char* id = env("INGOT_RUN_ID")) w.run_id = id;
  w.restart_count = env_int("INGOT_RESTART_COUNT", 0, 0, 1 << 20);
  w.agent_store = env("INGOT_USE_AGENT_STORE") && std::string(env("INGOT_USE_AGENT_STORE")) == "1";
  return w;
}

DistributedContext init_distributed(const InitOptions& options) {
  // Note [Ranks ignore SIGPIPE]: a write to a socket whose peer rank died raises SIGPIPE, which by default kills
  // this rank at once, silently (no error message, no error file, the watchdog never reports). Python ignores it
  // for every PyTorch worker; so do ingot's ranks: the write fails with EPIPE and the collective's error names
  // the op and the missing rank. It also kept `ingot launch` from naming the rank that died first
  // (tests/distributed/test_launch.cpp). As under Python, a program the rank starts afterwards inherits the
  // ignored signal (a shell pipeline it runs sees EPIPE rather than SIGPIPE).
  std::signal(SIGPIPE, SIG_IGN);
  DistributedContext ctx;
  TcpStoreOptions so;
  so.timeout = options.store_timeout;
  so.connect_timeout = options.connect_timeout;
  std::function<std::string(const std::string&, int)> broadcast_bytes;
  std::shared_ptr<Store> base;
  if (started_by_mpi()) {
    INGOT_CHECK(mpi::available(), "distributed bootstrap: started by mpirun/srun but ingot was built without MPI "
                "(set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT instead, or rebuild with -DINGOT_MPI=ON)");
    ctx.info = mpi::world();
    // Rank 0 hosts the store on MASTER_PORT when given (else any free port) and tells the others over MPI.
    std::string address;
    if (ctx.info.rank == 0) {
      const char* port = env("MASTER_PORT");
      ctx.server = std::make_shared<TcpStoreServer>(port ? env_int("MASTER_PORT", 0, 1, 65535) : 0);
      const char* addr = env("MASTER_ADDR");
      address = std::string(addr ? addr : this_host().c_str()) + " " + std::to_string(ctx.server->port());
    }
    address = mpi::broadcast(address, 0);
    size_t sp = address.find(' ');
    ctx.info.master_addr = address.substr(0, sp);
    ctx.info.master_port = std::stoi(address.substr(sp + 1));
    broadcast_bytes = [](const std::string& bytes, int root) { return mpi::broadcast(bytes, root); };
  } else if (auto w = world_from_env()) {
    ctx.info = *w;
    if (ctx.info.rank == 0 && !ctx.info.agent_store) {
      try {
        ctx.server = std::make_shared<TcpStoreServer>(ctx.info.master_port);
      } catch (const Error& e) {
        INGOT_FAIL("distributed bootstrap: rank 0 could not host the store on MASTER_PORT=", ctx.info.master_port,
                   " (set INGOT_USE_AGENT_STORE=1 if a launcher already hosts it there): ", e.what());
      }
    }
  } else {
    ctx.info.master_addr = "127.0.0.1";
    ctx.server = std::make_shared<TcpStoreServer>(0, "127.0.0.1");
    ctx.info.master_port = ctx.server->port();
  }
  const WorldInfo& w = ctx.info;
  base = std::make_shared<TcpStore>(ctx.server ? "127.0.0.1" : w.master_addr, w.master_port, so);
  ctx.store = std::make_shared<PrefixStore>("ingot/" + w.run_id + "/" + std::to_string(w.restart_count), base);

  // Check-in: each rank announces itself; a missing rank is named by the key it never wrote.
  ctx.store->set("checkin/rank" + std::to_string(w.rank), std::to_string(getpid()));
  std::vector<std::string> keys;
  for (int r = 0; r < w.world_size; ++r) keys.push_back("checkin/rank" + std::to_string(r));
  try {
    ctx.store->wait(keys, options.store_timeout);
  } catch (const Error& e) {
    INGOT_FAIL("distributed bootstrap (rank ", w.rank, " of ", w.world_size, ", ", w.source,
               "): not every rank checked in: ", e.what());
  }

  std::string backend = options.backend;
  if (backend == "auto") backend = nccl_available() && cuda_available() ? "nccl" : "gloo";
  ProcessGroupOptions po;
  po.timeout = options.timeout;
  po.rendezvous_timeout = options.store_timeout;
  po.trace_dir = options.trace_dir;
  po.report_grace = options.report_grace;
  po.broadcast_bytes = broadcast_bytes;
  if (backend == "nccl") {
    int n = cuda_device_count();
    INGOT_CHECK(n > 0, "distributed bootstrap: backend nccl needs a CUDA device, none is visible");
    // One GPU per local rank; a launcher that pins each worker to one GPU leaves exactly one visible.
    po.device = w.local_rank % n;
    // The rank's GPU becomes the thread's current device (what torch.cuda.set_device(local_rank) does in a torchrun
    // script): a worker that sees every GPU of the node (`ingot launch --nproc-per-node 2`) otherwise kept device 0
    // current, and a call on a legacy default stream (null handle) then acts on GPU 0's stream (Note [Null streams
    // name the current device], runtime/cuda/check.h): bench_gpt2_step's DDP hung on 2 H100s that way, eager too,
    // while the recipes (which set it themselves) and `--nproc-per-node gpu` (one GPU visible) ran.
    cuda::set_device(po.device);
    ctx.group = new_nccl_group(ctx.store, w.rank, w.world_size, po);
  } else {
    INGOT_CHECK(backend == "gloo", "distributed bootstrap: backend must be gloo, nccl or auto, got '", backend, "'");
    ctx.group = new_gloo_group(ctx.store, w.rank, w.world_size, po);
  }
  return ctx;
}

}  // namespace ingot::distributed
