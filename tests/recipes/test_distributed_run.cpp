// Data-parallel training end to end: `ingot launch --nproc-per-node N -- ingot run CONFIG` with Gloo workers
// on the CPU (recipes/data_parallel.h), checked against one process training on the same global batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "recipes/data.h"
#include "recipes/sharded_checkpoint.h"
#include "recipes/train.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"
#include "tests/shell.h"
#include "tests/tiny_run.h"

namespace ingot::recipes {
namespace {

using ingot::testing::train_losses;

namespace fs = std::filesystem;

using Result = ingot::testing::ShellResult;  // stdout and stderr together

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void expect_same_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << what << ": no step " << step;
    EXPECT_NEAR(got.at(step), loss, 1e-5 * std::abs(loss)) << what << " at step " << step;
  }
}

TEST(DataParallelSampler, RanksReadDisjointRowsThatMakeUpTheGlobalBatch) {
  TextDataset d = TextDataset::from_text(std::string(300, 'a') + "bcdefghijklmnopqrstuvwxyz0123456789", 0.0);
  BatchSampler whole(d, Split::Train, 6, 8, 7);
  for (int world : {2, 3}) {
    for (int64_t index : {0, 5}) {
      std::vector<double> joined;
      for (int rank = 0; rank < world; ++rank) {
        Tensor part = BatchSampler(d, Split::Train, 6, 8, 7, rank, world).batch(index);
        EXPECT_EQ(part.size(0), 6 / world);
        std::vector<double> v = part.to_vector();
        joined.insert(joined.end(), v.begin(), v.end());
      }
      EXPECT_EQ(joined, whole.batch(index).to_vector()) << "world " << world << " batch " << index;
    }
  }
  EXPECT_THROW(BatchSampler(d, Split::Train, 8, 8, 7, 0, 3), Error);
}

class DistributedRun : public ingot::testing::TinyRun {
 protected:
  DistributedRun() : TinyRun("ingot_dp_test", 1) {}
};

TEST_F(DistributedRun, TwoWorkersTrainLikeOneProcessOnTheSameGlobalBatch) {
  Result one = single("one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  Result two = launch(2, "two");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("distributed | 2 ranks (env, gloo) | DDP"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("(6 per rank x 2 ranks)"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("all 2 worker(s) succeeded"), std::string::npos) << two.output;
  // Rank 0 alone prints progress.
  size_t lines = 0;
  for (size_t at = two.output.find("step 6/6"); at != std::string::npos; at = two.output.find("step 6/6", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << two.output;

  std::map<int64_t, double> want = train_losses(path("one/metrics.jsonl"));
  ASSERT_EQ(want.size(), 6u);
  expect_same_losses(train_losses(path("two/metrics.jsonl")), want, "2 workers vs 1 process");
  auto s1 = nlohmann::json::parse(slurp(path("one/summary.json")));
  auto s2 = nlohmann::json::parse(slurp(path("two/summary.json")));
  EXPECT_NEAR(s2["val_loss"].get<double>(), s1["val_loss"].get<double>(), 1e-5 * s1["val_loss"].get<double>());
  EXPECT_TRUE(fs::exists(path("two/model.safetensors")));
  // tokens counts every rank's tokens: 12 sequences x 8 tokens per step.
  std::istringstream first(slurp(path("two/metrics.jsonl")));
  std::string line;
  std::getline(first, line);
  EXPECT_EQ(nlohmann::json::parse(line)["tokens"].get<int64_t>(), 96) << line;
}

TEST_F(DistributedRun, GradientAccumulationOfHalfBatchesEqualsTheFullBatchOnThreeWorkers) {
  Result full = launch(3, "full");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  Result accum = launch(3, "accum", "train.batch_size=6 train.gradient_accumulation_steps=2");
  ASSERT_EQ(accum.exit_code, 0) << accum.output;
  EXPECT_NE(accum.output.find("(2 per rank x 3 ranks)"), std::string::npos) << accum.output;
  expect_same_losses(train_losses(path("accum/metrics.jsonl")), train_losses(path("full/metrics.jsonl")),
                     "6 x 2 accumulated vs 12");
}

TEST_F(DistributedRun, ZeroOneMatchesPlainDdpAndCheckpointsTheFullOptimizerState) {
  // Small buckets so the model spans several, each padded and sharded; grad_clip (1.0) needs the global norm.
  const std::string common = "distributed.bucket_cap_mb=0.004 checkpoint.save_every=3 checkpoint.keep_last=0";
  Result plain = launch(2, "plain", common);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  Result zero = launch(2, "zero", common + " distributed.zero_stage=1");
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_NE(zero.output.find("DDP + ZeRO-1"), std::string::npos) << zero.output;
  expect_same_losses(train_losses(path("zero/metrics.jsonl")), train_losses(path("plain/metrics.jsonl")),
                     "ZeRO-1 vs plain DDP");
  // Note [ZeRO-1 checkpoints hold the full optimizer state]: the same names and values as plain DDP's.
  SafetensorsFile a = SafetensorsFile::open(path("plain/checkpoints/step_00000003/optimizer.safetensors"));
  SafetensorsFile b = SafetensorsFile::open(path("zero/checkpoints/step_00000003/optimizer.safetensors"));
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    std::vector<double> x = a.get(name).to_vector(), y = b.get(name).to_vector();
    ASSERT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 1e-5 * std::abs(x[i]) + 1e-9) << name << "[" << i << "]";
  }
}

TEST_F(DistributedRun, AKilledWorkerRestartsTheGroupWhichResumesFromTheLastCheckpoint) {
  Result ref = single("ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Rank 1 dies right after step 3 (its checkpoint is step 2); the launcher restarts both ranks, which resume.
  Result r = launch(2, "killed", "checkpoint.save_every=2", "--max-restarts 1", "INGOT_TEST_KILL_AT_STEP=1:3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resume | INGOT_RESTART_COUNT=1: continuing after step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all 2 worker(s) succeeded (attempt 1)"), std::string::npos) << r.output;
  expect_same_losses(train_losses(path("killed/metrics.jsonl")), train_losses(path("ref/metrics.jsonl")),
                     "restarted vs uninterrupted");
  auto summary = nlohmann::json::parse(slurp(path("killed/summary.json")));
  EXPECT_EQ(summary["resumed_from_step"].get<int64_t>(), 2);
}

TEST_F(DistributedRun, ZeroOneResumesFromAGatheredCheckpointAfterAKill) {
  Result ref = single("ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  Result r = launch(2, "killed", "checkpoint.save_every=2 distributed.zero_stage=1 distributed.bucket_cap_mb=0.004",
                    "--max-restarts 1", "INGOT_TEST_KILL_AT_STEP=0:3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("continuing after step 2"), std::string::npos) << r.output;
  expect_same_losses(train_losses(path("killed/metrics.jsonl")), train_losses(path("ref/metrics.jsonl")),
                     "ZeRO-1 restarted vs one uninterrupted process");
}

// ZeRO-2 and ZeRO-3 train like one process (1e-5 relative, as plain DDP: the same f32 sums in another order).
// ZeRO-3's checkpoints are sharded (every rank writes its slices: tests/recipes/test_sharded_checkpoint.cpp),
// and one written by 4 ranks resumes under 2 ranks with ZeRO-3 and in one process, each continuing with the
// uninterrupted run's losses (compiled ZeRO-3: tests/recipes/test_fsdp_compiled_run.cpp).
TEST_F(DistributedRun, ZeroTwoAndThreeTrainLikeOneProcessAndAFourRankCheckpointResumesUnderTwoAndOne) {
  Result ref = single("ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::map<int64_t, double> want = train_losses(path("ref/metrics.jsonl"));
  Result z2 = launch(2, "z2", "distributed.zero_stage=2 distributed.bucket_cap_mb=0.004");
  ASSERT_EQ(z2.exit_code, 0) << z2.output;
  EXPECT_NE(z2.output.find("DDP + ZeRO-2 (gradients and optimizer state sharded)"), std::string::npos) << z2.output;
  expect_same_losses(train_losses(path("z2/metrics.jsonl")), want, "ZeRO-2 on 2 workers vs 1 process");
  // With the next block's gather prefetched (Note [Eager prefetch], distributed/fsdp.h); the resumed runs below
  // without it.
  Result z3 = launch(4, "z3", "distributed.zero_stage=3 distributed.prefetch=true checkpoint.save_every=3 "
                              "checkpoint.keep_last=0");
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  EXPECT_NE(z3.output.find("FSDP / ZeRO-3 (weights, gradients and optimizer state sharded), one unit per "
                           "transformer block, gathered for forward and again for backward, the next block's "
                           "gather prefetched"),
            std::string::npos)
      << z3.output;
  // The model was never whole on a rank: each drew only its shards' slices of the initial weights (the bit-level
  // check: tests/recipes/test_pretrain_shard_init.cpp).
  EXPECT_NE(z3.output.find("init | rank 0 drew "), std::string::npos) << z3.output;
  expect_same_losses(train_losses(path("z3/metrics.jsonl")), want, "ZeRO-3 on 4 workers vs 1 process");
  const auto v_ref = nlohmann::json::parse(slurp(path("ref/summary.json")))["val_loss"].get<double>();
  const auto v_z3 = nlohmann::json::parse(slurp(path("z3/summary.json")))["val_loss"].get<double>();
  EXPECT_NEAR(v_z3, v_ref, 1e-5 * v_ref) << "the final eval runs through the gathered units";
  EXPECT_TRUE(fs::exists(path("z3/model.safetensors")));

  const std::string ckpt = path("z3/checkpoints/step_00000003");
  std::map<int64_t, double> rest;
  for (const auto& [step, loss] : want)
    if (step > 3) rest[step] = loss;
  Result two = launch(2, "z3_on_2", "distributed.zero_stage=3 distributed.reshard_after_forward=false resume_from=" + ckpt);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("gathered from forward to backward"), std::string::npos) << two.output;
  expect_same_losses(train_losses(path("z3_on_2/metrics.jsonl")), rest, "4-rank ZeRO-3 checkpoint resumed on 2");
  Result one = single("z3_on_1", "resume_from=" + ckpt);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  expect_same_losses(train_losses(path("z3_on_1/metrics.jsonl")), rest, "4-rank ZeRO-3 checkpoint resumed in 1 process");

  // bf16 compute with f32 masters: ZeRO-3's optimizer updates f32 master shards; on 2 ranks every sum is of two
  // numbers, so with the same bf16 reduction it follows bf16 DDP to f32 rounding, checkpoints (masters gathered)
  // included. (ZeRO-3's default f32 reduction keeps the average unrounded for the masters, which DDP, whose
  // gradients are the bf16 weights' own, does not: Note [Reduced gradients keep their precision].)
  const std::string bf16 = "dtype=bf16 max_steps=4 checkpoint.save_every=2 distributed.reduce_dtype=bf16";
  Result bd = launch(2, "bf16_ddp", bf16);
  ASSERT_EQ(bd.exit_code, 0) << bd.output;
  Result b3 = launch(2, "bf16_z3", bf16 + " distributed.zero_stage=3");
  ASSERT_EQ(b3.exit_code, 0) << b3.output;
  EXPECT_NE(b3.output.find("| f32 master weights "), std::string::npos) << b3.output;
  expect_same_losses(train_losses(path("bf16_z3/metrics.jsonl")), train_losses(path("bf16_ddp/metrics.jsonl")),
                     "bf16 ZeRO-3 vs bf16 DDP");
  // ZeRO-3 writes sharded checkpoints (recipes/sharded_checkpoint.h): each tensor assembled from the ranks' slices.
  SafetensorsFile md = SafetensorsFile::open(path("bf16_ddp/checkpoints/step_00000004/model.safetensors"));
  ShardedCheckpoint m3 = ShardedCheckpoint::open(path("bf16_z3/checkpoints/step_00000004"));
  std::vector<std::string> sharded_names;
  for (const std::string& name : m3.names("model/")) sharded_names.push_back(name.substr(6));
  std::vector<std::string> names = md.names();
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names, sharded_names);
  for (const std::string& name : md.names()) {
    std::vector<double> x = md.get(name).to_vector(), y = m3.read("model/" + name).to_vector();
    ASSERT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 1e-2 * std::abs(x[i]) + 1e-6) << name << "[" << i << "]";
  }
}

TEST_F(DistributedRun, AGlobalBatchThatDoesNotDivideByTheWorldSizeFailsEveryRankBeforeWriting) {
  Result r = launch(3, "bad", "train.batch_size=8", "--log-dir logs");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train.batch_size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("must divide by the world size 3"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("bad"))) << "nothing may be written";
  // Every rank checks on its own (no collective needed), so each exits with the config error.
  for (int rank = 0; rank < 3; ++rank) {
    const Result each = sh("WORLD_SIZE=3 RANK=" + std::to_string(rank) +
                           " MASTER_ADDR=127.0.0.1 MASTER_PORT=1 \"$INGOT\" run tiny.yaml output_dir=bad "
                           "train.batch_size=8");
    EXPECT_EQ(each.exit_code, 2) << each.output;
    EXPECT_NE(each.output.find("train.batch_size: 8 is the global batch over all ranks and must divide by the world "
                               "size 3 (WORLD_SIZE)"),
              std::string::npos)
        << each.output;
  }
  EXPECT_FALSE(fs::exists(path("bad")));
}

TEST_F(DistributedRun, LoraFinetuneOnPaddedChatDataWeighsRanksByTheirLossTokens) {
  // Padded chat rows carry different numbers of loss tokens per rank: each rank's mean is weighed by its share
  // of the global count, so two workers still train exactly like one process.
  const std::string src = INGOT_SOURCE_DIR;
  const std::string cfg = "'" + src + "/configs/llama_lora_finetune.yaml' device=cpu max_steps=4 train.log_every=1 "
                          "model.path=" + src + "/tests/fixtures/hf/llama_tiny tokenizer.path=" + src +
                          "/tests/fixtures/data/tokenizer data.path=" + src + "/tests/fixtures/data/kjv_chat.jsonl "
                          "lora.merge_on_export=false logging.plot=false data.val_fraction=0.25 train.eval_batches=3";
  Result one = sh("\"$INGOT\" run " + cfg + " output_dir=one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  Result two = sh("\"$INGOT\" launch --nproc-per-node 2 -- \"$INGOT\" run " + cfg + " output_dir=two");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  expect_same_losses(train_losses(path("two/metrics.jsonl")), train_losses(path("one/metrics.jsonl")),
                     "LoRA on 2 workers vs 1 process");
  // The held-out loss: the two ranks score alternate batches and the token-weighted sums are combined.
  const double v1 = nlohmann::json::parse(slurp(path("one/summary.json")))["val_loss"].get<double>();
  const double v2 = nlohmann::json::parse(slurp(path("two/summary.json")))["val_loss"].get<double>();
  EXPECT_GT(v1, 0.0);
  EXPECT_NEAR(v2, v1, 1e-6 * v1) << "split evaluation equals one process's";
  // Compiled, the per-step token weights are an input of the graph, not constants of the first step.
  Result comp = sh("\"$INGOT\" launch --nproc-per-node 2 -- \"$INGOT\" run " + cfg +
                   " output_dir=comp compile.enabled=true compile.cache_dir=" + path("cache"));
  ASSERT_EQ(comp.exit_code, 0) << comp.output;
  EXPECT_NE(comp.output.find("compile | 1 graph(s), 0 break(s), 0 recompile(s)"), std::string::npos) << comp.output;
  const std::map<int64_t, double> e = train_losses(path("one/metrics.jsonl")), c = train_losses(path("comp/metrics.jsonl"));
  ASSERT_EQ(e.size(), c.size());
  for (const auto& [step, loss] : e) EXPECT_NEAR(c.at(step), loss, 1e-4 * std::abs(loss)) << "compiled step " << step;
}

// compile.enabled under DDP: one compiled graph holding the all-reduces (ZeRO-1: reduce-scatters, all-gathers
// and the cross-rank gradient norm), training like eager DDP.
// distributed.reduce_dtype: bf16 halves the gradient bytes on the wire; training stays within bf16's rounding of
// the f32 run, and a dtype that is not offered is a config error naming the key.
TEST_F(DistributedRun, Bf16GradientAveragingTrainsNearTheF32RunAndSaysSo) {
  Result f = launch(2, "f32", "max_steps=4");
  ASSERT_EQ(f.exit_code, 0) << f.output;
  Result b = launch(2, "bf16", "max_steps=4 distributed.reduce_dtype=bf16");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("averaged in bf16"), std::string::npos) << b.output;
  const std::map<int64_t, double> lf = train_losses(path("f32/metrics.jsonl")), lb = train_losses(path("bf16/metrics.jsonl"));
  ASSERT_EQ(lf.size(), lb.size());
  bool differs = false;
  for (const auto& [step, loss] : lf) {
    EXPECT_NEAR(lb.at(step), loss, 1e-2 * std::abs(loss)) << "step " << step;
    differs = differs || lb.at(step) != loss;
  }
  EXPECT_TRUE(differs) << "bf16 averaging must round something";
  Result bad = single("bad", "distributed.reduce_dtype=f16");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("distributed.reduce_dtype"), std::string::npos) << bad.output;
}

// train.master_weights: false under plain DDP: every rank rounds the same averaged update of the same bf16 weights
// the same way (the rounding is a function of the value, its index and the step), so two workers train as one
// process does on the same global batch, to the bf16 averaging's rounding.
TEST_F(DistributedRun, Bf16WeightsWithoutMastersTrainOnTwoWorkersLikeOneProcess) {
  const std::string bare = "max_steps=4 dtype=bf16 train.master_weights=false";
  Result one = single("bare1", bare);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  Result two = launch(2, "bare2", bare);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::map<int64_t, double> l1 = train_losses(path("bare1/metrics.jsonl")),
                                  l2 = train_losses(path("bare2/metrics.jsonl"));
  ASSERT_EQ(l1.size(), 4u);
  ASSERT_EQ(l2.size(), 4u);
  for (const auto& [step, loss] : l1) EXPECT_NEAR(l2.at(step), loss, 1e-2 * std::abs(loss)) << "step " << step;
}

// train.master_weights: false under ZeRO-1/2/3, with AdamW and with AdamW8bit: each rank updates its bf16 shard in
// place (no f32 master shard). The shards' elements round with salts counted from the shard's start, not the
// tensor's, and AdamW8bit quantizes each rank's chunks in their own 256-element blocks, so the runs follow plain DDP
// to bf16's and the codes' rounding, not bit for bit. Checkpoints carry the bf16 shards and, for AdamW8bit, the
// moments element by element under ZeRO-1 (Note [8-bit state element by element], optim/adamw8bit.cpp), exact
// for the blocks they came from, and as the shards' codes under ZeRO-2/3 (Note [Moments in their blocks],
// recipes/sharded_checkpoint.cpp), loaded as written: a worker killed after step 3 resumes from step 2 with the
// uninterrupted run's losses at every stage. A ZeRO-3 checkpoint resumes in one process and plain DDP's under ZeRO-3, each near the uninterrupted run.
TEST_F(DistributedRun, Bf16WeightsWithoutMastersShardUnderZeroOneTwoAndThreeAndResumeExactly) {
  for (const std::string optimizer : {"adamw", "adamw8bit"}) {
    // AdamW8bit: wider blocks and buckets, so that the shards reach 8-bit state (4096 elements and more).
    const std::string model = "max_steps=4 dtype=bf16 train.master_weights=false optimizer.name=" + optimizer +
                              (optimizer == "adamw8bit" ? " model.n_embd=64 " : " ");
    const std::string bare = model + "checkpoint.save_every=2 checkpoint.keep_last=0 distributed.bucket_cap_mb=" +
                             (optimizer == "adamw8bit" ? "0.05" : "0.004");
    const std::string ddp_run = optimizer + "_ddp";
    Result ddp = launch(2, ddp_run, bare);
    ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
    const std::map<int64_t, double> want = train_losses(path(ddp_run + "/metrics.jsonl"));
    ASSERT_EQ(want.size(), 4u);
    auto near = [&](const std::map<int64_t, double>& got, const std::string& what) {
      ASSERT_FALSE(got.empty()) << what;
      for (const auto& [step, loss] : got)
        EXPECT_NEAR(loss, want.at(step), 1e-2 * std::abs(loss)) << what << " step " << step;
    };
    for (int stage : {1, 2, 3}) {
      const std::string name = optimizer + "_z" + std::to_string(stage),
                        args = bare + " distributed.zero_stage=" + std::to_string(stage);
      Result z = launch(2, name, args);
      ASSERT_EQ(z.exit_code, 0) << z.output;
      EXPECT_NE(z.output.find("ZeRO-" + std::to_string(stage)), std::string::npos) << z.output;
      EXPECT_NE(z.output.find(" on this rank"), std::string::npos) << z.output;
      EXPECT_NE(z.output.find(" | no f32 masters: the bf16 weights take each update rounded stochastically\n"),
                std::string::npos)
          << z.output;
      EXPECT_EQ(z.output.find("f32 master weights"), std::string::npos) << z.output;
      EXPECT_EQ(z.output.find("8-bit moments for 0 of"), std::string::npos) << z.output;
      near(train_losses(path(name + "/metrics.jsonl")), name);
      Result k = launch(2, name + "_killed", args, "--max-restarts 1", "INGOT_TEST_KILL_AT_STEP=1:3");
      ASSERT_EQ(k.exit_code, 0) << k.output;
      EXPECT_NE(k.output.find("continuing after step 2"), std::string::npos) << k.output;
      if (optimizer == "adamw8bit" && stage >= 2)  // Note [Moments in their blocks]: the codes themselves
        EXPECT_NE(k.output.find(" bucket(s) loaded as written, 0 decoded and requantized"), std::string::npos)
            << k.output;
      expect_same_losses(train_losses(path(name + "_killed/metrics.jsonl")),
                         train_losses(path(name + "/metrics.jsonl")), name + " restarted vs uninterrupted");
    }
    // The shards are bf16 and there are no masters: the checkpoint's model slices are the weights themselves.
    const std::string z3_ckpt = path(optimizer + "_z3/checkpoints/step_00000002");
    ShardedCheckpoint ck = ShardedCheckpoint::open(z3_ckpt);
    ASSERT_FALSE(ck.names("model/").empty());
    for (const std::string& name : ck.names("model/")) EXPECT_EQ(ck.read(name).dtype(), DType::bf16) << name;
    EXPECT_EQ(ck.names("blocks/").empty(), optimizer == "adamw");  // AdamW8bit's moments in their blocks
    Result one = single(optimizer + "_z3_on_1", model + "resume_from=" + z3_ckpt);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    near(train_losses(path(optimizer + "_z3_on_1/metrics.jsonl")), "ZeRO-3 checkpoint in one process");
    Result z3 = launch(2, optimizer + "_ddp_on_z3",
                       model + "distributed.zero_stage=3 resume_from=" + path(ddp_run + "/checkpoints/step_00000002"));
    ASSERT_EQ(z3.exit_code, 0) << z3.output;
    near(train_losses(path(optimizer + "_ddp_on_z3/metrics.jsonl")), "DDP checkpoint under ZeRO-3");
  }
}

// MFU over all ranks' devices: tokens/s counts every rank's tokens, so two workers at the same FLOPs a token
// report half one process's MFU per token a second (a 2-GPU run once printed 83% for 41% a GPU).
TEST_F(DistributedRun, MfuDividesByEveryRanksDevice) {
  const std::string args = "max_steps=3 logging.peak_tflops=1";
  Result one = single("mfu1", args);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  Result two = launch(2, "mfu2", args);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // MFU / (tokens/s) = FLOPs a token / peak, the same every step.
  auto mfu_per_rate = [&](const std::string& run) {
    std::vector<double> out;
    std::istringstream lines(slurp(path(run + "/metrics.jsonl")));
    for (std::string l; std::getline(lines, l);) {
      const nlohmann::json j = nlohmann::json::parse(l);
      if (j.value("kind", "") == "train") out.push_back(j.at("mfu").get<double>() / j.at("tokens_per_s").get<double>());
    }
    return out;
  };
  const std::vector<double> r1 = mfu_per_rate("mfu1"), r2 = mfu_per_rate("mfu2");
  ASSERT_EQ(r1.size(), 3u);
  ASSERT_EQ(r2.size(), 3u);
  for (size_t i = 0; i < r1.size(); ++i) EXPECT_NEAR(r2[i], 0.5 * r1[i], 1e-9 * r1[i]) << "step " << i + 1;
}

TEST_F(DistributedRun, CompiledDdpFollowsEagerDdpInOneGraph) {
  Result eager = launch(2, "eager", "max_steps=4");
  ASSERT_EQ(eager.exit_code, 0) << eager.output;
  Result comp = launch(2, "compiled", "max_steps=4 compile.enabled=true compile.cache_dir=" + path("cache"));
  ASSERT_EQ(comp.exit_code, 0) << comp.output;
  EXPECT_NE(comp.output.find("the bucket all-reduces are nodes of the compiled step"), std::string::npos)
      << comp.output;
  EXPECT_NE(comp.output.find("compile | 1 graph(s), 0 break(s), 0 recompile(s)"), std::string::npos) << comp.output;
  const std::map<int64_t, double> e = train_losses(path("eager/metrics.jsonl")),
                                   c = train_losses(path("compiled/metrics.jsonl"));
  ASSERT_EQ(e.size(), c.size());
  for (const auto& [step, loss] : e) EXPECT_NEAR(c.at(step), loss, 1e-4 * std::abs(loss)) << "step " << step;
  // ZeRO-1 with clipping (the global norm sums the ranks' shards inside the graph), compiled vs eager.
  const std::string z1 = "max_steps=4 distributed.zero_stage=1 distributed.bucket_cap_mb=0.004 train.grad_clip=0.05";
  Result ze = launch(2, "zero_eager", z1);
  ASSERT_EQ(ze.exit_code, 0) << ze.output;
  Result zc = launch(2, "zero_comp", z1 + " compile.enabled=true compile.cache_dir=" + path("cache"));
  ASSERT_EQ(zc.exit_code, 0) << zc.output;
  EXPECT_NE(zc.output.find("reduce-scatters and all-gathers are nodes of the compiled step"), std::string::npos)
      << zc.output;
  EXPECT_NE(zc.output.find("compile | 1 graph(s), 0 break(s), 0 recompile(s)"), std::string::npos) << zc.output;
  const std::map<int64_t, double> ze_l = train_losses(path("zero_eager/metrics.jsonl")),
                                   zc_l = train_losses(path("zero_comp/metrics.jsonl"));
  ASSERT_EQ(ze_l.size(), zc_l.size());
  for (const auto& [step, loss] : ze_l) EXPECT_NEAR(zc_l.at(step), loss, 1e-4 * std::abs(loss)) << "ZeRO-1 step " << step;
}

}  // namespace
}  // namespace ingot::recipes
