// Note [A failed export stops every rank] (recipes/export_streamed.h): ZeRO-3's streamed final export over Gloo
// with 2 real processes and a 60 s process-group timeout. When the writer (rank 0) fails, in the middle (the test
// hook) or at the very end (its file cannot be renamed into place), every rank throws within seconds, not after the
// timeout, with an error naming the file or directory, and nothing half-written is left. The recipe run
// (`ingot launch`) exits non-zero the same way.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "distributed/fsdp.h"
#include "distributed/spawn.h"
#include "models/tiny_models.h"
#include "recipes/export_streamed.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"
#include "tests/tiny_run.h"

namespace ingot::recipes {
namespace {

namespace fs = std::filesystem;
using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

// Every rank exports a sharded tiny GPT-2 into `path` (rank 0 writes) and returns the error it got ("" if none).
std::string export_into(const distributed::DistributedContext& ctx, const std::string& path) {
  manual_seed(5);
  models::GPT2 model(ingot::testing::tiny_gpt2_config());
  distributed::FullyShardedDataParallel fsdp(model, ctx.group);
  const std::vector<Tensor> shards = fsdp.optimizer_params();
  ShardedWeights w;
  w.writer = ctx.info.rank == 0;
  w.fetch = [&](size_t i) { return fsdp.gather_param(i, shards); };
  auto sum = [&](const std::vector<double>& v) {
    Tensor t = from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64);
    ctx.group->all_reduce(t, distributed::ReduceOp::Sum)->wait();
    return t.to_vector();
  };
  try {
    save_streamed_with_status(w, sum, fs::path(path).parent_path().string(), [&](const ShardedWeights& sw) {
      save_module_streamed(model, model.parameters(), path, sw);
      return std::vector<std::string>{path};
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void expect_nothing_half_written(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "temp file left: " << e.path();
}

TEST(ExportStreamed, AWriterFailingStopsEveryRankPromptlyWithAnErrorNamingTheFile) {
  if (is_rank_process()) {
    auto ctx = distributed::init_distributed(
        ingot::testing::gloo_test_init(std::chrono::milliseconds(60000), std::chrono::milliseconds(60000)));
    const std::string dir = std::getenv("INGOT_TEST_EXPORT_DIR");
    // At the end: the final name is taken by a non-empty directory, so the rename after the last tensor fails.
    const std::string blocked = dir + "/blocked/model.safetensors";
    if (ctx.info.rank == 0) {
      fs::create_directories(blocked);
      std::ofstream(blocked + "/keep") << "x";
    }
    auto t0 = std::chrono::steady_clock::now();
    std::string error = export_into(ctx, blocked);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(error.find("model.safetensors"), std::string::npos) << "rank " << ctx.info.rank << ": " << error;
    if (ctx.info.rank != 0) {
      EXPECT_NE(error.find("rank 0 failed to write the final weights"), std::string::npos) << error;
    }
    EXPECT_LT(s, 20.0) << "rank " << ctx.info.rank << " waited for the process group's timeout";
    if (ctx.info.rank == 0) {
      EXPECT_TRUE(fs::exists(blocked + "/keep")) << "the directory in the way is left alone";
      expect_nothing_half_written(dir + "/blocked");
    }
    // In the middle: the writer fails before its 4th tensor (the test hook), the others are between gathers.
    ::setenv("INGOT_TEST_FAIL_EXPORT_AFTER", "3", 1);
    const std::string mid = dir + "/mid/model.safetensors";
    if (ctx.info.rank == 0) fs::create_directories(dir + "/mid");
    t0 = std::chrono::steady_clock::now();
    error = export_into(ctx, mid);
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::unsetenv("INGOT_TEST_FAIL_EXPORT_AFTER");
    EXPECT_NE(error.find("before tensor 4 of the final weights into '" + dir + "/mid'"), std::string::npos)
        << "rank " << ctx.info.rank << ": " << error;
    EXPECT_LT(s, 20.0) << "rank " << ctx.info.rank << " waited for the process group's timeout";
    if (ctx.info.rank == 0) {
      EXPECT_FALSE(fs::exists(mid)) << "no half-written model.safetensors";
      expect_nothing_half_written(dir + "/mid");
    }
    // And a healthy export still works (the status exchanges cost one all-reduce per tensor).
    error = export_into(ctx, dir + "/mid/model.safetensors");
    EXPECT_EQ(error, "");
    if (ctx.info.rank == 0) {
      EXPECT_TRUE(fs::exists(mid));
    }
    return;
  }
  TempDir dir("ingot-export-fail-");
  ingot::testing::SpawnOptions o = ingot::testing::world(2).within(std::chrono::seconds(90));
  o.env["INGOT_TEST_EXPORT_DIR"] = dir.path();
  expect_ranks_pass(spawn_ranks(o));
}

class ExportStreamedRun : public ingot::testing::TinyRun {
 protected:
  ExportStreamedRun() : TinyRun("ingot_export_fail_test", 4) {}
};

// The recipe: `ingot launch` pretraining with ZeRO-3 whose writer fails mid-export exits non-zero with the
// writer's error, and leaves no model.safetensors.
TEST_F(ExportStreamedRun, APretrainRunWhoseWriterFailsMidExportExitsNonZero) {
  auto t0 = std::chrono::steady_clock::now();
  ingot::testing::ShellResult r =
      launch(2, "z3", "distributed.zero_stage=3 distributed.timeout_s=120", "", "INGOT_TEST_FAIL_EXPORT_AFTER=2");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("before tensor 3 of the final weights"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("z3/model.safetensors")));
  EXPECT_LT(s, 100.0) << r.output;
}

}  // namespace
}  // namespace ingot::recipes
