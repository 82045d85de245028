#include "recipes/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "recipes/hash.h"
#include "recipes/metrics.h"
#include "recipes/train.h"
#include "runtime/safetensors.h"
#include "recipes/train_state.h"
#include "runtime/file_util.h"

namespace ingot::recipes {
namespace {

namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
}

TEST(Hash, Sha256MatchesTheFipsExamples) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a's fed in uneven pieces exercises the buffering across blocks.
  Sha256 h;
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(h.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Hash, Crc32cMatchesTheCheckValueAndTensorFlowsMask) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

class Checkpoint : public ::testing::Test {
 protected:
  std::vector<CheckpointFile> files(const std::string& a, const std::string& b) {
    return {{"a.txt", [a](const std::string& p) { write_text(p, a); }},
            {"b.bin", [b](const std::string& p) { write_text(p, b); }}};
  }
  TempDir dir_{"ingot_ckpt_test"};
};

TEST_F(Checkpoint, WritesFilesAndAManifestWithSizesAndChecksums) {
  std::string path = write_checkpoint(dir_.path(), 7, files("alpha", "beta!"));
  EXPECT_EQ(path, dir_.path() + "/checkpoints/step_00000007");
  Manifest m = verify_checkpoint(path, {"a.txt", "b.bin"});
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.files.at("a.txt").bytes, 5u);
  EXPECT_EQ(m.files.at("b.bin").sha256, sha256_hex("beta!"));
  // Nothing but the final directory is left in checkpoints/.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_.path() + "/checkpoints")) entries += e.exists();
  EXPECT_EQ(entries, 1);
}

TEST_F(Checkpoint, AFailedWriteLeavesNoCheckpointAndKeepsTheOldOne) {
  std::string path = write_checkpoint(dir_.path(), 3, files("old", "old"));
  std::vector<CheckpointFile> bad = files("new", "new");
  bad.push_back({"c.txt", [](const std::string&) { INGOT_FAIL("disk full (simulated)"); }});
  EXPECT_THROW(write_checkpoint(dir_.path(), 3, bad), Error);
  EXPECT_EQ(read_file(path + "/a.txt"), "old");
  EXPECT_NO_THROW(verify_checkpoint(path));
  EXPECT_THROW(write_checkpoint(dir_.path(), 4, bad), Error);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir_.path(), 4)));
  EXPECT_EQ(list_checkpoints(dir_.path()).size(), 1u);
  for (const auto& e : fs::directory_iterator(dir_.path() + "/checkpoints"))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
}

TEST_F(Checkpoint, VerifyRefusesAChangedTruncatedOrMissingFileNamingIt) {
  std::string path = write_checkpoint(dir_.path(), 1, files("alpha", "beta!"));
  write_text(path + "/b.bin", "betA!");  // same size, different bytes
  try {
    verify_checkpoint(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file 'b.bin' does not match its checksum"), std::string::npos) << e.what();
  }
  write_text(path + "/b.bin", "bet");
  try {
    verify_checkpoint(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file 'b.bin' has 3 bytes but manifest.json says 5"), std::string::npos)
        << e.what();
  }
  fs::remove(path + "/b.bin");
  try {
    verify_checkpoint(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file 'b.bin' is listed in manifest.json but missing"), std::string::npos)
        << e.what();
  }
}

TEST_F(Checkpoint, VerifyRefusesABadOrIncompleteManifest) {
  std::string path = write_checkpoint(dir_.path(), 1, files("alpha", "beta!"));
  EXPECT_THROW(verify_checkpoint(path, {"a.txt", "state.json"}), Error);
  write_text(path + "/manifest.json", "{\"format\": \"ingot-checkpoint\", \"version\": 1, \"step\": 1,");
  try {
    verify_checkpoint(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json' is not valid JSON"), std::string::npos) << e.what();
  }
  fs::remove(path + "/manifest.json");
  try {
    verify_checkpoint(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no manifest.json"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(list_checkpoints(dir_.path()).empty());  // incomplete directories are not offered for resume
}

TEST_F(Checkpoint, PruneKeepsTheNewestAndRemovesCrashLeftovers) {
  for (int step : {2, 10, 4, 8}) write_checkpoint(dir_.path(), step, files("x", "y"));
  fs::create_directories(dir_.path() + "/checkpoints/.tmp-step_00000012-999");
  std::vector<std::string> removed = prune_checkpoints(dir_.path(), 2);
  EXPECT_EQ(removed.size(), 3u);
  auto left = list_checkpoints(dir_.path());
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].first, 8);
  EXPECT_EQ(left[1].first, 10);
  EXPECT_EQ(*latest_checkpoint(dir_.path()), checkpoint_path(dir_.path(), 10));
  EXPECT_FALSE(fs::exists(dir_.path() + "/checkpoints/.tmp-step_00000012-999"));
}

// --- exact resume of the pretrain loop ----------------------------------------------------------------------

class Resume : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (int i = 0; i < 40; ++i) text += "In the beginning God created the heaven and the earth. And the earth was ";
    write_text(dir_.file("text.txt"), text);
  }
  Config config(const std::string& out, std::vector<std::string> extra = {}) {
    Config c = Config::parse(
        "device: cpu\nmax_steps: 20\nseed: 11\n"
        "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, dropout: 0.1}\n"
        "train: {batch_size: 4, lr: 1.0e-2, warmup_steps: 3, log_every: 5, eval_batches: 0}\n"
        "data: {val_fraction: 0.0}\nlogging: {plot: false}\n",
        "resume.yaml");
    c.apply_override("data.path=" + dir_.file("text.txt"));
    c.apply_override("output_dir=" + dir_.file(out));
    for (const std::string& o : extra) c.apply_override(o);
    c.validate(pretrain_schema());
    return c;
  }
  std::vector<double> losses(const std::string& out) {
    std::vector<double> l;
    for (const MetricPoint& p : read_metrics(dir_.file(out + "/metrics.jsonl")))
      if (p.kind == "train") l.push_back(p.value);
    return l;
  }
  // Runs uninterrupted, then (in another directory) crashes after `halt` steps having saved every `every`,
  // resumes, and expects the same per-step losses, bit for bit.
  void expect_exact_resume(std::vector<std::string> extra, int64_t every, int64_t halt) {
    std::ostringstream log;
    run_pretrain(resolve_pretrain(config("full", extra)), log);
    std::vector<std::string> ckpt = extra;
    ckpt.push_back("checkpoint.save_every=" + std::to_string(every));
    PretrainSettings crashing = resolve_pretrain(config("split", ckpt));
    crashing.halt_after_steps = halt;
    run_pretrain(crashing, log);
    EXPECT_EQ(losses("split").size(), static_cast<size_t>(halt));
    ckpt.push_back("resume=true");
    TrainSummary r = run_pretrain(resolve_pretrain(config("split", ckpt)), log);
    EXPECT_EQ(r.resumed_from_step, halt / every * every);
    std::vector<double> a = losses("full"), b = losses("split");
    ASSERT_EQ(a.size(), 20u);
    ASSERT_EQ(b.size(), 20u) << "the replayed steps after the checkpoint must not be logged twice";
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;  // bitwise
    EXPECT_LT(a.back(), a.front());
    nlohmann::json sa = nlohmann::json::parse(read_file(dir_.file("full/summary.json")));
    nlohmann::json sb = nlohmann::json::parse(read_file(dir_.file("split/summary.json")));
    EXPECT_EQ(sa["first_loss"], sb["first_loss"]);
    EXPECT_EQ(sa["best_loss"], sb["best_loss"]);
    EXPECT_EQ(read_file(dir_.file("full/model.safetensors")), read_file(dir_.file("split/model.safetensors")));
  }
  TempDir dir_{"ingot_resume_test"};
};

TEST_F(Resume, CrashAfterStep13ResumedFromStep10EqualsAnUninterruptedRunBitwise) {
  expect_exact_resume({}, 10, 13);
}

TEST_F(Resume, Bf16MastersAndGradientAccumulationResumeBitwise) {
  expect_exact_resume({"dtype=bf16", "train.gradient_accumulation_steps=2", "max_steps=20"}, 5, 7);
}

TEST_F(Resume, AdamW8bitResumesBitwiseFromItsQuantizedState) {
  expect_exact_resume({"optimizer.name=adamw8bit"}, 10, 13);
  // The checkpoint holds the 8-bit codes and block absmax of the token embedding (256 x 16 = 4096 elements, the
  // only tensor large enough for 8-bit state) and f32 moments for the rest.
  SafetensorsFile f = SafetensorsFile::open(checkpoint_path(dir_.file("split"), 10) + "/optimizer.safetensors");
  int quantized = 0, f32 = 0;
  for (const std::string& name : f.names()) {
    if (name.ends_with(".exp_avg_q")) {
      ++quantized;
      EXPECT_EQ(f.get(name).dtype(), DType::i32) << name;
      EXPECT_EQ(f.get(name).numel(), 1024) << name;
    }
    if (name.ends_with(".exp_avg_sq_absmax")) {
      EXPECT_EQ(f.get(name).numel(), 16) << name;
    }
    if (name.ends_with(".exp_avg")) ++f32;
  }
  EXPECT_EQ(quantized, 1);
  EXPECT_GT(f32, 4);
}

TEST_F(Resume, KeepLastKeepsTheNewestCheckpointsAndTheSummaryListsThem) {
  std::ostringstream log;
  TrainSummary r = run_pretrain(
      resolve_pretrain(config("k", {"max_steps=8", "checkpoint.save_every=2", "checkpoint.keep_last=2"})), log);
  auto left = list_checkpoints(dir_.file("k"));
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].first, 6);
  EXPECT_EQ(left[1].first, 8);
  EXPECT_EQ(r.training_checkpoints, (std::vector<std::string>{left[0].second, left[1].second}));
  EXPECT_NE(log.str().find("checkpoint | step 8 | "), std::string::npos) << log.str();
}

TEST_F(Resume, AFreshRunReplacesTheEarlierRunsCheckpointsOnlyWithOverwriteOutputDir) {
  std::ostringstream log;
  run_pretrain(resolve_pretrain(config("f", {"max_steps=8", "checkpoint.save_every=4", "checkpoint.keep_last=0"})), log);
  ASSERT_EQ(list_checkpoints(dir_.file("f")).size(), 2u);
  EXPECT_THROW(resolve_pretrain(config("f", {"max_steps=6", "checkpoint.save_every=3"})), ConfigError);
  run_pretrain(resolve_pretrain(config("f", {"max_steps=6", "checkpoint.save_every=3", "checkpoint.keep_last=0",
                                             "overwrite_output_dir=true"})),
               log);
  auto left = list_checkpoints(dir_.file("f"));
  ASSERT_EQ(left.size(), 2u) << "steps 4 and 8 of the earlier run must be gone";
  EXPECT_EQ(left[0].first, 3);
  EXPECT_EQ(left[1].first, 6);
  EXPECT_NE(log.str().find("checkpoint | removed " + checkpoint_path(dir_.file("f"), 8)), std::string::npos)
      << log.str();
}

TEST_F(Resume, CollectiveAndCheckInTimeoutsComeFromTheConfigElseTheLauncher) {
  ::setenv("INGOT_COLLECTIVE_TIMEOUT_S", "42", 1);
  PretrainSettings from_env = resolve_pretrain(config("t"));
  PretrainSettings from_config =
      resolve_pretrain(config("t", {"distributed.timeout_s=5", "distributed.init_timeout_s=9"}));
  ::setenv("INGOT_COLLECTIVE_TIMEOUT_S", "soon", 1);
  std::string bad;
  try {
    resolve_pretrain(config("t"));
  } catch (const ConfigError& e) {
    bad = e.what();
  }
  ::unsetenv("INGOT_COLLECTIVE_TIMEOUT_S");
  PretrainSettings plain = resolve_pretrain(config("t"));
  EXPECT_EQ(from_env.run.distributed.timeout_s, 42);
  EXPECT_EQ(from_env.run.distributed.init_timeout_s, 300);
  EXPECT_EQ(from_config.run.distributed.timeout_s, 5);
  EXPECT_EQ(from_config.run.distributed.init_timeout_s, 9);
  EXPECT_EQ(plain.run.distributed.timeout_s, 600);
  EXPECT_NE(bad.find("environment INGOT_COLLECTIVE_TIMEOUT_S='soon': expected seconds > 0"), std::string::npos) << bad;
}

// Note [SM carve-out] (runtime/sm_budget.h): the config's carve-out, applied when a data-parallel run starts on
// GPUs; a negative one is refused naming the key (one that leaves the GPU no SMs is refused there, naming it too:
// CudaSmCarveout.ACarveOutLeavingNoSmsIsRefusedNamingItsSource).
TEST_F(Resume, SmCarveoutComesFromTheConfigAndANegativeOneNamesTheKey) {
  EXPECT_EQ(resolve_pretrain(config("s")).run.distributed.sm_carveout, 0);
  EXPECT_EQ(resolve_pretrain(config("s", {"distributed.sm_carveout=16"})).run.distributed.sm_carveout, 16);
  std::string bad;
  try {
    resolve_pretrain(config("s", {"distributed.sm_carveout=-1"}));
  } catch (const ConfigError& e) {
    bad = e.what();
  }
  EXPECT_NE(bad.find("distributed.sm_carveout"), std::string::npos) << bad;
  EXPECT_NE(bad.find("expected an integer >= 0, got '-1'"), std::string::npos) << bad;
}

TEST_F(Resume, ACorruptCheckpointIsRefusedNamingTheFileAndNothingIsWritten) {
  std::ostringstream log;
  PretrainSettings s = resolve_pretrain(config("c", {"checkpoint.save_every=4"}));
  s.halt_after_steps = 4;
  run_pretrain(s, log);
  std::string ckpt = checkpoint_path(dir_.file("c"), 4);
  std::string opt = read_file(ckpt + "/optimizer.safetensors");
  opt[opt.size() - 3] ^= 0x40;
  write_text(ckpt + "/optimizer.safetensors", opt);
  std::string metrics_before = read_file(dir_.file("c/metrics.jsonl"));
  try {
    run_pretrain(resolve_pretrain(config("c", {"checkpoint.save_every=4", "resume=true"})), log);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file 'optimizer.safetensors' does not match its checksum"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read_file(dir_.file("c/metrics.jsonl")), metrics_before);
  EXPECT_FALSE(fs::exists(dir_.file("c/model.safetensors")));
}

TEST_F(Resume, ADifferentConfigIsRefusedListingTheKeysThatChanged) {
  std::ostringstream log;
  PretrainSettings s = resolve_pretrain(config("d", {"checkpoint.save_every=2"}));
  s.halt_after_steps = 2;
  run_pretrain(s, log);
  Config changed = config("d", {"checkpoint.save_every=2", "resume=true", "train.lr=0.02", "train.log_every=1"});
  try {
    resolve_pretrain(changed);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("was made with a different config"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.lr: '1.0e-2' in the checkpoint, '0.02' now (command-line override 'train.lr=0.02')"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("train.log_every"), std::string::npos) << "logging keys may change: " << msg;
  }
}

TEST_F(Resume, ResumeFromAPathAndTheLaunchersRestartCount) {
  std::ostringstream log;
  PretrainSettings s = resolve_pretrain(config("r", {"checkpoint.save_every=3"}));
  s.halt_after_steps = 7;
  run_pretrain(s, log);
  std::string step3 = checkpoint_path(dir_.file("r"), 3);
  PretrainSettings from = resolve_pretrain(config("r", {"checkpoint.save_every=3", "resume_from=" + step3}));
  EXPECT_EQ(from.run.resume_checkpoint, step3);

  ::setenv("INGOT_RESTART_COUNT", "2", 1);
  PretrainSettings restarted = resolve_pretrain(config("r", {"checkpoint.save_every=3"}));
  PretrainSettings elsewhere = resolve_pretrain(config("fresh", {"checkpoint.save_every=3"}));
  ::setenv("INGOT_RESTART_COUNT", "x", 1);
  EXPECT_THROW(resolve_pretrain(config("r")), ConfigError);
  ::unsetenv("INGOT_RESTART_COUNT");
  EXPECT_EQ(restarted.run.resume_checkpoint, checkpoint_path(dir_.file("r"), 6));
  EXPECT_EQ(restarted.run.resume_reason, "INGOT_RESTART_COUNT=2");
  EXPECT_TRUE(elsewhere.run.resume_checkpoint.empty()) << "a restart before any checkpoint starts over";

  try {
    resolve_pretrain(config("r", {"resume_from=" + dir_.file("nope")}));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("resume_from: no checkpoint directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ingot::recipes
