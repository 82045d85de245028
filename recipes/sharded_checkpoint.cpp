#include "recipes/sharded_checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "optim/optimizer.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/kernels/quant8.h"
#include "runtime/safetensors.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "index.json";
constexpr const char* kState = "state.json";
constexpr const char* kFormat = "ingot-sharded-checkpoint";
constexpr int kVersion = 2;  // 2: moments in 8-bit blocks (version 1 has none; both are read)

std::string shard_name(const char* kind, int rank, int world) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s.shard-%05d-of-%05d.safetensors", kind, rank, world);
  return buf;
}

// A view of `flat` holding `n` elements at element `offset`.
Tensor flat_at(const Tensor& flat, int64_t offset, int64_t n) {
  return flat.as_strided({n}, {1}, flat.offset() + offset);
}

// Optimizer state entries are buffers shaped like their parameter (f32) or counters (i64 scalars).
bool is_counter(const Tensor& t) { return t.dim() == 0 || t.dtype() == DType::i64; }

// The slice of param k of `l` (numel elements) that rank r owns, in the parameter's flat elements.
struct Piece {
  int rank;
  int64_t begin, end;
};
std::vector<Piece> pieces_of(const FlatLayout& l, size_t k, int64_t numel, int world) {
  std::vector<Piece> out;
  const int64_t chunk = l.padded_numel / world;
  const int64_t lo = l.offsets[k], hi = lo + numel;
  if (numel == 0 || chunk == 0) return out;
  for (int64_t r = lo / chunk; r <= (hi - 1) / chunk; ++r)
    out.push_back({static_cast<int>(r), std::max(lo, r * chunk) - lo, std::min(hi, (r + 1) * chunk) - lo});
  return out;
}

int64_t numel_of(const Shape& s) { return numel(s); }

// Note [Moments in their blocks]
// AdamW8bit keeps each rank's chunk of a buffer as one-byte codes in 256-element blocks with an f32 absmax each
// (optim/optimizer.h). Written element by element (f32 moments, Note [8-bit state element by element]) an 8B
// model's checkpoint held 64 GB of moments, and a resume requantized them all. So a rank writes its codes and
// absmax as they are, "blocks/<b>.exp_avg_q" and "blocks/<b>.exp_avg_absmax" (the index lists them as tensors of
// world x the rank's length, one piece a rank), and the index lists each parameter's moment "optimizer/<p>.exp_avg"
// with where it lies in them instead of pieces: buffer element q = offset + i is rank q / chunk's element
// j = q % chunk, its code byte j of that rank's codes and its scale absmax[j / 256]. Reading such a tensor decodes
// those elements with the map element_state_dict() uses, so every reader that asks for element ranges (another
// world size, one process, ZeRO-1, f32 AdamW) gets what the f32 form gave, and a run with the writers' layout
// (same world size and buffers) loads the codes themselves (DataParallel::load_shards): bit for bit, nothing
// requantized. 2.03 bytes a parameter instead of 8.

// The moment of AdamW8bit whose codes (`*codes` true) or absmax state `state` names; null for any other state.
const optim::Quant8Moment* block_part(const std::string& state, bool* codes) {
  for (const optim::Quant8Moment& q : optim::kAdamW8bitMoments) {
    if (state == q.codes || state == q.absmax) {
      if (codes) *codes = state == q.codes;
      return &q;
    }
  }
  return nullptr;
}

// The state name after "<buffer>." in an optimizer key.
std::string state_of(const std::string& key) { return key.substr(key.find('.') + 1); }

// Calls f(name, dtype, shape, buffer b, param p) for every sliced tensor of the checkpoint, in a fixed order.
template <class F>
void for_each_sliced(const ShardedState& s, F&& f) {
  for (size_t b = 0; b < s.layout.size(); ++b)
    for (size_t k = 0; k < s.layout[b].params.size(); ++k) {
      const size_t p = s.layout[b].params[k];
      f("model/" + s.names[p], s.weights[b].dtype(), b, k, s.weights[b]);
    }
  for (const auto& [key, t] : s.optimizer) {
    if (key == "step" || is_counter(t) || block_part(state_of(key), nullptr)) continue;
    const size_t dot = key.find('.');
    const size_t b = std::stoul(key.substr(0, dot));
    INGOT_INTERNAL_CHECK(b < s.layout.size(), "sharded checkpoint: optimizer entry '", key, "' names no buffer");
    for (size_t k = 0; k < s.layout[b].params.size(); ++k)
      f("optimizer/" + std::to_string(s.layout[b].params[k]) + key.substr(dot), t.dtype(), b, k, t);
  }
  for (size_t b = 0; b < s.masters.size(); ++b)
    for (size_t k = 0; k < s.layout[b].params.size(); ++k)
      f("optimizer/master." + std::to_string(s.layout[b].params[k]), s.masters[b].dtype(), b, k, s.masters[b]);
}

// Rank 0's whole entries: untrained model entries, the step and the per-parameter counters.
std::vector<std::pair<std::string, Tensor>> whole_entries(const ShardedState& s) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : s.whole) out.emplace_back("model/" + name, t);
  for (const auto& [key, t] : s.optimizer) {
    if (key == "step") {
      out.emplace_back("optimizer/step", t);
    } else if (is_counter(t)) {
      const size_t dot = key.find('.');
      const size_t b = std::stoul(key.substr(0, dot));
      for (size_t p : s.layout.at(b).params) out.emplace_back("optimizer/" + std::to_string(p) + key.substr(dot), t);
    }
  }
  return out;
}

Shape shape_from_json(const nlohmann::json& j) {
  Shape s;
  for (const auto& d : j) s.push_back(d.get<int64_t>());
  return s;
}

}  // namespace

bool is_sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kIndex, ec);
}

std::vector<CheckpointFile> shard_files(const ShardedState& s) {
  const std::string model_file = shard_name("model", s.rank, s.world);
  const std::string opt_file = shard_name("optimizer", s.rank, s.world);
  auto write = [&s](bool model) {
    return [&s, model](const std::string& path) {
      std::vector<std::pair<std::string, Tensor>> named;
      if (s.rank == 0)
        for (auto& [name, t] : whole_entries(s))
          if ((name.rfind("model/", 0) == 0) == model) named.emplace_back(name, t);
      if (!model)
        for (const auto& [key, t] : s.optimizer)
          if (key != "step" && block_part(state_of(key), nullptr)) named.emplace_back("blocks/" + key, t);
      for_each_sliced(s, [&](const std::string& name, DType, size_t b, size_t k, const Tensor& chunk) {
        if ((name.rfind("model/", 0) == 0) != model) return;
        const FlatLayout& l = s.layout[b];
        const int64_t chunk_start = s.rank * (l.padded_numel / s.world);
        for (const Piece& pc : pieces_of(l, k, numel_of(s.shapes[l.params[k]]), s.world))
          if (pc.rank == s.rank)
            named.emplace_back(name, flat_at(chunk, l.offsets[k] + pc.begin - chunk_start, pc.end - pc.begin));
      });
      save_safetensors(path, named, {{"format", "ingot-shard"}});
    };
  };
  return {{model_file, write(true)}, {opt_file, write(false)}};
}

CheckpointFile shard_index_file(const ShardedState& s) {
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const auto& [name, t] : whole_entries(s)) {
    const std::string file = shard_name(name.rfind("model/", 0) == 0 ? "model" : "optimizer", 0, s.world);
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    tensors[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
                     {"shape", std::move(shape)},
                     {"pieces", {{file, 0, t.numel()}}}};
  }
  for_each_sliced(s, [&](const std::string& name, DType dtype, size_t b, size_t k, const Tensor&) {
    const FlatLayout& l = s.layout[b];
    const Shape& shape = s.shapes[l.params[k]];
    nlohmann::ordered_json dims = nlohmann::ordered_json::array();
    for (int64_t d : shape) dims.push_back(d);
    nlohmann::ordered_json pieces = nlohmann::ordered_json::array();
    const char* kind = name.rfind("model/", 0) == 0 ? "model" : "optimizer";
    for (const Piece& pc : pieces_of(l, k, numel_of(shape), s.world))
      pieces.push_back({shard_name(kind, pc.rank, s.world), pc.begin, pc.end});
    tensors[name] = {{"dtype", std::string(dtype_name(dtype))}, {"shape", std::move(dims)}, {"pieces", std::move(pieces)}};
  });
  // Note [Moments in their blocks]: each rank's parts as they are, and every parameter's moment located in them.
  for (const auto& [key, t] : s.optimizer) {
    bool codes = false;
    const optim::Quant8Moment* q = key == "step" ? nullptr : block_part(state_of(key), &codes);
    if (!q) continue;
    const size_t b = std::stoul(key.substr(0, key.find('.')));
    INGOT_INTERNAL_CHECK(b < s.layout.size(), "sharded checkpoint: optimizer entry '", key, "' names no buffer");
    const FlatLayout& l = s.layout[b];
    const int64_t chunk = l.padded_numel / s.world;
    const int64_t len = codes ? quant8_code_words(chunk) : quant8_blocks(chunk);
    INGOT_INTERNAL_CHECK(t.numel() == len, "sharded checkpoint: '", key, "' has ", t.numel(), " elements for a chunk of ",
                         chunk);
    nlohmann::ordered_json pieces = nlohmann::ordered_json::array();
    for (int r = 0; r < s.world; ++r) pieces.push_back({shard_name("optimizer", r, s.world), r * len, (r + 1) * len});
    tensors["blocks/" + key] = {{"dtype", std::string(dtype_name(t.dtype()))},
                                {"shape", {s.world * len}},
                                {"pieces", std::move(pieces)}};
    if (!codes) continue;
    for (size_t k = 0; k < l.params.size(); ++k) {
      nlohmann::ordered_json dims = nlohmann::ordered_json::array();
      for (int64_t d : s.shapes[l.params[k]]) dims.push_back(d);
      const std::string prefix = "blocks/" + std::to_string(b) + ".";
      tensors["optimizer/" + std::to_string(l.params[k]) + "." + q->name] = {
          {"dtype", "f32"},
          {"shape", std::move(dims)},
          {"blocks",
           {{"codes", prefix + q->codes},
            {"absmax", prefix + q->absmax},
            {"offset", l.offsets[k]},
            {"chunk", chunk},
            {"map", q->signed_map ? "signed" : "unsigned"}}}};
    }
  }
  nlohmann::ordered_json aliases = nlohmann::ordered_json::object();
  for (const auto& [alias, name] : s.aliases) aliases["model/" + alias] = "model/" + name;
  // One tensor per line: readable, and diffable between checkpoints.
  nlohmann::ordered_json head;
  head["format"] = kFormat;
  head["version"] = kVersion;
  head["world_size"] = s.world;
  head["zero_stage"] = s.zero_stage;
  std::string text = head.dump();
  text.pop_back();
  text += ",\n\"tensors\": {";
  bool first = true;
  for (const auto& [name, e] : tensors.items()) {
    text += (first ? "\n  " : ",\n  ") + nlohmann::json(name).dump() + ": " + e.dump();
    first = false;
  }
  text += "\n},\n\"aliases\": " + aliases.dump() + "}\n";
  return {kIndex, [text](const std::string& path) {
            write_file_atomic(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size()); });
          }};
}

struct ShardedCheckpoint::Impl {
  struct PieceRef {
    std::string file;
    int64_t begin, end;
  };
  struct Info {
    DType dtype = DType::f32;
    Shape shape;
    int64_t numel = 0;
    std::vector<PieceRef> pieces;
    std::optional<BlockSource> blocks;  // stored in 8-bit blocks (no pieces of its own)
  };
  std::string dir;
  Manifest manifest;
  int world = 0;
  std::map<std::string, Info> tensors;
  std::map<std::string, std::string> aliases;
  mutable std::mutex mu;
  mutable std::map<std::string, SafetensorsFile> files;  // opened (and checksummed) on first use
  mutable uint64_t bytes_read = 0;

  const std::string& resolve(const std::string& name) const {
    auto a = aliases.find(name);
    return a == aliases.end() ? name : a->second;
  }
  const Info& info(const std::string& name) const {
    auto it = tensors.find(resolve(name));
    INGOT_CHECK(it != tensors.end(), "checkpoint '", dir, "': index.json has no tensor '", name, "'");
    return it->second;
  }
  const SafetensorsFile& file(const std::string& name) const {
    auto it = files.find(name);
    if (it != files.end()) return it->second;
    verify_checkpoint_file(dir, name, manifest.files.at(name));
    return files.emplace(name, SafetensorsFile::open((fs::path(dir) / name).string())).first->second;
  }
};

ShardedCheckpoint ShardedCheckpoint::open(const std::string& dir) {
  auto m = std::make_shared<Impl>();
  m->dir = dir;
  m->manifest = verify_checkpoint_sizes(dir, {kIndex, kState}, {kIndex, kState});
  const std::string ipath = (fs::path(dir) / kIndex).string();
  auto bad = [&](const std::string& what) { INGOT_FAIL("checkpoint index '", ipath, "': ", what); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(ipath));
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object() || j.value("format", "") != kFormat) bad("not an ingot sharded checkpoint index (format)");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() < 1 ||
      j["version"].get<int>() > kVersion)
    bad("unsupported version (expected 1 to " + std::to_string(kVersion) + "; made by a newer ingot?)");
  try {
    m->world = j.at("world_size").get<int>();
    for (const auto& [name, e] : j.at("tensors").items()) {
      Impl::Info info;
      info.dtype = parse_dtype(e.at("dtype").get<std::string>());
      info.shape = shape_from_json(e.at("shape"));
      info.numel = numel_of(info.shape);
      if (e.contains("blocks")) {
        const nlohmann::json& b = e.at("blocks");
        const std::string map = b.at("map").get<std::string>();
        if (map != "signed" && map != "unsigned") bad("tensor '" + name + "': unknown map '" + map + "'");
        info.blocks = BlockSource{b.at("codes").get<std::string>(), b.at("absmax").get<std::string>(),
                                  b.at("offset").get<int64_t>(), b.at("chunk").get<int64_t>(), map == "signed"};
        if (info.dtype != DType::f32 || info.blocks->offset < 0 || info.blocks->chunk <= 0)
          bad("tensor '" + name + "': bad blocks entry");
        m->tensors.emplace(name, std::move(info));
        continue;
      }
      int64_t at = 0;
      for (const auto& p : e.at("pieces")) {
        Impl::PieceRef ref{p.at(0).get<std::string>(), p.at(1).get<int64_t>(), p.at(2).get<int64_t>()};
        if (!m->manifest.files.count(ref.file))
          bad("tensor '" + name + "' has a piece in '" + ref.file + "', which manifest.json does not list");
        if (ref.begin != at || ref.end <= ref.begin) bad("the pieces of tensor '" + name + "' do not tile it");
        at = ref.end;
        info.pieces.push_back(std::move(ref));
      }
      if (at != info.numel) bad("the pieces of tensor '" + name + "' do not cover its " + std::to_string(info.numel) +
                                " elements");
      m->tensors.emplace(name, std::move(info));
    }
    // A tensor in blocks lies inside its buffer: world x the chunk's codes and scales.
    for (const auto& [name, info] : m->tensors) {
      if (!info.blocks) continue;
      const BlockSource& b = *info.blocks;
      auto codes = m->tensors.find(b.codes), absmax = m->tensors.find(b.absmax);
      if (codes == m->tensors.end() || absmax == m->tensors.end() || codes->second.blocks || absmax->second.blocks)
        bad("tensor '" + name + "' names blocks '" + b.codes + "' / '" + b.absmax + "' that the index does not hold");
      if (codes->second.dtype != DType::i32 || codes->second.numel != m->world * quant8_code_words(b.chunk) ||
          absmax->second.dtype != DType::f32 || absmax->second.numel != m->world * quant8_blocks(b.chunk) ||
          b.offset + info.numel > m->world * b.chunk)
        bad("tensor '" + name + "' does not fit its blocks '" + b.codes + "' (chunk " + std::to_string(b.chunk) +
            " of " + std::to_string(m->world) + " ranks)");
    }
    for (const auto& [alias, name] : j.at("aliases").items()) {
      if (!m->tensors.count(name.get<std::string>())) bad("alias '" + alias + "' names no tensor");
      m->aliases.emplace(alias, name.get<std::string>());
    }
  } catch (const nlohmann::json::exception& e) {
    bad(e.what());
  } catch (const Error& e) {
    bad(e.what());
  }
  ShardedCheckpoint c;
  c.impl_ = std::move(m);
  return c;
}

const std::string& ShardedCheckpoint::dir() const { return impl_->dir; }
int ShardedCheckpoint::world_size() const { return impl_->world; }

std::vector<std::string> ShardedCheckpoint::names(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const auto& [name, _] : impl_->tensors)
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  for (const auto& [name, _] : impl_->aliases)
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

bool ShardedCheckpoint::has(const std::string& name) const {
  return impl_->tensors.count(impl_->resolve(name)) != 0;
}
DType ShardedCheckpoint::dtype(const std::string& name) const { return impl_->info(name).dtype; }
const Shape& ShardedCheckpoint::shape(const std::string& name) const { return impl_->info(name).shape; }

Tensor ShardedCheckpoint::read_flat(const std::string& name, int64_t begin, int64_t end) const {
  const Impl& m = *impl_;
  const Impl::Info& info = m.info(name);
  const std::string& key = m.resolve(name);
  INGOT_INTERNAL_CHECK(0 <= begin && begin <= end && end <= info.numel, "read_flat: [", begin, ", ", end,
                       ") outside '", name, "'");
  if (info.blocks) return read_blocks(*info.blocks, begin, end);
  Tensor out = empty({end - begin}, info.dtype);
  std::lock_guard<std::mutex> lock(m.mu);
  for (const Impl::PieceRef& p : info.pieces) {
    const int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
    if (lo >= hi) continue;
    const SafetensorsFile& f = m.file(p.file);
    INGOT_CHECK(f.has(key), "checkpoint '", m.dir, "': file '", p.file, "' lacks '", key, "', which index.json puts there");
    Tensor t = f.get(key);
    INGOT_CHECK(t.numel() == p.end - p.begin && t.dtype() == info.dtype, "checkpoint '", m.dir, "': '", key, "' in '",
                p.file, "' has ", t.numel(), " ", dtype_name(t.dtype()), " elements, index.json says ",
                p.end - p.begin, " ", dtype_name(info.dtype));
    Tensor flat = t.as_strided({t.numel()}, {1}, t.offset());
    flat_at(out, lo - begin, hi - lo).copy_(flat_at(flat, lo - p.begin, hi - lo));
    m.bytes_read += static_cast<uint64_t>(hi - lo) * itemsize(info.dtype);
  }
  return out;
}

// Elements [begin, end) of a tensor at `b.offset` of its buffer, decoded from the writers' codes and scales (Note
// [Moments in their blocks]); reads only the words and scales of the blocks they lie in.
Tensor ShardedCheckpoint::read_blocks(const BlockSource& b, int64_t begin, int64_t end) const {
  Tensor out = empty({end - begin}, DType::f32);
  float* o = out.data<float>();
  const std::array<float, 256>& map = optim::quant8_element_map(b.signed_map);
  const int64_t words = quant8_code_words(b.chunk), blocks = quant8_blocks(b.chunk);
  for (int64_t q = b.offset + begin, stop = b.offset + end; q < stop;) {
    const int64_t r = q / b.chunk, j0 = q - r * b.chunk, j1 = std::min(b.chunk, stop - r * b.chunk);
    const Tensor codes = read_flat(b.codes, r * words + j0 / 4, r * words + (j1 - 1) / 4 + 1);
    const Tensor absmax = read_flat(b.absmax, r * blocks + j0 / kQuant8Block, r * blocks + (j1 - 1) / kQuant8Block + 1);
    const uint8_t* c = reinterpret_cast<const uint8_t*>(codes.data_ptr()) + j0 % 4;
    const float* a = absmax.data<float>();
    float* dst = o + (q - b.offset - begin);
    const int64_t first_block = j0 / kQuant8Block;
#pragma omp parallel for schedule(static) if (j1 - j0 > (int64_t{1} << 16))
    for (int64_t j = j0; j < j1; ++j) dst[j - j0] = map[c[j - j0]] * a[j / kQuant8Block - first_block];
    q += j1 - j0;
  }
  return out;
}

std::optional<ShardedCheckpoint::BlockSource> ShardedCheckpoint::block_source(const std::string& name) const {
  return impl_->info(name).blocks;
}

Tensor ShardedCheckpoint::read(const std::string& name) const {
  const Impl::Info& info = impl_->info(name);
  Tensor flat = read_flat(name, 0, info.numel);
  return flat.as_strided(info.shape, contiguous_strides(info.shape), 0);
}

Tensor ShardedCheckpoint::read_chunk(const FlatLayout& l, int rank, int world, DType dtype,
                                     const std::function<std::string(size_t)>& key) const {
  const int64_t chunk = l.padded_numel / world;
  const int64_t start = rank * chunk;
  Tensor out = zeros({chunk}, dtype);
  for (size_t k = 0; k < l.params.size(); ++k) {
    const std::string name = key(l.params[k]);
    const Impl::Info& info = impl_->info(name);
    const int64_t lo = std::max(start, l.offsets[k]), hi = std::min(start + chunk, l.offsets[k] + info.numel);
    if (lo >= hi) continue;
    flat_at(out, lo - start, hi - lo).copy_(read_flat(name, lo - l.offsets[k], hi - l.offsets[k]));
  }
  return out;
}

uint64_t ShardedCheckpoint::bytes_read() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->bytes_read;
}

}  // namespace ingot::recipes
