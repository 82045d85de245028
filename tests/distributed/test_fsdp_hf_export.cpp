// Streamed HF export under ZeRO-3 with 2 and 4 Gloo processes: every rank takes part, one parameter at a time
// (FullyShardedDataParallel::gather_param to rank 0, which appends it with models::save_hf_model_streamed and
// drops it). The files equal, byte for byte, what one process's save_hf_model writes for the same weights; rank 0
// never allocates more than one whole tensor plus a conversion slab; a failure mid-export leaves the previous
// export as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "autograd/nn/module.h"
#include "distributed/bootstrap.h"
#include "distributed/fsdp.h"
#include "distributed/spawn.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "runtime/file_util.h"
#include "runtime/rng.h"

namespace ingot::distributed {
namespace {

namespace fs = std::filesystem;
using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

struct Sharded {
  models::HFConfig cfg;
  std::shared_ptr<models::CausalLM> model;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
};

// The fixture's weights, sharded over the group (each rank reads only its slices).
Sharded load_sharded(const std::string& dir, const std::shared_ptr<ProcessGroup>& group) {
  Sharded s;
  s.cfg = models::load_hf_config(dir);
  s.model = models::make_causal_lm(s.cfg);
  std::vector<std::string> names;
  for (const auto& [name, _] : s.model->named_parameters()) names.push_back(name);
  FsdpOptions o;
  o.broadcast_parameters = false;
  s.fsdp = std::make_unique<FullyShardedDataParallel>(*s.model, group, o);
  models::HFSliceReader reader(*s.model, s.cfg, dir);
  s.fsdp->load_shards(
      [&](size_t i, int64_t begin, int64_t end, Tensor& dst) { reader.read(names[i], begin, end, dst); });
  return s;
}

// The stage-3 export as the recipes run it: rank 0 writes, every other rank follows hf_export_order. `stop_at`
// makes every rank give up before that many parameters were gathered (a failed collective, say).
void export_sharded(const Sharded& s, const std::string& dir, const models::HFSaveOptions& opts, int rank,
                    size_t stop_at = SIZE_MAX) {
  const std::vector<Tensor> shards = s.fsdp->optimizer_params();
  size_t fetched = 0;
  auto next = [&](size_t i) {
    if (fetched++ == stop_at) INGOT_FAIL("export interrupted after ", stop_at, " parameters");
    return s.fsdp->gather_param(i, shards, 0);
  };
  if (rank == 0) {
    models::save_hf_model_streamed(*s.model, s.cfg, dir, opts, next);
    return;
  }
  for (size_t i : models::hf_export_order(*s.model, s.cfg, opts)) next(i);
}

void expect_same_directory(const std::string& got, const std::string& want) {
  std::vector<std::string> a, b;
  for (const auto& e : fs::directory_iterator(got)) a.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(want)) b.push_back(e.path().filename().string());
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  ASSERT_EQ(a, b);
  for (const std::string& f : a) EXPECT_TRUE(read_file(got + "/" + f) == read_file(want + "/" + f)) << f << " differs";
}

void export_matches_one_process() {
  auto ctx = init_distributed(ingot::testing::gloo_test_init());
  const int rank = ctx.info.rank, world = ctx.info.world_size;
  const std::string out = std::getenv("INGOT_TEST_EXPORT_DIR");
  // GPT-2 (transposed Conv1D weights, tied head) and Llama, in their own dtype and as bf16; the Llama split into
  // files of ~1/3 of the model so the index and the per-file data order are exercised.
  for (const char* fixture : {"gpt2_tiny", "llama_tiny_sharded"}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(fixture) + (bf16 ? " bf16" : " f32"));
      const std::string src = std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + fixture;
      const std::string tag = std::string(fixture) + (bf16 ? "_bf16" : "_f32");
      Sharded s = load_sharded(src, ctx.group);
      models::HFSaveOptions opts;
      if (bf16) opts.dtype = DType::bf16;
      int64_t total = 0, largest = 0;
      for (const auto& [_, p] : s.model->named_parameters()) {
        total += static_cast<int64_t>(p.nbytes());
        largest = std::max(largest, static_cast<int64_t>(p.nbytes()));
      }
      if (std::string(fixture) == "llama_tiny_sharded") opts.max_shard_bytes = total / 3;
      if (rank == 0) {
        const models::HFModel ref = models::load_hf_model(src);
        models::save_hf_model(*ref.model, ref.config, out + "/one_process_" + tag, opts);
      }

      Allocator& alloc = cpu_allocator();
      const int64_t before = alloc.stats().allocated_bytes;
      alloc.reset_peak();
      export_sharded(s, out + "/sharded_" + tag, opts, rank);
      const int64_t extra = alloc.stats().peak_allocated_bytes - before;
      if (rank != 0) continue;
      expect_same_directory(out + "/sharded_" + tag, out + "/one_process_" + tag);
      // One whole f32 tensor, plus at most one slab of it (GPT-2's transposed weights made contiguous) and its
      // bf16 conversion: the writer never holds a second whole tensor (tests/runtime/test_safetensors.cpp).
      const int64_t slab = std::min<int64_t>(largest, int64_t{4} << 20);
      EXPECT_LE(extra, largest + slab + slab / 2) << "rank 0 of " << world << " held more than one tensor";
      EXPECT_LT(extra, total) << "the whole model was gathered";
    }
  }

  // Every rank stops after 3 parameters: the previous export stays whole, and nothing half-written is left.
  Sharded s = load_sharded(std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/llama_tiny_sharded", ctx.group);
  const std::string target = out + "/sharded_llama_tiny_sharded_f32";
  std::vector<std::string> before;
  if (rank == 0) {
    for (const auto& e : fs::directory_iterator(target)) before.push_back(read_file(e.path().string()));
    EXPECT_THROW(export_sharded(s, target, {}, rank, 3), Error);
    std::vector<std::string> after;
    for (const auto& e : fs::directory_iterator(target)) after.push_back(read_file(e.path().string()));
    EXPECT_EQ(after, before);
    for (const auto& e : fs::directory_iterator(out))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path() << " was left";
  } else {
    EXPECT_THROW(export_sharded(s, target, {}, rank, 3), Error);
  }
}

void spawn(int world) {
  TempDir dir("ingot_fsdp_export");
  ingot::testing::SpawnOptions o = ingot::testing::world(world).within(std::chrono::seconds(120));
  o.env["INGOT_TEST_EXPORT_DIR"] = dir.path();
  expect_ranks_pass(spawn_ranks(o));
}

TEST(FsdpHfExport, TwoRanksStreamTheExportOneProcessWritesAndRankZeroHoldsOneTensorAtATime) {
  if (is_rank_process()) return export_matches_one_process();
  spawn(2);
}

TEST(FsdpHfExport, FourRanksStreamTheExportOneProcessWritesAndRankZeroHoldsOneTensorAtATime) {
  if (is_rank_process()) return export_matches_one_process();
  spawn(4);
}

}  // namespace
}  // namespace ingot::distributed
