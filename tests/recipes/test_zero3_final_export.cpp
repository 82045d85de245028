// The final weights of ZeRO-3 recipe runs (`ingot launch` with Gloo workers) are written from the shards, one
// gathered tensor at a time (TrainTask::save_final_sharded): pretrain's model.safetensors and full_finetune's HF
// export equal, byte for byte, what one process writes at the same final weights (the run's last sharded
// checkpoint resumed in one process, which saves without training further), and rank 0 never held more than about
// one whole tensor beyond its shards (the 'export |' line, measured with the allocator), so the model was never
// unsharded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "runtime/file_util.h"
#include "tests/shell.h"
#include "tests/tiny_run.h"

namespace ingot::recipes {
namespace {

namespace fs = std::filesystem;
using Result = ingot::testing::ShellResult;

class Zero3FinalExport : public ingot::testing::TinyRun {
 protected:
  Zero3FinalExport() : TinyRun("ingot_z3_export_test", 4) {}
};

void expect_same_directory(const std::string& got, const std::string& want) {
  std::vector<std::string> a, b;
  for (const auto& e : fs::directory_iterator(got)) a.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(want)) b.push_back(e.path().filename().string());
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  ASSERT_EQ(a, b) << got << " vs " << want;
  for (const std::string& f : a) EXPECT_TRUE(read_file(got + "/" + f) == read_file(want + "/" + f)) << f << " differs";
}

// The 'export |' line of a streamed save: rank 0's peak bytes beyond its shards while it wrote, next to the
// largest tensor and the whole model. At most the largest tensor plus a conversion slab (the writer's bf16/f32
// conversion or GPT-2's transposed copy, <= half of it here), and well below the whole model.
void expect_one_tensor_at_a_time(const Result& r) {
  static const std::regex line(
      R"(export \| ZeRO-3: the final weights were gathered one tensor at a time; rank 0 held at most [^(]*\((\d+) B\) )"
      R"(beyond its shards \(largest tensor [^(]*\((\d+) B\), whole model ([^)]*)\))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, line)) << "no streamed save:\n" << r.output;
  const int64_t held = std::stoll(m[1]), largest = std::stoll(m[2]);
  EXPECT_GT(held, 0);
  EXPECT_LE(held, largest + largest / 2 + 4096) << m[0];
}

// Pretraining, f32 and bf16 (f32 masters: the file holds f32 weights, as one process's does), on 2 and 4 ranks.
TEST_F(Zero3FinalExport, PretrainWeightsAreWrittenFromTheShardsAsOneProcessWritesThem) {
  for (const std::string dtype : {"f32", "bf16"}) {
    for (int world : {2, 4}) {
      SCOPED_TRACE(dtype + " on " + std::to_string(world) + " ranks");
      const std::string z3 = "z3_" + dtype + "_" + std::to_string(world);
      Result r = launch(world, z3, "dtype=" + dtype + " distributed.zero_stage=3 checkpoint.save_every=6");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      expect_one_tensor_at_a_time(r);
      const std::string one = "one_" + z3;
      Result o = single(one, "dtype=" + dtype + " resume_from=" + path(z3 + "/checkpoints/step_00000006"));
      ASSERT_EQ(o.exit_code, 0) << o.output;
      EXPECT_EQ(o.output.find("export | ZeRO-3"), std::string::npos) << "one process saves whole weights";
      const std::string got = read_file(path(z3 + "/model.safetensors"));
      EXPECT_GT(got.size(), 1000u);
      EXPECT_TRUE(got == read_file(path(one + "/model.safetensors"))) << "model.safetensors differs";
    }
  }
}

// Full fine-tuning of the tiny Llama 3 fixture: the HF export (config.json, weights, tokenizer files) from the
// shards equals the one-process export at the same weights.
TEST_F(Zero3FinalExport, FullFinetuneHfExportIsStreamedFromTheShardsAsOneProcessWritesIt) {
  const std::string src = INGOT_SOURCE_DIR;
  const std::string cfg = "'" + src + "/configs/llama_full_finetune.yaml' device=cpu max_steps=4 train.log_every=1 "
                          "model.path=" + src + "/tests/fixtures/hf/llama3_tiny tokenizer.path=" + src +
                          "/tests/fixtures/data/tokenizer data.path=" + src + "/tests/fixtures/data/kjv_instruct.jsonl "
                          "logging.plot=false train.eval_every=0 checkpoint.save_every=4";
  Result z3 = sh("\"$INGOT\" launch --nproc-per-node 2 -- \"$INGOT\" run " + cfg +
                 " output_dir=z3 distributed.zero_stage=3 export.max_shard_mb=0.2");
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  expect_one_tensor_at_a_time(z3);
  EXPECT_TRUE(fs::exists(path("z3/hf/model.safetensors.index.json"))) << "the export is split into several files";
  Result one = sh("\"$INGOT\" run " + cfg + " output_dir=one export.max_shard_mb=0.2 resume_from=" +
                  path("z3/checkpoints/step_00000004"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  expect_same_directory(path("z3/hf"), path("one/hf"));
}

}  // namespace
}  // namespace ingot::recipes
