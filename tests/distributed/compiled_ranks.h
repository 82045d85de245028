// Compiled data-parallel tests (test_ddp_compiled.cpp, test_fsdp_compiled.cpp): the current test re-run in N Gloo
// ranks (spawn.h) sharing one fresh kernel cache directory, so a kernel one rank compiled the others load, and
// with collective and store timeouts long enough for a rank to compile its step (g++) before its first collective.
//
//   TEST(Suite, Name) {
//     if (ingot::testing::is_rank_process()) {
//       const auto [ctx, cache_dir] = ingot::testing::join_compiled_ranks(20s);
//       ...the per-rank body, using EXPECT_*...;
//       return;
//     }
//     ingot::testing::run_compiled_ranks(2, 120s);
//   }
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

#include "distributed/bootstrap.h"
#include "distributed/spawn.h"
#include "runtime/file_util.h"

namespace ingot::testing {

inline constexpr const char* kCompiledRanksCacheEnv = "INGOT_TEST_CACHE_DIR";

struct CompiledRank {
  distributed::DistributedContext ctx;
  std::string cache_dir;  // the same directory on every rank of the test
};

// In a rank process: joins the world over Gloo, `timeout` for collectives and the store.
inline CompiledRank join_compiled_ranks(std::chrono::milliseconds timeout) {
  CompiledRank r{distributed::init_distributed(gloo_test_init(timeout, timeout)), ""};
  const char* dir = std::getenv(kCompiledRanksCacheEnv);
  r.cache_dir = dir ? dir : "";
  return r;
}

// In the test process: runs the current test in `world` ranks, each given `limit`, and expects every one to pass.
inline void run_compiled_ranks(int world, std::chrono::seconds limit) {
  TempDir cache("ingot-compiled-ranks-");
  SpawnOptions o = ingot::testing::world(world).within(limit);
  o.env[kCompiledRanksCacheEnv] = cache.path();
  expect_ranks_pass(spawn_ranks(o));
}

}  // namespace ingot::testing
