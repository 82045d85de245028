// Sharded ZeRO-2/3 checkpoints (recipes/sharded_checkpoint.h): the format in one process (N writers, read back
// as any number of ranks, each reading only its slices), and end to end under `ingot launch` with Gloo workers
// on the CPU: written by 4 ranks, resumed exactly on 4 and with the uninterrupted losses on 2 and in 1 process,
// a killed rank restarting from it, and missing or corrupt shard files refused by name with nothing overwritten.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <tuple>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "recipes/checkpoint.h"
#include "recipes/hash.h"
#include "recipes/sharded_checkpoint.h"
#include "recipes/train_state.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/kernels/quant8.h"
#include "tests/shell.h"
#include "tests/tiny_run.h"

namespace ingot::recipes {
namespace {

// Called with each_step_once false, as before: a killed or resumed run may log a step again.
using ingot::testing::train_losses;

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- the format, in one process --------------------------------------------------------------------------

// Three parameters in two flat buffers: [w0 (5x3), w1 (7)] and [w2 (2x2)]; values p*100 + i.
const std::vector<Shape> kShapes = {{5, 3}, {7}, {2, 2}};

std::vector<FlatLayout> layouts(int world) {
  auto pad = [&](int64_t n) { return (n + world - 1) / world * world; };
  return {{{0, 1}, {0, 15}, pad(22)}, {{2}, {0}, pad(4)}};
}

double value(size_t p, int64_t i, double scale) { return scale * (static_cast<double>(p) * 100 + static_cast<double>(i)); }

// Rank r of `world`'s chunk of buffer b holding value(p, i, scale), zeros in the padding.
Tensor chunk_of(int world, int rank, size_t b, double scale) {
  const FlatLayout l = layouts(world)[b];
  const int64_t chunk = l.padded_numel / world;
  std::vector<double> v(chunk, 0.0);
  for (size_t k = 0; k < l.params.size(); ++k)
    for (int64_t i = 0; i < numel(kShapes[l.params[k]]); ++i) {
      const int64_t at = l.offsets[k] + i - rank * chunk;
      if (at >= 0 && at < chunk) v[at] = value(l.params[k], i, scale);
    }
  return from_vector(v, {chunk}, DType::f32);
}

// Every rank's files, then rank 0's index and state.json, committed as one checkpoint of step `step`.
std::string commit_states(const std::string& out, int64_t step, const std::vector<ShardedState>& states) {
  const std::string tmp = begin_checkpoint(out, step, "sharded");
  std::vector<std::pair<std::string, ManifestEntry>> listed;
  for (const ShardedState& s : states)
    for (const CheckpointFile& f : shard_files(s)) listed.emplace_back(f.name, write_checkpoint_file(tmp, f));
  const CheckpointFile index = shard_index_file(states.at(0));
  listed.emplace_back(index.name, write_checkpoint_file(tmp, index));
  TrainState st;
  st.step = step;
  const std::string json = train_state_json(st);
  listed.emplace_back("state.json", write_checkpoint_file(tmp, {"state.json", [&](const std::string& p) {
                                                                  write_file_atomic(p, [&](std::FILE* f) {
                                                                    write_bytes(f, json.data(), json.size());
                                                                  });
                                                                }}));
  return commit_checkpoint(out, step, tmp, listed);
}

std::string write_four_rank_checkpoint(const std::string& out) {
  const int world = 4;
  std::vector<ShardedState> states;
  for (int r = 0; r < world; ++r) {
    ShardedState s;
    s.rank = r;
    s.world = world;
    s.zero_stage = 3;
    s.layout = layouts(world);
    s.names = {"w0", "w1", "w2"};
    s.shapes = kShapes;
    s.aliases = {{"tied_w2", "w2"}};
    for (size_t b = 0; b < 2; ++b) {
      s.weights.push_back(chunk_of(world, r, b, 1.0));
      s.optimizer[std::to_string(b) + ".exp_avg"] = chunk_of(world, r, b, -0.5);
      s.masters.push_back(chunk_of(world, r, b, 2.0));
    }
    s.optimizer["step"] = from_vector_i64({7}, {});
    if (r == 0) s.whole = {{"buffer", from_vector({1.0, 2.0, 3.0}, {3}, DType::f32)}};
    states.push_back(s);
  }
  return commit_states(out, 7, states);
}

TEST(ShardedCheckpoint, FourWritersLoadUnderAnyWorldSizeEachReadingOnlyItsSlices) {
  TempDir dir("ingot_sharded");
  const std::string ckpt = write_four_rank_checkpoint(dir.path());
  EXPECT_TRUE(is_sharded_checkpoint(ckpt));
  EXPECT_FALSE(fs::exists(dir.file("checkpoints/.tmp-step_00000007-sharded")));
  for (int r = 0; r < 4; ++r) {
    char name[64];
    std::snprintf(name, sizeof name, "model.shard-%05d-of-00004.safetensors", r);
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / name)) << name;
  }
  verify_checkpoint(ckpt);  // the manifest lists every rank's files with their checksums

  ShardedCheckpoint c = ShardedCheckpoint::open(ckpt);
  EXPECT_EQ(c.world_size(), 4);
  // Whole tensors: assembled from the pieces of several ranks.
  for (size_t p = 0; p < kShapes.size(); ++p) {
    const std::string name = "model/w" + std::to_string(p);
    Tensor t = c.read(name);
    EXPECT_EQ(t.shape(), kShapes[p]);
    std::vector<double> v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], value(p, static_cast<int64_t>(i), 1.0)) << name;
  }
  EXPECT_EQ(c.read("model/tied_w2").to_vector(), c.read("model/w2").to_vector());
  EXPECT_EQ(c.read("model/buffer").to_vector(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(c.read("optimizer/step").item(), 7);
  EXPECT_EQ(c.names("optimizer/master."),
            (std::vector<std::string>{"optimizer/master.0", "optimizer/master.1", "optimizer/master.2"}));

  // Resharded: every rank of 1, 2, 3 and 4 gets the chunks its own layout puts there, and reads only the bytes
  // of the elements in them (each of 4 ranks ~1/4 of the whole).
  const uint64_t total_bytes = 26 * 4;
  for (int world : {1, 2, 3, 4}) {
    for (int r = 0; r < world; ++r) {
      ShardedCheckpoint fresh = ShardedCheckpoint::open(ckpt);
      uint64_t elements = 0;
      for (size_t b = 0; b < 2; ++b) {
        const FlatLayout l = layouts(world)[b];
        Tensor got = fresh.read_chunk(l, r, world, DType::f32, [](size_t p) { return "model/w" + std::to_string(p); });
        EXPECT_EQ(got.to_vector(), chunk_of(world, r, b, 1.0).to_vector()) << "world " << world << " rank " << r;
        Tensor m = fresh.read_chunk(l, r, world, DType::f32, [](size_t p) { return "optimizer/master." + std::to_string(p); });
        EXPECT_EQ(m.to_vector(), chunk_of(world, r, b, 2.0).to_vector()) << "world " << world << " rank " << r;
        const int64_t chunk = l.padded_numel / world;
        const int64_t used = std::max<int64_t>(0, std::min<int64_t>((r + 1) * chunk, l.offsets.back() +
                                                                     numel(kShapes[l.params.back()])) - r * chunk);
        elements += static_cast<uint64_t>(used);
      }
      EXPECT_EQ(fresh.bytes_read(), 2 * elements * 4) << "world " << world << " rank " << r;
      if (world == 4) {
        EXPECT_LE(fresh.bytes_read(), 2 * (total_bytes / 4 + 8)) << "rank " << r;
      }
    }
  }
}

TEST(ShardedCheckpoint, AMissingOrChangedShardFileIsAnErrorNamingIt) {
  TempDir dir("ingot_sharded_bad");
  const std::string ckpt = write_four_rank_checkpoint(dir.path());
  // Rank 3 of 4 holds w1[3:7] and w2[3] (elements [18, 24) and [3, 4) of the two buffers), none of w0.
  const fs::path victim = fs::path(ckpt) / "model.shard-00003-of-00004.safetensors";
  // Changed bytes of the same size: found when the file is first read.
  std::string bytes = slurp(victim.string());
  bytes.back() ^= 0x40;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  ShardedCheckpoint c = ShardedCheckpoint::open(ckpt);
  c.read("model/w0");
  try {
    c.read("model/w1");
    FAIL() << "a changed shard file was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file 'model.shard-00003-of-00004.safetensors' does not match its checksum"),
              std::string::npos)
        << e.what();
  }
  // A missing one: found at open.
  fs::remove(victim);
  try {
    ShardedCheckpoint::open(ckpt);
    FAIL() << "a checkpoint with a missing shard file opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file 'model.shard-00003-of-00004.safetensors' is listed in manifest.json "
                                         "but missing"),
              std::string::npos)
        << e.what();
  }
}

// ---- AdamW8bit's moments in their blocks (Note [Moments in their blocks]) ----------------------------------

// Two buffers over three parameters whose chunks are no multiple of 4 or 256 elements, so code words and blocks
// straddle parameters and ranks: [q0 (40x30), q1 (700)] (1900 elements, 950 a rank) and [q2 (64x64)].
const std::vector<Shape> kQShapes = {{40, 30}, {700}, {64, 64}};
const std::vector<FlatLayout> kQLayout = {{{0, 1}, {0, 1200}, 1900}, {{2}, {0}, 4096}};

struct Moments {
  std::vector<ShardedState> states;  // two writers
  // Per buffer and rank, per moment (0: exp_avg, 1: exp_avg_sq): the values the codes decode to, chunk order.
  std::map<std::tuple<size_t, int, int>, std::vector<float>> decoded;
};

Moments quantized_moments() {
  const int world = 2;
  Moments out;
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int r = 0; r < world; ++r) {
    ShardedState s;
    s.rank = r;
    s.world = world;
    s.zero_stage = 3;
    s.layout = kQLayout;
    s.names = {"q0", "q1", "q2"};
    s.shapes = kQShapes;
    for (size_t b = 0; b < kQLayout.size(); ++b) {
      const int64_t chunk = kQLayout[b].padded_numel / world;
      s.weights.push_back(from_vector(std::vector<double>(chunk, 0.5), {chunk}, DType::bf16));
      for (int mi = 0; mi < 2; ++mi) {
        const optim::Quant8Moment& q = optim::kAdamW8bitMoments[mi];
        std::vector<float> x(chunk);
        for (float& v : x) v = q.signed_map ? 1e-3f * normal(gen) : 1e-6f * std::abs(normal(gen));
        Tensor codes = zeros({quant8_code_words(chunk)}, DType::i32), absmax = empty({quant8_blocks(chunk)}, DType::f32);
        const std::array<float, 256>& map = q.signed_map ? quant8_signed_map() : quant8_unsigned_map();
        quant8_quantize(x.data(), chunk, map.data(), reinterpret_cast<uint8_t*>(codes.data_ptr()), absmax.data<float>());
        std::vector<float>& d = out.decoded[{b, r, mi}];
        d.resize(chunk);
        const uint8_t* c = reinterpret_cast<const uint8_t*>(codes.data_ptr());
        for (int64_t j = 0; j < chunk; ++j)
          d[j] = optim::quant8_element_map(q.signed_map)[c[j]] * absmax.data<float>()[j / kQuant8Block];
        s.optimizer[std::to_string(b) + "." + q.codes] = codes;
        s.optimizer[std::to_string(b) + "." + q.absmax] = absmax;
      }
      s.optimizer[std::to_string(b) + ".step"] = from_vector_i64({5}, {});
    }
    s.optimizer["step"] = from_vector_i64({5}, {});
    out.states.push_back(s);
  }
  return out;
}

// What parameter p's moment mi decodes to, element by element, from the two writers' chunks.
std::vector<float> expected_moment(const Moments& m, size_t p, int mi) {
  for (size_t b = 0; b < kQLayout.size(); ++b)
    for (size_t k = 0; k < kQLayout[b].params.size(); ++k) {
      if (kQLayout[b].params[k] != p) continue;
      const int64_t chunk = kQLayout[b].padded_numel / 2;
      std::vector<float> v(numel(kQShapes[p]));
      for (size_t i = 0; i < v.size(); ++i) {
        const int64_t q = kQLayout[b].offsets[k] + static_cast<int64_t>(i);
        v[i] = m.decoded.at({b, static_cast<int>(q / chunk), mi})[q % chunk];
      }
      return v;
    }
  return {};
}

std::vector<float> floats(const Tensor& t) {
  const std::vector<double> v = t.to_vector();  // f32 values, exact in double
  return std::vector<float>(v.begin(), v.end());
}

TEST(ShardedCheckpoint, EightBitMomentsAreStoredInTheirBlocksAndReadElementByElementUnderAnyLayout) {
  TempDir dir("ingot_sharded_q8");
  const Moments m = quantized_moments();
  const std::string ckpt = commit_states(dir.path(), 5, m.states);
  ShardedCheckpoint c = ShardedCheckpoint::open(ckpt);

  // The codes and scales as the ranks held them, and about 2 bytes a parameter on disk instead of 8.
  EXPECT_EQ(c.names("blocks/"), (std::vector<std::string>{"blocks/0.exp_avg_absmax", "blocks/0.exp_avg_q",
                                                           "blocks/0.exp_avg_sq_absmax", "blocks/0.exp_avg_sq_q",
                                                           "blocks/1.exp_avg_absmax", "blocks/1.exp_avg_q",
                                                           "blocks/1.exp_avg_sq_absmax", "blocks/1.exp_avg_sq_q"}));
  EXPECT_EQ(c.dtype("blocks/0.exp_avg_q"), DType::i32);
  EXPECT_EQ(c.shape("blocks/0.exp_avg_q"), (Shape{2 * 238}));  // 950 codes a rank in 238 words
  EXPECT_EQ(c.shape("blocks/0.exp_avg_absmax"), (Shape{2 * 4}));
  uint64_t opt_bytes = 0;
  for (int r = 0; r < 2; ++r) opt_bytes += fs::file_size(fs::path(ckpt) / ("optimizer.shard-0000" + std::to_string(r) + "-of-00002.safetensors"));
  const int64_t n = 1900 + 4096;
  EXPECT_LT(opt_bytes, static_cast<uint64_t>(n) * 2 + 4096) << "bytes for " << n << " parameters' two moments";

  // Each parameter's moments read as f32 elements: the codes decoded with the map element_state_dict() uses.
  for (size_t p = 0; p < kQShapes.size(); ++p)
    for (int mi = 0; mi < 2; ++mi) {
      const std::string name = "optimizer/" + std::to_string(p) + "." + optim::kAdamW8bitMoments[mi].name;
      ASSERT_TRUE(c.has(name)) << name;
      EXPECT_EQ(c.shape(name), kQShapes[p]) << name;
      EXPECT_EQ(c.dtype(name), DType::f32) << name;
      EXPECT_EQ(floats(c.read(name)), expected_moment(m, p, mi)) << name;
      const auto src = c.block_source(name);
      ASSERT_TRUE(src) << name;
      EXPECT_EQ(src->chunk, p == 2 ? 2048 : 950) << name;
      EXPECT_EQ(src->offset, p == 1 ? 1200 : 0) << name;
      EXPECT_EQ(src->signed_map, mi == 0) << name;
    }
  EXPECT_FALSE(c.block_source("model/q0"));
  EXPECT_EQ(c.names("optimizer/0."), (std::vector<std::string>{"optimizer/0.exp_avg", "optimizer/0.exp_avg_sq",
                                                                "optimizer/0.step"}));

  // A range across the writers' boundary (rank 0 ends at q1's element 949 - 1200 < 0: q1 lies at [1200, 1900),
  // rank 1's chunk starts at 950, so q0's elements [900, 1000) cross it) reads only the blocks it lies in.
  {
    ShardedCheckpoint fresh = ShardedCheckpoint::open(ckpt);
    const std::vector<float> all = expected_moment(m, 0, 0);
    EXPECT_EQ(floats(fresh.read_flat("optimizer/0.exp_avg", 900, 1000)),
              std::vector<float>(all.begin() + 900, all.begin() + 1000));
    // rank 0: words 225..237 and block 3; rank 1: words 0..12 and block 0.
    EXPECT_EQ(fresh.bytes_read(), (13 + 13) * 4 + (1 + 1) * 4);
  }

  // Resharded: a chunk of three ranks is the elements' decoded values where that layout puts them.
  for (int world : {1, 3}) {
    const FlatLayout l{{0, 1}, {0, 1200}, (1900 + world - 1) / world * world};
    const int64_t chunk = l.padded_numel / world;
    std::vector<float> flat(l.padded_numel, 0.0f);
    for (size_t k = 0; k < 2; ++k) {
      const std::vector<float> v = expected_moment(m, k, 1);
      std::copy(v.begin(), v.end(), flat.begin() + l.offsets[k]);
    }
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(floats(c.read_chunk(l, r, world, DType::f32,
                                    [](size_t p) { return "optimizer/" + std::to_string(p) + ".exp_avg_sq"; })),
                std::vector<float>(flat.begin() + r * chunk, flat.begin() + (r + 1) * chunk))
          << "world " << world << " rank " << r;
  }

  // Requantized in the writers' blocks, the elements give the writers' codes and scales back bit for bit (Note
  // [8-bit state element by element]): a reader that takes the element form loses nothing either.
  for (int r = 0; r < 2; ++r)
    for (int mi = 0; mi < 2; ++mi) {
      const optim::Quant8Moment& q = optim::kAdamW8bitMoments[mi];
      const std::vector<float>& x = m.decoded.at({0, r, mi});
      std::vector<uint8_t> codes(952, 0);
      std::vector<float> absmax(4);
      quant8_quantize(x.data(), 950, (q.signed_map ? quant8_signed_map() : quant8_unsigned_map()).data(),
                      codes.data(), absmax.data());
      const Tensor& want = m.states[r].optimizer.at(std::string("0.") + q.codes);
      EXPECT_EQ(std::memcmp(codes.data(), want.data_ptr(), 950), 0) << q.name << " rank " << r;
      EXPECT_EQ(absmax, floats(m.states[r].optimizer.at(std::string("0.") + q.absmax))) << q.name << " rank " << r;
    }
}

// After a test changed `name` on purpose: manifest.json lists its new size and checksum, so what is refused is
// the content, not the checksum.
void rewrite_manifest_entry(const std::string& ckpt, const std::string& name) {
  const fs::path manifest = fs::path(ckpt) / "manifest.json";
  nlohmann::json j = nlohmann::json::parse(slurp(manifest.string()));
  const std::string path = (fs::path(ckpt) / name).string();
  j["files"][name] = {{"bytes", fs::file_size(path)}, {"sha256", sha256_file(path)}};
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << j.dump();
}

TEST(ShardedCheckpoint, AMomentNamingBlocksTheIndexLacksIsAnErrorNamingIt) {
  TempDir dir("ingot_sharded_q8_bad");
  const std::string ckpt = commit_states(dir.path(), 5, quantized_moments().states);
  // Point q2's first moment at codes that do not exist; keep the manifest's checksum of the index true.
  const fs::path index = fs::path(ckpt) / "index.json";
  std::string text = slurp(index.string());
  const std::string from = "\"codes\":\"blocks/1.exp_avg_q\"", to = "\"codes\":\"blocks/9.exp_avg_q\"";
  ASSERT_NE(text.find(from), std::string::npos) << text;
  text.replace(text.find(from), from.size(), to);
  std::ofstream(index, std::ios::binary | std::ios::trunc) << text;
  rewrite_manifest_entry(ckpt, "index.json");
  try {
    ShardedCheckpoint::open(ckpt);
    FAIL() << "an index naming missing blocks opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'optimizer/2.exp_avg' names blocks 'blocks/9.exp_avg_q'"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("index.json"), std::string::npos) << e.what();
  }
}

// ---- end to end under `ingot launch` ---------------------------------------------------------------------

using Result = ingot::testing::ShellResult;  // stdout and stderr together

std::map<int64_t, double> after(const std::map<int64_t, double>& losses, int64_t step) {
  std::map<int64_t, double> out;
  for (const auto& [s, l] : losses)
    if (s > step) out[s] = l;
  return out;
}

// Within `rel` relative (0: bitwise).
void expect_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, double rel,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << what << ": no step " << step;
    if (rel == 0) {
      EXPECT_EQ(got.at(step), loss) << what << " at step " << step;
    } else {
      EXPECT_NEAR(got.at(step), loss, rel * std::abs(loss)) << what << " at step " << step;
    }
  }
}

// Every file of a directory tree with its SHA-256.
std::map<std::string, std::string> tree_sums(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out[fs::relative(e.path(), root).string()] = sha256_file(e.path().string());
  return out;
}

class ShardedRun : public ingot::testing::TinyRun {
 protected:
  ShardedRun() : TinyRun("ingot_sharded_run", 2) {}
};

// Losses: the same N resumes bitwise (the same shards, the same sums); other world sizes and one process
// follow the uninterrupted run within 1e-5 relative (the same f32 sums in another order, as DDP vs one
// process).
TEST_F(ShardedRun, FourRanksWriteAndTheCheckpointResumesExactlyOnFourAndWithTheSameLossesOnTwoAndOne) {
  Result ref = single("ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::map<int64_t, double> want = after(train_losses(path("ref/metrics.jsonl"), false), 3);
  Result z3 = launch(4, "z3", "distributed.zero_stage=3 checkpoint.save_every=3 checkpoint.keep_last=0");
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  const std::string ckpt = path("z3/checkpoints/step_00000003");
  ASSERT_TRUE(is_sharded_checkpoint(ckpt)) << z3.output;
  EXPECT_FALSE(fs::exists(fs::path(ckpt) / "model.safetensors")) << "no rank gathers the whole model";
  for (const char* kind : {"model", "optimizer"})
    for (int r = 0; r < 4; ++r) {
      char name[64];
      std::snprintf(name, sizeof name, "%s.shard-%05d-of-00004.safetensors", kind, r);
      EXPECT_TRUE(fs::exists(fs::path(ckpt) / name)) << name;
    }
  auto index = nlohmann::json::parse(slurp(ckpt + "/index.json"));
  EXPECT_EQ(index["world_size"], 4);
  EXPECT_EQ(index["zero_stage"], 3);

  const std::map<int64_t, double> z3_rest = after(train_losses(path("z3/metrics.jsonl"), false), 3);
  Result four = launch(4, "on4", "distributed.zero_stage=3 resume_from=" + ckpt);
  ASSERT_EQ(four.exit_code, 0) << four.output;
  expect_losses(train_losses(path("on4/metrics.jsonl"), false), z3_rest, 0, "resumed on the same 4 ranks");
  Result two = launch(2, "on2", "distributed.zero_stage=3 resume_from=" + ckpt);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  expect_losses(train_losses(path("on2/metrics.jsonl"), false), want, 1e-5, "ZeRO-3 on 4 resumed by ZeRO-3 on 2");
  Result two_z2 = launch(2, "on2_z2", "distributed.zero_stage=2 distributed.bucket_cap_mb=0.004 resume_from=" + ckpt);
  ASSERT_EQ(two_z2.exit_code, 0) << two_z2.output;
  expect_losses(train_losses(path("on2_z2/metrics.jsonl"), false), want, 1e-5, "ZeRO-3 on 4 resumed by ZeRO-2 on 2");
  Result one = single("on1", "resume_from=" + ckpt);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  expect_losses(train_losses(path("on1/metrics.jsonl"), false), want, 1e-5, "ZeRO-3 on 4 resumed in one process");

  // ZeRO-2 with several buckets writes sharded checkpoints too, and ZeRO-3 resumes them exactly on the same N.
  Result z2 = launch(2, "z2", "distributed.zero_stage=2 distributed.bucket_cap_mb=0.004 checkpoint.save_every=3");
  ASSERT_EQ(z2.exit_code, 0) << z2.output;
  ASSERT_TRUE(is_sharded_checkpoint(path("z2/checkpoints/step_00000003")));
  EXPECT_EQ(nlohmann::json::parse(slurp(path("z2/checkpoints/step_00000003/index.json")))["zero_stage"], 2);
  Result z2_z3 = launch(2, "z2_z3", "distributed.zero_stage=3 resume_from=" + path("z2/checkpoints/step_00000003"));
  ASSERT_EQ(z2_z3.exit_code, 0) << z2_z3.output;
  expect_losses(train_losses(path("z2_z3/metrics.jsonl"), false), want, 1e-5, "ZeRO-2 on 2 resumed by ZeRO-3 on 2");
}

TEST_F(ShardedRun, AKilledRankAtStageThreeRestartsFromTheShardedCheckpointWithTheUninterruptedLosses) {
  const std::string z3 = "distributed.zero_stage=3 checkpoint.save_every=2";
  Result ref = launch(2, "ref", z3);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Rank 1 is SIGKILLed right after step 3 (its newest checkpoint is step 2's); the launcher restarts both.
  Result r = launch(2, "killed", z3, "--max-restarts 1", "INGOT_TEST_KILL_AT_STEP=1:3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resume | INGOT_RESTART_COUNT=1: continuing after step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all 2 worker(s) succeeded (attempt 1)"), std::string::npos) << r.output;
  EXPECT_TRUE(is_sharded_checkpoint(path("killed/checkpoints/step_00000006")));
  expect_losses(train_losses(path("killed/metrics.jsonl"), false), train_losses(path("ref/metrics.jsonl"), false), 0,
                "restarted vs uninterrupted, both ZeRO-3 on 2 ranks");
}

TEST_F(ShardedRun, AMissingOrCorruptShardFileStopsTheRunNamingItAndNothingIsOverwritten) {
  Result z3 = launch(4, "z3", "distributed.zero_stage=3 checkpoint.save_every=3 checkpoint.keep_last=0");
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  const std::string ckpt = path("z3/checkpoints/step_00000003");
  fs::copy(ckpt, path("missing"), fs::copy_options::recursive);
  fs::copy(ckpt, path("corrupt"), fs::copy_options::recursive);

  fs::remove(path("missing/optimizer.shard-00002-of-00004.safetensors"));
  Result m = launch(2, "out_missing", "distributed.zero_stage=3 resume_from=" + path("missing"));
  EXPECT_NE(m.exit_code, 0) << m.output;
  EXPECT_NE(m.output.find("file 'optimizer.shard-00002-of-00004.safetensors' is listed in manifest.json but missing"),
            std::string::npos)
      << m.output;
  EXPECT_FALSE(fs::exists(path("out_missing")));

  const std::string victim = path("corrupt/model.shard-00001-of-00004.safetensors");
  std::string bytes = slurp(victim);
  bytes[bytes.size() - 5] ^= 0x01;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  const std::string named = "file 'model.shard-00001-of-00004.safetensors' does not match its checksum";
  Result c1 = single("out_corrupt1", "resume_from=" + path("corrupt"));
  EXPECT_NE(c1.exit_code, 0) << c1.output;
  EXPECT_NE(c1.output.find(named), std::string::npos) << c1.output;
  EXPECT_FALSE(fs::exists(path("out_corrupt1")));
  Result c2 = launch(2, "out_corrupt2", "distributed.zero_stage=3 resume_from=" + path("corrupt"));
  EXPECT_NE(c2.exit_code, 0) << c2.output;
  EXPECT_NE(c2.output.find(named), std::string::npos) << c2.output;
  EXPECT_FALSE(fs::exists(path("out_corrupt2")));

  // The run's own newest checkpoint corrupted: resuming in place fails and leaves every file as it was.
  const std::string own = path("z3/checkpoints/step_00000006/optimizer.shard-00003-of-00004.safetensors");
  bytes = slurp(own);
  bytes[bytes.size() - 5] ^= 0x01;
  std::ofstream(own, std::ios::binary | std::ios::trunc) << bytes;
  const std::map<std::string, std::string> before = tree_sums(path("z3"));
  Result again = launch(4, "z3", "distributed.zero_stage=3 checkpoint.save_every=3 checkpoint.keep_last=0 "
                                 "resume=true max_steps=9 resume_schedule=keep");
  EXPECT_NE(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("file 'optimizer.shard-00003-of-00004.safetensors' does not match its checksum"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(tree_sums(path("z3")), before) << "a failed resume changed the run directory";
}

// Full fine-tuning at stage 3 builds the model without weights and each rank preads only its shards' slices of
// the HF checkpoint (models::HFSliceReader; half of the bytes on 2 ranks), training like one process (1e-5);
// resuming its sharded checkpoint reads no HF weights and continues bitwise.
TEST_F(ShardedRun, ZeroThreeFullFinetuneReadsOnlyItsSlicesOfTheHfCheckpointAndTrainsLikeOneProcess) {
  const std::string src = INGOT_SOURCE_DIR;
  const std::string cfg = "'" + src + "/configs/llama_full_finetune.yaml' device=cpu max_steps=4 train.log_every=1 "
                          "model.path=" + src + "/tests/fixtures/hf/llama3_tiny tokenizer.path=" + src +
                          "/tests/fixtures/data/tokenizer data.path=" + src + "/tests/fixtures/data/kjv_instruct.jsonl "
                          "logging.plot=false train.eval_every=0 checkpoint.save_every=2 checkpoint.keep_last=0";
  Result one = sh("\"$INGOT\" run " + cfg + " output_dir=one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.output.find("loading |"), std::string::npos) << one.output;
  Result z3 = sh("\"$INGOT\" launch --nproc-per-node 2 -- \"$INGOT\" run " + cfg +
                 " output_dir=z3 distributed.zero_stage=3");
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  EXPECT_NE(z3.output.find("loading | rank 0 read "), std::string::npos) << z3.output;
  EXPECT_NE(z3.output.find("bytes (50.0%): the slices of its shards only"), std::string::npos) << z3.output;
  expect_losses(train_losses(path("z3/metrics.jsonl"), false), train_losses(path("one/metrics.jsonl"), false), 1e-5,
                "ZeRO-3 full fine-tune on 2 ranks vs 1 process");
  const double v1 = nlohmann::json::parse(slurp(path("one/summary.json")))["val_loss"].get<double>();
  const double v3 = nlohmann::json::parse(slurp(path("z3/summary.json")))["val_loss"].get<double>();
  EXPECT_NEAR(v3, v1, 1e-5 * v1);
  EXPECT_TRUE(fs::exists(path("z3/hf/config.json")));

  Result resumed = sh("\"$INGOT\" launch --nproc-per-node 2 -- \"$INGOT\" run " + cfg +
                      " output_dir=resumed distributed.zero_stage=3 resume_from=" +
                      path("z3/checkpoints/step_00000002"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("loading |"), std::string::npos) << "a resume reads the checkpoint only";
  expect_losses(train_losses(path("resumed/metrics.jsonl"), false), after(train_losses(path("z3/metrics.jsonl"), false), 2), 0,
                "resumed on the same 2 ranks");
}

}  // namespace
}  // namespace ingot::recipes
