// Shard-wise loading of a Hugging Face checkpoint under ZeRO-3 with 4 Gloo processes: each rank preads only the
// bytes of its slices (models::HFSliceReader into FullyShardedDataParallel::load_shards), about a quarter of the
// checkpoint, and the model it then unshards equals load_hf_model's, bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "autograd/nn/module.h"
#include "distributed/bootstrap.h"
#include "distributed/fsdp.h"
#include "distributed/spawn.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "runtime/rng.h"

namespace ingot::distributed {
namespace {

using ingot::testing::expect_ranks_pass;
using ingot::testing::is_rank_process;
using ingot::testing::spawn_ranks;

// GPT-2 (Conv1D weights stored transposed, a tied head, one file) and a Llama in six files.
TEST(FsdpHfLoading, EachOfFourRanksPreadsAboutAQuarterOfTheCheckpointAndGetsExactlyItsSlices) {
  if (is_rank_process()) {
    auto ctx = init_distributed(ingot::testing::gloo_test_init());
    const int world = ctx.info.world_size;
    for (const char* fixture : {"gpt2_tiny", "llama_tiny_sharded"}) {
      SCOPED_TRACE(fixture);
      const std::string dir = std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + fixture;
      const models::HFModel ref = models::load_hf_model(dir);
      const models::HFConfig cfg = models::load_hf_config(dir);
      manual_seed(11 + static_cast<uint64_t>(ctx.info.rank));  // each rank's own random weights: all replaced
      std::shared_ptr<models::CausalLM> model = models::make_causal_lm(cfg);
      std::vector<std::string> names;
      for (const auto& [name, _] : model->named_parameters()) names.push_back(name);
      FsdpOptions o;
      o.broadcast_parameters = false;
      FullyShardedDataParallel fsdp(*model, ctx.group, o);
      models::HFSliceReader reader(*model, cfg, dir);
      fsdp.load_shards([&](size_t i, int64_t begin, int64_t end, Tensor& dst) { reader.read(names[i], begin, end, dst); });
      // A quarter, give or take the Conv1D slices' partial rows at their ends (read whole) and the padding.
      const double share = static_cast<double>(reader.bytes_read()) / static_cast<double>(reader.total_bytes());
      EXPECT_GT(share, 0.75 / world) << reader.bytes_read() << " of " << reader.total_bytes() << " bytes";
      EXPECT_LT(share, 1.2 / world) << reader.bytes_read() << " of " << reader.total_bytes() << " bytes";
      fsdp.unshard();
      const auto want = ref.model->named_parameters();
      const auto got = model->named_parameters();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].first, want[i].first);
        EXPECT_EQ(got[i].second.to_vector(), want[i].second.to_vector()) << got[i].first;
      }
    }
    return;
  }
  expect_ranks_pass(spawn_ranks(ingot::testing::world(4).within(std::chrono::seconds(60))));
}

}  // namespace
}  // namespace ingot::distributed
