// The recipes' data parallelism (recipes/data_parallel.cpp) under distributed.reduce_dtype's default f32 with
// bf16 weights: every sharded stage (ZeRO-1, 2 and 3) averages the gradients in f32 and leaves the f32 average in
// the shards' .grad, which the recipes' f32 masters then read (Note [Reduced gradients keep their precision],
// distributed/fsdp.h; the masters' exact update is checked in tests/distributed/test_zero.cpp). Before, ZeRO-1/2
// reduced bf16 weights' gradients in bf16 whatever the key said. Gloo, 2 ranks: a backward of a tiny GPT-2, and
// `ingot launch` runs whose losses then equal ZeRO-3's.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "autograd/ops.h"
#include "distributed/sampler.h"
#include "distributed/spawn.h"
#include "models/tiny_models.h"
#include "recipes/data_parallel.h"
#include "recipes/run_settings.h"
#include "runtime/rng.h"
#include "tests/tiny_run.h"

namespace ingot::recipes {
namespace {

// One stage (SHARDED_REDUCE_STAGE) per rank process: a process joins one process group.
void rank_body() {
  RunSettings run;
  resolve_placement(run);
  run.device = Device::cpu();
  run.dtype = DType::bf16;
  run.distributed.backend = "gloo";
  run.distributed.zero_stage = std::atoi(std::getenv("SHARDED_REDUCE_STAGE"));
  run.distributed.bucket_cap_mb = 8.0 / 1024;  // several buckets
  run.distributed.timeout_s = run.distributed.init_timeout_s = 60;
  ASSERT_EQ(run.distributed.reduce_dtype, "f32") << "the key's default, which this test is about";
  std::ostringstream log;
  std::unique_ptr<DataParallel> dp = DataParallel::join(run, log);
  ASSERT_TRUE(dp);
  manual_seed(5);
  models::GPT2 model(ingot::testing::tiny_gpt2_config());
  model.to(DType::bf16);
  dp->wrap(model, model.parameters());
  auto [ids, tgt] = ingot::testing::repeating_batch(4, 8);
  const distributed::RowRange r = distributed::batch_shard(4, dp->rank(), dp->world_size());
  dp->backward(model.loss(contiguous(narrow(ids, 0, r.begin, r.end - r.begin)),
                          contiguous(narrow(tgt, 0, r.begin, r.end - r.begin))),
               true);
  dp->synchronize();
  const std::vector<Tensor> shards = dp->optimizer_params();
  ASSERT_GT(shards.size(), 2u);
  for (size_t k = 0; k < shards.size(); ++k) {
    EXPECT_EQ(shards[k].dtype(), DType::bf16) << "shard " << k << " holds bf16 weights";
    ASSERT_TRUE(shards[k].grad().defined()) << "shard " << k;
    EXPECT_EQ(shards[k].grad().dtype(), DType::f32) << "ZeRO-" << run.distributed.zero_stage << ", shard " << k;
  }
}

TEST(ShardedReduceDtype, EveryZeroStageKeepsTheF32AverageOfBf16WeightsForTheMasters) {
  if (ingot::testing::is_rank_process()) return rank_body();
  for (const char* stage : {"1", "2", "3"}) {
    SCOPED_TRACE(std::string("ZeRO-") + stage);
    ingot::testing::SpawnOptions so = ingot::testing::world(2).within(std::chrono::seconds(60));
    so.env["SHARDED_REDUCE_STAGE"] = stage;
    ingot::testing::expect_ranks_pass(ingot::testing::spawn_ranks(so));
  }
}

class ShardedReduceDtypeRun : public ingot::testing::TinyRun {
 protected:
  ShardedReduceDtypeRun() : TinyRun("ingot_sharded_reduce_dtype", 2) {}
};

// bf16 weights, f32 masters, the default f32 reduction, 2 ranks: every sum is of two f32 numbers, so all three
// stages average to the same f32 gradients, update the same masters and give the same losses exactly (eager).
// With ZeRO-1/2's average rounded to bf16 again their losses leave ZeRO-3's by ~1e-5 from the third step on
// (5.228995 vs 5.228984), close to plain DDP's bf16 average, which this run does not compare.
TEST_F(ShardedReduceDtypeRun, Bf16ZeroOneAndTwoLossesEqualZeroThreeWhoseF32AverageReachesTheMasters) {
  const std::string bf16 = "dtype=bf16 distributed.bucket_cap_mb=0.004";
  std::map<std::string, std::map<int64_t, double>> losses;
  for (const char* stage : {"1", "2", "3"}) {
    const std::string out = std::string("z") + stage;
    const ingot::testing::ShellResult r = launch(2, out, bf16 + " distributed.zero_stage=" + stage);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses[stage] = ingot::testing::train_losses(path(out + "/metrics.jsonl"));
  }
  ASSERT_EQ(losses["3"].size(), 6u);
  EXPECT_EQ(losses["1"], losses["3"]) << "ZeRO-1 vs ZeRO-3";
  EXPECT_EQ(losses["2"], losses["3"]) << "ZeRO-2 vs ZeRO-3";
  // distributed.reduce_wire_dtype bf16 (Note [Narrow wire, wide sum], distributed/process_group.h): eager ZeRO-3's
  // gradients of bf16 weights are bf16 already, so sending them in bf16 and summing in f32 is the same average.
  const ingot::testing::ShellResult wire =
      launch(2, "z3_wire", bf16 + " distributed.zero_stage=3 distributed.reduce_wire_dtype=bf16");
  ASSERT_EQ(wire.exit_code, 0) << wire.output;
  EXPECT_NE(wire.output.find("gradients sent in bf16 and summed in f32"), std::string::npos) << wire.output;
  EXPECT_EQ(ingot::testing::train_losses(path("z3_wire/metrics.jsonl")), losses["3"]) << "bf16 wire vs f32 wire";
  const ingot::testing::ShellResult bad =
      launch(2, "z1_wire", bf16 + " distributed.zero_stage=1 distributed.reduce_wire_dtype=bf16");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("distributed.reduce_wire_dtype: bf16 applies to zero_stage 3"), std::string::npos)
      << bad.output;
  EXPECT_FALSE(std::filesystem::exists(path("z1_wire/metrics.jsonl"))) << "nothing may be written";
}

}  // namespace
}  // namespace ingot::recipes
